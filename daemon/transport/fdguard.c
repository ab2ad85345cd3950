/*
 * Descriptor headroom for ZeroMQ's listeners. libzmq 4.3's ipc:// listener aborts the process
 * when accept() fails with EMFILE (ipc_listener.cpp), and every connection it accepts costs a
 * descriptor aquad does not see; unauthenticated tcp:// connections can use up what local
 * clients need. So aquad counts its descriptors against RLIMIT_NOFILE (read again each time:
 * it may be lowered under a running aquad) and, before they run out:
 *
 * - stops the tcp:// endpoint (unbinds it: its connections close, remote clients reconnect and
 *   register again) when fewer than twice the reserve (an eighth of the limit, 24 to 64) are
 *   free, or when more connections wait
 *   for their CURVE handshake than it admits (limits.unregistered, at most a sixteenth of the
 *   limit), and binds it again a second later once there is room;
 * - takes the ipc:// endpoint's name away (renames the socket file to PATH.paused: the listener
 *   and every connection stay, new connects fail with ENOENT and ZeroMQ retries them) when
 *   fewer than the reserve are free, and gives it back once twice that are.
 *
 * ZMQ_BACKLOG is FDGUARD_BACKLOG, so no more connections than that can be queued for the
 * listener to accept once its name is gone; the reserve is larger.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zmq.h>

#include "fdguard.h"
#include "log.h"
#include "state.h"
#include "time-util.h"

#define MONITOR_ENDPOINT "inproc://aquad-router-monitor"
/* A precise count at least this often, and whenever the estimate comes near the reserve. */
#define RECOUNT_NS    (NSEC_PER_SEC)
#define TCP_REBIND_NS (NSEC_PER_SEC)

/* Descriptors open in this process, or -1. */
static long count_fds(void)
{
        DIR *d = opendir("/proc/self/fd");
        struct dirent *e;
        long n = 0;

        if (!d)
                return -1;
        while ((e = readdir(d)))
                n += e->d_name[0] != '.';
        closedir(d);
        return n - 1; /* the directory's own */
}

static uint64_t fd_limit_now(void)
{
        struct rlimit rl;

        if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
                return 0;
        return (uint64_t)rl.rlim_cur;
}

int fdguard_open(struct server *s)
{
        int zero = 0, backlog = FDGUARD_BACKLOG;
        int events = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED |
                     ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                     ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;

        if (zmq_setsockopt(s->router, ZMQ_BACKLOG, &backlog, sizeof(backlog)) < 0 ||
            zmq_socket_monitor(s->router, MONITOR_ENDPOINT, events) < 0)
                return log_error_errno(-errno, "Failed to monitor the ROUTER: %s",
                                       zmq_strerror(errno));
        s->monitor = zmq_socket(s->zctx, ZMQ_PAIR);
        if (!s->monitor || zmq_setsockopt(s->monitor, ZMQ_LINGER, &zero, sizeof(zero)) < 0 ||
            zmq_connect(s->monitor, MONITOR_ENDPOINT) < 0)
                return log_error_errno(-errno, "Failed to monitor the ROUTER: %s",
                                       zmq_strerror(errno));
        s->fdg.counted = count_fds();
        s->fdg.counted_ns = now_mono_ns();
        return 0;
}

static void pending_drop(struct server *s, int fd)
{
        for (size_t i = 0; i < s->fdg.n_pending; i++)
                if (s->fdg.pending[i] == fd) {
                        s->fdg.pending[i] = s->fdg.pending[--s->fdg.n_pending];
                        return;
                }
}

void fdguard_event(struct server *s, uint16_t event, uint32_t value, const char *endpoint)
{
        int fd = (int)value;

        switch (event) {
        case ZMQ_EVENT_ACCEPTED:
                s->fdg.accepted++;
                if (strncmp(endpoint, "tcp://", 6) == 0 &&
                    s->fdg.n_pending < ARRAY_SIZE(s->fdg.pending))
                        s->fdg.pending[s->fdg.n_pending++] = fd;
                break;
        case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
                pending_drop(s, fd);
                break;
        case ZMQ_EVENT_DISCONNECTED:
                pending_drop(s, fd);
                s->fdg.closed++;
                break;
        case ZMQ_EVENT_CLOSED:
                pending_drop(s, fd);
                break;
        default:
                break;
        }
}

static void ipc_pause(struct server *s, bool pause, long free_fds)
{
        _cleanup_free_ char *paused = NULL;

        if (!s->ipc_path || pause == s->fdg.ipc_paused ||
            asprintf(&paused, "%s.paused", s->ipc_path) < 0)
                return;
        if (pause ? rename(s->ipc_path, paused) < 0 : rename(paused, s->ipc_path) < 0) {
                log_error_errno(-errno, "Failed to %s %s: %m", pause ? "pause" : "resume",
                                s->ipc_path);
                return;
        }
        s->fdg.ipc_paused = pause;
        if (pause) {
                s->stats.fd_exhausted++;
                log_warning("Only %ld descriptors left of %" PRIu64 ": new connections to %s wait "
                            "(the socket is %s until there is room)",
                            free_fds, s->fd_limit, s->ipc_path, paused);
        } else
                log_notice("%ld descriptors free again: %s accepts connections", free_fds,
                           s->ipc_path);
}

static void tcp_pause(struct server *s, bool pause, long free_fds, const char *why)
{
        const char *ep = s->config->remote.endpoint;
        uint64_t now = now_mono_ns();

        if (!ep || pause == s->fdg.tcp_paused)
                return;
        if (!pause && now < s->fdg.tcp_paused_ns + TCP_REBIND_NS)
                return;
        if (pause ? zmq_unbind(s->router, ep) < 0 : zmq_bind(s->router, ep) < 0) {
                log_error_errno(-errno, "Failed to %s %s: %s", pause ? "unbind" : "bind again", ep,
                                zmq_strerror(errno));
                return;
        }
        s->fdg.tcp_paused = pause;
        s->fdg.n_pending = 0;
        if (pause) {
                s->fdg.tcp_paused_ns = now;
                log_warning("Stopping %s for now: %s (%ld descriptors free of %" PRIu64
                            "); remote clients reconnect once it is back",
                            ep, why, free_fds, s->fd_limit);
        } else
                log_notice("Serving %s again (%ld descriptors free)", ep, free_fds);
}

/* Descriptors kept free: an eighth of the limit, from 24 to 64 (more than the backlog). */
static long reserve_of(uint64_t limit)
{
        return (long)MIN(MAX(limit / 8, (uint64_t)24), (uint64_t)64);
}

void fdguard_check(struct server *s, uint64_t now)
{
        uint64_t limit = fd_limit_now();
        long reserve;
        long used = s->fdg.counted + (long)(s->fdg.accepted - s->fdg.closed);
        long free_fds;
        size_t tcp_cap;

        if (limit)
                s->fd_limit = limit;
        if (!s->fd_limit || !s->monitor)
                return;
        reserve = reserve_of(s->fd_limit);
        /* Count for real when the estimate comes near the reserve, or once a second. */
        if (now >= s->fdg.counted_ns + RECOUNT_NS || (long)s->fd_limit - used < 4 * reserve) {
                long n = count_fds();
                if (n >= 0) {
                        s->fdg.counted = used = n;
                        s->fdg.accepted = s->fdg.closed = 0;
                        s->fdg.counted_ns = now;
                }
        }
        free_fds = (long)s->fd_limit - used;
        tcp_cap =
            MIN((size_t)s->config->limits.unregistered, MAX((size_t)(s->fd_limit / 16), (size_t)8));
        if (free_fds < 2 * reserve)
                tcp_pause(s, true, free_fds, "descriptors are running out");
        else if (s->fdg.n_pending > tcp_cap)
                tcp_pause(s, true, free_fds, "too many connections wait for their handshake");
        else if (free_fds >= 4 * reserve)
                tcp_pause(s, false, free_fds, NULL);
        if (s->fdg.share_refused) {
                unsigned long n = s->fdg.share_refused();
                if (n != s->stats.ipc_share_refused &&
                    (!s->fdg.share_log_ns || now - s->fdg.share_log_ns >= NSEC_PER_SEC * 10)) {
                        s->fdg.share_log_ns = now;
                        log_notice("%lu ipc:// connections closed as they came, their user "
                                   "holding its share (twice limits.clients-per-user)",
                                   n);
                }
                s->stats.ipc_share_refused = n;
        }
        if (free_fds < reserve)
                ipc_pause(s, true, free_fds);
        else if (free_fds >= 2 * reserve)
                ipc_pause(s, false, free_fds);
}

void fdguard_close(struct server *s)
{
        /* libzmq unlinks the socket by its name when it closes the listener. */
        ipc_pause(s, false, 0);
}
