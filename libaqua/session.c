/*
 * A context's life: open, register with aquad, reconnect and re-register after losing it, and
 * aqua_poll(), which hands each message to the role that handles it and collects events.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alog.h"
#include "ctx.h"
#include "curve.h"
#include "gpunode.h"
#include "time-util.h"
#include "wire.h"

#define DEFAULT_TIMEOUT_MS  5000
#define DEFAULT_CHUNK_BYTES (UINT64_C(32) << 20)
#define BACKOFF_MIN_MS      20
#define BACKOFF_MAX_MS      1000

extern char *program_invocation_short_name;

/* ---------------------------------------------------------------- small pieces */

uint64_t ctx_deadline(const aqua_ctx *ctx)
{
        return now_mono_ns() + (uint64_t)ctx->timeout_ms * NSEC_PER_MSEC;
}

int ctx_push_event(aqua_ctx *ctx, const struct aqua_event *ev)
{
        if (ctx->ev_n == ctx->ev_cap) {
                size_t cap = ctx->ev_cap ? ctx->ev_cap * 2 : 16;
                struct aqua_event *a = malloc(cap * sizeof(*a));

                if (!a)
                        return -ENOMEM;
                for (size_t i = 0; i < ctx->ev_n; i++)
                        a[i] = ctx->events[(ctx->ev_head + i) % ctx->ev_cap];
                free(ctx->events);
                ctx->events = a;
                ctx->ev_cap = cap;
                ctx->ev_head = 0;
        }
        ctx->events[(ctx->ev_head + ctx->ev_n++) % ctx->ev_cap] = *ev;
        return 0;
}

void ctx_forget_lease_events(aqua_ctx *ctx, const aqua_lease *lease)
{
        size_t kept = 0;

        for (size_t i = 0; i < ctx->ev_n; i++) {
                struct aqua_event ev = ctx->events[(ctx->ev_head + i) % ctx->ev_cap];

                if (ev.lease != lease)
                        ctx->events[(ctx->ev_head + kept++) % ctx->ev_cap] = ev;
        }
        ctx->ev_n = kept;
}

void ctx_forget_tensor_events(aqua_ctx *ctx, const struct aqua_tensor *t)
{
        size_t kept = 0;

        for (size_t i = 0; i < ctx->ev_n; i++) {
                struct aqua_event ev = ctx->events[(ctx->ev_head + i) % ctx->ev_cap];

                if (ev.tensor != t)
                        ctx->events[(ctx->ev_head + kept++) % ctx->ev_cap] = ev;
        }
        ctx->ev_n = kept;
}

int ctx_add_pending(aqua_ctx *ctx, uint64_t request_id, enum pending_kind kind, uint64_t arg)
{
        if (ctx->n_pending == ctx->cap_pending) {
                size_t cap = ctx->cap_pending ? ctx->cap_pending * 2 : 8;
                struct ctx_pending *a = realloc(ctx->pending, cap * sizeof(*a));

                if (!a)
                        return -ENOMEM;
                ctx->pending = a;
                ctx->cap_pending = cap;
        }
        ctx->pending[ctx->n_pending++] =
            (struct ctx_pending){.request_id = request_id, .kind = kind, .arg = arg};
        return 0;
}

bool ctx_take_pending(aqua_ctx *ctx, uint64_t request_id, struct ctx_pending *ret)
{
        for (size_t i = 0; i < ctx->n_pending; i++)
                if (ctx->pending[i].request_id == request_id) {
                        *ret = ctx->pending[i];
                        ctx->pending[i] = ctx->pending[--ctx->n_pending];
                        return true;
                }
        return false;
}

void held_clear(struct held *h)
{
        if (h->fds)
                side_close_fds(h->fds, h->n);
        free(h->items);
        free(h->ptrs);
        free(h->fds);
        free(h->fabric);
        free(h->ids);
        *h = (struct held){0};
}

static Aqua__Role role_to_proto(enum aqua_role role)
{
        switch (role) {
        case AQUA_ROLE_PRODUCER:
                return AQUA__ROLE__ROLE_PRODUCER;
        case AQUA_ROLE_CONSUMER:
                return AQUA__ROLE__ROLE_CONSUMER;
        default:
                return AQUA__ROLE__ROLE_NEUTRAL;
        }
}

/* ---------------------------------------------------------------- registration */

/* Held chunks per message when re-registering: within aquad's repeated-items (4096 by
 * default; do not configure it below this). */
#define HELD_PER_MESSAGE 256

/*
 * Send what a Hello needs on the side channel (a producer's chunk fds after a restart) and fill
 * env with the Hello; *held keeps the memory env points into until the Hello is sent.
 */
static int hello_prepare(aqua_ctx *ctx, const uint8_t token[SIDE_TOKEN_LEN], Aqua__Envelope *env,
                         Aqua__Hello *hello, Aqua__PeerLink *links, Aqua__PeerLink **link_ptrs,
                         struct held *held)
{
        const struct gpu_info *gi = gpu_info(ctx->gpu);
        int r = 0;

        aqua__hello__init(hello);
        if (!ctx->fabric)
                hello->token =
                    (ProtobufCBinaryData){.len = SIDE_TOKEN_LEN, .data = (uint8_t *)token};
        hello->fabric_handles = ctx->fabric;
        if (ctx->has_custody_secret)
                hello->custody_secret = (ProtobufCBinaryData){.len = sizeof(ctx->custody_secret),
                                                              .data = ctx->custody_secret};
        hello->role = role_to_proto(ctx->role);
        hello->gpu_uuid = (char *)gi->uuid;
        hello->gpu_ordinal = (uint32_t)gi->ordinal;
        hello->gpu_capacity = gi->capacity;
        hello->client_name = ctx->client_name;
        hello->host = ctx->host;
        hello->granularity = gi->granularity;
        for (size_t i = 0; i < gi->n_peers; i++) {
                aqua__peer_link__init(&links[i]);
                links[i].gpu_uuid = (char *)gi->peers[i].uuid;
                link_ptrs[i] = &links[i];
        }
        hello->n_links = gi->n_peers;
        hello->links = link_ptrs;

        if (ctx->ops && ctx->ops->held)
                r = ctx->ops->held(ctx, held);
        if (r < 0)
                return r;
        hello->n_held = held->n;
        hello->held = held->ptrs;

        aqua__envelope__init(env);
        env->request_id = transport_next_id(ctx->t);
        env->body_case = AQUA__ENVELOPE__BODY_HELLO;
        env->hello = hello;

        /* More than one message should carry (aquad's repeated-items limit): the first parts
         * go ahead as HelloHeld, the Hello carries the last and the total. */
        if (held->n > HELD_PER_MESSAGE) {
                size_t first = ((held->n - 1) / HELD_PER_MESSAGE) * HELD_PER_MESSAGE;

                for (size_t off = 0; off < first; off += HELD_PER_MESSAGE) {
                        Aqua__Envelope part = AQUA__ENVELOPE__INIT;
                        Aqua__HelloHeld hh = AQUA__HELLO_HELD__INIT;

                        hh.token = hello->token;
                        hh.held = held->ptrs + off;
                        hh.n_held = HELD_PER_MESSAGE;
                        part.request_id = transport_next_id(ctx->t);
                        part.body_case = AQUA__ENVELOPE__BODY_HELLO_HELD;
                        part.hello_held = &hh;
                        r = transport_send(ctx->t, &part);
                        if (r != 0)
                                return r > 0 ? -ECONNRESET : r;
                }
                hello->held = held->ptrs + first;
                hello->n_held = held->n - first;
                hello->held_total = (uint32_t)held->n;
        }

        /* The host's evidence that this process may use its GPU: the GPU's device node,
         * which only a process the host lets use it can open. None where the host lists no
         * such GPU (aquad then asks for none); a node this process may not open is not sent,
         * and aquad refuses the Hello saying so. */
        if (!ctx->fabric) {
                int fd = gpunode_open(gpunode_root(), gi->uuid);

                if (fd >= 0) {
                        Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;

                        f.kind = AQUA__SIDE_FRAME__KIND__KIND_DEVICE_FD;
                        f.request_id = env->request_id;
                        r = transport_side_send(ctx->t, &f, &fd, 1);
                        close(fd);
                        if (r != 0)
                                return r > 0 ? -ECONNRESET : r;
                        hello->device_node = true;
                } else if (fd != -ENOENT)
                        alog_notice("cannot open the device node of %s (%s): aquad will refuse to "
                                    "register it",
                                    gi->uuid, strerror(-fd));
        }

        /* The fds go first so the daemon has them when it reads the Hello; at most
         * SIDE_MAX_FDS per datagram, each frame naming its chunks. */
        for (size_t off = 0; held->fds && off < held->n; off += SIDE_MAX_FDS) {
                Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
                size_t n = MIN(held->n - off, (size_t)SIDE_MAX_FDS);

                f.kind = AQUA__SIDE_FRAME__KIND__KIND_REREGISTER_FDS;
                f.request_id = env->request_id;
                f.n_chunk_ids = n;
                f.chunk_ids = held->ids + off;
                r = transport_side_send(ctx->t, &f, held->fds + off, n);
                if (r != 0)
                        return r > 0 ? -ECONNRESET : r;
        }
        return 0;
}

static void session_welcome(aqua_ctx *ctx, const Aqua__Welcome *w)
{
        ctx->client_id = w->client_id;
        snprintf(ctx->paired_with, sizeof(ctx->paired_with), "%s",
                 w->paired_with ? w->paired_with : "");
        ctx->dram_budget = w->dram_budget;
        ctx->reclaim_deadline_ms = w->reclaim_deadline_ms;
        if (w->custody_secret.len == sizeof(ctx->custody_secret)) {
                memcpy(ctx->custody_secret, w->custody_secret.data, sizeof(ctx->custody_secret));
                ctx->has_custody_secret = true;
        }
        ctx->state = SESSION_CONNECTED;
        ctx->backoff_ms = 0;
        ctx->keepalive_ms = ctx->fabric ? w->keepalive_ms : 0;
        ctx->keepalive_due_ns =
            ctx->keepalive_ms ? now_mono_ns() + ctx->keepalive_ms * NSEC_PER_MSEC : 0;
        /* The timer wakes aqua_fd() for the next Keepalive, where there is one. */
        transport_set_timer(ctx->t, ctx->keepalive_due_ns);
        for (size_t i = 0; ctx->ops && ctx->ops->lease_lost && i < w->n_lost_leases; i++)
                ctx->ops->lease_lost(ctx, w->lost_leases[i]);
        alog_info("gpu %d registered with aquad as client %" PRIu64 "%s%s", ctx->device,
                  ctx->client_id, ctx->paired_with[0] ? ", paired with " : "", ctx->paired_with);
}

/* Connect, register, and wait for the Welcome, all before deadline_ns. */
static int session_connect(aqua_ctx *ctx, uint64_t deadline_ns)
{
        uint8_t token[SIDE_TOKEN_LEN];
        Aqua__Envelope env, *reply = NULL;
        Aqua__Hello hello;
        Aqua__PeerLink links[16], *link_ptrs[16];
        _cleanup_(held_clear) struct held held = {0};
        int r;

        r = ctx->fabric ? 0 : transport_side_connect(ctx->t, deadline_ns, token);
        if (r == -EPERM) {
                alog_error("%s", transport_reject_reason(ctx->t));
                return r;
        }
        if (r == TRANSPORT_E_REJECTED) {
                alog_error("aquad refused this process: %s", transport_reject_reason(ctx->t));
                return error_from_reject(transport_reject_code(ctx->t));
        }
        if (r == TRANSPORT_E_CLOSED)
                return -ECONNRESET;
        if (r < 0)
                return r;
        r = hello_prepare(ctx, token, &env, &hello, links, link_ptrs, &held);
        if (r < 0)
                goto fail;
        ctx->state = SESSION_AWAIT_WELCOME;
        r = transport_call(ctx->t, &env, deadline_ns, &reply);
        if (r == TRANSPORT_E_CLOSED) {
                r = -ECONNRESET;
                goto fail;
        }
        if (r < 0)
                goto fail;
        if (reply->body_case == AQUA__ENVELOPE__BODY_WELCOME) {
                session_welcome(ctx, reply->welcome);
                aqua__envelope__free_unpacked(reply, NULL);
                return 0;
        }
        if (reply->body_case == AQUA__ENVELOPE__BODY_ERROR) {
                alog_error("aquad refused to register gpu %d: %s", ctx->device,
                           reply->error->message ? reply->error->message : "");
                r = error_from_code(reply->error->code);
                if (r >= 0)
                        r = -EPROTO;
        } else
                r = -EPROTO;
        aqua__envelope__free_unpacked(reply, NULL);
fail:
        transport_side_close(ctx->t);
        ctx->state = SESSION_RETRY;
        return r;
}

static void schedule_retry(aqua_ctx *ctx)
{
        ctx->backoff_ms =
            ctx->backoff_ms ? MIN(ctx->backoff_ms * 2, BACKOFF_MAX_MS) : BACKOFF_MIN_MS;
        ctx->state = SESSION_RETRY;
        ctx->session_deadline_ns = now_mono_ns() + ctx->backoff_ms * NSEC_PER_MSEC;
        transport_set_timer(ctx->t, ctx->session_deadline_ns);
}

/* The daemon went away: keep every mapping, forget what only it knew, and start retrying. */
static void session_lost(aqua_ctx *ctx, const char *why)
{
        struct aqua_event ev = {.type = AQUA_EVENT_DISCONNECTED};

        if (ctx->state == SESSION_RETRY && (ctx->fabric || !transport_side_connected(ctx->t)))
                return;
        alog_warning("gpu %d lost aquad (%s); reconnecting", ctx->device, why);
        /* The reconnect that may have caused this is seen: it is not a second loss. */
        if (ctx->fabric)
                (void)transport_reconnected(ctx->t);
        transport_side_close(ctx->t);
        if (ctx->state == SESSION_CONNECTED) {
                ctx_push_event(ctx, &ev);
                /* A daemon that was up is likely restarting: try soon. */
                ctx->backoff_ms = 0;
        }
        ctx->client_id = 0;
        ctx->n_pending = 0;
        if (ctx->ops && ctx->ops->session_lost)
                ctx->ops->session_lost(ctx);
        schedule_retry(ctx);
}

static void session_reconnected(aqua_ctx *ctx)
{
        struct aqua_event ev = {.type = AQUA_EVENT_RECONNECTED};

        ctx_push_event(ctx, &ev);
}

/* One non-blocking step of reconnecting, for aqua_poll(). */
static void session_step(aqua_ctx *ctx)
{
        uint8_t token[SIDE_TOKEN_LEN];
        uint64_t now;
        int r;

        if (ctx->state == SESSION_CONNECTED)
                return;
        now = now_mono_ns();
        switch (ctx->state) {
        case SESSION_RETRY:
                if (now < ctx->session_deadline_ns)
                        return;
                r = ctx->fabric ? 0 : transport_side_start(ctx->t);
                if (r == -EPERM)
                        alog_error("%s", transport_reject_reason(ctx->t));
                if (r < 0) {
                        schedule_retry(ctx);
                        return;
                }
                ctx->state = SESSION_AWAIT_TOKEN;
                ctx->session_deadline_ns = ctx_deadline(ctx);
                transport_set_timer(ctx->t, ctx->session_deadline_ns);
                /* The token may be there already. */
                __attribute__((fallthrough));
        case SESSION_AWAIT_TOKEN: {
                Aqua__Envelope env;
                Aqua__Hello hello;
                Aqua__PeerLink links[16], *link_ptrs[16];
                _cleanup_(held_clear) struct held held = {0};

                r = ctx->fabric ? 0 : transport_side_finish(ctx->t, token);
                if (r == -EAGAIN) {
                        if (now >= ctx->session_deadline_ns)
                                schedule_retry(ctx);
                        return;
                }
                if (r == TRANSPORT_E_REJECTED)
                        alog_error("aquad refused this process: %s",
                                   transport_reject_reason(ctx->t));
                if (r == 0)
                        r = hello_prepare(ctx, token, &env, &hello, links, link_ptrs, &held);
                if (r == 0)
                        r = transport_send(ctx->t, &env);
                if (r == 0)
                        r = ctx_add_pending(ctx, env.request_id, PENDING_HELLO, 0);
                if (r != 0) {
                        transport_side_close(ctx->t);
                        schedule_retry(ctx);
                        return;
                }
                ctx->hello_id = env.request_id;
                ctx->state = SESSION_AWAIT_WELCOME;
                return;
        }
        case SESSION_AWAIT_WELCOME:
                if (now >= ctx->session_deadline_ns) {
                        transport_side_close(ctx->t);
                        schedule_retry(ctx);
                }
                return;
        case SESSION_CONNECTED:
                return;
        }
}

/* A client on tcp:// says it is still there, every Welcome.keepalive_ms while it polls. */
static void session_keepalive(aqua_ctx *ctx)
{
        Aqua__Envelope env = AQUA__ENVELOPE__INIT;
        Aqua__Keepalive k = AQUA__KEEPALIVE__INIT;
        uint64_t now;

        if (!ctx->keepalive_due_ns || ctx->state != SESSION_CONNECTED)
                return;
        now = now_mono_ns();
        if (now < ctx->keepalive_due_ns)
                return;
        env.request_id = transport_next_id(ctx->t);
        env.body_case = AQUA__ENVELOPE__BODY_KEEPALIVE;
        env.keepalive = &k;
        if (transport_send(ctx->t, &env) < 0)
                alog_debug("could not send a keepalive to aquad");
        ctx->keepalive_due_ns = now + ctx->keepalive_ms * NSEC_PER_MSEC;
        transport_set_timer(ctx->t, ctx->keepalive_due_ns);
}

int ctx_ensure_connected(aqua_ctx *ctx, uint64_t deadline_ns)
{
        /* A blocking call does not wait for the back-off: try now. */
        if (ctx->state == SESSION_RETRY)
                ctx->session_deadline_ns = 0;
        for (;;) {
                int r;

                session_step(ctx);
                if (ctx->state == SESSION_CONNECTED)
                        return 0;
                r = ctx_pump(ctx);
                if (r < 0)
                        return r;
                if (ctx->state == SESSION_CONNECTED)
                        return 0;
                if (now_mono_ns() >= deadline_ns)
                        return -ENOTCONN;
                transport_wait(ctx->t, ctx->state == SESSION_RETRY
                                           ? MIN(deadline_ns, ctx->session_deadline_ns)
                                           : deadline_ns);
        }
}

int ctx_call(aqua_ctx *ctx, Aqua__Envelope *req, uint64_t deadline_ns, Aqua__Envelope **ret_reply)
{
        Aqua__Envelope *reply = NULL;
        bool again = ctx->fabric;
        int r;

retry:
        r = ctx_ensure_connected(ctx, deadline_ns);
        if (r < 0)
                return r;
        r = transport_call(ctx->t, req, deadline_ns, &reply);
        if (r == TRANSPORT_E_CLOSED) {
                session_lost(ctx, "side channel closed");
                return -ENOTCONN;
        }
        if (r < 0)
                return r;
        if (reply->body_case == AQUA__ENVELOPE__BODY_ERROR) {
                alog_debug("aquad answered %s with error %d: %s", wire_body_name(req),
                           reply->error->code, reply->error->message ? reply->error->message : "");
                /* Over tcp a new connection (ZeroMQ reconnected after a cut link) is a new
                 * client to aquad: register again, with what this context holds. */
                if (ctx->fabric &&
                    reply->error->code == AQUA__ERROR_CODE__ERROR_CODE_NOT_REGISTERED) {
                        aqua__envelope__free_unpacked(reply, NULL);
                        session_lost(ctx, "aquad no longer knows this connection");
                        if (!again)
                                return -ENOTCONN;
                        again = false;
                        req->request_id = 0;
                        goto retry;
                }
                r = error_from_code(reply->error->code);
                aqua__envelope__free_unpacked(reply, NULL);
                return r == 0 ? -EPROTO : r;
        }
        *ret_reply = reply;
        return 0;
}

/* ---------------------------------------------------------------- dispatch */

static void dispatch_pending(aqua_ctx *ctx, const struct ctx_pending *p, Aqua__Envelope *e)
{
        bool handled = false;

        switch (p->kind) {
        case PENDING_HELLO:
                /* The answer to an attempt given up on (it timed out, a newer one followed):
                 * acting on it would tear down the session the newer attempt made. */
                if (e->request_id != ctx->hello_id || ctx->state != SESSION_AWAIT_WELCOME) {
                        alog_debug("ignored the late answer to an earlier Hello");
                        return;
                }
                if (e->body_case == AQUA__ENVELOPE__BODY_WELCOME) {
                        session_welcome(ctx, e->welcome);
                        session_reconnected(ctx);
                } else {
                        alog_warning("aquad did not take gpu %d back: %s", ctx->device,
                                     e->body_case == AQUA__ENVELOPE__BODY_ERROR && e->error->message
                                         ? e->error->message
                                         : wire_body_name(e));
                        transport_side_close(ctx->t);
                        schedule_retry(ctx);
                }
                return;
        case PENDING_OFFER:
        case PENDING_BORROW:
        case PENDING_RECLAIM:
                if (ctx->ops && ctx->ops->reply)
                        ctx->ops->reply(ctx, p, e);
                return;
        case PENDING_RETURN:
                break;
        }
        if (e->body_case == AQUA__ENVELOPE__BODY_ERROR) {
                alog_warning("aquad refused a request: %s",
                             e->error->message ? e->error->message : "");
                return;
        }
        if (ctx->ops && ctx->ops->dispatch)
                ctx->ops->dispatch(ctx, e, &handled);
}

int ctx_dispatch(aqua_ctx *ctx, Aqua__Envelope *e)
{
        struct ctx_pending p;
        bool handled = false;
        int r = 0;

        /* Over tcp aquad ended the registration (silent past remote.grace, or a new
         * connection): register again with what this context holds. */
        if (ctx->fabric && e->body_case == AQUA__ENVELOPE__BODY_ERROR &&
            e->error->code == AQUA__ERROR_CODE__ERROR_CODE_NOT_REGISTERED &&
            ctx->state == SESSION_CONNECTED) {
                session_lost(ctx, "aquad no longer knows this connection");
                return 0;
        }
        if (e->request_id != 0) {
                /* Replies nobody tracks (the Ack of a load report) need nothing. */
                if (ctx_take_pending(ctx, e->request_id, &p))
                        dispatch_pending(ctx, &p, e);
                return 0;
        }
        switch (e->body_case) {
        case AQUA__ENVELOPE__BODY_PAIR_CHANGED: {
                struct aqua_event ev = {.type = AQUA_EVENT_PAIR_CHANGED};
                snprintf(ctx->paired_with, sizeof(ctx->paired_with), "%s",
                         e->pair_changed->paired_with ? e->pair_changed->paired_with : "");
                return ctx_push_event(ctx, &ev);
        }
        case AQUA__ENVELOPE__BODY_STOPPING: {
                struct aqua_event ev = {.type = AQUA_EVENT_DAEMON_STOPPING};
                return ctx_push_event(ctx, &ev);
        }
        case AQUA__ENVELOPE__BODY_ERROR:
                alog_warning("aquad: %s", e->error->message ? e->error->message : "error");
                return 0;
        default:
                break;
        }
        if (ctx->ops && ctx->ops->dispatch)
                r = ctx->ops->dispatch(ctx, e, &handled);
        if (!handled)
                alog_debug("ignored a %s notice from aquad", wire_body_name(e));
        return r;
}

int ctx_pump(aqua_ctx *ctx)
{
        int r;

        if (ctx->fabric && transport_reconnected(ctx->t) && ctx->state == SESSION_CONNECTED)
                session_lost(ctx, "the connection to aquad was made again");
        for (;;) {
                Aqua__Envelope *e = NULL;

                r = transport_next(ctx->t, &e);
                if (r == -EAGAIN)
                        break;
                if (r < 0)
                        return r;
                r = ctx_dispatch(ctx, e);
                aqua__envelope__free_unpacked(e, NULL);
                if (r < 0)
                        return r;
        }
        if (!transport_side_connected(ctx->t))
                return 0;
        r = transport_side_pump(ctx->t);
        if (r == TRANSPORT_E_CLOSED)
                session_lost(ctx, "side channel closed");
        else if (r == TRANSPORT_E_REJECTED) {
                alog_error("aquad refused this process: %s", transport_reject_reason(ctx->t));
                session_lost(ctx, "rejected");
        } else if (r < 0)
                return r;
        return 0;
}

int ctx_wait(aqua_ctx *ctx, const struct completion *c, uint64_t deadline_ns)
{
        int r;

        for (;;) {
                r = ctx_pump(ctx);
                if (r < 0)
                        return r;
                if (c->done)
                        return 0;
                if (ctx->state != SESSION_CONNECTED)
                        return -ENOTCONN;
                if (transport_wait(ctx->t, deadline_ns) == -ETIMEDOUT)
                        return -ETIMEDOUT;
        }
}

/* ---------------------------------------------------------------- public */

static int resolve_side_path(const char *given, const char *endpoint, char **ret)
{
        const char *env = getenv("AQUA_SIDE_PATH"), *path;
        size_t len;
        char *s;

        if (given || (env && *env)) {
                s = strdup(given ? given : env);
                if (!s)
                        return -ENOMEM;
                *ret = s;
                return 0;
        }
        /* Another host: no side channel at all, fabric handles instead. */
        if (strncmp(endpoint, "tcp://", 6) == 0) {
                *ret = NULL;
                return 0;
        }
        if (strncmp(endpoint, "ipc://", 6) != 0 || !endpoint[6])
                return -EINVAL;
        /* aquad's own default pairs aquad.sock with aquad.side. */
        path = endpoint + 6;
        len = strlen(path);
        if (len > 5 && strcmp(path + len - 5, ".sock") == 0)
                len -= 5;
        if (asprintf(&s, "%.*s.side", (int)len, path) < 0)
                return -ENOMEM;
        *ret = s;
        return 0;
}

DEFINE_TRIVIAL_CLEANUP_FUNC(aqua_ctx *, aqua_close);

/* The CURVE keys from the options, else from $AQUA_SERVER_KEY and $AQUA_KEY_FILE; none: {0}. */
static int resolve_curve(const struct aqua_options *o, char keys[3][CURVE_KEY_TEXT + 1],
                         struct transport_curve *ret)
{
        const char *server = getenv("AQUA_SERVER_KEY"), *file = getenv("AQUA_KEY_FILE");
        char err[256];

        *ret = (struct transport_curve){0};
        if (o->server_key || o->public_key || o->secret_key) {
                if (!curve_key_valid(o->server_key) || !curve_key_valid(o->public_key) ||
                    !curve_key_valid(o->secret_key)) {
                        alog_error("server_key, public_key and secret_key go together, each 40 "
                                   "characters of Z85");
                        return -EINVAL;
                }
                *ret = (struct transport_curve){o->server_key, o->public_key, o->secret_key};
                return 0;
        }
        if (!server || !*server)
                return 0;
        if (curve_public_key_load(server, keys[0], err, sizeof(err)) < 0) {
                alog_error("$AQUA_SERVER_KEY: %s", err);
                return -EINVAL;
        }
        if (!file || !*file) {
                alog_error("$AQUA_SERVER_KEY needs this client's key pair in $AQUA_KEY_FILE");
                return -EINVAL;
        }
        if (curve_keyfile_load(file, keys[1], keys[2], err, sizeof(err)) < 0) {
                alog_error("$AQUA_KEY_FILE: %s", err);
                return -EINVAL;
        }
        *ret = (struct transport_curve){keys[0], keys[1], keys[2]};
        return 0;
}

_public_ int aqua_open(int device, enum aqua_role role, const struct aqua_options *opts,
                       aqua_ctx **ret_ctx)
{
        struct aqua_options o = AQUA_OPTIONS_INIT;
        const char *endpoint, *env;
        char keys[3][CURVE_KEY_TEXT + 1];
        struct transport_curve curve;
        _cleanup_(aqua_closep) aqua_ctx *ctx = NULL;
        int r;

        if (device < 0 || !ret_ctx ||
            (role != AQUA_ROLE_PRODUCER && role != AQUA_ROLE_CONSUMER && role != AQUA_ROLE_NEUTRAL))
                return -EINVAL;
        if (opts) {
                if (opts->size < offsetof(struct aqua_options, size) + sizeof(opts->size))
                        return -EINVAL;
                /* Take what the caller's (possibly older, smaller) struct has. */
                memcpy(&o, opts, MIN(opts->size, sizeof(o)));
                o.size = sizeof(o);
        }
        if (o.timeout_ms < 0)
                return -EINVAL;
        env = getenv("AQUA_ENDPOINT");
        endpoint = o.endpoint ? o.endpoint : env && *env ? env : AQUA_DEFAULT_ENDPOINT;

        ctx = calloc(1, sizeof(*ctx));
        if (!ctx)
                return -ENOMEM;
        ctx->device = device;
        ctx->role = role;
        ctx->ops = role == AQUA_ROLE_PRODUCER   ? &producer_role
                   : role == AQUA_ROLE_CONSUMER ? &consumer_role
                                                : NULL;
        ctx->timeout_ms = o.timeout_ms ? o.timeout_ms : DEFAULT_TIMEOUT_MS;
        ctx->state = SESSION_RETRY;
        ctx->endpoint = strdup(endpoint);
        ctx->client_name = strdup(o.client_name ? o.client_name : program_invocation_short_name);
        if (gethostname(ctx->host, sizeof(ctx->host) - 1) < 0)
                ctx->host[0] = '\0';
        if (!ctx->endpoint || !ctx->client_name)
                return -ENOMEM;
        r = resolve_side_path(o.side_path, endpoint, &ctx->side_path);
        if (r < 0)
                return r;
        r = gpu_open(device, &ctx->gpu);
        if (r < 0)
                return r;
        ctx->fabric = !ctx->side_path;
        if (ctx->fabric && role != AQUA_ROLE_NEUTRAL && !gpu_info(ctx->gpu)->fabric) {
                alog_error("%s has no side channel (no side_path, no $AQUA_SIDE_PATH): lending "
                           "across hosts needs fabric handles, which device %d does not support "
                           "(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED is 0)",
                           endpoint, device);
                return -EOPNOTSUPP;
        }
        ctx->chunk_bytes = ALIGN_UP(o.chunk_bytes ? o.chunk_bytes : DEFAULT_CHUNK_BYTES,
                                    gpu_info(ctx->gpu)->granularity);
        r = resolve_curve(&o, keys, &curve);
        if (r < 0)
                return r;
        r = transport_new(ctx->endpoint, ctx->side_path, &curve, &ctx->t);
        explicit_bzero(keys, sizeof(keys));
        if (r < 0)
                return r;
        r = session_connect(ctx, ctx_deadline(ctx));
        if (r < 0)
                return r;
        *ret_ctx = TAKE_PTR(ctx);
        return 0;
}

/*
 * Tell aquad this context maps nothing any more: a client on tcp:// has no side channel whose EOF
 * says so, and without it its registration (and custody) would outlive it until remote.grace.
 */
static void session_goodbye(aqua_ctx *ctx)
{
        Aqua__Envelope env = AQUA__ENVELOPE__INIT, *reply = NULL;
        Aqua__Goodbye g = AQUA__GOODBYE__INIT;
        uint64_t deadline = now_mono_ns() + MIN((uint64_t)ctx->timeout_ms, 1000) * NSEC_PER_MSEC;

        if (!ctx->t || ctx->state != SESSION_CONNECTED)
                return;
        env.request_id = transport_next_id(ctx->t);
        env.body_case = AQUA__ENVELOPE__BODY_GOODBYE;
        env.goodbye = &g;
        if (transport_call(ctx->t, &env, deadline, &reply) == 0)
                aqua__envelope__free_unpacked(reply, NULL);
        else
                alog_debug("aquad did not answer goodbye; it ends the registration by itself");
}

_public_ aqua_ctx *aqua_close(aqua_ctx *ctx)
{
        if (!ctx)
                return NULL;
        /* Unmap before the side channel closes: the daemon hands chunks back on its EOF. */
        if (ctx->gpu) {
                if (ctx->ops && ctx->ops->free)
                        ctx->ops->free(ctx);
                copies_clear(ctx);
                if (ctx->fabric)
                        session_goodbye(ctx);
        }
        transport_free(ctx->t);
        gpu_free(ctx->gpu);
        free(ctx->endpoint);
        free(ctx->side_path);
        free(ctx->client_name);
        free(ctx->events);
        free(ctx->pending);
        explicit_bzero(ctx->custody_secret, sizeof(ctx->custody_secret));
        free(ctx);
        return NULL;
}

_public_ int aqua_get_info(aqua_ctx *ctx, struct aqua_info *ret)
{
        const struct gpu_info *gi;

        if (!ctx || !ret)
                return -EINVAL;
        gi = gpu_info(ctx->gpu);
        *ret = (struct aqua_info){
            .device = ctx->device,
            .role = ctx->role,
            .capacity = gi->capacity,
            .granularity = gi->granularity,
            .chunk_bytes = ctx->chunk_bytes,
            .client_id = ctx->client_id,
            .connected = ctx->state == SESSION_CONNECTED,
            .dram_budget = ctx->dram_budget,
            .reclaim_deadline_ms = ctx->reclaim_deadline_ms,
        };
        if (ctx->ops && ctx->ops->info)
                ctx->ops->info(ctx, ret);
        snprintf(ret->gpu_uuid, sizeof(ret->gpu_uuid), "%s", gi->uuid);
        snprintf(ret->paired_with, sizeof(ret->paired_with), "%s", ctx->paired_with);
        return 0;
}

_public_ int aqua_device_memory(aqua_ctx *ctx, uint64_t *ret_free, uint64_t *ret_total)
{
        uint64_t free_b, total;
        int r;

        if (!ctx || !ret_free || !ret_total)
                return -EINVAL;
        r = gpu_mem_info(ctx->gpu, &free_b, &total);
        if (r < 0)
                return r;
        *ret_free = free_b;
        *ret_total = total;
        return 0;
}

_public_ int aqua_report_load(aqua_ctx *ctx, const struct aqua_load *load)
{
        Aqua__Envelope env = AQUA__ENVELOPE__INIT;
        Aqua__LoadReport lr = AQUA__LOAD_REPORT__INIT;

        if (!ctx || !load || !(load->load >= 0.0))
                return -EINVAL;
        if (ctx->state != SESSION_CONNECTED)
                return -ENOTCONN;
        lr.load = load->load;
        lr.used_bytes = load->used_bytes;
        lr.free_bytes = load->free_bytes;
        if (ctx->ops && ctx->ops->load)
                ctx->ops->load(ctx, &lr);
        env.body_case = AQUA__ENVELOPE__BODY_LOAD;
        env.load = &lr;
        /* An id, so that the daemon's Ack is recognised and dropped. */
        env.request_id = transport_next_id(ctx->t);
        return transport_send(ctx->t, &env);
}

_public_ int aqua_poll(aqua_ctx *ctx, struct aqua_event *events, size_t n_events, size_t *ret_n)
{
        size_t n;
        int r;

        if (_unlikely_(!ctx || !ret_n || (n_events > 0 && !events)))
                return -EINVAL;
        /* The common case, every engine iteration: nothing arrived, nothing queued. */
        if (_likely_(ctx->ev_n == 0 && ctx->state == SESSION_CONNECTED && transport_idle(ctx->t) &&
                     !(ctx->ops && ctx->ops->busy && ctx->ops->busy(ctx)))) {
                *ret_n = 0;
                return 0;
        }
        transport_timer_fired(ctx->t);
        r = ctx_pump(ctx);
        if (r < 0)
                return r;
        session_step(ctx);
        session_keepalive(ctx);
        if (ctx->state == SESSION_CONNECTED && ctx->ops && ctx->ops->poll_step)
                ctx->ops->poll_step(ctx);
        n = MIN(n_events, ctx->ev_n);
        for (size_t i = 0; i < n; i++)
                events[i] = ctx->events[(ctx->ev_head + i) % ctx->ev_cap];
        if (n > 0) {
                ctx->ev_head = (ctx->ev_head + n) % ctx->ev_cap;
                ctx->ev_n -= n;
        }
        *ret_n = n;
        return 0;
}

_public_ int aqua_fd(aqua_ctx *ctx, int *ret_fd)
{
        if (!ctx || !ret_fd)
                return -EINVAL;
        *ret_fd = transport_fd(ctx->t);
        return 0;
}
