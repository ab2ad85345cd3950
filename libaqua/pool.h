/*
 * The producer's chunk table: every exportable allocation libaqua made on the producer's GPU,
 * from allocation through the daemon's pool until it is released again.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "gpu.h"
#include "idmap.h"

enum pool_state {
        POOL_OFFERING,   /* allocated, offer sent, no daemon id yet */
        POOL_OFFERED,    /* in the daemon's pool (possibly leased to a consumer) */
        POOL_RECLAIMING, /* asked back; waiting for the daemon to say it is free */
};

struct pool_chunk {
        uint64_t ref; /* our reference (ChunkOffer.client_ref) */
        uint64_t id;  /* the daemon's chunk id; 0 until the offer is answered */
        uint64_t size;
        gpu_handle handle;
        enum pool_state state;
        /* Token of the blocking aqua_reclaim() waiting for this chunk; 0: report as an event. */
        uint64_t waiter;
        /* Its offer is a call in progress: if the session is lost meanwhile, the caller (not
         * the session) releases it. */
        bool in_call;
        size_t index; /* in pool.chunks */
};

struct pool {
        struct pool_chunk **chunks;
        size_t n, cap;
        struct idmap by_id;
        uint64_t last_ref;
        uint64_t offered_bytes; /* OFFERED or RECLAIMING */
};

/* Allocate an exportable chunk of size bytes on g and add it (state OFFERING). */
int pool_alloc(struct pool *p, struct gpu *g, uint64_t size, struct pool_chunk **ret);
/* Record the daemon's id: the chunk is OFFERED. */
int pool_set_id(struct pool *p, struct pool_chunk *c, uint64_t id);
struct pool_chunk *pool_get(const struct pool *p, uint64_t id);
/* Release the chunk's memory on g and forget it. */
void pool_release(struct pool *p, struct gpu *g, struct pool_chunk *c);
/* Release everything. */
void pool_clear(struct pool *p, struct gpu *g);
