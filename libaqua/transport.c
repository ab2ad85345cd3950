/* The client's DEALER and side channel: handshake, request/reply matching, queues, one epoll fd. */
#include "transport.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <zmq.h>

#include "time-util.h"
#include "trust.h"
#include "util.h"

/* Replies to a client are small; anything larger than this is not from a sane daemon. */
#define TRANSPORT_MAX_MESSAGE (4u << 20)

struct env_node {
        struct env_node *next;
        Aqua__Envelope *e;
};

struct transport {
        void *dealer;
        int zmq_fd;
        int side_fd;
        int epoll_fd;
        int timer_fd;
        char *endpoint;
        bool several; /* endpoint is a list: ZMQ_IMMEDIATE */
        char *side_path;
        uint64_t last_id;
        /* Until a receive has seen EAGAIN after the last send or receive, ZeroMQ may hold
         * messages without its fd being readable (a send can swallow the read activation). */
        bool zmq_maybe_pending;
        /* No side channel (a client on another host): ZeroMQ's reconnects are what tells that
         * aquad sees a new client, so the DEALER's handshakes are watched. */
        void *monitor;
        int monitor_fd;
        unsigned handshakes;
        bool timer_armed;
        struct env_node *inbox_head, **inbox_tail;
        struct side_msg *side_head, **side_tail;
        struct wire_limits limits;
        uint64_t dropped;
        char reject_reason[256];
        Aqua__SideFrame__RejectReason reject_code;
};

/* One ZeroMQ context (and I/O thread) for all contexts of the process. */
static pthread_mutex_t zctx_lock = PTHREAD_MUTEX_INITIALIZER;
static void *zctx;
static unsigned zctx_users;

static void *zctx_ref(void)
{
        void *z;

        pthread_mutex_lock(&zctx_lock);
        if (!zctx) {
                zctx = zmq_ctx_new();
                if (zctx)
                        /* Block no signals in the caller's process beyond what ZeroMQ needs. */
                        zmq_ctx_set(zctx, ZMQ_BLOCKY, 0);
        }
        if (zctx)
                zctx_users++;
        z = zctx;
        pthread_mutex_unlock(&zctx_lock);
        return z;
}

static void zctx_unref(void)
{
        void *z = NULL;

        pthread_mutex_lock(&zctx_lock);
        if (zctx && --zctx_users == 0) {
                z = zctx;
                zctx = NULL;
        }
        pthread_mutex_unlock(&zctx_lock);
        if (z)
                zmq_ctx_term(z);
}

struct side_msg *side_msg_free(struct side_msg *m)
{
        if (!m)
                return NULL;
        side_close_fds(m->fds, m->n_fds);
        if (m->frame)
                aqua__side_frame__free_unpacked(m->frame, NULL);
        free(m);
        return NULL;
}

int transport_new(const char *endpoint, const char *side_path, const struct transport_curve *curve,
                  struct transport **ret)
{
        _cleanup_(transport_freep) struct transport *t = NULL;
        struct epoll_event ev = {.events = EPOLLIN};
        size_t fd_len = sizeof(int);
        int linger = 0;
        int64_t maxmsg = TRANSPORT_MAX_MESSAGE;

        t = calloc(1, sizeof(*t));
        if (!t)
                return -ENOMEM;
        t->side_fd = t->epoll_fd = t->timer_fd = t->zmq_fd = t->monitor_fd = -1;
        t->inbox_tail = &t->inbox_head;
        t->side_tail = &t->side_head;
        t->limits = (struct wire_limits)WIRE_LIMITS_DEFAULT;
        t->limits.max_message = TRANSPORT_MAX_MESSAGE;
        t->endpoint = strdup(endpoint);
        t->side_path = side_path ? strdup(side_path) : NULL;
        if (!t->endpoint || (side_path && !t->side_path))
                return -ENOMEM;
        if (side_path && strlen(side_path) >= sizeof(((struct sockaddr_un *)NULL)->sun_path))
                return -ENAMETOOLONG;
        if (!zctx_ref())
                return -errno;
        t->dealer = zmq_socket(zctx, ZMQ_DEALER);
        if (!t->dealer) {
                int r = -errno;

                zctx_unref();
                return r;
        }
        zmq_setsockopt(t->dealer, ZMQ_LINGER, &linger, sizeof(linger));
        zmq_setsockopt(t->dealer, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
        if (curve && curve->server_key &&
            (zmq_setsockopt(t->dealer, ZMQ_CURVE_SERVERKEY, curve->server_key,
                            strlen(curve->server_key)) < 0 ||
             zmq_setsockopt(t->dealer, ZMQ_CURVE_PUBLICKEY, curve->public_key,
                            strlen(curve->public_key)) < 0 ||
             zmq_setsockopt(t->dealer, ZMQ_CURVE_SECRETKEY, curve->secret_key,
                            strlen(curve->secret_key)) < 0))
                return -errno;
        if (!side_path) {
                char addr[64];

                snprintf(addr, sizeof(addr), "inproc://aqua-monitor-%p", (void *)t);
                if (zmq_socket_monitor(t->dealer, addr, ZMQ_EVENT_HANDSHAKE_SUCCEEDED) < 0)
                        return -errno;
                t->monitor = zmq_socket(zctx, ZMQ_PAIR);
                if (!t->monitor)
                        return -errno;
                zmq_setsockopt(t->monitor, ZMQ_LINGER, &linger, sizeof(linger));
                if (zmq_connect(t->monitor, addr) < 0 ||
                    zmq_getsockopt(t->monitor, ZMQ_FD, &t->monitor_fd, &fd_len) < 0)
                        return -errno;
        }
        /* Several endpoints (a domain's aquad instances, "tcp://a:7100,tcp://b:7100"): only the
         * leader listens, and a message goes only to a connection that is up, so to it. */
        t->several = strchr(endpoint, ',') != NULL;
        if (t->several) {
                int immediate = 1;
                _cleanup_free_ char *list = strdup(endpoint);
                char *save = NULL;

                if (!list)
                        return -ENOMEM;
                zmq_setsockopt(t->dealer, ZMQ_IMMEDIATE, &immediate, sizeof(immediate));
                for (char *e = strtok_r(list, ",", &save); e; e = strtok_r(NULL, ",", &save))
                        if (zmq_connect(t->dealer, e) < 0)
                                return -errno;
        } else if (zmq_connect(t->dealer, endpoint) < 0)
                return -errno;
        if (zmq_getsockopt(t->dealer, ZMQ_FD, &t->zmq_fd, &fd_len) < 0)
                return -errno;
        t->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
        t->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
        if (t->epoll_fd < 0 || t->timer_fd < 0)
                return -errno;
        ev.data.fd = t->zmq_fd;
        if (epoll_ctl(t->epoll_fd, EPOLL_CTL_ADD, t->zmq_fd, &ev) < 0)
                return -errno;
        ev.data.fd = t->timer_fd;
        if (epoll_ctl(t->epoll_fd, EPOLL_CTL_ADD, t->timer_fd, &ev) < 0)
                return -errno;
        ev.data.fd = t->monitor_fd;
        if (t->monitor && epoll_ctl(t->epoll_fd, EPOLL_CTL_ADD, t->monitor_fd, &ev) < 0)
                return -errno;
        t->zmq_maybe_pending = true;
        *ret = TAKE_PTR(t);
        return 0;
}

struct transport *transport_free(struct transport *t)
{
        if (!t)
                return NULL;
        while (t->inbox_head) {
                struct env_node *n = t->inbox_head;
                t->inbox_head = n->next;
                aqua__envelope__free_unpacked(n->e, NULL);
                free(n);
        }
        while (t->side_head) {
                struct side_msg *m = t->side_head;
                t->side_head = m->next;
                side_msg_free(m);
        }
        if (t->monitor)
                zmq_close(t->monitor);
        if (t->dealer) {
                zmq_socket_monitor(t->dealer, NULL, 0);
                zmq_close(t->dealer);
                zctx_unref();
        }
        safe_close(t->side_fd);
        safe_close(t->epoll_fd);
        safe_close(t->timer_fd);
        free(t->endpoint);
        free(t->side_path);
        free(t);
        return NULL;
}

/* ---------------------------------------------------------------- side channel */

void transport_side_close(struct transport *t)
{
        if (t->side_fd < 0)
                return;
        epoll_ctl(t->epoll_fd, EPOLL_CTL_DEL, t->side_fd, NULL);
        t->side_fd = safe_close(t->side_fd);
        /* Frames of the old connection (fds for grants never completed) mean nothing now. */
        while (t->side_head) {
                struct side_msg *m = t->side_head;
                t->side_head = m->next;
                side_msg_free(m);
        }
        t->side_tail = &t->side_head;
}

bool transport_side_connected(const struct transport *t)
{
        return t->side_fd >= 0;
}

const char *transport_reject_reason(const struct transport *t)
{
        return t->reject_reason;
}

Aqua__SideFrame__RejectReason transport_reject_code(const struct transport *t)
{
        return t->reject_code;
}

int transport_side_start(struct transport *t)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        struct epoll_event ev = {.events = EPOLLIN};
        _cleanup_close_ int fd = -1;

        transport_side_close(t);
        t->reject_reason[0] = 0;
        t->reject_code = AQUA__SIDE_FRAME__REJECT_REASON__REJECT_REASON_UNSPECIFIED;
        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;
        strcpy(sa.sun_path, t->side_path); /* length checked in transport_new() */
        /* A Unix stream connect completes (or fails) at once unless the backlog is full. */
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS)
                return -errno;
        /* Nothing is sent to a server another user runs, or one in a folder others could
         * change: it would be told what this process maps. */
        if (trust_server(fd, t->side_path,
                         strncmp(t->endpoint, "ipc://", 6) == 0 ? t->endpoint + 6 : NULL,
                         t->reject_reason, sizeof(t->reject_reason)) < 0)
                return -EPERM;
        ev.data.fd = fd;
        if (epoll_ctl(t->epoll_fd, EPOLL_CTL_ADD, fd, &ev) < 0)
                return -errno;
        t->side_fd = TAKE_FD(fd);
        return 0;
}

/* Read one frame from the side channel into the queue, or handle REJECT / EOF. */
static int side_read_one(struct transport *t)
{
        int fds[SIDE_MAX_FDS];
        Aqua__SideFrame *f = NULL;
        struct side_msg *m;
        size_t n = 0;
        int r;

        if (t->side_fd < 0)
                return TRANSPORT_E_CLOSED;
        r = side_recv(t->side_fd, &f, fds, SIDE_MAX_FDS, &n);
        if (r == -EAGAIN)
                return r;
        if (r == SIDE_E_EOF || r == -ECONNRESET) {
                transport_side_close(t);
                return TRANSPORT_E_CLOSED;
        }
        if (r == SIDE_E_MALFORMED) {
                t->dropped++;
                return 0;
        }
        if (r < 0)
                return r;
        if (f->kind == AQUA__SIDE_FRAME__KIND__KIND_REJECT) {
                snprintf(t->reject_reason, sizeof(t->reject_reason), "%s", f->text ? f->text : "");
                t->reject_code = f->reject_reason;
                aqua__side_frame__free_unpacked(f, NULL);
                side_close_fds(fds, n);
                transport_side_close(t);
                return TRANSPORT_E_REJECTED;
        }
        m = malloc(sizeof(*m) + n * sizeof(int));
        if (!m) {
                aqua__side_frame__free_unpacked(f, NULL);
                side_close_fds(fds, n);
                return -ENOMEM;
        }
        m->next = NULL;
        m->frame = f;
        m->n_fds = n;
        memcpy(m->fds, fds, n * sizeof(int));
        *t->side_tail = m;
        t->side_tail = &m->next;
        return 0;
}

int transport_side_pump(struct transport *t)
{
        for (;;) {
                int r = side_read_one(t);
                if (r == -EAGAIN)
                        return 0;
                if (r != 0)
                        return r;
        }
}

static struct side_msg *side_unqueue(struct transport *t, Aqua__SideFrame__Kind kind, uint64_t id)
{
        for (struct side_msg **p = &t->side_head; *p; p = &(*p)->next) {
                struct side_msg *m = *p;
                uint64_t mid = kind == AQUA__SIDE_FRAME__KIND__KIND_GRANT_FDS
                                   ? m->frame->lease_id
                                   : m->frame->request_id;

                if (m->frame->kind != kind || (id != 0 && mid != id))
                        continue;
                *p = m->next;
                if (t->side_tail == &m->next)
                        t->side_tail = p;
                m->next = NULL;
                return m;
        }
        return NULL;
}

int transport_side_take(struct transport *t, Aqua__SideFrame__Kind kind, uint64_t id,
                        uint64_t deadline_ns, struct side_msg **ret)
{
        for (;;) {
                struct side_msg *m = side_unqueue(t, kind, id);
                int r;

                if (m) {
                        *ret = m;
                        return 0;
                }
                r = side_read_one(t);
                if (r == -EAGAIN) {
                        struct pollfd p = {.fd = t->side_fd, .events = POLLIN};
                        int ms = ms_until(deadline_ns);

                        if (ms == 0)
                                return -ETIMEDOUT;
                        if (poll(&p, 1, ms) < 0 && errno != EINTR)
                                return -errno;
                } else if (r != 0)
                        return r;
        }
}

void transport_side_drop(struct transport *t, Aqua__SideFrame__Kind kind)
{
        struct side_msg *m;

        transport_side_pump(t);
        while ((m = side_unqueue(t, kind, 0)))
                side_msg_free(m);
}

int transport_side_finish(struct transport *t, uint8_t ret_token[SIDE_TOKEN_LEN])
{
        struct side_msg *m;
        int r;

        r = transport_side_pump(t);
        if (r != 0)
                return r;
        m = side_unqueue(t, AQUA__SIDE_FRAME__KIND__KIND_HELLO, 0);
        if (!m)
                return -EAGAIN;
        if (m->frame->token.len != SIDE_TOKEN_LEN) {
                side_msg_free(m);
                transport_side_close(t);
                return -EPROTO;
        }
        memcpy(ret_token, m->frame->token.data, SIDE_TOKEN_LEN);
        side_msg_free(m);
        return 0;
}

int transport_side_connect(struct transport *t, uint64_t deadline_ns,
                           uint8_t ret_token[SIDE_TOKEN_LEN])
{
        int r;

        r = transport_side_start(t);
        if (r < 0)
                return r;
        for (;;) {
                struct pollfd p = {.fd = t->side_fd, .events = POLLIN};
                int ms;

                r = transport_side_finish(t, ret_token);
                if (r != -EAGAIN)
                        return r;
                ms = ms_until(deadline_ns);
                if (ms == 0) {
                        transport_side_close(t);
                        return -ETIMEDOUT;
                }
                if (poll(&p, 1, ms) < 0 && errno != EINTR)
                        return -errno;
        }
}

int transport_side_send(struct transport *t, Aqua__SideFrame *f, const int *fds, size_t n_fds)
{
        int r;

        if (t->side_fd < 0)
                return TRANSPORT_E_CLOSED;
        r = side_send(t->side_fd, f, fds, n_fds);
        if (r == -EPIPE || r == -ECONNRESET) {
                transport_side_close(t);
                return TRANSPORT_E_CLOSED;
        }
        return r;
}

/* ---------------------------------------------------------------- envelopes */

uint64_t transport_next_id(struct transport *t)
{
        return ++t->last_id;
}

int transport_send(struct transport *t, Aqua__Envelope *e)
{
        _cleanup_free_ void *buf = NULL;
        size_t len;
        int r;

        r = wire_encode(e, &buf, &len);
        if (r < 0)
                return r;
        t->zmq_maybe_pending = true;
        if (zmq_send(t->dealer, buf, len, ZMQ_DONTWAIT) < 0)
                return errno == EAGAIN ? -EAGAIN : -errno;
        return 0;
}

/* Receive and decode one message from ZeroMQ without blocking. */
static int zmq_next(struct transport *t, Aqua__Envelope **ret)
{
        for (;;) {
                zmq_msg_t msg;
                int more = 0, r;
                size_t more_len = sizeof(more);
                Aqua__Envelope *e = NULL;

                zmq_msg_init(&msg);
                if (zmq_msg_recv(&msg, t->dealer, ZMQ_DONTWAIT) < 0) {
                        r = -errno;
                        zmq_msg_close(&msg);
                        if (r == -EAGAIN)
                                t->zmq_maybe_pending = false;
                        return r;
                }
                zmq_getsockopt(t->dealer, ZMQ_RCVMORE, &more, &more_len);
                if (more) {
                        /* Multi-part messages are not part of the protocol: drop all parts. */
                        while (more && zmq_msg_recv(&msg, t->dealer, ZMQ_DONTWAIT) >= 0)
                                zmq_getsockopt(t->dealer, ZMQ_RCVMORE, &more, &more_len);
                        zmq_msg_close(&msg);
                        t->dropped++;
                        continue;
                }
                /* Until a receive says EAGAIN, more may be queued without the fd telling. */
                t->zmq_maybe_pending = true;
                r = wire_decode(zmq_msg_data(&msg), zmq_msg_size(&msg), &t->limits, &e, NULL, 0);
                zmq_msg_close(&msg);
                if (r < 0)
                        return r;
                if (r > 0) {
                        t->dropped++;
                        continue;
                }
                *ret = e;
                return 0;
        }
}

static int inbox_push(struct transport *t, Aqua__Envelope *e)
{
        struct env_node *n = malloc(sizeof(*n));

        if (!n)
                return -ENOMEM;
        n->next = NULL;
        n->e = e;
        *t->inbox_tail = n;
        t->inbox_tail = &n->next;
        return 0;
}

int transport_next(struct transport *t, Aqua__Envelope **ret)
{
        struct env_node *n = t->inbox_head;

        if (n) {
                t->inbox_head = n->next;
                if (!t->inbox_head)
                        t->inbox_tail = &t->inbox_head;
                *ret = n->e;
                free(n);
                return 0;
        }
        return zmq_next(t, ret);
}

int transport_call(struct transport *t, Aqua__Envelope *req, uint64_t deadline_ns,
                   Aqua__Envelope **ret_reply)
{
        int r;

        if (req->request_id == 0)
                req->request_id = transport_next_id(t);
        r = transport_send(t, req);
        /* Several endpoints and none connected yet (a leader being elected): wait for one. */
        while (r == -EAGAIN && t->several && now_mono_ns() < deadline_ns) {
                zmq_pollitem_t item = {.socket = t->dealer, .events = ZMQ_POLLOUT};
                uint64_t left_ms = (deadline_ns - now_mono_ns()) / NSEC_PER_MSEC;

                if (zmq_poll(&item, 1, (long)MIN(left_ms + 1, 50)) < 0 && errno != EINTR)
                        return -errno;
                r = transport_send(t, req);
        }
        if (r == -EAGAIN && t->several)
                r = -ETIMEDOUT;
        if (r < 0)
                return r;
        for (;;) {
                Aqua__Envelope *e = NULL;

                r = zmq_next(t, &e);
                if (r == 0) {
                        if (e->request_id == req->request_id) {
                                *ret_reply = e;
                                return 0;
                        }
                        r = inbox_push(t, e);
                        if (r < 0) {
                                aqua__envelope__free_unpacked(e, NULL);
                                return r;
                        }
                        continue;
                }
                if (r != -EAGAIN)
                        return r;
                /* A dead daemon never answers: its side channel's EOF says so at once. Without
                 * one (a client on another host) only the deadline can. */
                r = t->side_path ? transport_side_pump(t) : 0;
                if (r == TRANSPORT_E_CLOSED || r == TRANSPORT_E_REJECTED || r < 0)
                        return r == TRANSPORT_E_REJECTED ? TRANSPORT_E_CLOSED : r;
                /* With several endpoints, a connection made anew means a new leader, which
                 * never saw the request. */
                if (t->several && transport_reconnected(t))
                        return TRANSPORT_E_RECONNECTED;
                r = transport_wait(t, deadline_ns);
                if (r < 0)
                        return r;
        }
}

/* ---------------------------------------------------------------- readiness */

static bool monitor_pending(struct transport *t)
{
        int events = 0;
        size_t len = sizeof(events);

        return t->monitor && zmq_getsockopt(t->monitor, ZMQ_EVENTS, &events, &len) == 0 &&
               (events & ZMQ_POLLIN);
}

bool transport_reconnected(struct transport *t)
{
        bool again = false;

        while (monitor_pending(t)) {
                zmq_msg_t m;
                uint16_t event;

                zmq_msg_init(&m);
                if (zmq_msg_recv(&m, t->monitor, ZMQ_DONTWAIT) < 0) {
                        zmq_msg_close(&m);
                        break;
                }
                /* An event is a frame with its number and value, then one with the address. */
                if (zmq_msg_more(&m) && zmq_msg_size(&m) >= sizeof(event)) {
                        memcpy(&event, zmq_msg_data(&m), sizeof(event));
                        if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED && t->handshakes++ > 0)
                                again = true;
                }
                zmq_msg_close(&m);
        }
        return again;
}

bool transport_idle(struct transport *t)
{
        struct pollfd p = {.fd = t->epoll_fd, .events = POLLIN};

        if (t->inbox_head || t->zmq_maybe_pending || monitor_pending(t))
                return false;
        return poll(&p, 1, 0) == 0;
}

int transport_wait(struct transport *t, uint64_t deadline_ns)
{
        /* Not the epoll fd: its timer may be readable and is the event loop's business. */
        struct pollfd p[2] = {{.fd = t->zmq_fd, .events = POLLIN},
                              {.fd = t->side_fd, .events = POLLIN}};
        int ms;

        /* Several endpoints: the monitor's events too (a new leader reached). */
        if (t->several)
                p[1].fd = t->monitor_fd;
        if (t->zmq_maybe_pending)
                return 0;
        ms = deadline_ns == UINT64_MAX ? -1 : ms_until(deadline_ns);
        if (ms == 0)
                return -ETIMEDOUT;
        if (poll(p, p[1].fd >= 0 ? 2 : 1, ms) < 0 && errno != EINTR)
                return -errno;
        return 0;
}

int transport_set_timer(struct transport *t, uint64_t deadline_ns)
{
        struct itimerspec its = {0};

        if (deadline_ns) {
                its.it_value.tv_sec = (time_t)(deadline_ns / NSEC_PER_SEC);
                its.it_value.tv_nsec = (long)(deadline_ns % NSEC_PER_SEC);
        }
        if (timerfd_settime(t->timer_fd, TFD_TIMER_ABSTIME, &its, NULL) < 0)
                return -errno;
        t->timer_armed = deadline_ns != 0;
        return 0;
}

bool transport_timer_fired(struct transport *t)
{
        uint64_t n;

        if (!t->timer_armed)
                return false;
        if (read(t->timer_fd, &n, sizeof(n)) != sizeof(n))
                return false;
        t->timer_armed = false;
        return true;
}

int transport_fd(const struct transport *t)
{
        return t->epoll_fd;
}

uint64_t transport_dropped(const struct transport *t)
{
        return t->dropped;
}
