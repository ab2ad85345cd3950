/*
 * The consumer's leases: each one address range on the consumer's GPU with a table of chunks,
 * every chunk backed by a producer's memory (imported and mapped) or, after a reclaim, by host
 * memory. A tensor-pool lease (AQUA_BORROW_TENSORS) lends its chunks to aqua tensors instead:
 * each chunk is free or used by one tensor chunk, and a reclaim gives it back (tier NONE).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "aqua/aqua.h"
#include "gpu.h"
#include "idmap.h"
#include "move.h"

struct lease_chunk {
        uint64_t id;
        uint64_t offset; /* in the lease's range */
        uint64_t size;
        enum aqua_tier tier;
        bool has_handle; /* PEER: the imported handle; DRAM: a mappable host allocation */
        gpu_handle handle;
        bool mapped; /* at lease.dptr + offset */
        void *host;  /* DRAM without a mappable allocation: pinned host memory */
        /* Tensor-pool leases: the tensor chunk this chunk backs, NULL when free. */
        struct aqua_tensor *user;
        size_t user_index;
};

struct aqua_lease {
        struct aqua_lease *next, *prev;
        uint64_t id;
        uint64_t dptr;
        uint64_t size;
        uint64_t peer_bytes;
        uint64_t dram_bytes;
        bool tensor_pool; /* AQUA_BORROW_TENSORS: its chunks back tensors; the range is internal */
        size_t n_free;    /* pool: PEER chunks with no user */
        size_t n_chunks;
        struct lease_chunk chunks[];
};

struct lease_table {
        struct aqua_lease *head;
        struct idmap by_id;
        struct idmap chunk_by_id; /* chunk id -> struct lease_chunk */
        bool no_host_map;         /* the driver cannot map host allocations: use pinned memory */
        uint64_t peer_bytes;
        uint64_t dram_bytes;
        uint64_t pool_free_bytes;
};

struct lease_grant_chunk {
        uint64_t id;
        uint64_t size;
        int fd;
        const uint8_t *fabric; /* a fabric handle (GPU_FABRIC_HANDLE_LEN bytes) instead of fd */
        bool unusable; /* set by lease_create(): the driver refused to import fd */
};

/*
 * Import n chunks (fds stay the caller's), reserve one range for all of them, map them back to
 * back and grant g access. On failure nothing is left behind. Returns 0, -EIO (chunks whose
 * descriptor could not be imported are marked unusable), -ENOMEM.
 */
int lease_create(struct lease_table *t, struct gpu_dev *g, uint64_t lease_id,
                 struct lease_grant_chunk *chunks, size_t n, bool tensor_pool,
                 struct aqua_lease **ret);

struct aqua_lease *lease_get(const struct lease_table *t, uint64_t id);
bool lease_valid(const struct lease_table *t, const struct aqua_lease *l);
struct lease_chunk *lease_chunk_by_id(const struct lease_table *t, uint64_t chunk_id);

/*
 * Move a PEER chunk's bytes to host memory and let go of the producer's memory: at the same
 * device address where the driver maps host allocations, else in pinned host memory (the
 * range is then unmapped there). Returns 0 or a negative errno with the chunk untouched.
 */
int lease_migrate(struct lease_table *t, struct gpu_dev *g, struct aqua_lease *l,
                  struct lease_chunk *c);

/* What move_out() needs to move chunk c of a plain lease off its producer. */
void lease_move_prepare(const struct aqua_lease *l, const struct lease_chunk *c, struct move *m);
/* Take the result of a successful move of c: its new backing, counters; the peer handle goes. */
void lease_moved(struct lease_table *t, struct gpu_dev *g, struct aqua_lease *l,
                 struct lease_chunk *c, struct move *m);

/* A pool chunk goes back to its producer: unmap and release it (its user must be gone). */
void lease_chunk_give_back(struct lease_table *t, struct gpu_dev *g, struct aqua_lease *l,
                           struct lease_chunk *c);

/* Pool chunks: the first free one of `size` in any pool lease, or NULL; take it and let it go. */
struct lease_chunk *lease_tensor_pool_find(struct lease_table *t, uint64_t size,
                                           struct aqua_lease **ret_lease);
void lease_chunk_use(struct lease_table *t, struct aqua_lease *l, struct lease_chunk *c,
                     struct aqua_tensor *user, size_t index);
void lease_chunk_unuse(struct lease_table *t, struct aqua_lease *l, struct lease_chunk *c);
/* Whether a tensor uses any chunk of l. */
bool lease_in_use(const struct aqua_lease *l);

/* Unmap and release everything of l, remove it and free it. */
void lease_table_remove(struct lease_table *t, struct gpu_dev *g, struct aqua_lease *l);
void lease_table_clear(struct lease_table *t, struct gpu_dev *g);
