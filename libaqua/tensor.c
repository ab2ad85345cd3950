/* Aqua tensors: create, grow and trim chunk by chunk across tiers, query, promote, free. */
#include "tensor.h"

#include <errno.h>
#include <stdlib.h>

#include "ctx.h"
#include "move.h"
#include "util.h"

#define DEFAULT_CHUNK (UINT64_C(32) << 20)

static bool tensor_valid(const aqua_ctx *ctx, const aqua_tensor *t)
{
        /* Compare pointers only: a freed tensor's memory must not be read. */
        for (const aqua_tensor *i = ctx->consumer.tensors; i; i = i->next)
                if (i == t)
                        return true;
        return false;
}

static int tensor_check(aqua_ctx *ctx, const aqua_tensor *t)
{
        if (!ctx)
                return -EINVAL;
        if (ctx->role != AQUA_ROLE_CONSUMER)
                return -EPERM;
        return !t || tensor_valid(ctx, t) ? 0 : -EINVAL;
}

static uint64_t chunk_at(const aqua_tensor *t, size_t i)
{
        return t->dptr + (uint64_t)i * t->chunk_bytes;
}

static void account(aqua_ctx *ctx, aqua_tensor *t, enum aqua_tier tier, int64_t delta)
{
        t->bytes[tier] += (uint64_t)delta;
        ctx->consumer.tensor_bytes[tier] += (uint64_t)delta;
}

/* Give chunk i's memory back to where it came from; the chunk becomes NONE. */
static void tensor_chunk_release(aqua_ctx *ctx, aqua_tensor *t, size_t i)
{
        struct tensor_chunk *c = &t->chunks[i];

        if (c->tier == AQUA_TIER_NONE)
                return;
        if (c->mapped)
                gpu_unmap(ctx->gpu, chunk_at(t, i), t->chunk_bytes);
        if (c->own_handle)
                gpu_release(ctx->gpu, c->handle);
        if (c->host)
                gpu_host_free(ctx->gpu, c->host);
        if (c->lc)
                lease_chunk_unuse(&ctx->consumer.leases, c->lease, c->lc);
        account(ctx, t, c->tier, -(int64_t)t->chunk_bytes);
        *c = (struct tensor_chunk){0};
}

static int place_peer(aqua_ctx *ctx, aqua_tensor *t, size_t i)
{
        struct tensor_chunk *c = &t->chunks[i];
        struct aqua_lease *l = NULL;
        struct lease_chunk *lc = lease_tensor_pool_find(&ctx->consumer.leases, t->chunk_bytes, &l);
        int r;

        if (!lc)
                return AQUA_NO_MEMORY;
        r = gpu_map(ctx->gpu, chunk_at(t, i), t->chunk_bytes, lc->handle);
        if (r < 0)
                return r;
        lease_chunk_use(&ctx->consumer.leases, l, lc, t, i);
        *c = (struct tensor_chunk){
            .tier = AQUA_TIER_PEER, .mapped = true, .handle = lc->handle, .lease = l, .lc = lc};
        return 0;
}

static int place_local(aqua_ctx *ctx, aqua_tensor *t, size_t i)
{
        gpu_handle h;
        int r;

        r = gpu_alloc_local(ctx->gpu, t->chunk_bytes, &h);
        if (r == -ENOMEM)
                return AQUA_NO_MEMORY;
        if (r < 0)
                return r;
        r = gpu_map(ctx->gpu, chunk_at(t, i), t->chunk_bytes, h);
        if (r < 0) {
                gpu_release(ctx->gpu, h);
                return r;
        }
        t->chunks[i] = (struct tensor_chunk){
            .tier = AQUA_TIER_LOCAL, .mapped = true, .own_handle = true, .handle = h};
        return 0;
}

static int place_dram(aqua_ctx *ctx, aqua_tensor *t, size_t i)
{
        struct tensor_chunk *c = &t->chunks[i];
        gpu_handle h;
        void *host = NULL;
        int r;

        /* Only what the daemon granted: that is the host memory this server lets us pin. */
        if (ctx->consumer.tensor_bytes[AQUA_TIER_DRAM] + t->chunk_bytes >
            ctx->consumer.dram_granted)
                return AQUA_NO_MEMORY;
        if (!ctx->consumer.leases.no_host_map) {
                r = gpu_alloc_host_mappable(ctx->gpu, t->chunk_bytes, &h);
                if (r == 0) {
                        r = gpu_map(ctx->gpu, chunk_at(t, i), t->chunk_bytes, h);
                        if (r < 0) {
                                gpu_release(ctx->gpu, h);
                                return r;
                        }
                        *c = (struct tensor_chunk){.tier = AQUA_TIER_DRAM,
                                                   .mapped = true,
                                                   .own_handle = true,
                                                   .handle = h};
                        return 0;
                }
                if (r != -EOPNOTSUPP)
                        return r == -ENOMEM ? AQUA_NO_MEMORY : r;
                ctx->consumer.leases.no_host_map = true;
        }
        r = gpu_host_alloc(ctx->gpu, t->chunk_bytes, &host);
        if (r < 0)
                return r == -ENOMEM ? AQUA_NO_MEMORY : r;
        *c = (struct tensor_chunk){.tier = AQUA_TIER_DRAM, .host = host};
        return 0;
}

/* Back chunk i by the first tier that has room, in the tensor's order. */
static int chunk_place(aqua_ctx *ctx, aqua_tensor *t, size_t i)
{
        int r = AQUA_NO_MEMORY;

        if (t->want == AQUA_TIER_NONE || t->want == AQUA_TIER_PEER)
                r = place_peer(ctx, t, i);
        if (r == AQUA_NO_MEMORY &&
            (t->want == AQUA_TIER_LOCAL ||
             (t->want == AQUA_TIER_NONE && (t->flags & AQUA_TENSOR_ALLOW_LOCAL))))
                r = place_local(ctx, t, i);
        if (r == AQUA_NO_MEMORY && (t->want == AQUA_TIER_NONE || t->want == AQUA_TIER_DRAM))
                r = place_dram(ctx, t, i);
        if (r == 0)
                account(ctx, t, t->chunks[i].tier, (int64_t)t->chunk_bytes);
        return r;
}

_public_ int aqua_tensor_new(aqua_ctx *ctx, uint64_t max_bytes,
                             const struct aqua_tensor_options *opts, aqua_tensor **ret)
{
        struct aqua_tensor_options o = AQUA_TENSOR_OPTIONS_INIT;
        uint64_t gran, size;
        aqua_tensor *t;
        size_t n;
        int r;

        r = tensor_check(ctx, NULL);
        if (r < 0)
                return r;
        if (!ret || max_bytes == 0 || (opts && opts->size < sizeof(o)))
                return -EINVAL;
        if (opts)
                o = *opts;
        if (o.tier < AQUA_TIER_NONE || o.tier > AQUA_TIER_LOCAL ||
            (o.flags & ~(AQUA_TENSOR_ALLOW_LOCAL | AQUA_TENSOR_RECLAIM_LOCAL)))
                return -EINVAL;
        if (o.chunk_bytes == 0) {
                o.chunk_bytes = DEFAULT_CHUNK;
                for (aqua_lease *l = ctx->consumer.leases.head; l; l = l->next)
                        if (l->tensor_pool && l->n_chunks) {
                                o.chunk_bytes = l->chunks[0].size;
                                break;
                        }
        }
        gran = gpu_info(ctx->gpu)->granularity;
        if (o.chunk_bytes % gran != 0 || max_bytes > UINT64_MAX / 2)
                return -EINVAL;
        n = (max_bytes + o.chunk_bytes - 1) / o.chunk_bytes;
        size = (uint64_t)n * o.chunk_bytes;
        t = calloc(1, sizeof(*t) + n * sizeof(t->chunks[0]));
        if (!t)
                return -ENOMEM;
        r = gpu_reserve(ctx->gpu, size, &t->dptr);
        if (r < 0) {
                free(t);
                return r == -ENOMEM ? r : -EIO;
        }
        t->max_bytes = size;
        t->chunk_bytes = o.chunk_bytes;
        t->n_chunks = n;
        t->want = o.tier;
        t->flags = o.flags;
        t->next = ctx->consumer.tensors;
        if (t->next)
                t->next->prev = t;
        ctx->consumer.tensors = t;
        *ret = t;
        return 0;
}

_public_ aqua_tensor *aqua_tensor_free(aqua_ctx *ctx, aqua_tensor *t)
{
        if (!t || tensor_check(ctx, t) < 0)
                return NULL;
        copies_wait_all(ctx);
        for (size_t i = 0; i < t->n_chunks; i++)
                tensor_chunk_release(ctx, t, i);
        gpu_unreserve(ctx->gpu, t->dptr, t->max_bytes);
        if (t->prev)
                t->prev->next = t->next;
        else
                ctx->consumer.tensors = t->next;
        if (t->next)
                t->next->prev = t->prev;
        ctx_forget_tensor_events(ctx, t);
        free(t);
        return NULL;
}

void tensor_free_all(aqua_ctx *ctx)
{
        while (ctx->consumer.tensors)
                aqua_tensor_free(ctx, ctx->consumer.tensors);
}

_public_ uint64_t aqua_tensor_dptr(const aqua_tensor *t)
{
        return t ? t->dptr : 0;
}

_public_ int aqua_tensor_get_info(aqua_ctx *ctx, const aqua_tensor *t, struct aqua_tensor_info *ret)
{
        int r = tensor_check(ctx, t);

        if (r < 0)
                return r;
        if (!t || !ret)
                return -EINVAL;
        *ret = (struct aqua_tensor_info){
            .dptr = t->dptr,
            .max_bytes = t->max_bytes,
            .chunk_bytes = t->chunk_bytes,
            .begin = (uint64_t)t->head * t->chunk_bytes,
            .end = (uint64_t)t->tail * t->chunk_bytes,
            .peer_bytes = t->bytes[AQUA_TIER_PEER],
            .local_bytes = t->bytes[AQUA_TIER_LOCAL],
            .dram_bytes = t->bytes[AQUA_TIER_DRAM],
        };
        return 0;
}

_public_ int aqua_tensor_grow(aqua_ctx *ctx, aqua_tensor *t, uint64_t end)
{
        size_t want, i;
        int r = tensor_check(ctx, t);

        if (r < 0)
                return r;
        if (!t)
                return -EINVAL;
        if (end > t->max_bytes)
                return -ERANGE;
        want = (end + t->chunk_bytes - 1) / t->chunk_bytes;
        for (i = t->tail; i < want; i++) {
                r = chunk_place(ctx, t, i);
                if (r != 0)
                        break;
        }
        if (r != 0) {
                /* All or nothing: what this call mapped goes again. */
                while (i-- > t->tail)
                        tensor_chunk_release(ctx, t, i);
                return r;
        }
        if (want > t->tail)
                t->tail = want;
        return 0;
}

_public_ int aqua_tensor_trim(aqua_ctx *ctx, aqua_tensor *t, uint64_t begin, uint64_t end)
{
        size_t head, tail;
        int r = tensor_check(ctx, t);

        if (r < 0)
                return r;
        if (!t || begin > end)
                return -EINVAL;
        head = MIN(begin / t->chunk_bytes, t->n_chunks);
        tail = MIN((end + t->chunk_bytes - 1) / t->chunk_bytes, t->n_chunks);
        if (head <= t->head && tail >= t->tail)
                return 0;
        /* A copy still reading a chunk must finish before the chunk goes. */
        r = copies_wait_all(ctx);
        if (r < 0)
                return r;
        for (size_t i = t->head; i < t->tail; i++)
                if (i < head || i >= tail)
                        tensor_chunk_release(ctx, t, i);
        t->head = MAX(t->head, head);
        t->tail = MIN(t->tail, tail);
        if (t->head >= t->tail)
                /* Empty: it grows again from where it was trimmed to. */
                t->tail = t->head = MIN(head, t->n_chunks);
        return 0;
}

_public_ int aqua_tensor_get_range(aqua_ctx *ctx, const aqua_tensor *t, uint64_t offset,
                                   struct aqua_tensor_range *ret)
{
        const struct tensor_chunk *c;
        size_t i, j;
        int r = tensor_check(ctx, t);

        if (r < 0)
                return r;
        if (!t || !ret)
                return -EINVAL;
        if (offset >= t->max_bytes)
                return -ERANGE;
        i = offset / t->chunk_bytes;
        c = &t->chunks[i];
        /* Pinned host chunks are separate allocations: each is its own run. */
        for (j = i + 1; !c->host && j < t->n_chunks; j++)
                if (t->chunks[j].tier != c->tier || t->chunks[j].host)
                        break;
        *ret = (struct aqua_tensor_range){
            .offset = (uint64_t)i * t->chunk_bytes,
            .bytes = (uint64_t)(j - i) * t->chunk_bytes,
            .tier = c->tier,
            .host = c->host,
        };
        return 0;
}

/* ---------------------------------------------------------------- reclaim and promote */

void tensor_move_prepare(const aqua_tensor *t, size_t i, struct move *m)
{
        *m = (struct move){
            .at = chunk_at(t, i),
            .size = t->chunk_bytes,
            .old = t->chunks[i].handle,
            .local_first = t->flags & AQUA_TENSOR_RECLAIM_LOCAL,
        };
}

void tensor_moved(aqua_ctx *ctx, aqua_tensor *t, size_t i, const struct move *m)
{
        struct tensor_chunk *c = &t->chunks[i];

        account(ctx, t, AQUA_TIER_PEER, -(int64_t)t->chunk_bytes);
        account(ctx, t, m->tier, (int64_t)t->chunk_bytes);
        *c = (struct tensor_chunk){
            .tier = m->tier,
            .mapped = m->has_handle,
            .own_handle = m->has_handle,
            .handle = m->handle,
            .host = m->host,
        };
}

/* Promote chunk i of t into free pool chunk lc once its bytes are there. */
static void chunk_promoted(aqua_ctx *ctx, aqua_tensor *t, size_t i, struct aqua_lease *l,
                           struct lease_chunk *lc)
{
        struct tensor_chunk *c = &t->chunks[i];
        struct aqua_event ev = {.type = AQUA_EVENT_TENSOR_MIGRATED,
                                .tensor = t,
                                .offset = (uint64_t)i * t->chunk_bytes,
                                .bytes = t->chunk_bytes,
                                .tier = AQUA_TIER_PEER};
        bool moved_address = !c->mapped;

        if (c->mapped && gpu_unmap(ctx->gpu, chunk_at(t, i), t->chunk_bytes) < 0)
                return;
        if (gpu_map(ctx->gpu, chunk_at(t, i), t->chunk_bytes, lc->handle) < 0) {
                /* Keep the old backing where it was. */
                if (c->mapped)
                        gpu_map(ctx->gpu, chunk_at(t, i), t->chunk_bytes, c->handle);
                return;
        }
        if (c->own_handle)
                gpu_release(ctx->gpu, c->handle);
        if (c->host)
                gpu_host_free(ctx->gpu, c->host);
        account(ctx, t, c->tier, -(int64_t)t->chunk_bytes);
        account(ctx, t, AQUA_TIER_PEER, (int64_t)t->chunk_bytes);
        lease_chunk_use(&ctx->consumer.leases, l, lc, t, i);
        *c = (struct tensor_chunk){
            .tier = AQUA_TIER_PEER, .mapped = true, .handle = lc->handle, .lease = l, .lc = lc};
        /* Its device address holds it again: the engine was told it had moved. */
        if (moved_address)
                ctx_push_event(ctx, &ev);
}

struct promotion {
        aqua_tensor *t;
        size_t i;
        struct aqua_lease *l;
        struct lease_chunk *lc;
};

static int promote_one(aqua_ctx *ctx, aqua_tensor *t, bool include_local, uint64_t *budget,
                       struct promotion **p, size_t *n, size_t *cap)
{
        for (size_t i = t->head; i < t->tail && *budget >= t->chunk_bytes; i++) {
                struct tensor_chunk *c = &t->chunks[i];
                struct aqua_lease *l = NULL;
                struct lease_chunk *lc;

                if (c->tier != AQUA_TIER_DRAM && !(include_local && c->tier == AQUA_TIER_LOCAL))
                        continue;
                lc = lease_tensor_pool_find(&ctx->consumer.leases, t->chunk_bytes, &l);
                if (!lc)
                        return 0;
                if (*n == *cap) {
                        size_t nc = *cap ? *cap * 2 : 16;
                        struct promotion *a = realloc(*p, nc * sizeof(*a));

                        if (!a)
                                return -ENOMEM;
                        *p = a;
                        *cap = nc;
                }
                /* Reserved for this chunk until the copy is done. */
                lease_chunk_use(&ctx->consumer.leases, l, lc, t, i);
                (*p)[(*n)++] = (struct promotion){t, i, l, lc};
                *budget -= t->chunk_bytes;
        }
        return 0;
}

_public_ int aqua_tensor_promote(aqua_ctx *ctx, aqua_tensor *t, bool include_local,
                                 uint64_t max_bytes, uint64_t *ret_bytes)
{
        _cleanup_free_ struct promotion *p = NULL;
        _cleanup_free_ struct aqua_copy_piece *pieces = NULL;
        size_t n = 0, cap = 0, n_pieces;
        uint64_t budget = max_bytes, moved = 0;
        int r = tensor_check(ctx, t);

        if (r < 0)
                return r;
        for (aqua_tensor *i = t ? t : ctx->consumer.tensors; i && r == 0; i = t ? NULL : i->next)
                r = promote_one(ctx, i, include_local, &budget, &p, &n, &cap);
        if (r == 0 && n) {
                pieces = calloc(n, sizeof(*pieces));
                r = pieces ? copies_wait_all(ctx) : -ENOMEM;
        }
        if (r == 0 && n) {
                for (size_t k = 0; k < n; k++) {
                        const struct tensor_chunk *c = &p[k].t->chunks[p[k].i];

                        pieces[k] = (struct aqua_copy_piece){
                            .dst = p[k].l->dptr + p[k].lc->offset,
                            .src =
                                c->mapped ? chunk_at(p[k].t, p[k].i) : (uint64_t)(uintptr_t)c->host,
                            .bytes = p[k].t->chunk_bytes};
                }
                n_pieces = copy_merge(pieces, n);
                r = gpu_copy_batch(ctx->gpu, NULL, NULL, pieces, n_pieces, true, NULL, 0);
                if (r == 0)
                        r = gpu_stream_sync(ctx->gpu, NULL);
        }
        for (size_t k = 0; k < n; k++) {
                lease_chunk_unuse(&ctx->consumer.leases, p[k].l, p[k].lc);
                if (r == 0) {
                        chunk_promoted(ctx, p[k].t, p[k].i, p[k].l, p[k].lc);
                        if (p[k].lc->user)
                                moved += p[k].t->chunk_bytes;
                }
        }
        if (r < 0)
                return r == -ENOMEM ? r : -EIO;
        if (ret_bytes)
                *ret_bytes = moved;
        return 0;
}
