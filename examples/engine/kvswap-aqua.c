/*
 * The aqua swap backend: swapped KV blocks live in GPU memory borrowed from a producer through
 * libaqua, move to DRAM with it when the producer reclaims, and go to host memory without a lease.
 *
 * Leases are raw mappings from aqua_borrow(): a range of chunks, each cut into blocks of the
 * engine's block size. Copies address a chunk's bytes where libaqua says they are (the device
 * range, or a host copy after a reclaim where host memory could not be mapped in). They are
 * plain memcpy, which needs device memory the CPU can address: simcuda's, not a real GPU's.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "aqua/aqua.h"
#include "kvswap.h"
#include "log.h"
#include "parse-util.h"
#include "time-util.h"
#include "util.h"

struct aq_lease;

struct aq_chunk {
        struct aq_lease *lease;
        uint64_t offset, bytes;
        enum aqua_tier tier;
        uint8_t *base; /* where its bytes are now */
        uint32_t n_blocks, n_free;
        uint32_t *free; /* stack of free block indices */
};

struct aq_lease {
        aqua_lease *lease;
        uint64_t id, dptr, bytes;
        size_t n_chunks;
        struct aq_chunk *chunks;
        uint64_t used_blocks;
        struct aq_lease *next;
};

struct aq_ref {
        struct aq_chunk *chunk;
        uint32_t block;
};

struct aq_slot {
        size_t n, block_bytes;
        uint64_t checksum;
        enum kv_tier tier;
        uint8_t *host; /* a host buffer when no lease had room; else refs[] */
        struct aq_slot *prev, *next;
        struct aq_ref refs[];
};

struct piece {
        const uint8_t *src;
        uint8_t *dst;
        size_t len;
};

struct aq {
        struct kv_swap_aqua_config cfg;
        aqua_ctx *ctx;
        struct aq_lease *leases;
        struct aq_slot *slots;
        size_t block_bytes; /* 0 until the first swap-out */
        uint64_t free_blocks[_KV_TIER_MAX];
        uint64_t last_borrow_ns;
        int last_borrow_result;
        bool reclaimed;
        struct piece *pieces;
        size_t pieces_allocated;
        struct kv_swap_aqua_stats st;
};

static const char *sz(char *buf, size_t n, uint64_t bytes)
{
        return format_size(buf, n, bytes);
}

void kv_swap_aqua_config_defaults(struct kv_swap_aqua_config *c)
{
        *c = (struct kv_swap_aqua_config){
            .device = 0,
            .borrow_bytes = UINT64_C(1) << 30,
            .allow_dram = true,
            .retry_ns = NSEC_PER_SEC,
        };
}

static enum kv_tier tier_of_chunk(const struct aq_chunk *c)
{
        return c->tier == AQUA_TIER_PEER ? KV_TIER_PEER : KV_TIER_DRAM;
}

/* Read where chunk i of l is now from libaqua; keeps the free-block counts by tier right. */
static int chunk_refresh(struct aq *a, struct aq_lease *l, size_t i)
{
        struct aq_chunk *c = &l->chunks[i];
        struct aqua_chunk_info ci;
        int r;

        r = aqua_lease_get_chunk(a->ctx, l->lease, i, &ci);
        if (r < 0)
                return r;
        a->free_blocks[tier_of_chunk(c)] -= c->n_free;
        c->offset = ci.offset;
        c->bytes = ci.bytes;
        c->tier = ci.tier;
        c->base = ci.host ? ci.host : (uint8_t *)(uintptr_t)(l->dptr + ci.offset);
        a->free_blocks[tier_of_chunk(c)] += c->n_free;
        return 0;
}

/* Cut a chunk into blocks once the block size is known. */
static int chunk_blocks(struct aq *a, struct aq_chunk *c)
{
        if (c->free || a->block_bytes == 0)
                return 0;
        c->n_blocks = (uint32_t)MIN(c->bytes / a->block_bytes, (uint64_t)UINT32_MAX);
        c->free = calloc(MAX(c->n_blocks, 1u), sizeof(*c->free));
        if (!c->free)
                return -ENOMEM;
        /* Lowest blocks on top: the first slots sit at the start of the lease. */
        for (uint32_t b = 0; b < c->n_blocks; b++)
                c->free[b] = c->n_blocks - 1 - b;
        c->n_free = c->n_blocks;
        a->free_blocks[tier_of_chunk(c)] += c->n_free;
        return 0;
}

static void lease_free(struct aq *a, struct aq_lease *l)
{
        for (size_t i = 0; i < l->n_chunks; i++) {
                a->free_blocks[tier_of_chunk(&l->chunks[i])] -= l->chunks[i].n_free;
                free(l->chunks[i].free);
        }
        free(l->chunks);
        free(l);
}

/*
 * Can the CPU read memory at p? A write(2) from an address the process cannot read fails with
 * EFAULT instead of faulting: true on simcuda, false for a real GPU's device memory.
 */
static bool cpu_addressable(const void *p)
{
        int fd[2];
        bool ok;

        if (pipe2(fd, O_CLOEXEC) < 0)
                return false;
        ok = write(fd[1], p, 1) == 1;
        close(fd[0]);
        close(fd[1]);
        return ok;
}

static int lease_add(struct aq *a, const struct aqua_grant *g)
{
        struct aqua_lease_info li;
        struct aq_lease *l;
        int r;

        r = aqua_lease_get_info(a->ctx, g->lease, &li);
        if (r < 0)
                return r;
        if (!cpu_addressable((const void *)(uintptr_t)li.dptr)) {
                log_error("aqua: this backend copies through the CPU's view of the lease, which "
                          "only simulated GPUs (simcuda) give; a real GPU needs copies by the "
                          "driver");
                return -EOPNOTSUPP;
        }
        l = calloc(1, sizeof(*l));
        if (!l)
                return -ENOMEM;
        l->chunks = calloc(MAX(li.n_chunks, (size_t)1), sizeof(*l->chunks));
        if (!l->chunks) {
                free(l);
                return -ENOMEM;
        }
        l->lease = g->lease;
        l->id = li.lease_id;
        l->dptr = li.dptr;
        l->bytes = li.bytes;
        l->n_chunks = li.n_chunks;
        for (size_t i = 0; i < l->n_chunks && r >= 0; i++) {
                l->chunks[i].lease = l;
                l->chunks[i].tier = AQUA_TIER_PEER;
                r = chunk_refresh(a, l, i);
                if (r >= 0)
                        r = chunk_blocks(a, &l->chunks[i]);
        }
        if (r < 0) {
                lease_free(a, l);
                return r;
        }
        l->next = a->leases;
        a->leases = l;
        a->st.leases++;
        a->st.lent_bytes += li.peer_bytes;
        a->st.peer_bytes += li.peer_bytes;
        return 0;
}

/* Ask aquad for memory; a refusal is an expected outcome, logged when it changes. */
static int borrow(struct aq *a, bool allow_dram)
{
        struct aqua_grant g;
        char b1[32], b2[32];
        int r;

        a->last_borrow_ns = now_mono_ns();
        r = aqua_borrow(a->ctx, a->cfg.borrow_bytes, 0, allow_dram ? AQUA_BORROW_ALLOW_DRAM : 0,
                        &g);
        if (r != 0) {
                if (r != a->last_borrow_result)
                        log_info("aqua: nothing to borrow now (%s); slots go to DRAM",
                                 aqua_strerror(r));
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
        r = lease_add(a, &g);
        if (r < 0) {
                aqua_return(a->ctx, g.lease);
                return r;
        }
        log_info("aqua: borrowed %s of peer memory (lease %" PRIu64 ", mapped at 0x%" PRIx64
                 ")%s%s",
                 sz(b1, sizeof(b1), g.bytes), a->leases->id, g.dptr,
                 g.dram_bytes ? ", DRAM budget " : "",
                 g.dram_bytes ? sz(b2, sizeof(b2), g.dram_bytes) : "");
        return 0;
}

int kv_swap_aqua_stats(const struct kv_swap *s, struct kv_swap_aqua_stats *ret);

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

static void *ref_addr(const struct aq *a, const struct aq_ref *r)
{
        return r->chunk->base + (size_t)r->block * a->block_bytes;
}

static enum kv_tier slot_tier(const struct aq_slot *s)
{
        if (s->host)
                return KV_TIER_DRAM;
        for (size_t i = 0; i < s->n; i++)
                if (s->refs[i].chunk->tier != AQUA_TIER_PEER)
                        return KV_TIER_DRAM;
        return KV_TIER_PEER;
}

/* Take n blocks from lease chunks, peer first; false (nothing taken) when they do not fit. */
static bool take_blocks(struct aq *a, struct aq_slot *s, size_t n)
{
        size_t k = 0;

        if (a->free_blocks[KV_TIER_PEER] + a->free_blocks[KV_TIER_DRAM] < n)
                return false;
        for (int want = KV_TIER_PEER; want < _KV_TIER_MAX && k < n; want++)
                for (struct aq_lease *l = a->leases; l && k < n; l = l->next)
                        for (size_t i = 0; i < l->n_chunks && k < n; i++) {
                                struct aq_chunk *c = &l->chunks[i];
                                if (tier_of_chunk(c) != want)
                                        continue;
                                while (c->n_free > 0 && k < n) {
                                        s->refs[k++] = (struct aq_ref){c, c->free[--c->n_free]};
                                        a->free_blocks[want]--;
                                        l->used_blocks++;
                                }
                        }
        return true;
}

static void release_blocks(struct aq *a, struct aq_slot *s)
{
        if (s->host)
                return;
        for (size_t i = 0; i < s->n; i++) {
                struct aq_chunk *c = s->refs[i].chunk;
                c->free[c->n_free++] = s->refs[i].block;
                a->free_blocks[tier_of_chunk(c)]++;
                c->lease->used_blocks--;
        }
}

/*
 * One batched copy: the pieces in order, contiguous neighbours merged. The memcpy stands in for
 * one cuMemcpyBatchAsync over the merged pieces.
 */
static void copy_batch(struct aq *a, size_t n)
{
        size_t k = 0;

        for (size_t i = 0; i < n; i++) {
                struct piece *p = &a->pieces[i];
                if (k > 0) {
                        struct piece *q = &a->pieces[k - 1];
                        if (q->src + q->len == p->src && q->dst + q->len == p->dst) {
                                q->len += p->len;
                                continue;
                        }
                }
                a->pieces[k++] = *p;
        }
        for (size_t i = 0; i < k; i++)
                memcpy(a->pieces[i].dst, a->pieces[i].src, a->pieces[i].len);
        a->st.copies++;
        a->st.copy_pieces += k;
}

static int pieces_reserve(struct aq *a, size_t n)
{
        if (n <= a->pieces_allocated)
                return 0;
        struct piece *p = reallocarray(a->pieces, n, sizeof(*p));
        if (!p)
                return -ENOMEM;
        a->pieces = p;
        a->pieces_allocated = n;
        return 0;
}

static int aq_swap_out(void *ctx, void *const *blocks, size_t n, size_t block_bytes,
                       void **ret_slot, enum kv_tier *ret_tier)
{
        struct aq *a = ctx;
        struct aq_slot *s;
        size_t bytes;
        int r;

        if (n == 0 || block_bytes == 0 || size_mul_overflows(n, block_bytes, &bytes))
                return -EINVAL;
        if (a->block_bytes == 0) {
                a->block_bytes = block_bytes;
                for (struct aq_lease *l = a->leases; l; l = l->next)
                        for (size_t i = 0; i < l->n_chunks; i++) {
                                r = chunk_blocks(a, &l->chunks[i]);
                                if (r < 0)
                                        return r;
                        }
        }
        if (block_bytes != a->block_bytes)
                return -EINVAL;
        r = pieces_reserve(a, n);
        if (r < 0)
                return r;
        s = calloc(1, sizeof(*s) + n * sizeof(s->refs[0]));
        if (!s)
                return -ENOMEM;
        s->n = n;
        s->block_bytes = block_bytes;
        if (!take_blocks(a, s, n)) {
                s->host = malloc(bytes);
                if (!s->host) {
                        free(s);
                        return -ENOMEM;
                }
        }
        s->checksum = kv_checksum(blocks, n, block_bytes);
        for (size_t i = 0; i < n; i++)
                a->pieces[i] = (struct piece){
                    blocks[i], s->host ? s->host + i * block_bytes : ref_addr(a, &s->refs[i]),
                    block_bytes};
        copy_batch(a, n);

        s->tier = slot_tier(s);
        slot_account(a, s, true);
        s->next = a->slots;
        if (a->slots)
                a->slots->prev = s;
        a->slots = s;
        *ret_slot = s;
        *ret_tier = s->tier;
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
        bool ok;

        if (!s || n != s->n || block_bytes != s->block_bytes)
                return -EINVAL;
        for (size_t i = 0; i < n; i++)
                a->pieces[i] =
                    (struct piece){s->host ? s->host + i * block_bytes : ref_addr(a, &s->refs[i]),
                                   blocks[i], block_bytes};
        copy_batch(a, n);
        /* The copy that arrived is what the engine reads: check that one. */
        ok = kv_checksum(blocks, n, block_bytes) == s->checksum;
        tier = s->tier;
        slot_drop(a, s);
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

static struct aq_lease *lease_find(struct aq *a, const aqua_lease *lease)
{
        for (struct aq_lease *l = a->leases; l; l = l->next)
                if (l->lease == lease)
                        return l;
        return NULL;
}

/* Chunks of l in [offset, offset + bytes) moved (or everything, bytes == 0): re-read them. */
static int lease_moved(struct aq *a, struct aq_lease *l, uint64_t offset, uint64_t bytes,
                       uint64_t *slots, uint64_t *slot_bytes)
{
        int r;

        for (size_t i = 0; i < l->n_chunks; i++) {
                struct aq_chunk *c = &l->chunks[i];
                if (bytes && (c->offset + c->bytes <= offset || c->offset >= offset + bytes))
                        continue;
                bool was_peer = c->tier == AQUA_TIER_PEER;
                r = chunk_refresh(a, l, i);
                if (r < 0)
                        return r;
                if (was_peer && c->tier != AQUA_TIER_PEER)
                        a->st.peer_bytes -= MIN(c->bytes, a->st.peer_bytes);
        }
        /* Requests swapped out into those chunks are in DRAM now. */
        for (struct aq_slot *s = a->slots; s; s = s->next) {
                if (s->tier != KV_TIER_PEER || slot_tier(s) == KV_TIER_PEER)
                        continue;
                slot_account(a, s, false);
                s->tier = KV_TIER_DRAM;
                slot_account(a, s, true);
                (*slots)++;
                *slot_bytes += (uint64_t)s->n * s->block_bytes;
        }
        return 0;
}

/* A lease wholly in DRAM with nothing in it holds host memory for nobody: give it back. */
static void return_empty_leases(struct aq *a)
{
        for (struct aq_lease **p = &a->leases; *p;) {
                struct aq_lease *l = *p;
                bool peer = false;
                for (size_t i = 0; i < l->n_chunks; i++)
                        peer = peer || l->chunks[i].tier == AQUA_TIER_PEER;
                if (peer || l->used_blocks > 0 || a->block_bytes == 0) {
                        p = &l->next;
                        continue;
                }
                *p = l->next;
                log_info("aqua: lease %" PRIu64 " is all in DRAM and empty: returned", l->id);
                aqua_return(a->ctx, l->lease);
                lease_free(a, l);
        }
}

static int aq_poll(void *ctx)
{
        struct aq *a = ctx;
        struct aqua_event ev[16];
        uint64_t moved = 0, slots = 0, slot_bytes = 0;
        size_t n;
        int r;

        do {
                r = aqua_poll(a->ctx, ev, ARRAY_SIZE(ev), &n);
                if (r < 0)
                        return r;
                for (size_t i = 0; i < n; i++) {
                        struct aq_lease *l = ev[i].lease ? lease_find(a, ev[i].lease) : NULL;
                        switch (ev[i].type) {
                        case AQUA_EVENT_MIGRATED:
                        case AQUA_EVENT_LEASE_LOST:
                                if (!l)
                                        break;
                                r = lease_moved(a, l, ev[i].offset,
                                                ev[i].type == AQUA_EVENT_MIGRATED ? ev[i].bytes : 0,
                                                &slots, &slot_bytes);
                                if (r < 0)
                                        return r;
                                moved += ev[i].bytes;
                                if (ev[i].type == AQUA_EVENT_LEASE_LOST)
                                        log_warning("aqua: aquad lost lease %" PRIu64
                                                    "; its data was moved to DRAM",
                                                    l->id);
                                break;
                        case AQUA_EVENT_RECLAIM_FAILED:
                                log_error("aqua: a reclaim could not be honoured: %s",
                                          aqua_strerror(ev[i].error));
                                break;
                        case AQUA_EVENT_DISCONNECTED:
                                log_warning("aqua: lost aquad; leases stay mapped");
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
                }
        } while (n == ARRAY_SIZE(ev));

        if (moved > 0) {
                char b1[32], b2[32];
                a->st.migrated_bytes += moved;
                a->st.slots_migrated += slots;
                a->st.slot_bytes_migrated += slot_bytes;
                a->reclaimed = true;
                log_info("aqua: reclaim: libaqua moved %s of leased memory to DRAM at the same "
                         "addresses; %" PRIu64 " swapped requests (%s of KV) are in DRAM now",
                         sz(b1, sizeof(b1), moved), slots, sz(b2, sizeof(b2), slot_bytes));
        }
        return_empty_leases(a);

        /* Out of peer room: ask again now and then (the producer may offer again). */
        bool room = a->block_bytes ? a->free_blocks[KV_TIER_PEER] > 0 : a->st.peer_bytes > 0;
        if (!room && now_mono_ns() - a->last_borrow_ns >= a->cfg.retry_ns) {
                r = borrow(a, false);
                if (r < 0)
                        return r;
        }
        return 0;
}

static void aq_free(void *ctx)
{
        struct aq *a = ctx;

        if (!a)
                return;
        while (a->slots)
                slot_drop(a, a->slots);
        while (a->leases) {
                struct aq_lease *l = a->leases;
                a->leases = l->next;
                aqua_return(a->ctx, l->lease);
                lease_free(a, l);
        }
        if (a->st.dram_budget > 0)
                aqua_return_dram(a->ctx, a->st.dram_budget);
        aqua_close(a->ctx);
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
};

static void aqua_log(enum aqua_log_level level, const char *message, void *userdata)
{
        log_internal(level == AQUA_LOG_ERROR     ? LOG_LEVEL_ERROR
                     : level == AQUA_LOG_WARNING ? LOG_LEVEL_WARNING
                     : level == AQUA_LOG_NOTICE  ? LOG_LEVEL_NOTICE
                     : level == AQUA_LOG_INFO    ? LOG_LEVEL_INFO
                                                 : LOG_LEVEL_DEBUG,
                     0, "libaqua: %s", message);
}

int kv_swap_aqua_new(const struct kv_swap_aqua_config *c, struct kv_swap *ret)
{
        struct aqua_options o = AQUA_OPTIONS_INIT;
        struct aq *a;
        int r;

        if (!c || !ret || c->borrow_bytes == 0)
                return -EINVAL;
        a = calloc(1, sizeof(*a));
        if (!a)
                return -ENOMEM;
        a->cfg = *c;
        aqua_set_log(aqua_log, NULL, AQUA_LOG_WARNING);
        o.endpoint = c->endpoint;
        o.client_name = "aqua-engine";
        r = aqua_open(c->device, AQUA_ROLE_CONSUMER, &o, &a->ctx);
        if (r < 0) {
                free(a);
                return r;
        }
        r = borrow(a, c->allow_dram);
        if (r < 0) {
                aq_free(a);
                return r;
        }
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
