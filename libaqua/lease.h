/*
 * The consumer's leases: each one address range on the consumer's GPU with a table of chunks,
 * every chunk backed by a producer's memory (imported and mapped) or, after a reclaim, by host
 * memory. This is the chunk view later data-plane modules attach to.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "aqua/aqua.h"
#include "gpu.h"
#include "idmap.h"

struct lease_chunk {
        uint64_t id;
        uint64_t offset; /* in the lease's range */
        uint64_t size;
        enum aqua_tier tier;
        bool has_handle; /* PEER: the imported handle; DRAM: a mappable host allocation */
        gpu_handle handle;
        bool mapped; /* at lease.dptr + offset */
        void *host;  /* DRAM without a mappable allocation: pinned host memory */
};

struct aqua_lease {
        struct aqua_lease *next, *prev;
        uint64_t id;
        uint64_t dptr;
        uint64_t size;
        uint64_t peer_bytes;
        uint64_t dram_bytes;
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
};

struct lease_grant_chunk {
        uint64_t id;
        uint64_t size;
        int fd;
};

/*
 * Import n chunks (fds stay the caller's), reserve one range for all of them, map them back to
 * back and grant g access. On failure nothing is left behind. Returns 0, -EIO, -ENOMEM.
 */
int lease_create(struct lease_table *t, struct gpu *g, uint64_t lease_id,
                 const struct lease_grant_chunk *chunks, size_t n, struct aqua_lease **ret);

struct aqua_lease *lease_get(const struct lease_table *t, uint64_t id);
bool lease_valid(const struct lease_table *t, const struct aqua_lease *l);
struct lease_chunk *lease_chunk_by_id(const struct lease_table *t, uint64_t chunk_id);

/*
 * Move a PEER chunk's bytes to host memory and let go of the producer's memory: at the same
 * device address where the driver maps host allocations, else in pinned host memory (the
 * range is then unmapped there). Returns 0 or a negative errno with the chunk untouched.
 */
int lease_migrate(struct lease_table *t, struct gpu *g, struct aqua_lease *l,
                  struct lease_chunk *c);

/* Unmap and release everything of l, remove it and free it. */
void lease_destroy(struct lease_table *t, struct gpu *g, struct aqua_lease *l);
void lease_table_clear(struct lease_table *t, struct gpu *g);
