/* The consumer's side: borrow and map chunks, honour reclaim notices, return leases. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "alog.h"
#include "ctx.h"
#include "tensor.h"
#include "time-util.h"

static int check_consumer(aqua_ctx *ctx)
{
        if (!ctx)
                return -EINVAL;
        return ctx->role == AQUA_ROLE_CONSUMER ? 0 : -EPERM;
}

/*
 * Tell the daemon we are done with chunk_ids of lease_id (all of it when n == 0), no waiting;
 * unusable: chunks of it that could not be imported, for the daemon to drop.
 */
static int return_async(aqua_ctx *ctx, uint64_t lease_id, uint64_t *chunk_ids, size_t n,
                        uint64_t dram_bytes, uint64_t *unusable, size_t n_unusable)
{
        Aqua__Envelope env = AQUA__ENVELOPE__INIT;
        Aqua__Return ret = AQUA__RETURN__INIT;
        int r;

        if (ctx->state != SESSION_CONNECTED)
                return -ENOTCONN;
        ret.lease_id = lease_id;
        ret.n_chunk_ids = n;
        ret.chunk_ids = chunk_ids;
        ret.dram_bytes = dram_bytes;
        ret.unusable_chunk_ids = unusable;
        ret.n_unusable_chunk_ids = n_unusable;
        env.body_case = AQUA__ENVELOPE__BODY_RETURN;
        env.return_ = &ret;
        env.request_id = transport_next_id(ctx->t);
        r = transport_send(ctx->t, &env);
        if (r < 0)
                return r;
        return ctx_add_pending(ctx, env.request_id, PENDING_RETURN, 0);
}

/*
 * Collect the fds of a grant from its GRANT_FDS frames, in the order of g->chunks. A frame that
 * names its chunks may come in any order; one that does not fills the next places.
 */
static int grant_fds(aqua_ctx *ctx, const Aqua__Grant *g, uint64_t deadline, int *fds)
{
        size_t got = 0;

        while (got < g->n_chunks) {
                struct side_msg *m = NULL;
                const Aqua__SideFrame *f;
                int r;

                r = transport_side_take(ctx->t, AQUA__SIDE_FRAME__KIND__KIND_GRANT_FDS, g->lease_id,
                                        deadline, &m);
                if (r > 0)
                        return -ENOTCONN;
                if (r < 0)
                        return r;
                f = m->frame;
                if (got + m->n_fds > g->n_chunks ||
                    (f->n_chunk_ids != 0 && f->n_chunk_ids != m->n_fds)) {
                        side_msg_free(m);
                        return -EPROTO;
                }
                for (size_t i = 0; i < m->n_fds; i++) {
                        size_t at = got + i;

                        if (f->n_chunk_ids && g->chunks[at]->chunk_id != f->chunk_ids[i]) {
                                for (at = 0; at < g->n_chunks; at++)
                                        if (g->chunks[at]->chunk_id == f->chunk_ids[i] &&
                                            fds[at] < 0)
                                                break;
                                if (at == g->n_chunks) {
                                        side_msg_free(m);
                                        return -EPROTO;
                                }
                        }
                        if (fds[at] >= 0) {
                                side_msg_free(m);
                                return -EPROTO;
                        }
                        fds[at] = m->fds[i];
                        m->fds[i] = -1;
                }
                got += m->n_fds;
                side_msg_free(m);
        }
        return 0;
}

/*
 * Import and map g's chunks into a lease. On failure the grant goes back to the daemon, naming
 * the chunks whose descriptors could not be imported (their number in *ret_unusable) so that
 * they are not granted again.
 */
static int grant_map(aqua_ctx *ctx, const Aqua__Grant *g, uint64_t deadline, bool tensor_pool,
                     aqua_lease **ret_lease, size_t *ret_unusable)
{
        _cleanup_free_ struct lease_grant_chunk *chunks = NULL;
        _cleanup_free_ uint64_t *unusable = NULL;
        _cleanup_free_ int *fds = NULL;
        size_t n_unusable = 0;
        int r;

        *ret_unusable = 0;
        chunks = calloc(g->n_chunks, sizeof(*chunks));
        fds = malloc(g->n_chunks * sizeof(*fds));
        unusable = malloc(g->n_chunks * sizeof(*unusable));
        if (!chunks || !fds || !unusable) {
                return_async(ctx, g->lease_id, NULL, 0, g->dram_bytes, NULL, 0);
                return -ENOMEM;
        }
        for (size_t i = 0; i < g->n_chunks; i++)
                fds[i] = -1;
        /* A consumer on another host finds fabric handles in the grant itself. */
        r = ctx->fabric ? 0 : grant_fds(ctx, g, deadline, fds);
        if (r == 0) {
                for (size_t i = 0; i < g->n_chunks; i++) {
                        const ProtobufCBinaryData *f = &g->chunks[i]->fabric_handle;

                        chunks[i] = (struct lease_grant_chunk){
                            .id = g->chunks[i]->chunk_id,
                            .size = g->chunks[i]->size,
                            .fd = fds[i],
                            .fabric =
                                ctx->fabric && f->len == GPU_FABRIC_HANDLE_LEN ? f->data : NULL};
                }
                r = lease_create(&ctx->consumer.leases, ctx->gpu, g->lease_id, chunks, g->n_chunks,
                                 tensor_pool, ret_lease);
        }
        side_close_fds(fds, g->n_chunks);
        if (r == 0)
                return 0;
        for (size_t i = 0; i < g->n_chunks; i++)
                if (chunks[i].unusable)
                        unusable[n_unusable++] = chunks[i].id;
        alog_error("could not map lease %" PRIu64 " of %zu chunks (%zu could not be imported): %s",
                   g->lease_id, g->n_chunks, n_unusable, aqua_strerror(r));
        return_async(ctx, g->lease_id, NULL, 0, g->dram_bytes, unusable, n_unusable);
        *ret_unusable = n_unusable;
        return r;
}

/* One Borrow and the mapping of its grant; *ret_unusable as grant_map() says. */
static int borrow_once(aqua_ctx *ctx, uint64_t bytes, uint64_t min_bytes, unsigned flags,
                       uint64_t deadline, struct aqua_grant *ret, size_t *ret_unusable)
{
        Aqua__Envelope env = AQUA__ENVELOPE__INIT, *reply = NULL;
        Aqua__Borrow b = AQUA__BORROW__INIT;
        const Aqua__Grant *g;
        aqua_lease *lease = NULL;
        int r;

        *ret_unusable = 0;
        b.bytes = bytes;
        b.min_bytes = min_bytes;
        b.allow_dram = flags & AQUA_BORROW_ALLOW_DRAM;
        env.body_case = AQUA__ENVELOPE__BODY_BORROW;
        env.borrow = &b;
        r = ctx_call(ctx, &env, deadline, &reply);
        if (r == -ETIMEDOUT && env.request_id)
                /* A grant arriving later would be a lease nobody uses: give it back then. */
                ctx_add_pending(ctx, env.request_id, PENDING_BORROW, 0);
        if (r > 0)
                /* Fds the daemon sent before deciding to refuse are ours to close. */
                transport_side_drop(ctx->t, AQUA__SIDE_FRAME__KIND__KIND_GRANT_FDS);
        if (r != 0)
                return r;
        if (reply->body_case != AQUA__ENVELOPE__BODY_GRANT) {
                aqua__envelope__free_unpacked(reply, NULL);
                return -EPROTO;
        }
        g = reply->grant;
        if (g->n_chunks > 0) {
                r = grant_map(ctx, g, deadline, flags & AQUA_BORROW_TENSORS, &lease, ret_unusable);
                if (r < 0) {
                        aqua__envelope__free_unpacked(reply, NULL);
                        return r == -ENOTCONN || r == -ETIMEDOUT || r == -ENOMEM ? r : -EIO;
                }
        }
        ctx->consumer.dram_granted += g->dram_bytes;
        *ret = (struct aqua_grant){
            .lease = lease,
            .dptr = lease && !lease->tensor_pool ? lease->dptr : 0,
            .bytes = lease ? lease->size : 0,
            .dram_bytes = g->dram_bytes,
            .partial = g->partial,
        };
        aqua__envelope__free_unpacked(reply, NULL);
        return 0;
}

/* Each retry follows a grant with chunks the daemon has since dropped, so it cannot loop. */
#define BORROW_RETRIES 3

_public_ int aqua_borrow(aqua_ctx *ctx, uint64_t bytes, uint64_t min_bytes, unsigned flags,
                         struct aqua_grant *ret)
{
        uint64_t deadline;
        size_t unusable;
        int r;

        r = check_consumer(ctx);
        if (r < 0)
                return r;
        if (!ret || bytes == 0 || min_bytes > bytes ||
            (flags & ~(AQUA_BORROW_ALLOW_DRAM | AQUA_BORROW_TENSORS)))
                return -EINVAL;
        deadline = ctx_deadline(ctx);
        for (int i = 0;; i++) {
                r = borrow_once(ctx, bytes, min_bytes, flags, deadline, ret, &unusable);
                /* The Return that names them goes out before the next Borrow, so the daemon
                 * has dropped them by the time it answers that. */
                if (r != -EIO || unusable == 0 || i == BORROW_RETRIES)
                        return r;
                alog_warning("%zu granted chunks could not be imported; aquad drops them, "
                             "borrowing again",
                             unusable);
        }
}

_public_ int aqua_return(aqua_ctx *ctx, aqua_lease *lease)
{
        Aqua__Envelope env = AQUA__ENVELOPE__INIT, *reply = NULL;
        Aqua__Return ret = AQUA__RETURN__INIT;
        _cleanup_free_ uint64_t *ids = NULL;
        uint64_t lease_id;
        size_t n = 0;
        int r;

        r = check_consumer(ctx);
        if (r < 0)
                return r;
        if (!lease_valid(&ctx->consumer.leases, lease))
                return -EINVAL;
        if (lease_in_use(lease))
                return -EBUSY;
        /* Chunks already moved to DRAM were returned when that happened. */
        ids = malloc(lease->n_chunks * sizeof(*ids));
        if (!ids)
                return -ENOMEM;
        for (size_t i = 0; i < lease->n_chunks; i++)
                if (lease->chunks[i].tier == AQUA_TIER_PEER)
                        ids[n++] = lease->chunks[i].id;
        lease_id = lease->id;
        /*
         * A batch still copying into or out of the lease must finish before its memory is
         * unmapped: on a GPU the copy would fault and take the context with it. A batch that
         * failed does not keep the lease.
         */
        copies_wait_all(ctx);
        /* Unmapped first: the daemon may hand the memory back to its producer at once. */
        ctx_forget_lease_events(ctx, lease);
        lease_table_remove(&ctx->consumer.leases, ctx->gpu, lease);
        if (n == 0)
                return 0;

        ret.lease_id = lease_id;
        ret.n_chunk_ids = n;
        ret.chunk_ids = ids;
        env.body_case = AQUA__ENVELOPE__BODY_RETURN;
        env.return_ = &ret;
        r = ctx_call(ctx, &env, ctx_deadline(ctx), &reply);
        if (r == -ETIMEDOUT && env.request_id)
                ctx_add_pending(ctx, env.request_id, PENDING_RETURN, 0);
        if (r != 0)
                return r;
        aqua__envelope__free_unpacked(reply, NULL);
        return 0;
}

_public_ int aqua_return_dram(aqua_ctx *ctx, uint64_t bytes)
{
        Aqua__Envelope env = AQUA__ENVELOPE__INIT, *reply = NULL;
        Aqua__Return ret = AQUA__RETURN__INIT;
        int r;

        r = check_consumer(ctx);
        if (r < 0)
                return r;
        if (bytes == 0 || bytes > ctx->consumer.dram_granted)
                return -EINVAL;
        ret.dram_bytes = bytes;
        env.body_case = AQUA__ENVELOPE__BODY_RETURN;
        env.return_ = &ret;
        r = ctx_call(ctx, &env, ctx_deadline(ctx), &reply);
        if (r != 0)
                return r;
        ctx->consumer.dram_granted -= bytes;
        aqua__envelope__free_unpacked(reply, NULL);
        return 0;
}

_public_ int aqua_lease_get_info(aqua_ctx *ctx, const aqua_lease *lease,
                                 struct aqua_lease_info *ret)
{
        if (!ctx || !ret || !lease_valid(&ctx->consumer.leases, lease))
                return -EINVAL;
        *ret = (struct aqua_lease_info){
            .lease_id = lease->id,
            .dptr = lease->dptr,
            .bytes = lease->size,
            .peer_bytes = lease->peer_bytes,
            .dram_bytes = lease->dram_bytes,
            .n_chunks = lease->n_chunks,
            .chunk_bytes = lease->n_chunks ? lease->chunks[0].size : 0,
        };
        return 0;
}

_public_ int aqua_lease_get_chunk(aqua_ctx *ctx, const aqua_lease *lease, size_t index,
                                  struct aqua_chunk_info *ret)
{
        const struct lease_chunk *c;

        if (!ctx || !ret || !lease_valid(&ctx->consumer.leases, lease))
                return -EINVAL;
        if (index >= lease->n_chunks)
                return -ERANGE;
        c = &lease->chunks[index];
        *ret = (struct aqua_chunk_info){
            .chunk_id = c->id,
            .offset = c->offset,
            .bytes = c->size,
            .tier = c->tier,
            .host = c->host,
        };
        return 0;
}

/* ---------------------------------------------------------------- notices */

/* Report a moved run, merging it into *run when it continues it. */
static void report_run(aqua_ctx *ctx, struct aqua_event *run, const struct aqua_event *ev)
{
        if (run->bytes && run->type == ev->type && run->lease == ev->lease &&
            run->tensor == ev->tensor && run->tier == ev->tier && !run->host && !ev->host &&
            run->offset + run->bytes == ev->offset) {
                run->bytes += ev->bytes;
                return;
        }
        if (run->bytes)
                ctx_push_event(ctx, run);
        *run = *ev;
}

/*
 * The two kinds of lease differ only here: where a chunk's data lives (a plain lease's range, or
 * the tensor a tensor-pool chunk backs) and what the engine hears once it moved.
 */
static void chunk_move_prepare(aqua_lease *l, struct lease_chunk *c, struct move *ret)
{
        if (l->tensor_pool)
                tensor_move_prepare(c->user, c->user_index, ret);
        else
                lease_move_prepare(l, c, ret);
}

static void chunk_moved(aqua_ctx *ctx, aqua_lease *l, struct lease_chunk *c, struct move *m,
                        struct aqua_event *ret)
{
        aqua_tensor *t = c->user;
        size_t idx = c->user_index;

        if (!l->tensor_pool) {
                lease_moved(&ctx->consumer.leases, ctx->gpu, l, c, m);
                ret->type = AQUA_EVENT_MIGRATED;
                ret->tier = AQUA_TIER_DRAM;
                return;
        }
        tensor_moved(ctx, t, idx, m);
        lease_chunk_give_back(&ctx->consumer.leases, ctx->gpu, l, c);
        *ret = (struct aqua_event){.type = AQUA_EVENT_TENSOR_MIGRATED,
                                   .tensor = t,
                                   .offset = (uint64_t)idx * t->chunk_bytes,
                                   .bytes = t->chunk_bytes,
                                   .tier = m->tier,
                                   .host = m->host};
}

/*
 * Move the listed chunks of l off their producer, all in one batch: a plain lease's chunks to
 * DRAM at the lease's addresses, a pool lease's chunks that back tensors to DRAM (or local
 * memory) at the tensors' addresses; free pool chunks need no copy. Collect the chunks that may
 * go back in done, report what moved as events.
 */
static size_t migrate_chunks(aqua_ctx *ctx, aqua_lease *l, const uint64_t *chunk_ids, size_t n,
                             uint64_t *done)
{
        _cleanup_free_ struct move *moves = calloc(n ? n : 1, sizeof(*moves));
        _cleanup_free_ struct lease_chunk **movers = calloc(n ? n : 1, sizeof(*movers));
        struct aqua_event run = {0};
        size_t n_done = 0, n_moves = 0;
        int r = 0;

        if (!moves || !movers)
                r = -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                struct lease_chunk *c = lease_chunk_by_id(&ctx->consumer.leases, chunk_ids[i]);

                if (!c || c < l->chunks || c >= l->chunks + l->n_chunks ||
                    c->tier != AQUA_TIER_PEER) {
                        /* Not ours (any more), or moved already: nothing maps it here. */
                        done[n_done++] = chunk_ids[i];
                        continue;
                }
                if (l->tensor_pool && !c->user) {
                        lease_chunk_give_back(&ctx->consumer.leases, ctx->gpu, l, c);
                        done[n_done++] = chunk_ids[i];
                        continue;
                }
                if (r < 0)
                        continue;
                chunk_move_prepare(l, c, &moves[n_moves]);
                movers[n_moves++] = c;
        }
        /* A batch still reading or writing this memory must finish before it moves. */
        if (n_moves && r == 0)
                r = copies_wait_all(ctx);
        if (n_moves && r == 0)
                r = move_out(ctx->gpu, moves, n_moves, &ctx->consumer.leases.no_host_map);
        for (size_t k = 0; k < n_moves; k++) {
                struct lease_chunk *c = movers[k];
                struct move *m = &moves[k];
                struct aqua_event ev = {.lease = l, .offset = c->offset, .bytes = c->size};

                if (r < 0 || m->error < 0) {
                        ev.type = AQUA_EVENT_RECLAIM_FAILED;
                        ev.error = r < 0 ? r : m->error;
                        ev.tensor = c->user;
                        alog_error("lease %" PRIu64 ": could not move chunk %" PRIu64
                                   " off its producer: %s",
                                   l->id, c->id, aqua_strerror(ev.error));
                        ctx_push_event(ctx, &ev);
                        continue;
                }
                ctx->consumer.migrations++;
                ctx->consumer.bytes_moved += c->size;
                chunk_moved(ctx, l, c, m, &ev);
                report_run(ctx, &run, &ev);
                done[n_done++] = c->id;
        }
        if (run.bytes)
                ctx_push_event(ctx, &run);
        return n_done;
}

static int consumer_reclaim_notice(aqua_ctx *ctx, const Aqua__ReclaimNotice *rn)
{
        _cleanup_free_ uint64_t *all = NULL, *done = NULL;
        aqua_lease *l = lease_get(&ctx->consumer.leases, rn->lease_id);
        const uint64_t *ids = rn->chunk_ids;
        size_t n = rn->n_chunk_ids;

        alog_info("lease %" PRIu64 ": reclaim of %zu chunks (%s), deadline %" PRIu64 " ms",
                  rn->lease_id, n, rn->reason ? rn->reason : "", rn->deadline_ms);
        if (!l)
                /* Returned already, or never mapped: the daemon may take it all back. */
                return return_async(ctx, rn->lease_id, rn->chunk_ids, n, 0, NULL, 0);
        if (n == 0) {
                /* The whole lease. */
                all = malloc(l->n_chunks * sizeof(*all));
                if (!all)
                        return -ENOMEM;
                for (size_t i = 0; i < l->n_chunks; i++)
                        all[i] = l->chunks[i].id;
                ids = all;
                n = l->n_chunks;
        }
        done = malloc(n * sizeof(*done));
        if (!done)
                return -ENOMEM;
        n = migrate_chunks(ctx, l, ids, n, done);
        if (n == 0)
                return 0;
        return return_async(ctx, rn->lease_id, done, n, 0, NULL, 0);
}

static int consumer_dispatch(aqua_ctx *ctx, Aqua__Envelope *e, bool *ret_handled)
{
        *ret_handled = e->body_case == AQUA__ENVELOPE__BODY_RECLAIM_NOTICE;
        if (!*ret_handled)
                return 0;
        return consumer_reclaim_notice(ctx, e->reclaim_notice);
}

static void consumer_late_grant(aqua_ctx *ctx, Aqua__Envelope *e)
{
        const Aqua__Grant *g = e->grant;
        struct side_msg *m = NULL;

        /* Its fds are of no use: close them as they come. */
        while (g->lease_id && transport_side_take(ctx->t, AQUA__SIDE_FRAME__KIND__KIND_GRANT_FDS,
                                                  g->lease_id, 0, &m) == 0)
                side_msg_free(m);
        if (g->lease_id || g->dram_bytes)
                return_async(ctx, g->lease_id, NULL, 0, g->dram_bytes, NULL, 0);
}

static int consumer_held(aqua_ctx *ctx, struct held *ret)
{
        struct held h = {0};
        size_t n = 0;

        for (aqua_lease *l = ctx->consumer.leases.head; l; l = l->next)
                for (size_t i = 0; i < l->n_chunks; i++)
                        n += l->chunks[i].tier == AQUA_TIER_PEER;
        if (n == 0) {
                *ret = h;
                return 0;
        }
        h.items = calloc(n, sizeof(*h.items));
        h.ptrs = calloc(n, sizeof(*h.ptrs));
        if (!h.items || !h.ptrs) {
                held_clear(&h);
                return -ENOMEM;
        }
        for (aqua_lease *l = ctx->consumer.leases.head; l; l = l->next)
                for (size_t i = 0; i < l->n_chunks; i++) {
                        Aqua__HeldChunk *hc = &h.items[h.n];

                        if (l->chunks[i].tier != AQUA_TIER_PEER)
                                continue;
                        aqua__held_chunk__init(hc);
                        hc->chunk_id = l->chunks[i].id;
                        hc->size = l->chunks[i].size;
                        hc->lease_id = l->id;
                        h.ptrs[h.n++] = hc;
                }
        *ret = h;
        return 0;
}

static void consumer_lease_lost(aqua_ctx *ctx, uint64_t lease_id)
{
        aqua_lease *l = lease_get(&ctx->consumer.leases, lease_id);
        struct aqua_event ev = {.type = AQUA_EVENT_LEASE_LOST, .lease = l};
        _cleanup_free_ uint64_t *ids = NULL, *done = NULL;
        size_t n = 0;

        if (!l)
                return;
        alog_warning("aquad lost lease %" PRIu64 "; moving its data to host memory", lease_id);
        ids = malloc(l->n_chunks * sizeof(*ids));
        done = malloc(l->n_chunks * sizeof(*done));
        if (ids && done) {
                for (size_t i = 0; i < l->n_chunks; i++)
                        if (l->chunks[i].tier == AQUA_TIER_PEER)
                                ids[n++] = l->chunks[i].id;
                migrate_chunks(ctx, l, ids, n, done);
        }
        ctx_push_event(ctx, &ev);
}

static void consumer_reply(aqua_ctx *ctx, const struct ctx_pending *p, Aqua__Envelope *e)
{
        if (p->kind == PENDING_BORROW && e->body_case == AQUA__ENVELOPE__BODY_GRANT)
                consumer_late_grant(ctx, e);
}

static void consumer_info(const aqua_ctx *ctx, struct aqua_info *ret)
{
        const struct consumer_state *c = &ctx->consumer;

        ret->borrowed_bytes = c->leases.peer_bytes;
        ret->dram_bytes = c->leases.dram_bytes;
        ret->tensor_peer_bytes = c->tensor_bytes[AQUA_TIER_PEER];
        ret->tensor_local_bytes = c->tensor_bytes[AQUA_TIER_LOCAL];
        ret->tensor_dram_bytes = c->tensor_bytes[AQUA_TIER_DRAM];
        ret->pool_free_bytes = c->leases.pool_free_bytes;
        ret->dram_granted = c->dram_granted;
}

static void consumer_load(const aqua_ctx *ctx, Aqua__LoadReport *lr)
{
        lr->migrations = ctx->consumer.migrations;
        lr->bytes_moved = ctx->consumer.bytes_moved;
        lr->dram_bytes = ctx->consumer.leases.dram_bytes;
}

static const char *tier_name(enum aqua_tier t)
{
        switch (t) {
        case AQUA_TIER_PEER:
                return "peer memory";
        case AQUA_TIER_DRAM:
                return "DRAM";
        case AQUA_TIER_LOCAL:
                return "local memory";
        default:
                return "not mapped";
        }
}

/* Where addr lies, in the caller's terms: a tensor's offset and tier, or a lease; false: in
 * neither (copy.c's reports of failed copies). */
static bool consumer_describe(const aqua_ctx *ctx, uint64_t addr, char *buf, size_t len)
{
        for (const struct aqua_tensor *t = ctx->consumer.tensors; t; t = t->next)
                if (addr >= t->dptr && addr - t->dptr < t->max_bytes) {
                        const struct tensor_chunk *c =
                            &t->chunks[(addr - t->dptr) / t->chunk_bytes];
                        int k = snprintf(buf, len,
                                         "the tensor at 0x%" PRIx64 ", offset %" PRIu64 " (%s",
                                         t->dptr, addr - t->dptr, tier_name(c->tier));
                        if (c->lease && k >= 0 && (size_t)k < len)
                                k += snprintf(buf + k, len - k, " of lease %" PRIu64, c->lease->id);
                        if (k >= 0 && (size_t)k < len)
                                snprintf(buf + k, len - k, ")");
                        return true;
                }
        for (const struct aqua_lease *l = ctx->consumer.leases.head; l; l = l->next)
                if (!l->tensor_pool && addr >= l->dptr && addr - l->dptr < l->size) {
                        snprintf(buf, len, "lease %" PRIu64 ", offset %" PRIu64, l->id,
                                 addr - l->dptr);
                        return true;
                }
        return false;
}

static void consumer_free(aqua_ctx *ctx)
{
        /* Tensors first: their chunks are leased chunks, and copies may still read them. */
        tensor_free_all(ctx);
        copies_clear(ctx);
        lease_table_clear(&ctx->consumer.leases, ctx->gpu);
}

const struct role_ops consumer_role = {
    .held = consumer_held,
    .dispatch = consumer_dispatch,
    .reply = consumer_reply,
    .lease_lost = consumer_lease_lost,
    .info = consumer_info,
    .load = consumer_load,
    .describe = consumer_describe,
    .free = consumer_free,
};
