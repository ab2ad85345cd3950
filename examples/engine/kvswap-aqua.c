/*
 * The aqua swap backend: swapped KV blocks live in one aqua tensor whose chunks libaqua places in
 * memory borrowed from a producer GPU (a tensor pool) or in DRAM, and moves to DRAM when the
 * producer reclaims; copies are libaqua's batched copies. Host memory when the tensor is full.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "aqua-log.h"
#include "aqua/aqua.h"
#include "example-log.h"
#include "example-parse.h"
#include "example-util.h"
#include "kvswap.h"

/* The tensor's address range: only what is used gets mapped, so it can be generous. */
#define TENSOR_MAX_BYTES (UINT64_C(64) << 30)

struct aq_chunk {
        enum kv_tier tier;
        uint8_t *base; /* where its bytes are: the tensor's address, or a host copy */
        uint32_t n_free;
        uint32_t *free; /* stack of free block indices */
};

struct aq_ref {
        uint32_t chunk, block;
};

struct aq_slot {
        size_t n, block_bytes;
        unsigned n_layers; /* 0: written whole by swap_out; else layer by layer (aqua_layers) */
        uint64_t checksum;
        enum kv_tier tier;
        uint8_t *host; /* a host buffer when the tensor had no room; else refs[] */
        struct aq_slot *prev, *next;
        struct aq_ref refs[];
};

struct aq {
        struct kv_swap_aqua_config cfg;
        aqua_ctx *ctx;
        aqua_tensor *tensor;
        uint64_t dptr, chunk_bytes;
        struct aq_chunk *chunks; /* the tensor's window, chunk by chunk from offset 0 */
        size_t n_chunks;
        size_t block_bytes; /* 0 until the first swap-out */
        uint32_t blocks_per_chunk;
        uint64_t free_blocks[_KV_TIER_MAX];
        bool tensor_full; /* the last grow found no room in any tier */
        struct aq_slot *slots;
        aqua_lease **leases;
        size_t n_leases;
        uint64_t last_borrow_ns;
        int last_borrow_result;
        bool reclaimed;
        struct aqua_copy_piece *pieces;
        size_t pieces_allocated;
        aqua_layers *layers; /* offload and prefetch streams, for layered slots */
        unsigned n_layers;
        struct kv_swap_aqua_stats st;
};

void kv_swap_aqua_config_defaults(struct kv_swap_aqua_config *c)
{
        *c = (struct kv_swap_aqua_config){
            .device = 0,
            .borrow_bytes = UINT64_C(1) << 30,
            .allow_dram = true,
            .retry_ns = NSEC_PER_SEC,
        };
}

static const char *sz(char *buf, size_t n, uint64_t bytes)
{
        return format_size(buf, n, bytes);
}

/* Ask aquad for a tensor pool; a refusal is an expected outcome, logged when it changes. */
static int borrow(struct aq *a, bool allow_dram)
{
        unsigned flags = AQUA_BORROW_TENSORS | (allow_dram ? AQUA_BORROW_ALLOW_DRAM : 0);
        struct aqua_grant g;
        char b1[32], b2[32];
        int r;

        a->last_borrow_ns = now_mono_ns();
        r = aqua_borrow(a->ctx, a->cfg.borrow_bytes, 0, flags, &g);
        if (r != 0) {
                if (r != a->last_borrow_result)
                        log_info("aqua: nothing to borrow now (%s)", aqua_strerror(r));
                a->last_borrow_result = r;
                return r < 0 && r != -ENOTCONN && r != -ETIMEDOUT ? r : 0;
        }
        a->last_borrow_result = 0;
        a->st.dram_budget += g.dram_bytes;
        if (!g.lease) {
                log_info("aqua: no peer memory to borrow; DRAM budget %s",
                         sz(b1, sizeof(b1), g.dram_bytes));
                return 0;
        }
        aqua_lease **l = reallocarray(a->leases, a->n_leases + 1, sizeof(*l));
        if (!l) {
                aqua_return(a->ctx, g.lease);
                return -ENOMEM;
        }
        a->leases = l;
        a->leases[a->n_leases++] = g.lease;
        a->st.leases++;
        a->st.lent_bytes += g.bytes;
        a->tensor_full = false;
        log_info("aqua: borrowed %s of peer memory for the KV tensor%s%s",
                 sz(b1, sizeof(b1), g.bytes), g.dram_bytes ? ", DRAM budget " : "",
                 g.dram_bytes ? sz(b2, sizeof(b2), g.dram_bytes) : "");
        return 0;
}

/* Read where chunk i is now; keeps the free-block counts by tier right. */
static int chunk_refresh(struct aq *a, size_t i)
{
        struct aq_chunk *c = &a->chunks[i];
        struct aqua_tensor_range rg;
        uint64_t off = i * a->chunk_bytes;
        int r;

        r = aqua_tensor_get_range(a->ctx, a->tensor, off, &rg);
        if (r < 0)
                return r;
        a->free_blocks[c->tier] -= c->n_free;
        c->tier = rg.tier == AQUA_TIER_PEER ? KV_TIER_PEER : KV_TIER_DRAM;
        c->base = rg.host ? (uint8_t *)rg.host + (off - rg.offset)
                          : (uint8_t *)(uintptr_t)(a->dptr + off);
        a->free_blocks[c->tier] += c->n_free;
        return 0;
}

static int refresh_all(struct aq *a)
{
        for (size_t i = 0; i < a->n_chunks; i++) {
                int r = chunk_refresh(a, i);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Map one more chunk at the end of the tensor: AQUA_NO_MEMORY when no tier has room. */
static int grow(struct aq *a)
{
        struct aq_chunk *c;
        int r;

        if (a->tensor_full || (a->n_chunks + 1) * a->chunk_bytes > TENSOR_MAX_BYTES)
                return AQUA_NO_MEMORY;
        c = reallocarray(a->chunks, a->n_chunks + 1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        a->chunks = c;
        c = &a->chunks[a->n_chunks];
        *c = (struct aq_chunk){.tier = KV_TIER_DRAM};
        c->free = calloc(a->blocks_per_chunk, sizeof(*c->free));
        if (!c->free)
                return -ENOMEM;
        r = aqua_tensor_grow(a->ctx, a->tensor, (a->n_chunks + 1) * a->chunk_bytes);
        if (r != 0) {
                free(c->free);
                if (r == AQUA_NO_MEMORY)
                        a->tensor_full = true;
                return r;
        }
        /* Lowest blocks on top: slots fill a chunk from its start. */
        for (uint32_t b = 0; b < a->blocks_per_chunk; b++)
                c->free[b] = a->blocks_per_chunk - 1 - b;
        c->n_free = a->blocks_per_chunk;
        a->free_blocks[KV_TIER_DRAM] += c->n_free;
        a->n_chunks++;
        return chunk_refresh(a, a->n_chunks - 1);
}

static void slot_account(struct aq *a, const struct aq_slot *s, bool add)
{
        uint64_t bytes = (uint64_t)s->n * s->block_bytes;
        uint64_t *slots = s->tier == KV_TIER_PEER ? &a->st.slots_peer : &a->st.slots_dram;
        uint64_t *b = s->tier == KV_TIER_PEER ? &a->st.bytes_peer : &a->st.bytes_dram;

        if (add) {
                (*slots)++;
                *b += bytes;
                a->st.peak_bytes_peer = MAX(a->st.peak_bytes_peer, a->st.bytes_peer);
                a->st.peak_bytes_dram = MAX(a->st.peak_bytes_dram, a->st.bytes_dram);
        } else {
                (*slots)--;
                *b -= bytes;
        }
}

static uint64_t ref_addr(const struct aq *a, const struct aq_ref *r)
{
        return (uint64_t)(uintptr_t)(a->chunks[r->chunk].base + (size_t)r->block * a->block_bytes);
}

static enum kv_tier slot_tier(const struct aq *a, const struct aq_slot *s)
{
        if (s->host)
                return KV_TIER_DRAM;
        for (size_t i = 0; i < s->n; i++)
                if (a->chunks[s->refs[i].chunk].tier != KV_TIER_PEER)
                        return KV_TIER_DRAM;
        return KV_TIER_PEER;
}

/* Take n free blocks of the tiers allowed (peer first); callers checked there are enough. */
static void take_blocks(struct aq *a, struct aq_slot *s, size_t n, bool dram_too)
{
        size_t k = 0;

        for (int want = KV_TIER_PEER; want <= (dram_too ? KV_TIER_DRAM : KV_TIER_PEER); want++)
                for (size_t i = 0; i < a->n_chunks && k < n; i++) {
                        struct aq_chunk *c = &a->chunks[i];
                        if (c->tier != (enum kv_tier)want)
                                continue;
                        while (c->n_free > 0 && k < n) {
                                s->refs[k++] = (struct aq_ref){(uint32_t)i, c->free[--c->n_free]};
                                a->free_blocks[want]--;
                        }
                }
}

/*
 * Room for n blocks in the tensor, peer memory first: free peer blocks, else grow while the
 * pool has free chunks, else free blocks of any tier, else grow into DRAM. Returns 1 with the
 * blocks taken, 0 when the tensor has no room (the slot goes to host memory).
 */
static int place(struct aq *a, struct aq_slot *s, size_t n)
{
        struct aqua_info in;
        int r;

        while (a->free_blocks[KV_TIER_PEER] < n) {
                if (aqua_get_info(a->ctx, &in) < 0 || in.pool_free_bytes < a->chunk_bytes)
                        break;
                r = grow(a);
                if (r < 0)
                        return r;
                if (r > 0)
                        break;
        }
        if (a->free_blocks[KV_TIER_PEER] >= n) {
                take_blocks(a, s, n, false);
                return 1;
        }
        while (a->free_blocks[KV_TIER_PEER] + a->free_blocks[KV_TIER_DRAM] < n) {
                r = grow(a);
                if (r < 0)
                        return r;
                if (r > 0)
                        return 0;
        }
        take_blocks(a, s, n, true);
        return 1;
}

static void release_blocks(struct aq *a, struct aq_slot *s)
{
        if (s->host)
                return;
        for (size_t i = 0; i < s->n; i++) {
                struct aq_chunk *c = &a->chunks[s->refs[i].chunk];
                c->free[c->n_free++] = s->refs[i].block;
                a->free_blocks[c->tier]++;
        }
}

static int pieces_reserve(struct aq *a, size_t n)
{
        if (n <= a->pieces_allocated)
                return 0;
        struct aqua_copy_piece *p = reallocarray(a->pieces, n, sizeof(*p));
        if (!p)
                return -ENOMEM;
        a->pieces = p;
        a->pieces_allocated = n;
        return 0;
}

/* One batched copy through libaqua (it merges pieces that continue each other), waited for. */
static int copy_batch(struct aq *a, size_t n)
{
        aqua_ticket ticket;
        size_t merged = 0;
        int r;

        for (size_t i = 0; i < n; i++)
                merged += i == 0 ||
                          a->pieces[i - 1].src + a->pieces[i - 1].bytes != a->pieces[i].src ||
                          a->pieces[i - 1].dst + a->pieces[i - 1].bytes != a->pieces[i].dst;
        r = aqua_copy_batch(a->ctx, a->pieces, n, NULL, NULL, NULL, &ticket);
        if (r == 0)
                r = aqua_copy_wait(a->ctx, ticket);
        if (r < 0)
                return log_error_errno(r, "aqua: a batched copy of %zu pieces failed: %m", n);
        a->st.copies++;
        a->st.copy_pieces += merged;
        return 0;
}

/* The first slot fixes the block size: the tensor's chunks are cut into blocks of it. */
static int block_size(struct aq *a, size_t n, size_t block_bytes, size_t *ret_bytes)
{
        if (n == 0 || block_bytes == 0 || size_mul_overflows(n, block_bytes, ret_bytes))
                return -EINVAL;
        if (a->block_bytes == 0) {
                if (block_bytes > a->chunk_bytes)
                        return -EINVAL;
                a->block_bytes = block_bytes;
                a->blocks_per_chunk = (uint32_t)(a->chunk_bytes / block_bytes);
        }
        if (block_bytes != a->block_bytes)
                return -EINVAL;
        return pieces_reserve(a, n);
}

static struct aq_slot *slot_new(size_t n, size_t block_bytes, unsigned n_layers)
{
        struct aq_slot *s = calloc(1, sizeof(*s) + n * sizeof(s->refs[0]));
        if (s) {
                s->n = n;
                s->block_bytes = block_bytes;
                s->n_layers = n_layers;
        }
        return s;
}

static void slot_link(struct aq *a, struct aq_slot *s)
{
        s->tier = slot_tier(a, s);
        slot_account(a, s, true);
        s->next = a->slots;
        if (a->slots)
                a->slots->prev = s;
        a->slots = s;
}

static int aq_swap_out(void *ctx, void *const *blocks, size_t n, size_t block_bytes,
                       void **ret_slot, enum kv_tier *ret_tier)
{
        struct aq *a = ctx;
        struct aq_slot *s;
        size_t bytes;
        int r;

        r = block_size(a, n, block_bytes, &bytes);
        if (r < 0)
                return r;
        s = slot_new(n, block_bytes, 0);
        if (!s)
                return -ENOMEM;
        s->checksum = kv_checksum(blocks, n, block_bytes);
        r = place(a, s, n);
        if (r == 0) {
                s->host = malloc(bytes);
                if (!s->host)
                        r = -ENOMEM;
                else
                        for (size_t i = 0; i < n; i++)
                                memcpy(s->host + i * block_bytes, blocks[i], block_bytes);
        } else if (r > 0) {
                for (size_t i = 0; i < n; i++)
                        a->pieces[i] = (struct aqua_copy_piece){
                            .dst = ref_addr(a, &s->refs[i]),
                            .src = (uint64_t)(uintptr_t)blocks[i],
                            .bytes = block_bytes,
                        };
                r = copy_batch(a, n);
                if (r < 0)
                        release_blocks(a, s);
        }
        if (r < 0) {
                free(s->host);
                free(s);
                return r;
        }

        slot_link(a, s);
        *ret_slot = s;
        *ret_tier = s->tier;
        return 0;
}

static int layers_setup(struct aq *a, unsigned n_layers)
{
        if (a->layers && a->n_layers == n_layers)
                return 0;
        if (a->layers)
                return -EINVAL; /* one model per engine: one layer count */
        int r = aqua_layers_new(a->ctx, n_layers, NULL, NULL, &a->layers);
        if (r < 0)
                return log_error_errno(r, "aqua: aqua_layers_new(%u) failed: %m", n_layers);
        a->n_layers = n_layers;
        return 0;
}

static int aq_reserve(void *ctx, size_t n, size_t block_bytes, unsigned n_layers, void **ret_slot,
                      enum kv_tier *ret_tier)
{
        struct aq *a = ctx;
        struct aq_slot *s;
        size_t bytes;
        int r;

        if (n_layers == 0 || block_bytes % n_layers != 0)
                return -EINVAL;
        r = block_size(a, n, block_bytes, &bytes);
        if (r >= 0)
                r = layers_setup(a, n_layers);
        if (r < 0)
                return r;
        s = slot_new(n, block_bytes, n_layers);
        if (!s)
                return -ENOMEM;
        r = place(a, s, n);
        if (r == 0) {
                s->host = calloc(n, block_bytes);
                r = s->host ? 0 : -ENOMEM;
        }
        if (r < 0) {
                free(s);
                return r;
        }
        slot_link(a, s);
        *ret_slot = s;
        *ret_tier = s->tier;
        return 0;
}

/* Where segment `layer` of the slot's block i lives now. */
static uint64_t segment_addr(const struct aq *a, const struct aq_slot *s, size_t i, unsigned layer)
{
        size_t seg = s->block_bytes / s->n_layers;
        if (s->host)
                return (uint64_t)(uintptr_t)(s->host + i * s->block_bytes + layer * seg);
        return ref_addr(a, &s->refs[i]) + layer * seg;
}

static int aq_write_layer(void *ctx, void *slot, unsigned layer, size_t first, void *const *src,
                          size_t m)
{
        struct aq *a = ctx;
        struct aq_slot *s = slot;
        int r;

        if (!s || s->n_layers == 0 || layer >= s->n_layers || first > s->n || m > s->n - first)
                return -EINVAL;
        size_t seg = s->block_bytes / s->n_layers;
        for (size_t i = 0; i < m; i++) {
                s->checksum += kv_segment_hash((first + i) * s->n_layers + layer, src[i], seg);
                a->pieces[i] = (struct aqua_copy_piece){
                    .dst = segment_addr(a, s, first + i, layer),
                    .src = (uint64_t)(uintptr_t)src[i],
                    .bytes = seg,
                };
        }
        if (m == 0)
                return 0;
        /* Layer `layer` goes out while the engine computes the next; the one before must be
         * done now, as its source is about to be reused. */
        r = aqua_layers_offload(a->layers, layer, a->pieces, m, NULL);
        if (r == 0 && layer > 0)
                r = aqua_layers_wait(a->layers, layer - 1);
        if (r < 0)
                return log_error_errno(r, "aqua: offload of layer %u failed: %m", layer);
        a->st.layer_offloads++;
        a->st.copy_pieces += m;
        return 0;
}

static int aq_seal(void *ctx, void *slot)
{
        struct aq *a = ctx;
        int r;

        if (!slot || !a->layers)
                return -EINVAL;
        for (unsigned l = 0; l < a->n_layers; l++) {
                r = aqua_layers_wait(a->layers, l);
                if (r < 0)
                        return log_error_errno(r, "aqua: waiting for layer %u failed: %m", l);
        }
        return 0;
}

/* Prefetch before decode: layer by layer on the prefetch stream, then wait for all. */
static int prefetch_layers(struct aq *a, struct aq_slot *s, void *const *blocks)
{
        size_t seg = s->block_bytes / s->n_layers;
        int r;

        for (unsigned l = 0; l < s->n_layers; l++) {
                for (size_t i = 0; i < s->n; i++)
                        a->pieces[i] = (struct aqua_copy_piece){
                            .dst = (uint64_t)(uintptr_t)((uint8_t *)blocks[i] + l * seg),
                            .src = segment_addr(a, s, i, l),
                            .bytes = seg,
                        };
                r = aqua_layers_prefetch(a->layers, l, a->pieces, s->n, NULL);
                if (r < 0)
                        return log_error_errno(r, "aqua: prefetch of layer %u failed: %m", l);
                a->st.layer_prefetches++;
                a->st.copy_pieces += s->n;
                /* The pieces array is reused for the next layer: libaqua copied it. */
        }
        for (unsigned l = 0; l < s->n_layers; l++) {
                r = aqua_layers_wait(a->layers, l);
                if (r < 0)
                        return r;
        }
        return 0;
}

static void slot_drop(struct aq *a, struct aq_slot *s)
{
        slot_account(a, s, false);
        release_blocks(a, s);
        if (s->prev)
                s->prev->next = s->next;
        else
                a->slots = s->next;
        if (s->next)
                s->next->prev = s->prev;
        free(s->host);
        free(s);
}

static int aq_swap_in(void *ctx, void *slot, void *const *blocks, size_t n, size_t block_bytes)
{
        struct aq *a = ctx;
        struct aq_slot *s = slot;
        enum kv_tier tier;
        int r = 0;

        if (!s || n != s->n || block_bytes != s->block_bytes)
                return -EINVAL;
        if (s->host)
                for (size_t i = 0; i < n; i++)
                        memcpy(blocks[i], s->host + i * block_bytes, block_bytes);
        else if (s->n_layers)
                r = prefetch_layers(a, s, blocks);
        else {
                for (size_t i = 0; i < n; i++)
                        a->pieces[i] = (struct aqua_copy_piece){
                            .dst = (uint64_t)(uintptr_t)blocks[i],
                            .src = ref_addr(a, &s->refs[i]),
                            .bytes = block_bytes,
                        };
                r = copy_batch(a, n);
        }
        /* The copy that arrived is what the engine reads: check that one. */
        uint64_t got = s->n_layers ? kv_layered_checksum(blocks, n, block_bytes, s->n_layers)
                                   : kv_checksum(blocks, n, block_bytes);
        bool ok = r == 0 && got == s->checksum;
        tier = s->tier;
        slot_drop(a, s);
        if (r < 0)
                return r;
        if (!ok) {
                a->st.checksum_failures++;
                return -EIO;
        }
        a->st.verified_swap_ins[tier]++;
        return 0;
}

static void aq_discard(void *ctx, void *slot)
{
        if (slot)
                slot_drop(ctx, slot);
}

static enum kv_tier aq_tier_of(void *ctx, void *slot)
{
        return ((struct aq_slot *)slot)->tier;
}

/* After chunks changed tier: move the slots in them, counting those that left peer memory. */
static void retier_slots(struct aq *a, uint64_t *ret_out, uint64_t *ret_out_bytes, uint64_t *ret_in)
{
        for (struct aq_slot *s = a->slots; s; s = s->next) {
                enum kv_tier t = slot_tier(a, s);
                if (t == s->tier)
                        continue;
                if (t == KV_TIER_DRAM) {
                        (*ret_out)++;
                        *ret_out_bytes += (uint64_t)s->n * s->block_bytes;
                } else
                        (*ret_in)++;
                slot_account(a, s, false);
                s->tier = t;
                slot_account(a, s, true);
        }
}

static int aq_poll(void *ctx)
{
        struct aq *a = ctx;
        struct aqua_event ev[16];
        uint64_t moved = 0, out = 0, out_bytes = 0, in = 0;
        bool rescan = false;
        size_t n;
        int r;

        do {
                r = aqua_poll(a->ctx, ev, ARRAY_SIZE(ev), &n);
                if (r < 0)
                        return r;
                for (size_t i = 0; i < n; i++)
                        switch (ev[i].type) {
                        case AQUA_EVENT_TENSOR_MIGRATED:
                                if (ev[i].tensor != a->tensor)
                                        break;
                                if (ev[i].tier != AQUA_TIER_PEER)
                                        moved += ev[i].bytes;
                                rescan = true;
                                break;
                        case AQUA_EVENT_MIGRATED:
                                rescan = true;
                                break;
                        case AQUA_EVENT_LEASE_LOST:
                                log_warning("aqua: aquad lost a lease; its data was moved to DRAM");
                                rescan = true;
                                break;
                        case AQUA_EVENT_RECLAIM_FAILED:
                                log_error("aqua: a reclaim could not be honoured: %s",
                                          aqua_strerror(ev[i].error));
                                break;
                        case AQUA_EVENT_DISCONNECTED:
                                log_warning("aqua: lost aquad; the tensor stays mapped");
                                break;
                        case AQUA_EVENT_RECONNECTED:
                                log_info("aqua: connected to aquad again");
                                break;
                        case AQUA_EVENT_DAEMON_STOPPING:
                                log_info("aqua: aquad is stopping");
                                break;
                        default:
                                break;
                        }
        } while (n == ARRAY_SIZE(ev));

        if (rescan) {
                r = refresh_all(a);
                if (r < 0)
                        return r;
                retier_slots(a, &out, &out_bytes, &in);
                a->tensor_full = false; /* the pool changed: a grow may find room again */
        }
        if (moved > 0) {
                char b1[32], b2[32];
                a->st.migrated_bytes += moved;
                a->st.slots_migrated += out;
                a->st.slot_bytes_migrated += out_bytes;
                a->reclaimed = true;
                log_info("aqua: reclaim: libaqua moved %s of the KV tensor to DRAM at the same "
                         "addresses; %" PRIu64 " swapped requests (%s of KV) are in DRAM now",
                         sz(b1, sizeof(b1), moved), out, sz(b2, sizeof(b2), out_bytes));
        }

        /* Out of peer room: ask again now and then (the producer may offer again), and move
         * what is in DRAM back to peer memory when a new lease came. */
        struct aqua_info info;
        if (a->free_blocks[KV_TIER_PEER] == 0 && aqua_get_info(a->ctx, &info) == 0 &&
            info.pool_free_bytes == 0 && now_mono_ns() - a->last_borrow_ns >= a->cfg.retry_ns) {
                size_t before = a->n_leases;
                r = borrow(a, false);
                if (r < 0)
                        return r;
                if (a->n_leases > before && info.tensor_dram_bytes > 0) {
                        uint64_t promoted = 0;
                        char b[32];
                        r = aqua_tensor_promote(a->ctx, a->tensor, false, AQUA_ALL, &promoted);
                        if (r < 0)
                                return r;
                        r = refresh_all(a);
                        if (r < 0)
                                return r;
                        out = out_bytes = in = 0;
                        retier_slots(a, &out, &out_bytes, &in);
                        a->st.slots_promoted += in;
                        log_info("aqua: moved %s of the KV tensor back to peer memory: %" PRIu64
                                 " swapped requests with it",
                                 sz(b, sizeof(b), promoted), in);
                }
        }
        if (aqua_get_info(a->ctx, &info) == 0)
                a->st.peer_bytes = info.tensor_peer_bytes;
        return 0;
}

static void aq_free(void *ctx)
{
        struct aq *a = ctx;

        if (!a)
                return;
        while (a->slots)
                slot_drop(a, a->slots);
        aqua_layers_free(a->layers);
        aqua_tensor_free(a->ctx, a->tensor);
        for (size_t i = 0; i < a->n_leases; i++)
                aqua_return(a->ctx, a->leases[i]);
        if (a->st.dram_budget > 0)
                aqua_return_dram(a->ctx, a->st.dram_budget);
        aqua_close(a->ctx);
        for (size_t i = 0; i < a->n_chunks; i++)
                free(a->chunks[i].free);
        free(a->chunks);
        free(a->leases);
        free(a->pieces);
        free(a);
}

static const struct kv_swap_ops aqua_ops = {
    .name = "aqua",
    .swap_out = aq_swap_out,
    .swap_in = aq_swap_in,
    .discard = aq_discard,
    .tier_of = aq_tier_of,
    .poll = aq_poll,
    .free = aq_free,
    .reserve = aq_reserve,
    .write_layer = aq_write_layer,
    .seal = aq_seal,
};

int kv_swap_aqua_new(const struct kv_swap_aqua_config *c, struct kv_swap *ret)
{
        struct aqua_options o = AQUA_OPTIONS_INIT;
        struct aqua_tensor_options to = AQUA_TENSOR_OPTIONS_INIT;
        struct aqua_tensor_info ti;
        struct aq *a;
        int r;

        if (!c || !ret || c->borrow_bytes == 0)
                return -EINVAL;
        a = calloc(1, sizeof(*a));
        if (!a)
                return -ENOMEM;
        a->cfg = *c;
        examples_aqua_log_setup();
        o.endpoint = c->endpoint;
        o.client_name = "aqua-engine";
        r = aqua_open(c->device, AQUA_ROLE_CONSUMER, &o, &a->ctx);
        if (r < 0) {
                free(a);
                return r;
        }
        /* Borrow first: the tensor takes the chunk size of the pool. */
        r = borrow(a, c->allow_dram);
        if (r >= 0)
                r = aqua_tensor_new(a->ctx, TENSOR_MAX_BYTES, &to, &a->tensor);
        if (r >= 0)
                r = aqua_tensor_get_info(a->ctx, a->tensor, &ti);
        if (r < 0) {
                aq_free(a);
                return r;
        }
        a->dptr = ti.dptr;
        a->chunk_bytes = ti.chunk_bytes;
        *ret = (struct kv_swap){&aqua_ops, a};
        return 0;
}

int kv_swap_aqua_stats(const struct kv_swap *s, struct kv_swap_aqua_stats *ret)
{
        if (!s || s->ops != &aqua_ops || !ret)
                return -EINVAL;
        *ret = ((const struct aq *)s->ctx)->st;
        return 0;
}

bool kv_swap_aqua_take_reclaimed(struct kv_swap *s)
{
        if (!s || s->ops != &aqua_ops)
                return false;
        struct aq *a = s->ctx;
        bool r = a->reclaimed;
        a->reclaimed = false;
        return r;
}

struct aqua_ctx *kv_swap_aqua_context(struct kv_swap *s)
{
        if (!s || s->ops != &aqua_ops)
                return NULL;
        return ((struct aq *)s->ctx)->ctx;
}
