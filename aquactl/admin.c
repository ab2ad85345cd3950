/* aquactl's session with aquad: side channel handshake, Hello as ADMIN, request/reply with
 * timeouts. */
#include "admin.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <zmq.h>

#include "side.h"
#include "time-util.h"
#include "trust.h"
#include "wire.h"

struct admin {
        int side;
        void *zctx;
        void *dealer;
        char *endpoint;
        uint64_t next_request;
        int timeout_ms;
};

/*
 * Replies to listing queries grow with the pool (a chunk row per 2 MiB), so aquactl accepts far
 * larger messages than aquad does from clients; it only ever talks to its own daemon.
 */
static const struct wire_limits admin_limits = {
    .max_message = 256u << 20,
    .max_repeated = 1u << 22,
    .max_string = 1u << 16,
};

static int fail(int r, char *err, size_t err_len, const char *fmt, ...) _printf_(4, 5);
static int fail(int r, char *err, size_t err_len, const char *fmt, ...)
{
        va_list ap;

        if (err && err_len) {
                va_start(ap, fmt);
                vsnprintf(err, err_len, fmt, ap);
                va_end(ap);
        }
        return r;
}

char *admin_side_path(const char *endpoint)
{
        const char *path;
        size_t len;
        char *s;

        if (!endpoint || strncmp(endpoint, "ipc://", 6) != 0 || !endpoint[6])
                return strdup("/run/aqua/aquad.side");
        /* The rule libaqua follows too, so that both find the same daemon. */
        path = endpoint + 6;
        len = strlen(path);
        if (len > 5 && strcmp(path + len - 5, ".sock") == 0)
                len -= 5;
        if (asprintf(&s, "%.*s.side", (int)len, path) < 0)
                return NULL;
        return s;
}

struct admin *admin_free(struct admin *a)
{
        if (!a)
                return NULL;
        if (a->dealer)
                zmq_close(a->dealer);
        if (a->zctx)
                zmq_ctx_term(a->zctx);
        safe_close(a->side);
        free(a->endpoint);
        free(a);
        return NULL;
}

static int side_connect(const char *endpoint, const char *path, int *ret_fd, char *err,
                        size_t err_len)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        _cleanup_close_ int fd = -1;
        char why[PATH_MAX + 256];

        if (strlen(path) >= sizeof(sa.sun_path))
                return fail(-ENAMETOOLONG, err, err_len, "side channel path %s is too long", path);
        memcpy(sa.sun_path, path, strlen(path) + 1);
        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return fail(-errno, err, err_len, "cannot create a socket: %s", strerror(errno));
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
                int e = errno;

                if (e == ENOENT || e == ECONNREFUSED)
                        return fail(ADMIN_E_NOT_RUNNING, err, err_len,
                                    "aquad is not running at %s (%s: %s)", endpoint, path,
                                    strerror(e));
                if (e == EACCES || e == EPERM)
                        return fail(ADMIN_E_DENIED, err, err_len,
                                    "permission denied connecting to aquad at %s (%s); run as a "
                                    "user or group the daemon's socket allows",
                                    endpoint, path);
                return fail(-e, err, err_len, "cannot connect to aquad at %s (%s): %s", endpoint,
                            path, strerror(e));
        }
        /* Nothing is sent to a server another user runs, or one in a folder others could
         * change: an admin's request names what it may do. */
        if (trust_server(fd, path, strncmp(endpoint, "ipc://", 6) == 0 ? endpoint + 6 : NULL, why,
                         sizeof(why)) < 0)
                return fail(ADMIN_E_DENIED, err, err_len, "%s", why);
        *ret_fd = TAKE_FD(fd);
        return 0;
}

/* Read what aquad sent on the side channel; the only frames an admin expects are HELLO and REJECT.
 */
static int side_read(struct admin *a, Aqua__SideFrame **ret, char *err, size_t err_len)
{
        int fds[4];
        size_t n_fds = 0;
        int r;

        r = side_recv(a->side, ret, fds, ARRAY_SIZE(fds), &n_fds);
        if (r == SIDE_E_EOF)
                return fail(ADMIN_E_STOPPING, err, err_len, "aquad at %s closed the connection",
                            a->endpoint);
        if (r == SIDE_E_MALFORMED)
                return fail(ADMIN_E_PROTOCOL, err, err_len,
                            "aquad at %s sent a side channel frame this aquactl cannot read",
                            a->endpoint);
        if (r < 0)
                return fail(r, err, err_len, "side channel to aquad at %s: %s", a->endpoint,
                            strerror(-r));
        /* Nothing an admin asks for comes with descriptors. */
        side_close_fds(fds, n_fds);
        if ((*ret)->kind == AQUA__SIDE_FRAME__KIND__KIND_REJECT) {
                const char *why = *(*ret)->text ? (*ret)->text : "no reason given";

                /* Only a refusal of the user is about permission (and so is one without a
                 * reason, from an older aquad). */
                if ((*ret)->reject_reason ==
                    AQUA__SIDE_FRAME__REJECT_REASON__REJECT_REASON_STOPPING)
                        r = fail(ADMIN_E_STOPPING, err, err_len, "aquad at %s is stopping: %s",
                                 a->endpoint, why);
                else if ((*ret)->reject_reason ==
                         AQUA__SIDE_FRAME__REJECT_REASON__REJECT_REASON_CLIENT_LIMIT)
                        r = fail(ADMIN_E_REFUSED, err, err_len, "aquad at %s is full: %s",
                                 a->endpoint, why);
                else
                        r = fail(ADMIN_E_DENIED, err, err_len, "aquad at %s refused this user: %s",
                                 a->endpoint, why);
                aqua__side_frame__free_unpacked(*ret, NULL);
                *ret = NULL;
                return r;
        }
        return 0;
}

static int send_envelope(struct admin *a, Aqua__Envelope *e, char *err, size_t err_len)
{
        _cleanup_free_ void *buf = NULL;
        size_t len;
        int r;

        r = wire_encode(e, &buf, &len);
        if (r < 0)
                return fail(r, err, err_len, "cannot encode a request: %s", strerror(-r));
        if (zmq_send(a->dealer, buf, len, ZMQ_DONTWAIT) < 0)
                return fail(-errno, err, err_len, "cannot send to aquad at %s: %s", a->endpoint,
                            zmq_strerror(errno));
        return 0;
}

/* Receive one message; of a multipart message the last part is the Envelope. */
static int recv_envelope(struct admin *a, Aqua__Envelope **ret, char *err, size_t err_len)
{
        zmq_msg_t msg;
        char why[256];
        int more, r;

        zmq_msg_init(&msg);
        do {
                if (zmq_msg_recv(&msg, a->dealer, ZMQ_DONTWAIT) < 0) {
                        r = -errno;
                        zmq_msg_close(&msg);
                        return fail(r, err, err_len, "cannot receive from aquad at %s: %s",
                                    a->endpoint, zmq_strerror(-r));
                }
                more = zmq_msg_more(&msg);
        } while (more);
        r = wire_decode(zmq_msg_data(&msg), zmq_msg_size(&msg), &admin_limits, ret, why,
                        sizeof(why));
        zmq_msg_close(&msg);
        if (r > 0)
                return fail(ADMIN_E_PROTOCOL, err, err_len, "aquad at %s sent %s", a->endpoint,
                            why);
        if (r < 0)
                return fail(r, err, err_len, "cannot decode a reply: %s", strerror(-r));
        return 0;
}

/* Wait until the DEALER has a message, or fail on the deadline or on news from the side channel. */
static int wait_readable(struct admin *a, uint64_t deadline, char *err, size_t err_len)
{
        for (;;) {
                zmq_pollitem_t items[2] = {
                    {.socket = a->dealer, .events = ZMQ_POLLIN},
                    {.fd = a->side, .events = ZMQ_POLLIN},
                };
                int n = zmq_poll(items, 2, ms_until(deadline));

                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return fail(-errno, err, err_len, "waiting for aquad: %s",
                                    zmq_strerror(errno));
                if (items[0].revents & ZMQ_POLLIN)
                        return 0;
                if (items[1].revents) {
                        Aqua__SideFrame *f = NULL;
                        int r = side_read(a, &f, err, err_len);

                        if (r != 0)
                                return r;
                        aqua__side_frame__free_unpacked(f, NULL);
                        continue;
                }
                if (n == 0 && ms_until(deadline) == 0)
                        return fail(ADMIN_E_TIMEOUT, err, err_len,
                                    "no reply from aquad at %s within %d ms", a->endpoint,
                                    a->timeout_ms);
        }
}

int admin_call(struct admin *a, Aqua__Envelope *request, Aqua__Envelope **ret_reply, char *err,
               size_t err_len)
{
        uint64_t deadline = now_mono_ns() + (uint64_t)a->timeout_ms * NSEC_PER_MSEC;
        uint64_t id = a->next_request++;
        int r;

        request->request_id = id;
        r = send_envelope(a, request, err, err_len);
        if (r != 0)
                return r;
        for (;;) {
                Aqua__Envelope *reply = NULL;

                r = wait_readable(a, deadline, err, err_len);
                if (r != 0)
                        return r;
                r = recv_envelope(a, &reply, err, err_len);
                if (r != 0)
                        return r;
                if (reply->body_case == AQUA__ENVELOPE__BODY_STOPPING) {
                        r = fail(ADMIN_E_STOPPING, err, err_len, "aquad at %s is stopping: %s",
                                 a->endpoint,
                                 *reply->stopping->reason ? reply->stopping->reason : "no reason");
                        aqua__envelope__free_unpacked(reply, NULL);
                        return r;
                }
                if (reply->request_id == id) {
                        *ret_reply = reply;
                        return 0;
                }
                /* A notice (request_id 0) or a late reply to an earlier, timed-out request. */
                aqua__envelope__free_unpacked(reply, NULL);
        }
}

static int admin_hello(struct admin *a, const uint8_t *token, size_t token_len,
                       const char *client_name, char *err, size_t err_len)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Hello h = AQUA__HELLO__INIT;
        Aqua__Envelope *reply = NULL;
        int r;

        h.token = (ProtobufCBinaryData){.len = token_len, .data = (uint8_t *)token};
        h.role = AQUA__ROLE__ROLE_ADMIN;
        h.client_name = (char *)client_name;
        e.body_case = AQUA__ENVELOPE__BODY_HELLO;
        e.hello = &h;
        r = admin_call(a, &e, &reply, err, err_len);
        if (r != 0)
                return r;
        if (reply->body_case == AQUA__ENVELOPE__BODY_WELCOME)
                r = 0;
        else if (reply->body_case == AQUA__ENVELOPE__BODY_ERROR &&
                 reply->error->code == AQUA__ERROR_CODE__ERROR_CODE_PERMISSION)
                r = fail(ADMIN_E_DENIED, err, err_len, "aquad at %s refused admin access: %s",
                         a->endpoint, reply->error->message);
        else if (reply->body_case == AQUA__ENVELOPE__BODY_ERROR)
                r = fail(ADMIN_E_REFUSED, err, err_len, "aquad at %s refused to register: %s",
                         a->endpoint, reply->error->message);
        else
                r = fail(ADMIN_E_PROTOCOL, err, err_len, "aquad at %s answered hello with %s",
                         a->endpoint, wire_body_name(reply));
        aqua__envelope__free_unpacked(reply, NULL);
        return r;
}

static struct admin *admin_new(const char *endpoint, int timeout_ms)
{
        struct admin *a = calloc(1, sizeof(*a));

        if (!a)
                return NULL;
        a->side = -1;
        a->next_request = 1;
        a->timeout_ms = timeout_ms;
        a->endpoint = strdup(endpoint);
        return a->endpoint ? a : admin_free(a);
}

int admin_connect(const char *endpoint, const char *side_path, const char *client_name,
                  int timeout_ms, struct admin **ret, char *err, size_t err_len)
{
        _cleanup_(admin_freep) struct admin *a = NULL;
        Aqua__SideFrame *hello = NULL;
        struct pollfd p;
        int linger = 0, r;

        a = admin_new(endpoint, timeout_ms);
        if (!a)
                return fail(-ENOMEM, err, err_len, "out of memory");

        r = side_connect(endpoint, side_path, &a->side, err, err_len);
        if (r != 0)
                return r;

        /* aquad greets first: the token ties the DEALER we open next to this connection. */
        p = (struct pollfd){.fd = a->side, .events = POLLIN};
        r = poll(&p, 1, timeout_ms);
        if (r < 0)
                return fail(-errno, err, err_len, "waiting for aquad: %s", strerror(errno));
        if (r == 0)
                return fail(ADMIN_E_TIMEOUT, err, err_len,
                            "aquad at %s accepted the connection but sent no greeting within %d ms",
                            endpoint, timeout_ms);
        r = side_read(a, &hello, err, err_len);
        if (r != 0)
                return r;
        if (hello->kind != AQUA__SIDE_FRAME__KIND__KIND_HELLO) {
                aqua__side_frame__free_unpacked(hello, NULL);
                return fail(ADMIN_E_PROTOCOL, err, err_len,
                            "aquad at %s greeted with an unexpected side channel frame", endpoint);
        }

        a->zctx = zmq_ctx_new();
        a->dealer = a->zctx ? zmq_socket(a->zctx, ZMQ_DEALER) : NULL;
        if (!a->dealer) {
                aqua__side_frame__free_unpacked(hello, NULL);
                return fail(-errno, err, err_len, "cannot create a ZeroMQ socket: %s",
                            zmq_strerror(errno));
        }
        zmq_setsockopt(a->dealer, ZMQ_LINGER, &linger, sizeof(linger));
        if (zmq_connect(a->dealer, endpoint) < 0) {
                r = -errno;
                aqua__side_frame__free_unpacked(hello, NULL);
                return fail(r, err, err_len, "cannot connect to %s: %s", endpoint,
                            zmq_strerror(-r));
        }
        r = admin_hello(a, hello->token.data, hello->token.len, client_name, err, err_len);
        aqua__side_frame__free_unpacked(hello, NULL);
        if (r != 0)
                return r;
        *ret = TAKE_PTR(a);
        return 0;
}

int admin_connect_remote(const char *endpoint, const char *server_key, const char *public_key,
                         const char *secret_key, const char *client_name, int timeout_ms,
                         struct admin **ret, char *err, size_t err_len)
{
        _cleanup_(admin_freep) struct admin *a = NULL;
        int linger = 0, r;

        a = admin_new(endpoint, timeout_ms);
        if (!a)
                return fail(-ENOMEM, err, err_len, "out of memory");
        a->zctx = zmq_ctx_new();
        a->dealer = a->zctx ? zmq_socket(a->zctx, ZMQ_DEALER) : NULL;
        if (!a->dealer)
                return fail(-errno, err, err_len, "cannot create a ZeroMQ socket: %s",
                            zmq_strerror(errno));
        zmq_setsockopt(a->dealer, ZMQ_LINGER, &linger, sizeof(linger));
        if (zmq_setsockopt(a->dealer, ZMQ_CURVE_SERVERKEY, server_key, strlen(server_key)) < 0 ||
            zmq_setsockopt(a->dealer, ZMQ_CURVE_PUBLICKEY, public_key, strlen(public_key)) < 0 ||
            zmq_setsockopt(a->dealer, ZMQ_CURVE_SECRETKEY, secret_key, strlen(secret_key)) < 0)
                return fail(-errno, err, err_len, "cannot use the CURVE keys: %s",
                            zmq_strerror(errno));
        if (zmq_connect(a->dealer, endpoint) < 0) {
                r = -errno;
                return fail(r, err, err_len, "cannot connect to %s: %s", endpoint,
                            zmq_strerror(-r));
        }
        /* No side channel and no token: the CURVE key is who this is. */
        r = admin_hello(a, NULL, 0, client_name, err, err_len);
        if (r == ADMIN_E_TIMEOUT)
                r = fail(ADMIN_E_TIMEOUT, err, err_len,
                         "no reply from aquad at %s within %d ms (over CURVE: is this client's "
                         "public key in aquad's remote.clients, and the server key aquad's?)",
                         endpoint, timeout_ms);
        if (r != 0)
                return r;
        *ret = TAKE_PTR(a);
        return 0;
}
