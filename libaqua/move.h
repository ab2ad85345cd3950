/*
 * Moving chunks off the memory that backs them now (a producer's, on reclaim) into fresh host or
 * local memory, many at once: one staging range, one batched copy, then a remap at the same
 * device address. Used for leases and tensors alike.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "aqua/aqua.h"
#include "gpu.h"

struct move {
        /* in */
        uint64_t at;      /* device address the chunk is mapped at now; read from, remapped */
        uint64_t size;    /* a multiple of the granularity */
        gpu_handle old;   /* mapped at `at`: mapped back there if the new memory cannot be */
        bool local_first; /* try the GPU's own memory before host memory */
        /* out, valid when error == 0 */
        int error;
        enum aqua_tier tier; /* LOCAL or DRAM */
        bool has_handle;     /* the new allocation, now mapped at `at` */
        gpu_handle handle;
        void *host;      /* pinned host memory (no mappable host memory): `at` is unmapped */
        uint64_t staged; /* internal: where the new allocation is mapped for the copy */
};

/*
 * Copy every chunk into a new allocation and map it at its address in place of the old one.
 * The old handles stay the caller's (to release, or to unmap elsewhere first). Chunks whose new
 * memory could not be had keep error < 0 and their old mapping; the rest succeed together.
 * *no_host_map is set once the driver refuses host allocations that can be mapped (then pinned
 * host memory is used, and `at` is left unmapped). Returns 0 (see each error), or a negative
 * errno when the copy failed: then no chunk moved.
 */
int move_out(struct gpu_dev *g, struct move *m, size_t n, bool *no_host_map);

/* Undo what a successful move holds (for callers that drop the result). */
void move_free(struct gpu_dev *g, struct move *m);

/*
 * Merge pieces that continue each other (dst and src both contiguous) in place; returns the new
 * count. Order is kept otherwise.
 */
size_t copy_merge(struct aqua_copy_piece *p, size_t n);
