/*
 * The producer's offers: every exportable allocation libaqua made on the producer's GPU,
 * from allocation through the daemon's pool until it is released again.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "gpu.h"
#include "idmap.h"

enum offer_state {
        OFFER_OFFERING,   /* allocated, offer sent, no daemon id yet */
        OFFER_OFFERED,    /* in the daemon's pool (possibly leased to a consumer) */
        OFFER_RECLAIMING, /* asked back; waiting for the daemon to say it is free */
};

struct offered_chunk {
        uint64_t ref; /* our reference (ChunkOffer.client_ref) */
        uint64_t id;  /* the daemon's chunk id; 0 until the offer is answered */
        uint64_t size;
        gpu_handle handle;
        enum offer_state state;
        /* Token of the blocking aqua_reclaim() waiting for this chunk; 0: report as an event. */
        uint64_t waiter;
        /* Its offer is a call in progress: if the session is lost meanwhile, the caller (not
         * the session) releases it. */
        bool in_call;
        size_t index; /* in offers.chunks */
};

struct offers {
        struct offered_chunk **chunks;
        size_t n, cap;
        struct idmap by_id;
        uint64_t last_ref;
        uint64_t offered_bytes; /* OFFERED or RECLAIMING */
};

/* Allocate an exportable chunk of size bytes on g (with fabric: as a fabric handle too) and add it
 * (state OFFERING). */
int offers_alloc(struct offers *p, struct gpu_dev *g, uint64_t size, bool fabric,
                 struct offered_chunk **ret);
/* Record the daemon's id: the chunk is OFFERED. */
int offers_set_id(struct offers *p, struct offered_chunk *c, uint64_t id);
struct offered_chunk *offers_get(const struct offers *p, uint64_t id);
/* Release the chunk's memory on g and forget it. */
void offers_release(struct offers *p, struct gpu_dev *g, struct offered_chunk *c);
/* Release everything. */
void offers_clear(struct offers *p, struct gpu_dev *g);
