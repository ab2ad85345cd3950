/*
 * Where preempted requests' KV blocks go: a swap backend interface, the time
 * model for each memory tier, and the host-memory backend that really copies.
 */
#include <stdlib.h>
#include <string.h>

#include "kvswap.h"
#include "example-util.h"

static const char *const tier_names[_KV_TIER_MAX] = {
    [KV_TIER_PEER] = "peer",
    [KV_TIER_DRAM] = "dram",
};

const char *kv_tier_to_string(enum kv_tier t)
{
        return t >= 0 && t < _KV_TIER_MAX ? tier_names[t] : NULL;
}

enum kv_tier kv_tier_from_string(const char *s)
{
        for (int i = 0; i < _KV_TIER_MAX; i++)
                if (s && strcmp(s, tier_names[i]) == 0)
                        return i;
        return _KV_TIER_INVALID;
}

void kv_tier_cost_defaults(struct kv_tier_cost cost[_KV_TIER_MAX])
{
        cost[KV_TIER_PEER] = (struct kv_tier_cost){.gbytes_per_s = 370.0, .call_ns = 3000};
        cost[KV_TIER_DRAM] = (struct kv_tier_cost){.gbytes_per_s = 50.0, .call_ns = 3000};
}

uint64_t kv_tier_cost_ns(const struct kv_tier_cost *c, uint64_t bytes)
{
        if (bytes == 0)
                return 0;
        /* GB/s is bytes per ns. */
        return c->call_ns + (uint64_t)((double)bytes / c->gbytes_per_s);
}

static inline uint64_t mix(uint64_t h, uint64_t w)
{
        h ^= w * UINT64_C(0x9e3779b97f4a7c15);
        return ((h << 31) | (h >> 33)) * UINT64_C(0x100000001b3);
}

uint64_t kv_checksum(void *const *blocks, size_t n, size_t block_bytes)
{
        /*
         * Word at a time in four independent lanes (a multiply-rotate mix in
         * the spirit of FNV/xxhash): integrity checks run on every swap, so a
         * byte loop, or one long dependency chain, would dominate a whole
         * simulated run. Lanes are folded per block, so the result depends on
         * the order of the blocks as well as their bytes.
         */
        uint64_t h = UINT64_C(0xcbf29ce484222325) ^ block_bytes;
        for (size_t i = 0; i < n; i++) {
                const uint8_t *p = blocks[i];
                uint64_t l[4] = {h, h ^ 1, h ^ 2, h ^ 3};
                size_t j = 0;
                for (; j + 32 <= block_bytes; j += 32)
                        for (int k = 0; k < 4; k++) {
                                uint64_t w;
                                memcpy(&w, p + j + 8 * k, 8);
                                l[k] = mix(l[k], w);
                        }
                for (; j + 8 <= block_bytes; j += 8) {
                        uint64_t w;
                        memcpy(&w, p + j, 8);
                        l[0] = mix(l[0], w);
                }
                for (; j < block_bytes; j++)
                        l[1] = (l[1] ^ p[j]) * UINT64_C(0x100000001b3);
                h = mix(mix(mix(mix(h, l[0]), l[1]), l[2]), l[3]);
        }
        return h ^ (h >> 29);
}

uint64_t kv_segment_hash(uint64_t index, const void *segment, size_t bytes)
{
        void *const p[1] = {(void *)segment};
        uint64_t h = mix(kv_checksum(p, 1, bytes), index + 1);
        return h ^ (h >> 31);
}

uint64_t kv_layered_checksum(void *const *blocks, size_t n, size_t block_bytes, unsigned n_layers)
{
        size_t seg = block_bytes / n_layers;
        uint64_t sum = 0;

        for (size_t i = 0; i < n; i++)
                for (unsigned l = 0; l < n_layers; l++)
                        sum += kv_segment_hash((uint64_t)i * n_layers + l,
                                               (const uint8_t *)blocks[i] + l * seg, seg);
        return sum;
}

void kv_swap_free(struct kv_swap *s)
{
        if (s && s->ops) {
                s->ops->free(s->ctx);
                *s = (struct kv_swap){};
        }
}

struct host_slot {
        size_t n, block_bytes;
        unsigned n_layers; /* 0: written whole by swap_out; else by write_layer() */
        uint64_t checksum;
        uint8_t data[];
};

struct host_ctx {
        enum kv_tier tier;
        uint64_t capacity;
        struct kv_swap_host_stats stats;
};

static int host_swap_out(void *ctx, void *const *blocks, size_t n, size_t block_bytes,
                         void **ret_slot, enum kv_tier *ret_tier)
{
        struct host_ctx *h = ctx;
        size_t bytes, total;

        if (n == 0 || block_bytes == 0 || size_mul_overflows(n, block_bytes, &bytes) ||
            size_add_overflows(bytes, sizeof(struct host_slot), &total))
                return -EINVAL;
        if (h->capacity > 0 && h->stats.bytes + bytes > h->capacity)
                return -ENOSPC;

        struct host_slot *s = malloc(total);
        if (!s)
                return -ENOMEM;
        s->n = n;
        s->block_bytes = block_bytes;
        s->n_layers = 0;
        for (size_t i = 0; i < n; i++)
                memcpy(s->data + i * block_bytes, blocks[i], block_bytes);
        s->checksum = kv_checksum(blocks, n, block_bytes);

        h->stats.slots++;
        h->stats.bytes += bytes;
        *ret_slot = s;
        *ret_tier = h->tier;
        return 0;
}

static void host_release(struct host_ctx *h, struct host_slot *s)
{
        h->stats.slots--;
        h->stats.bytes -= s->n * s->block_bytes;
        free(s);
}

static int host_swap_in(void *ctx, void *slot, void *const *blocks, size_t n, size_t block_bytes)
{
        struct host_ctx *h = ctx;
        struct host_slot *s = slot;

        if (!s || n != s->n || block_bytes != s->block_bytes)
                return -EINVAL;
        for (size_t i = 0; i < n; i++)
                memcpy(blocks[i], s->data + i * block_bytes, block_bytes);
        /* Check the copy that arrived, not the one kept: that is what the engine will read. */
        uint64_t got = s->n_layers ? kv_layered_checksum(blocks, n, block_bytes, s->n_layers)
                                   : kv_checksum(blocks, n, block_bytes);
        bool ok = got == s->checksum;
        host_release(h, s);
        if (!ok) {
                h->stats.checksum_failures++;
                return -EIO;
        }
        return 0;
}

static void host_discard(void *ctx, void *slot)
{
        if (slot)
                host_release(ctx, slot);
}

static enum kv_tier host_tier_of(void *ctx, void *slot)
{
        return ((struct host_ctx *)ctx)->tier;
}

static int host_reserve(void *ctx, size_t n, size_t block_bytes, unsigned n_layers, void **ret_slot,
                        enum kv_tier *ret_tier)
{
        struct host_ctx *h = ctx;
        size_t bytes, total;

        if (n == 0 || n_layers == 0 || block_bytes == 0 || block_bytes % n_layers != 0 ||
            size_mul_overflows(n, block_bytes, &bytes) ||
            size_add_overflows(bytes, sizeof(struct host_slot), &total))
                return -EINVAL;
        if (h->capacity > 0 && h->stats.bytes + bytes > h->capacity)
                return -ENOSPC;
        struct host_slot *s = calloc(1, total);
        if (!s)
                return -ENOMEM;
        s->n = n;
        s->block_bytes = block_bytes;
        s->n_layers = n_layers;
        h->stats.slots++;
        h->stats.bytes += bytes;
        *ret_slot = s;
        *ret_tier = h->tier;
        return 0;
}

static int host_write_layer(void *ctx, void *slot, unsigned layer, size_t first, void *const *src,
                            size_t m)
{
        struct host_slot *s = slot;

        if (!s || s->n_layers == 0 || layer >= s->n_layers || first > s->n || m > s->n - first)
                return -EINVAL;
        size_t seg = s->block_bytes / s->n_layers;
        for (size_t i = 0; i < m; i++) {
                memcpy(s->data + (first + i) * s->block_bytes + layer * seg, src[i], seg);
                s->checksum += kv_segment_hash((first + i) * s->n_layers + layer, src[i], seg);
        }
        return 0;
}

static int host_seal(void *ctx, void *slot)
{
        return slot ? 0 : -EINVAL;
}

static void host_free(void *ctx)
{
        free(ctx);
}

static const struct kv_swap_ops host_ops = {
    .name = "host",
    .swap_out = host_swap_out,
    .swap_in = host_swap_in,
    .discard = host_discard,
    .tier_of = host_tier_of,
    .poll = NULL,
    .free = host_free,
    .reserve = host_reserve,
    .write_layer = host_write_layer,
    .seal = host_seal,
};

int kv_swap_host_new(enum kv_tier tier, uint64_t capacity_bytes, struct kv_swap *ret)
{
        if (tier < 0 || tier >= _KV_TIER_MAX || !ret)
                return -EINVAL;
        struct host_ctx *h = calloc(1, sizeof(*h));
        if (!h)
                return -ENOMEM;
        h->tier = tier;
        h->capacity = capacity_bytes;
        *ret = (struct kv_swap){&host_ops, h};
        return 0;
}

int kv_swap_host_stats(const struct kv_swap *s, struct kv_swap_host_stats *ret)
{
        if (!s || s->ops != &host_ops)
                return -EINVAL;
        *ret = ((const struct host_ctx *)s->ctx)->stats;
        return 0;
}

int kv_swap_host_corrupt(struct kv_swap *s, void *slot, size_t offset)
{
        struct host_slot *h = slot;
        if (!s || s->ops != &host_ops || !h || offset >= h->n * h->block_bytes)
                return -EINVAL;
        h->data[offset] ^= 0x01;
        return 0;
}
