/*
 * Where preempted requests' KV blocks go: a swap backend interface, the time
 * model for each memory tier, and the host-memory backend that really copies.
 */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum kv_tier {
        KV_TIER_PEER, /* a producer GPU's HBM, over NVLink */
        KV_TIER_DRAM, /* host DRAM, over PCIe */
        _KV_TIER_MAX,
        _KV_TIER_INVALID = -EINVAL,
};

const char *kv_tier_to_string(enum kv_tier t);
enum kv_tier kv_tier_from_string(const char *s);

/*
 * Simulated cost of one batched transfer on a tier: a fixed per-call cost plus
 * bytes over bandwidth. Defaults from the measurements in the design notes:
 * NVLink 4 ~370 GB/s per direction, PCIe Gen5 host DMA ~50 GB/s, ~3 us a call.
 */
struct kv_tier_cost {
        double gbytes_per_s;
        uint64_t call_ns;
};

void kv_tier_cost_defaults(struct kv_tier_cost cost[_KV_TIER_MAX]);
uint64_t kv_tier_cost_ns(const struct kv_tier_cost *c, uint64_t bytes);

/* A 64-bit hash of n blocks of block_bytes each, in order: what integrity checks compare. */
uint64_t kv_checksum(void *const *blocks, size_t n, size_t block_bytes);

/*
 * The checksum of a slot written layer by layer: each block is n_layers segments of
 * block_bytes / n_layers (layer-major), and the slot's hash is the sum of each segment's hash
 * keyed by its position (block * n_layers + layer), so layers may be written in any order.
 * kv_segment_hash() is one term; kv_layered_checksum() the whole over n blocks.
 */
uint64_t kv_segment_hash(uint64_t index, const void *segment, size_t bytes);
uint64_t kv_layered_checksum(void *const *blocks, size_t n, size_t block_bytes, unsigned n_layers);

/*
 * A swap backend. ctx is the backend's own state. The engine hands it the
 * local memory of a request's blocks as an array of pointers, so one call
 * moves all of them (a batched copy), never one call per block.
 *
 * swap_out: copy n blocks of block_bytes away. On success *ret_slot names the
 *   copy (owned by the backend until swap_in or discard) and *ret_tier says
 *   where it went; the local blocks may be reused as soon as it returns.
 *   -ENOSPC when the backend is full.
 * swap_in: copy the slot's blocks into blocks (same n and block_bytes as at
 *   swap_out) and release the slot. -EIO when the bytes no longer match what
 *   was swapped out (the backend checks); the slot is released anyway.
 * discard: release a slot without copying (its request went away). NULL-safe.
 * tier_of: where the slot's bytes are now; a backend may move them between
 *   tiers in poll().
 * poll: the engine calls it once per iteration at a safe point (no copy of
 *   its own in flight). Returns >= 0 or a negative errno. May be NULL.
 * free: release the backend; every slot must have been swapped in or discarded.
 *
 * Layer-wise slots (LayerKV: a prefill's KV goes out layer by layer as each layer is computed),
 * optional (NULL in a backend without them):
 * reserve: a slot for n blocks of block_bytes, each n_layers segments of block_bytes / n_layers
 *   (layer-major), nothing written yet; *ret_tier as for swap_out. -ENOSPC when full.
 * write_layer: copy segment `layer` of the slot's blocks [first, first + m) from src[0..m) (each
 *   src[i] points at one segment). The copy may still run when it returns: src may be reused
 *   once the next write_layer() or seal() has returned (one layer in flight, as an offload
 *   stream overlapping the next layer's compute).
 * seal: every layer written; waits for copies in flight. The slot then behaves as one from
 *   swap_out (swap_in checks the layered checksum of what arrives).
 */
struct kv_swap_ops {
        const char *name;
        int (*swap_out)(void *ctx, void *const *blocks, size_t n, size_t block_bytes,
                        void **ret_slot, enum kv_tier *ret_tier);
        int (*swap_in)(void *ctx, void *slot, void *const *blocks, size_t n, size_t block_bytes);
        void (*discard)(void *ctx, void *slot);
        enum kv_tier (*tier_of)(void *ctx, void *slot);
        int (*poll)(void *ctx);
        void (*free)(void *ctx);
        int (*reserve)(void *ctx, size_t n, size_t block_bytes, unsigned n_layers, void **ret_slot,
                       enum kv_tier *ret_tier);
        int (*write_layer)(void *ctx, void *slot, unsigned layer, size_t first, void *const *src,
                           size_t m);
        int (*seal)(void *ctx, void *slot);
};

struct kv_swap {
        const struct kv_swap_ops *ops;
        void *ctx;
};

void kv_swap_free(struct kv_swap *s);

/*
 * The host-memory backend: every slot is a malloc'd copy plus its checksum.
 * tier is the tier it stands in for in the time model (the bytes are always
 * in host memory); capacity_bytes bounds what it holds at once (0: no bound).
 */
int kv_swap_host_new(enum kv_tier tier, uint64_t capacity_bytes, struct kv_swap *ret);

/* What the host backend holds right now, for tests and reports. */
struct kv_swap_host_stats {
        size_t slots;
        uint64_t bytes;
        uint64_t checksum_failures;
};
int kv_swap_host_stats(const struct kv_swap *s, struct kv_swap_host_stats *ret);
/* Fault injection for tests: flip one bit of a slot's kept copy. -EINVAL out of range. */
int kv_swap_host_corrupt(struct kv_swap *s, void *slot, size_t offset);

/*
 * The aqua backend (kvswap-aqua.c): the consumer side of aqua. It borrows a
 * tensor pool (peer GPU memory) through libaqua and keeps swapped blocks in
 * one aqua tensor, whose chunks libaqua places in the pool while it has room
 * and in DRAM (within the daemon's budget) otherwise. A reclaim moves chunks
 * to DRAM at the same addresses inside poll() (aqua_poll() at the engine's
 * safe point); the slots in them answer KV_TIER_DRAM from then on. When a
 * producer offers again, a new borrow and aqua_tensor_promote() bring them
 * back. Copies are libaqua's batched copies; without room in the tensor a
 * slot is host memory. Every swap-in is checked against the swap-out checksum.
 */
struct kv_swap_aqua_config {
        const char *endpoint;  /* aquad's endpoint; NULL: $AQUA_ENDPOINT or libaqua's default */
        int device;            /* the consumer's CUDA device ordinal */
        uint64_t borrow_bytes; /* memory to ask for (now, and again once no peer room is left) */
        bool allow_dram;       /* the first borrow may make up what peers lack with DRAM budget */
        uint64_t retry_ns;     /* wall time between borrow attempts while no peer room is left */
};

void kv_swap_aqua_config_defaults(struct kv_swap_aqua_config *c);

/*
 * Connect to aquad as a consumer and borrow. A daemon with nothing to lend is
 * no error: slots go to DRAM until a borrow succeeds. Errors from aqua_open()
 * (-ECONNREFUSED, -ENOENT, -ELIBACC, ...) are passed up.
 */
int kv_swap_aqua_new(const struct kv_swap_aqua_config *c, struct kv_swap *ret);

/* What the aqua backend did so far, and holds now. */
struct kv_swap_aqua_stats {
        uint64_t leases;         /* leases granted */
        uint64_t lent_bytes;     /* peer bytes granted over all leases */
        uint64_t peer_bytes;     /* peer memory mapped now */
        uint64_t migrated_bytes; /* lease memory a reclaim moved to DRAM */
        uint64_t slots_migrated; /* swapped requests whose KV a reclaim moved to DRAM */
        uint64_t slot_bytes_migrated;
        uint64_t slots_promoted;         /* swapped requests moved back to peer memory */
        uint64_t dram_budget;            /* DRAM budget the daemon granted */
        uint64_t slots_peer, slots_dram; /* live slots by tier */
        uint64_t bytes_peer, bytes_dram; /* their KV bytes */
        uint64_t peak_bytes_peer, peak_bytes_dram;
        uint64_t verified_swap_ins[_KV_TIER_MAX]; /* swap-ins whose checksum matched, by tier */
        uint64_t checksum_failures;
        uint64_t copies;           /* batched copies issued (one per swap-out or swap-in) */
        uint64_t copy_pieces;      /* contiguous pieces in them */
        uint64_t layer_offloads;   /* aqua_layers_offload() calls (LayerKV prefill) */
        uint64_t layer_prefetches; /* aqua_layers_prefetch() calls (before decode) */
};
int kv_swap_aqua_stats(const struct kv_swap *s, struct kv_swap_aqua_stats *ret);

/* Whether a reclaim moved memory since the last call (clears it): for demos that wait for one. */
bool kv_swap_aqua_take_reclaimed(struct kv_swap *s);

/* The backend's libaqua context, for callers that keep tensors of their own beside its slots (they
 * share its leases, and its poll() handles their reclaims too); NULL for another backend. */
struct aqua_ctx;
struct aqua_ctx *kv_swap_aqua_context(struct kv_swap *s);
