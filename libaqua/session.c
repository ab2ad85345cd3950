/*
 * A context's life with aquad: register, reconnect and re-register after losing it, calls that
 * wait for their reply, and the dispatch of each message to the role that handles it (what
 * aqua_poll() runs); the public calls on a context are ctx.c's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alog.h"
#include "ctx.h"
#include "gpunode.h"
#include "time-util.h"
#include "wire.h"

#define BACKOFF_MIN_MS 20
#define BACKOFF_MAX_MS 1000

extern char *program_invocation_short_name;

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
int session_connect(aqua_ctx *ctx, uint64_t deadline_ns)
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
        if (r == TRANSPORT_E_CLOSED || r == TRANSPORT_E_RECONNECTED) {
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
void session_step(aqua_ctx *ctx)
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
void session_keepalive(aqua_ctx *ctx)
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

/* One request and its reply; *ret_stranger: aquad answered that it does not know this
 * connection (and did nothing with the request), the session is lost. */
static int call_once(aqua_ctx *ctx, Aqua__Envelope *req, uint64_t deadline_ns, bool *ret_stranger,
                     Aqua__Envelope **ret_reply)
{
        Aqua__Envelope *reply = NULL;
        int r;

        r = ctx_ensure_connected(ctx, deadline_ns);
        if (r < 0)
                return r;
        r = transport_call(ctx->t, req, deadline_ns, &reply);
        if (r == TRANSPORT_E_CLOSED) {
                session_lost(ctx, "side channel closed");
                return -ENOTCONN;
        }
        if (r == TRANSPORT_E_RECONNECTED) {
                /* Another aquad of the domain leads: it never saw the request. */
                session_lost(ctx, "another aquad of the domain answers now");
                *ret_stranger = true;
                return -ENOTCONN;
        }
        if (r < 0)
                return r;
        if (reply->body_case != AQUA__ENVELOPE__BODY_ERROR) {
                *ret_reply = reply;
                return 0;
        }
        alog_debug("aquad answered %s with error %d: %s", wire_body_name(req), reply->error->code,
                   reply->error->message ? reply->error->message : "");
        r = error_from_code(reply->error->code);
        if (reply->error->code == AQUA__ERROR_CODE__ERROR_CODE_NOT_REGISTERED) {
                session_lost(ctx, "aquad no longer knows this connection");
                *ret_stranger = true;
        }
        aqua__envelope__free_unpacked(reply, NULL);
        return r == 0 ? -EPROTO : r;
}

int ctx_call(aqua_ctx *ctx, Aqua__Envelope *req, uint64_t deadline_ns, Aqua__Envelope **ret_reply)
{
        /* A connection aquad does not know (over tcp ZeroMQ reconnected after a cut link; over
         * ipc aquad restarted): register again, with what this context holds, and ask once
         * more. */
        for (int attempt = 0;; attempt++) {
                bool stranger = false;
                int r = call_once(ctx, req, deadline_ns, &stranger, ret_reply);

                if (!stranger || attempt > 0)
                        return r;
                req->request_id = 0;
        }
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

        /* aquad does not know this connection: over tcp it ended the registration (silent
         * past remote.grace, or a new connection); over ipc a request sent while aquad
         * restarted reached the new one before this context noticed (ZeroMQ delivers what it
         * queued as soon as it reconnects). Register again with what this context holds. */
        if (e->body_case == AQUA__ENVELOPE__BODY_ERROR &&
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

/*
 * Tell aquad this context maps nothing any more: a client on tcp:// has no side channel whose EOF
 * says so, and without it its registration (and custody) would outlive it until remote.grace.
 */
void session_goodbye(aqua_ctx *ctx)
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
