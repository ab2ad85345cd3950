/*
 * Who may connect, and what a side channel may cost: accepting side channels (credentials,
 * the client limit, a user's share, the descriptors left), room for a new one among those still
 * without a Hello, and reading their frames (malformed ones counted and logged in moderation).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "admission.h"
#include "dispatch.h"
#include "drop.h"
#include "log.h"
#include "state.h"
#include "time-util.h"

/* Out of descriptors: how long aquad stops accepting side channels (and serves the others). */
#define ACCEPT_PAUSE_NS (100 * NSEC_PER_MSEC)
/* A side channel without a Hello this long may be closed to make room for a new one. */
#define UNREGISTERED_GRACE_NS NSEC_PER_SEC
/* Repeated conditions (descriptors out, evictions) are logged at most this often. */
#define LOG_INTERVAL_NS (10 * NSEC_PER_SEC)

#define REJECT(name) AQUA__SIDE_FRAME__REJECT_REASON__REJECT_REASON_##name

static void reject(struct server *s, int fd, Aqua__SideFrame__RejectReason reason, const char *fmt,
                   ...) _printf_(4, 5);
static void reject(struct server *s, int fd, Aqua__SideFrame__RejectReason reason, const char *fmt,
                   ...)
{
        Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
        char text[256];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(text, sizeof(text), fmt, ap);
        va_end(ap);
        f.kind = AQUA__SIDE_FRAME__KIND__KIND_REJECT;
        f.text = text;
        f.reject_reason = reason;
        (void)side_send(fd, &f, NULL, 0);
        s->stats.refused++;
        log_notice("Refused a side-channel connection: %s", text);
        events_add(broker_events(s->broker), "refused", "%s", text);
}

/* Descriptors aquad holds for clients: pooled chunks, those waiting for their request, sockets. */
static size_t count_unregistered(const struct server *s, struct client **ret_oldest)
{
        struct client *oldest = NULL;
        size_t n = 0;

        for (struct list_node *x = s->clients.next; x != &s->clients; x = x->next) {
                struct client *c = list_entry(x, struct client, node);
                if (c->registered)
                        continue;
                if (!oldest)
                        oldest = c;
                n++;
        }
        *ret_oldest = oldest;
        return n;
}

/* The oldest unregistered side channel of the user holding the most of them (the newcomer's
 * own counted too), or NULL. */
static struct client *oldest_of_top_user(const struct server *s, uid_t newcomer)
{
        struct client *best = NULL;
        size_t best_n = 0;

        for (struct list_node *x = s->clients.next; x != &s->clients; x = x->next) {
                struct client *c = list_entry(x, struct client, node), *first = NULL;
                size_t n = c->cred.uid == newcomer;

                if (c->registered || c->remote)
                        continue;
                for (struct list_node *y = s->clients.next; y != &s->clients; y = y->next) {
                        struct client *d = list_entry(y, struct client, node);
                        if (d->registered || d->remote || d->cred.uid != c->cred.uid)
                                continue;
                        if (!first)
                                first = d;
                        n++;
                }
                if (n > best_n) {
                        best_n = n;
                        best = first;
                }
        }
        return best;
}

/*
 * A side channel that has not sent Hello holds nothing: when too many wait, the oldest makes
 * room if it has had UNREGISTERED_GRACE_NS to say Hello (a client sends it within
 * milliseconds; it may connect again). Idle connections cannot lock out the clients that
 * register. False when all are younger: the new connection is refused (a burst of clients).
 */
static bool make_room_for_unregistered(struct server *s, uid_t newcomer)
{
        struct client *oldest;
        uint64_t now = now_mono_ns();

        if ((int64_t)count_unregistered(s, &oldest) < s->config->limits.unregistered || !oldest)
                return true;
        /* The one to go is the oldest of the user who holds the most: a user's flood of idle
         * connections evicts its own before anyone else's. */
        oldest = oldest_of_top_user(s, newcomer) ?: oldest;
        if (now - oldest->accepted_ns < UNREGISTERED_GRACE_NS)
                return false;
        s->stats.evicted++;
        if (!s->evict_log_ns || now - s->evict_log_ns >= LOG_INTERVAL_NS) {
                s->evict_log_ns = now;
                log_notice("%" PRId64 " side channels wait for their Hello: closing the oldest "
                           "(client %" PRIu64 ", pid %d; %" PRIu64 " closed so far)",
                           s->config->limits.unregistered, oldest->id, (int)oldest->cred.pid,
                           s->stats.evicted);
        }
        server_drop_client(s, oldest);
        return true;
}

/* Root and aquad's own user: the operator, who has no share to keep to. */
static bool unlimited(uid_t uid)
{
        return uid == 0 || uid == geteuid();
}

/* Side channels (registered or not) of uid. */
static size_t count_of_user(const struct server *s, uid_t uid)
{
        size_t n = 0;

        for (struct list_node *x = s->clients.next; x != &s->clients; x = x->next) {
                const struct client *c = list_entry(x, struct client, node);
                n += !c->remote && c->cred.uid == uid;
        }
        return n;
}

/*
 * Whether a new side channel fits the shares (daemon/README.md, "Who may hold what"): no user
 * but root and aquad's own holds more than limits.clients-per-user, and the last
 * limits.admin-reserve slots of limits.clients are only for admins, so that one user's flood
 * never locks out the others or the operator. Rejects (and says why) where it does not.
 */
static bool within_share(struct server *s, int fd, const struct side_cred *cred,
                         const gid_t *groups, size_t n_groups)
{
        const struct config_limits *l = &s->config->limits;
        struct client *oldest;
        int64_t registered = (int64_t)(s->n_clients - count_unregistered(s, &oldest));
        bool admin =
            config_access_allows(&s->config->admin, cred->uid, cred->gid, groups, n_groups);
        size_t mine;

        if (registered >= l->clients) {
                reject(s, fd, REJECT(CLIENT_LIMIT), "the limit of %" PRId64 " clients is reached",
                       l->clients);
                return false;
        }
        if (!admin && registered >= l->clients - l->admin_reserve) {
                reject(s, fd, REJECT(CLIENT_LIMIT),
                       "%" PRId64 " clients: the last %" PRId64 " of limits.clients (%" PRId64
                       ") are kept for admins",
                       registered, l->admin_reserve, l->clients);
                return false;
        }
        if (unlimited(cred->uid))
                return true;
        mine = count_of_user(s, cred->uid);
        if ((int64_t)mine >= l->clients_per_user) {
                uint64_t now = now_mono_ns();

                s->stats.share_refused++;
                if (!s->share_log_ns || now - s->share_log_ns >= LOG_INTERVAL_NS) {
                        s->share_log_ns = now;
                        log_notice("uid %u holds its share of %" PRId64 " clients "
                                   "(limits.clients-per-user): refusing more (%" PRIu64
                                   " refused so far)",
                                   cred->uid, l->clients_per_user, s->stats.share_refused);
                }
                reject(s, fd, REJECT(CLIENT_LIMIT),
                       "uid %u holds %zu clients, its share (limits.clients-per-user %" PRId64 ")",
                       cred->uid, mine, l->clients_per_user);
                return false;
        }
        return true;
}

void admission_accept_side(struct server *s)
{
        if (s->accept_paused_ns && now_mono_ns() < s->accept_paused_ns)
                return;
        s->accept_paused_ns = 0;
        for (int i = 0; i < SERVER_BATCH; i++) {
                Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
                _cleanup_close_ int fd = -1;
                struct side_cred cred;
                gid_t groups[CLIENT_MAX_GROUPS];
                socklen_t glen = sizeof(groups);
                size_t n_groups = 0;
                struct client *c;

                fd = accept4(s->side_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
                        /* The connection stays queued; accepting again at once would spin. */
                        uint64_t now = now_mono_ns();
                        s->accept_paused_ns = now + ACCEPT_PAUSE_NS;
                        s->stats.fd_exhausted++;
                        if (!s->fd_log_ns || now - s->fd_log_ns >= LOG_INTERVAL_NS) {
                                s->fd_log_ns = now;
                                log_warning_errno(-errno,
                                                  "Out of descriptors accepting a side "
                                                  "channel: %m; pausing new connections "
                                                  "(%" PRIu64 " times so far)",
                                                  s->stats.fd_exhausted);
                        }
                        return;
                }
                if (fd < 0) {
                        if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                                log_warning_errno(-errno, "Failed to accept a side channel: %m");
                        return;
                }
                if (side_peer_cred(fd, &cred) < 0) {
                        log_warning_errno(-errno, "Failed to read peer credentials: %m");
                        continue;
                }
                if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) == 0)
                        n_groups = glen / sizeof(gid_t);
                if (s->stopping) {
                        reject(s, fd, REJECT(STOPPING), "aquad is stopping");
                        continue;
                }
                if (!config_access_allows(&s->config->allow, cred.uid, cred.gid, groups,
                                          n_groups) &&
                    !config_access_allows(&s->config->admin, cred.uid, cred.gid, groups,
                                          n_groups)) {
                        reject(s, fd, REJECT(PERMISSION),
                               "uid %u gid %u (pid %d) is not in the allowed users or "
                               "groups",
                               cred.uid, cred.gid, (int)cred.pid);
                        continue;
                }
                if (!within_share(s, fd, &cred, groups, n_groups))
                        continue;
                if (!make_room_for_unregistered(s, cred.uid)) {
                        reject(s, fd, REJECT(CLIENT_LIMIT),
                               "%" PRId64 " side channels are waiting to register; retry",
                               s->config->limits.unregistered);
                        continue;
                }
                c = calloc(1, sizeof(*c));
                if (!c) {
                        log_error("Out of memory accepting a client");
                        continue;
                }
                c->cred = cred;
                if (proc_identify(cred.pid, &c->process) < 0)
                        c->process = (struct proc_id){0};
                memcpy(c->groups, groups, n_groups * sizeof(gid_t));
                c->n_groups = n_groups;
                list_init(&c->pending);
                list_init(&c->outbox);
                list_init(&c->deferred);
                if (getrandom(c->token, sizeof(c->token), 0) != sizeof(c->token)) {
                        log_error_errno(-errno, "Failed to draw a token: %m");
                        free(c);
                        continue;
                }
                f.kind = AQUA__SIDE_FRAME__KIND__KIND_HELLO;
                f.token = (ProtobufCBinaryData){.len = sizeof(c->token), .data = c->token};
                if (side_send(fd, &f, NULL, 0) < 0) {
                        free(c);
                        continue;
                }
                c->id = s->next_client_id++;
                c->side_fd = TAKE_FD(fd);
                c->accepted_ns = now_mono_ns();
                c->hello_deadline_ns = c->accepted_ns + s->config->request_timeout_ns;
                list_append(&s->clients, &c->node);
                s->n_clients++;
                log_debug("Side channel from pid %d uid %u gid %u: client %" PRIu64, (int)cred.pid,
                          cred.uid, cred.gid, c->id);
        }
}

/* Read what a client's side socket holds; false when the client is gone (and freed). */
#define SIDE_MALFORMED_LOG_INTERVAL_NS (10 * NSEC_PER_SEC)

/*
 * A client can send garbage as fast as aquad reads it: the log gets the first frame, then the
 * count at most every SIDE_MALFORMED_LOG_INTERVAL_NS and when the client goes (gone: the rest).
 */
static void log_side_malformed(struct client *c, bool gone)
{
        uint64_t now = now_mono_ns();

        if (c->side_malformed_unlogged == 0 ||
            (!gone && c->side_malformed_log_ns &&
             now - c->side_malformed_log_ns < SIDE_MALFORMED_LOG_INTERVAL_NS))
                return;
        if (c->side_malformed_log_ns == 0 && c->side_malformed == 1)
                log_notice("Client %" PRIu64 " sent a malformed side frame; ignored (more are "
                           "counted, and logged every %u s)",
                           c->id, (unsigned)(SIDE_MALFORMED_LOG_INTERVAL_NS / NSEC_PER_SEC));
        else
                log_notice("Client %" PRIu64 " sent %" PRIu64
                           " more malformed side frames (%" PRIu64 " in all); ignored",
                           c->id, c->side_malformed_unlogged, c->side_malformed);
        c->side_malformed_unlogged = 0;
        c->side_malformed_log_ns = now;
}

bool admission_read_side(struct server *s, struct client *c)
{
        for (int i = 0; i < SERVER_BATCH; i++) {
                Aqua__SideFrame *f = NULL;
                int fds[SIDE_MAX_FDS];
                size_t n = 0;
                int r;

                r = side_recv(c->side_fd, &f, fds, SIDE_MAX_FDS, &n);
                if (r == -EAGAIN)
                        return true;
                if (r == SIDE_E_EOF || r == -ECONNRESET) {
                        log_side_malformed(c, true);
                        server_drop_client(s, c);
                        return false;
                }
                if (r == SIDE_E_MALFORMED) {
                        s->stats.side_malformed++;
                        c->side_malformed++;
                        c->side_malformed_unlogged++;
                        log_side_malformed(c, false);
                        continue;
                }
                if (r < 0) {
                        log_warning_errno(r, "Side channel of client %" PRIu64 " failed: %m",
                                          c->id);
                        server_drop_client(s, c);
                        return false;
                }
                dispatch_side_frame(s, c, f, fds, n);
                aqua__side_frame__free_unpacked(f, NULL);
        }
        return true;
}
