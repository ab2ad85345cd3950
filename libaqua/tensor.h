/*
 * Aqua tensors: one reserved device range per tensor, a table of chunks each backed by a leased
 * peer chunk, local GPU memory or host DRAM, mapped on demand and released at either end.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "aqua/aqua.h"
#include "gpu.h"
#include "lease.h"

struct tensor_chunk {
        enum aqua_tier tier; /* NONE: not mapped */
        bool mapped;         /* at dptr + index * chunk_bytes (not so for pinned host memory) */
        bool own_handle;     /* LOCAL, and DRAM that can be mapped: our allocation */
        gpu_handle handle;
        struct aqua_lease *lease; /* PEER: the pool lease and its chunk backing this one */
        struct lease_chunk *lc;
        void *host; /* DRAM in pinned host memory */
};

struct aqua_tensor {
        struct aqua_tensor *next, *prev;
        uint64_t dptr, max_bytes, chunk_bytes;
        size_t head, tail; /* the window: chunks [head, tail) are mapped */
        enum aqua_tier want;
        unsigned flags;
        uint64_t bytes[4]; /* per tier */
        size_t n_chunks;
        struct tensor_chunk chunks[];
};

struct move;
/* Free every tensor of the context (aqua_close). */
void tensor_free_all(aqua_ctx *ctx);
/* What move_out() needs to move tensor chunk i (backed by a leased chunk) off its producer. */
void tensor_move_prepare(const struct aqua_tensor *t, size_t i, struct move *m);
/* Take the new backing of chunk i; its leased chunk is the caller's to give back. */
void tensor_moved(aqua_ctx *ctx, struct aqua_tensor *t, size_t i, const struct move *m);
