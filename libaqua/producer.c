/* The producer's side: offer exportable chunks, reclaim them, release what the daemon frees. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "alog.h"
#include "ctx.h"
#include "time-util.h"

/* Chunks per Offer: one side-channel datagram carries all their fds. */
#define OFFER_BATCH 128
/* Scrubbing: bytes zeroed and read back per aqua_poll(), so that an engine's loop never waits
 * long; and the host buffer they are read back through. */
#define SCRUB_BUDGET (UINT64_C(256) << 20)
#define SCRUB_BUF    (4u << 20)

static int check_producer(aqua_ctx *ctx)
{
        if (!ctx)
                return -EINVAL;
        return ctx->role == AQUA_ROLE_PRODUCER ? 0 : -EPERM;
}

/* Offer chunks[0..n): fds first on the side channel, then the Offer; or fabric handles in it. */
static int offer_batch(aqua_ctx *ctx, struct offered_chunk **chunks, size_t n)
{
        Aqua__Envelope env = AQUA__ENVELOPE__INIT, *reply = NULL;
        Aqua__Offer offer = AQUA__OFFER__INIT;
        Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
        Aqua__ChunkOffer items[OFFER_BATCH], *ptrs[OFFER_BATCH];
        uint8_t fabric[OFFER_BATCH][GPU_FABRIC_HANDLE_LEN];
        int fds[OFFER_BATCH];
        size_t n_fds = 0;
        uint64_t deadline = ctx_deadline(ctx);
        int r;

        r = ctx_ensure_connected(ctx, deadline);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++)
                chunks[i]->in_call = true;
        for (size_t i = 0; i < n; i++) {
                aqua__chunk_offer__init(&items[i]);
                items[i].client_ref = chunks[i]->ref;
                items[i].size = chunks[i]->size;
                ptrs[i] = &items[i];
                if (ctx->fabric) {
                        r = gpu_export_fabric(ctx->gpu, chunks[i]->handle, fabric[i]);
                        items[i].fabric_handle =
                            (ProtobufCBinaryData){.len = GPU_FABRIC_HANDLE_LEN, .data = fabric[i]};
                        if (r < 0)
                                goto out;
                        continue;
                }
                r = gpu_export(ctx->gpu, chunks[i]->handle, &fds[i]);
                if (r < 0)
                        goto out;
                n_fds++;
        }
        offer.n_chunks = n;
        offer.chunks = ptrs;
        env.body_case = AQUA__ENVELOPE__BODY_OFFER;
        env.offer = &offer;
        env.request_id = transport_next_id(ctx->t);

        f.kind = AQUA__SIDE_FRAME__KIND__KIND_OFFER_FDS;
        f.request_id = env.request_id;
        r = ctx->fabric ? 0 : transport_side_send(ctx->t, &f, fds, n_fds);
        if (r > 0)
                r = -ENOTCONN;
        if (r < 0)
                goto out;

        r = ctx_call(ctx, &env, deadline, &reply);
        if (r == -ETIMEDOUT) {
                /* The reply may still come; its ids are what the daemon will grant. */
                if (ctx_add_pending(ctx, env.request_id, PENDING_OFFER, chunks[0]->ref) < 0)
                        alog_warning("lost track of an unanswered offer");
                goto out;
        }
        if (r != 0)
                goto out;
        if (reply->body_case != AQUA__ENVELOPE__BODY_OFFER_REPLY ||
            reply->offer_reply->n_chunk_ids != n) {
                r = -EPROTO;
                goto out;
        }
        for (size_t i = 0; i < n; i++) {
                r = offers_set_id(&ctx->producer.offers, chunks[i],
                                  reply->offer_reply->chunk_ids[i]);
                if (r < 0)
                        goto out;
        }
out:
        for (size_t i = 0; i < n; i++)
                chunks[i]->in_call = false;
        side_close_fds(fds, n_fds);
        if (reply)
                aqua__envelope__free_unpacked(reply, NULL);
        return r;
}

_public_ int aqua_offer(aqua_ctx *ctx, uint64_t bytes, uint64_t *ret_offered)
{
        uint64_t n_chunks, offered = 0;
        int r;

        r = check_producer(ctx);
        if (r < 0)
                return r;
        if (bytes == 0)
                return -EINVAL;
        n_chunks = bytes / ctx->chunk_bytes + (bytes % ctx->chunk_bytes != 0);

        while (n_chunks > 0) {
                struct offered_chunk *batch[OFFER_BATCH];
                size_t n = 0, want = MIN(n_chunks, (uint64_t)OFFER_BATCH);
                bool full = false;

                for (; n < want; n++) {
                        r = offers_alloc(&ctx->producer.offers, ctx->gpu, ctx->chunk_bytes,
                                         ctx->fabric, &batch[n]);
                        if (r == -ENOMEM) {
                                full = true;
                                break;
                        }
                        if (r < 0)
                                break;
                }
                if (n == 0 || (r < 0 && !full)) {
                        for (size_t i = 0; i < n; i++)
                                offers_release(&ctx->producer.offers, ctx->gpu, batch[i]);
                        if (offered > 0 && full)
                                break;
                        return r < 0 ? r : -ENOMEM;
                }
                r = offer_batch(ctx, batch, n);
                if (r == -ETIMEDOUT)
                        return r;
                if (r != 0) {
                        for (size_t i = 0; i < n; i++)
                                offers_release(&ctx->producer.offers, ctx->gpu, batch[i]);
                        /* A daemon limit ends an offer that got somewhere; report what did. */
                        if (r == AQUA_LIMIT && offered > 0)
                                break;
                        return r;
                }
                offered += n * ctx->chunk_bytes;
                n_chunks -= n;
                if (full)
                        break;
        }
        if (ret_offered)
                *ret_offered = offered;
        return 0;
}

/* Release the chunks of ids (a ReclaimReply's free ones, or a Reclaimed notice). */
static void release_ids(aqua_ctx *ctx, const uint64_t *ids, size_t n)
{
        struct reclaim_wait *w = &ctx->producer.reclaim;
        uint64_t evented = 0;

        for (size_t i = 0; i < n; i++) {
                struct offered_chunk *c = offers_get(&ctx->producer.offers, ids[i]);

                if (!c)
                        continue;
                if (w->token && c->waiter == w->token) {
                        w->freed += c->size;
                        if (--w->waiting == 0)
                                complete(&w->returned, 0);
                } else
                        evented += c->size;
                offers_release(&ctx->producer.offers, ctx->gpu, c);
        }
        if (evented > 0) {
                struct aqua_event ev = {.type = AQUA_EVENT_RECLAIMED, .bytes = evented};
                ctx_push_event(ctx, &ev);
        }
}

/* Mark pending chunks as reclaiming, waited for by the blocking call `token` (0: none). */
static void mark_pending(aqua_ctx *ctx, const uint64_t *ids, size_t n, uint64_t token)
{
        for (size_t i = 0; i < n; i++) {
                struct offered_chunk *c = offers_get(&ctx->producer.offers, ids[i]);

                if (!c || c->state == OFFER_RECLAIMING)
                        continue;
                c->state = OFFER_RECLAIMING;
                c->waiter = token;
                if (token)
                        ctx->producer.reclaim.waiting++;
        }
}

/* Fill env with a ReclaimRequest for bytes (AQUA_ALL: everything offered). */
static void reclaim_envelope(uint64_t bytes, Aqua__Envelope *env, Aqua__ReclaimRequest *req)
{
        aqua__reclaim_request__init(req);
        req->all = bytes == AQUA_ALL;
        req->bytes = req->all ? 0 : bytes;
        aqua__envelope__init(env);
        env->body_case = AQUA__ENVELOPE__BODY_RECLAIM_REQUEST;
        env->reclaim_request = req;
}

/*
 * A ReclaimReply, to the blocking aqua_reclaim() whose token it carries or to nobody (async, or
 * a blocking call that gave up on it): free what it frees now, mark the rest reclaiming. The
 * chunks a waiting call covers count towards what it frees; the others are reported as events.
 */
static void reclaim_replied(aqua_ctx *ctx, uint64_t token, const Aqua__Envelope *e)
{
        struct reclaim_wait *w = &ctx->producer.reclaim;
        const Aqua__ReclaimReply *rr;
        bool waited = token && token == w->token && !w->replied.done;
        uint64_t covered = 0;

        if (e->body_case != AQUA__ENVELOPE__BODY_RECLAIM_REPLY) {
                int r = e->body_case == AQUA__ENVELOPE__BODY_ERROR ? error_from_code(e->error->code)
                                                                  : -EPROTO;
                if (waited)
                        complete(&w->replied, r == 0 ? -EPROTO : r);
                else
                        alog_warning("aquad refused a reclaim: %s",
                                     e->body_case == AQUA__ENVELOPE__BODY_ERROR && e->error->message
                                         ? e->error->message
                                         : wire_body_name(e));
                return;
        }
        rr = e->reclaim_reply;
        token = waited ? token : 0;
        /* Pending ones first: a Reclaimed notice for them may follow at once. */
        mark_pending(ctx, rr->pending_chunk_ids, rr->n_pending_chunk_ids, token);
        for (size_t i = 0; waited && i < rr->n_pending_chunk_ids; i++) {
                const struct offered_chunk *c =
                    offers_get(&ctx->producer.offers, rr->pending_chunk_ids[i]);
                if (c)
                        covered += c->size;
        }
        for (size_t i = 0; waited && i < rr->n_chunk_ids; i++) {
                struct offered_chunk *c = offers_get(&ctx->producer.offers, rr->chunk_ids[i]);
                if (!c)
                        continue;
                covered += c->size;
                c->waiter = token;
                w->waiting++;
        }
        release_ids(ctx, rr->chunk_ids, rr->n_chunk_ids);
        if (waited) {
                w->covered = covered;
                complete(&w->replied, 0);
        }
}

/* Send a ReclaimRequest whose reply reclaim_replied() takes, for the call `token` (0: none). */
static int reclaim_request(aqua_ctx *ctx, uint64_t bytes, uint64_t token)
{
        Aqua__Envelope env;
        Aqua__ReclaimRequest req;
        struct ctx_pending p;
        int r;

        reclaim_envelope(bytes, &env, &req);
        env.request_id = transport_next_id(ctx->t);
        r = ctx_add_pending(ctx, env.request_id, PENDING_RECLAIM, token);
        if (r < 0)
                return r;
        r = transport_send(ctx->t, &env);
        if (r < 0)
                ctx_take_pending(ctx, env.request_id, &p);
        return r;
}

/* One request of the blocking aqua_reclaim(), and its reply: the bytes it covered. */
static int reclaim_round(aqua_ctx *ctx, uint64_t bytes, uint64_t deadline, uint64_t *ret_covered)
{
        struct reclaim_wait *w = &ctx->producer.reclaim;
        bool again = true;
        int r;

        for (;;) {
                w->replied = (struct completion){0};
                r = ctx_ensure_connected(ctx, deadline);
                if (r == 0)
                        r = reclaim_request(ctx, bytes, w->token);
                /* Its reply comes through the dispatch as every message does. An unanswered
                 * one stays pending: what aquad decided still arrives, as events. */
                if (r == 0)
                        r = ctx_wait(ctx, &w->replied, deadline);
                if (r == 0)
                        r = w->replied.result;
                /* aquad restarted, or over tcp a cut link made this a new client (aquad then
                 * answers NOT_REGISTERED, having done nothing): once registered again, ask
                 * again. A reclaim asked twice takes nothing twice. */
                if (r == -ENOTCONN && again) {
                        again = false;
                        continue;
                }
                if (r == 0)
                        *ret_covered = w->covered;
                return r;
        }
}

_public_ int aqua_reclaim(aqua_ctx *ctx, uint64_t bytes, int timeout_ms, uint64_t *ret_freed)
{
        struct reclaim_wait *w;
        uint64_t wait_until, wanted, covered = 0, freed;
        bool no_reply;
        int r;

        r = check_producer(ctx);
        if (r < 0)
                return r;
        w = &ctx->producer.reclaim;
        if (bytes == 0 || timeout_ms < AQUA_FOREVER || w->token)
                return -EINVAL;
        wait_until = timeout_ms == AQUA_FOREVER
                         ? UINT64_MAX
                         : now_mono_ns() + (uint64_t)timeout_ms * NSEC_PER_MSEC;
        wanted = bytes == AQUA_ALL ? ctx->producer.offers.offered_bytes : bytes;

        /* One blocking reclaim at a time per context; a token of its own, so that the late
         * reply to an earlier one that gave up is not taken for this one's. */
        *w = (struct reclaim_wait){.token = ++ctx->producer.last_token};
        /* A reply names at most the daemon's repeated-items limit of chunks: ask on for more. */
        for (;;) {
                uint64_t got = 0;

                r = reclaim_round(ctx, bytes == AQUA_ALL ? AQUA_ALL : wanted - covered,
                                  MIN(ctx_deadline(ctx), wait_until), &got);
                if (r != 0 || got == 0)
                        break;
                covered += got;
                if (covered >= wanted)
                        break;
        }
        if (r != 0 && covered == 0 && r != -ETIMEDOUT) {
                *w = (struct reclaim_wait){0};
                return r;
        }
        if (r != 0 && covered > 0) {
                alog_debug("reclaim: asking for more failed: %s", aqua_strerror(r));
                r = 0;
        }
        no_reply = r == -ETIMEDOUT;

        /* The rest comes back in Reclaimed notices as consumers return it. An earlier round
         * may have seen none out for a while: the completion counts from now. */
        r = 0;
        if (w->waiting > 0) {
                w->returned = (struct completion){0};
                r = ctx_wait(ctx, &w->returned, wait_until);
        }
        if (r == -ETIMEDOUT || r == -ENOTCONN)
                r = 0;
        freed = w->freed;
        if (w->waiting > 0 || no_reply) {
                /* Whatever is still out is reported by aqua_poll() when it comes. */
                for (size_t i = 0; i < ctx->producer.offers.n; i++)
                        if (ctx->producer.offers.chunks[i]->waiter == w->token)
                                ctx->producer.offers.chunks[i]->waiter = 0;
                if (r >= 0)
                        r = ctx->state != SESSION_CONNECTED ? -ENOTCONN
                            : now_mono_ns() >= wait_until   ? AQUA_TIMEOUT
                                                            : -ETIMEDOUT; /* no answer in time */
        }
        *w = (struct reclaim_wait){0};
        if (r >= 0 && ret_freed)
                *ret_freed = freed;
        return r;
}

_public_ int aqua_reclaim_async(aqua_ctx *ctx, uint64_t bytes)
{
        int r;

        r = check_producer(ctx);
        if (r < 0)
                return r;
        if (bytes == 0)
                return -EINVAL;
        if (ctx->state != SESSION_CONNECTED)
                return -ENOTCONN;
        r = reclaim_request(ctx, bytes, 0);
        return r < 0 ? r : AQUA_PENDING;
}

static void scrub_queue(aqua_ctx *ctx, const uint64_t *ids, size_t n)
{
        if (ctx->producer.scrub_n + n > ctx->producer.scrub_cap) {
                size_t cap = MAX(ctx->producer.scrub_cap * 2, ctx->producer.scrub_n + n);
                uint64_t *a = reallocarray(ctx->producer.scrub_ids, cap, sizeof(*a));
                if (!a) {
                        /* The chunks stay unusable for others until aquad asks again (after a
                         * restart); nothing is exposed. */
                        alog_error("out of memory queueing %zu chunks to scrub", n);
                        return;
                }
                ctx->producer.scrub_ids = a;
                ctx->producer.scrub_cap = cap;
        }
        memcpy(ctx->producer.scrub_ids + ctx->producer.scrub_n, ids, n * sizeof(*ids));
        ctx->producer.scrub_n += n;
}

static void producer_scrub_step(aqua_ctx *ctx)
{
        Aqua__Envelope env = AQUA__ENVELOPE__INIT;
        Aqua__ScrubDone done = AQUA__SCRUB_DONE__INIT;
        _cleanup_free_ uint64_t *ok = NULL, *failed = NULL;
        uint64_t spent = 0;
        size_t taken = 0;
        int r;

        if (ctx->producer.scrub_n == 0)
                return;
        if (!ctx->producer.scrub_buf &&
            gpu_host_alloc(ctx->gpu, SCRUB_BUF, &ctx->producer.scrub_buf) < 0) {
                alog_warning("scrub: no host buffer to verify chunks; trying again later");
                return;
        }
        ok = calloc(ctx->producer.scrub_n, sizeof(*ok));
        failed = calloc(ctx->producer.scrub_n, sizeof(*failed));
        if (!ok || !failed)
                return;
        for (; taken < ctx->producer.scrub_n && spent < SCRUB_BUDGET; taken++) {
                struct offered_chunk *c =
                    offers_get(&ctx->producer.offers, ctx->producer.scrub_ids[taken]);

                /* Released meanwhile (a reclaim): nothing left to scrub or to report. */
                if (!c)
                        continue;
                r = gpu_scrub(ctx->gpu, c->handle, c->size, ctx->producer.scrub_buf, SCRUB_BUF);
                if (r == 0)
                        ok[done.n_chunk_ids++] = c->id;
                else {
                        alog_warning("scrub: chunk %" PRIu64 " %s", c->id,
                                     r > 0 ? "did not read back as zero" : aqua_strerror(r));
                        failed[done.n_failed_chunk_ids++] = c->id;
                }
                spent += c->size;
        }
        memmove(ctx->producer.scrub_ids, ctx->producer.scrub_ids + taken,
                (ctx->producer.scrub_n - taken) * sizeof(*ctx->producer.scrub_ids));
        ctx->producer.scrub_n -= taken;
        if (done.n_chunk_ids + done.n_failed_chunk_ids == 0)
                return;
        done.chunk_ids = ok;
        done.failed_chunk_ids = failed;
        env.body_case = AQUA__ENVELOPE__BODY_SCRUB_DONE;
        env.scrub_done = &done;
        /* An id, so that the daemon's Ack is recognised and dropped. A ScrubDone lost with the
         * connection costs nothing: a restarted aquad asks again for every dirty chunk. */
        env.request_id = transport_next_id(ctx->t);
        r = transport_send(ctx->t, &env);
        if (r < 0)
                alog_debug("scrub: could not report %zu chunks: %s",
                           done.n_chunk_ids + done.n_failed_chunk_ids, aqua_strerror(r));
}

static void producer_free(aqua_ctx *ctx)
{
        offers_clear(&ctx->producer.offers, ctx->gpu);
        if (ctx->producer.scrub_buf)
                gpu_host_free(ctx->gpu, ctx->producer.scrub_buf);
        ctx->producer.scrub_buf = NULL;
        free(ctx->producer.scrub_ids);
        ctx->producer.scrub_ids = NULL;
        ctx->producer.scrub_n = ctx->producer.scrub_cap = 0;
}

static int producer_dispatch(aqua_ctx *ctx, Aqua__Envelope *e, bool *ret_handled)
{
        switch (e->body_case) {
        case AQUA__ENVELOPE__BODY_SCRUB_REQUEST:
                /* Read after the session was lost, it is a gone daemon's: a restarted one asks
                 * again for every dirty chunk (producer_session_lost() says why not to do it). */
                if (ctx->state != SESSION_CONNECTED) {
                        alog_debug("ignored a scrub request of %zu chunks from a lost session",
                                   e->scrub_request->n_chunk_ids);
                        break;
                }
                /* Done in bounded steps from aqua_poll(); a first step right away. */
                scrub_queue(ctx, e->scrub_request->chunk_ids, e->scrub_request->n_chunk_ids);
                producer_scrub_step(ctx);
                break;
        case AQUA__ENVELOPE__BODY_RECLAIMED:
                release_ids(ctx, e->reclaimed->chunk_ids, e->reclaimed->n_chunk_ids);
                break;
        default:
                *ret_handled = false;
                return 0;
        }
        *ret_handled = true;
        return 0;
}

static int producer_held(aqua_ctx *ctx, struct held *ret)
{
        struct held h = {0};
        size_t n = 0;
        int r;

        for (size_t i = 0; i < ctx->producer.offers.n; i++)
                n += ctx->producer.offers.chunks[i]->id != 0;
        if (n == 0) {
                *ret = h;
                return 0;
        }
        h.items = calloc(n, sizeof(*h.items));
        h.ptrs = calloc(n, sizeof(*h.ptrs));
        h.ids = calloc(n, sizeof(*h.ids));
        if (ctx->fabric)
                h.fabric = malloc(n * sizeof(*h.fabric));
        else
                h.fds = malloc(n * sizeof(*h.fds));
        if (!h.items || !h.ptrs || !h.ids || (!h.fds && !h.fabric)) {
                held_clear(&h);
                return -ENOMEM;
        }
        for (size_t i = 0; i < ctx->producer.offers.n; i++) {
                const struct offered_chunk *c = ctx->producer.offers.chunks[i];
                Aqua__HeldChunk *hc = &h.items[h.n];

                if (c->id == 0)
                        continue;
                r = h.fabric ? gpu_export_fabric(ctx->gpu, c->handle, h.fabric[h.n])
                             : gpu_export(ctx->gpu, c->handle, &h.fds[h.n]);
                if (r < 0) {
                        held_clear(&h);
                        return r;
                }
                aqua__held_chunk__init(hc);
                if (h.fabric)
                        hc->fabric_handle = (ProtobufCBinaryData){.len = GPU_FABRIC_HANDLE_LEN,
                                                                  .data = h.fabric[h.n]};
                hc->chunk_id = c->id;
                hc->size = c->size;
                h.ids[h.n] = c->id;
                h.ptrs[h.n++] = hc;
        }
        *ret = h;
        return 0;
}

static void producer_session_lost(aqua_ctx *ctx)
{
        /*
         * Scrubs not done yet were the lost daemon's requests. A restarted one asks again for
         * every chunk still dirty; doing the old requests' work after it would first answer the
         * new requests for those chunks (so the daemon grants them as clean) and then, when the
         * new requests' turn comes, zero them again under the consumer they were granted to.
         */
        ctx->producer.scrub_n = 0;
        /* Chunks whose offer was never answered: no daemon will ever know them. Those of an
         * offer still in its call are the caller's to release. */
        for (size_t i = ctx->producer.offers.n; i-- > 0;)
                if (ctx->producer.offers.chunks[i]->state == OFFER_OFFERING &&
                    !ctx->producer.offers.chunks[i]->in_call)
                        offers_release(&ctx->producer.offers, ctx->gpu,
                                       ctx->producer.offers.chunks[i]);
}

static void producer_late_offer(aqua_ctx *ctx, uint64_t first_ref, Aqua__Envelope *e)
{
        bool ok = e->body_case == AQUA__ENVELOPE__BODY_OFFER_REPLY;

        for (size_t i = ctx->producer.offers.n; i-- > 0;) {
                struct offered_chunk *c = ctx->producer.offers.chunks[i];
                uint64_t k = c->ref - first_ref;

                if (c->state != OFFER_OFFERING || c->ref < first_ref || k >= OFFER_BATCH)
                        continue;
                if (ok && k < e->offer_reply->n_chunk_ids &&
                    offers_set_id(&ctx->producer.offers, c, e->offer_reply->chunk_ids[k]) == 0)
                        continue;
                offers_release(&ctx->producer.offers, ctx->gpu, c);
        }
}

static void producer_reply(aqua_ctx *ctx, const struct ctx_pending *p, Aqua__Envelope *e)
{
        if (p->kind == PENDING_OFFER)
                producer_late_offer(ctx, p->arg, e);
        else if (p->kind == PENDING_RECLAIM)
                reclaim_replied(ctx, p->arg, e);
}

static void producer_info(const aqua_ctx *ctx, struct aqua_info *ret)
{
        ret->offered_bytes = ctx->producer.offers.offered_bytes;
}

static bool producer_busy(const aqua_ctx *ctx)
{
        return ctx->producer.scrub_n > 0;
}

const struct role_ops producer_role = {
    .held = producer_held,
    .dispatch = producer_dispatch,
    .reply = producer_reply,
    .session_lost = producer_session_lost,
    .info = producer_info,
    .busy = producer_busy,
    .poll_step = producer_scrub_step,
    .free = producer_free,
};
