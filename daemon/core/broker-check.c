/*
 * A consistency check of the pool's books, for fuzzers and tests: every chunk is in exactly one
 * state, every lease holds what it counts, and the totals add up.
 */
#include <inttypes.h>
#include <stdio.h>

#include "broker-private.h"
#include "broker.h"

int broker_check(struct broker *broker, char err[BROKER_ERR_MAX])
{
        uint64_t pool_bytes = 0, lent = 0, dram = 0;
        size_t n_chunks = 0, n_leases = 0;

        for (struct list_node *x = broker->gpus.next; x != &broker->gpus; x = x->next) {
                struct gpu *g = list_entry(x, struct gpu, node);
                uint64_t offered = 0, gpu_lent = 0, borrowed = 0;

                for (struct list_node *k = g->chunks.next; k != &g->chunks; k = k->next) {
                        struct chunk *c = list_entry(k, struct chunk, producer_node);

                        if (c->producer != g || broker_find_chunk(broker, c->id) != c)
                                return broker_fail(err, 1, "chunk %" PRIu64 " is misfiled", c->id);
                        if ((c->state == CHUNK_FREE) != !c->lease)
                                return broker_fail(err, 1, "chunk %" PRIu64 " is %s with%s a lease",
                                                   c->id, chunk_state_to_string(c->state),
                                                   c->lease ? "" : "out");
                        if (c->scrubbing && (!c->dirty || c->state != CHUNK_FREE))
                                return broker_fail(
                                    err, 1, "chunk %" PRIu64 " is being scrubbed but is %s%s",
                                    c->id, chunk_state_to_string(c->state),
                                    c->dirty ? "" : " and clean");
                        if (list_linked(&c->free_node) != chunk_grantable(c))
                                return broker_fail(err, 1,
                                                   "chunk %" PRIu64 " is %sin the free list but "
                                                   "%sgrantable",
                                                   c->id, list_linked(&c->free_node) ? "" : "not ",
                                                   chunk_grantable(c) ? "" : "not ");
                        if (c->lease && broker_find_lease(broker, c->lease->id) != c->lease)
                                return broker_fail(err, 1, "chunk %" PRIu64 " is in a dead lease",
                                                   c->id);
                        if (c->lease && c->lease->producer != g)
                                return broker_fail(err, 1,
                                                   "chunk %" PRIu64 " of %s is in lease %" PRIu64
                                                   " of another producer",
                                                   c->id, g->uuid, c->lease->id);
                        offered += c->size;
                        gpu_lent += c->lease ? c->size : 0;
                        n_chunks++;
                }
                for (struct list_node *k = g->leases.next; k != &g->leases; k = k->next)
                        borrowed += list_entry(k, struct lease, consumer_node)->bytes;
                if (offered != g->offered_bytes || gpu_lent != g->lent_bytes ||
                    borrowed != g->borrowed_bytes)
                        return broker_fail(err, 1,
                                           "GPU %s counts %" PRIu64 "/%" PRIu64 "/%" PRIu64
                                           " bytes offered/lent/borrowed, its objects %" PRIu64
                                           "/%" PRIu64 "/%" PRIu64,
                                           g->uuid, g->offered_bytes, g->lent_bytes,
                                           g->borrowed_bytes, offered, gpu_lent, borrowed);
                pool_bytes += offered;
                lent += gpu_lent;
                dram += g->dram_bytes;
        }
        for (struct list_node *x = broker->leases.next; x != &broker->leases; x = x->next) {
                struct lease *l = list_entry(x, struct lease, broker_node);
                uint64_t bytes = 0;
                size_t n = 0;

                if (broker_find_lease(broker, l->id) != l)
                        return broker_fail(err, 1, "lease %" PRIu64 " is misfiled", l->id);
                for (struct list_node *k = l->chunks.next; k != &l->chunks; k = k->next) {
                        struct chunk *c = list_entry(k, struct chunk, lease_node);
                        if (c->lease != l)
                                return broker_fail(err, 1,
                                                   "chunk %" PRIu64 " is listed in lease %" PRIu64
                                                   " but leased to another",
                                                   c->id, l->id);
                        bytes += c->size;
                        n++;
                }
                if (n != l->n_chunks || bytes != l->bytes)
                        return broker_fail(err, 1,
                                           "lease %" PRIu64 " counts %zu chunks of %" PRIu64
                                           " bytes, holds %zu of %" PRIu64,
                                           l->id, l->n_chunks, l->bytes, n, bytes);
                n_leases++;
        }
        if (n_chunks != broker->n_chunks || n_leases != broker->n_leases ||
            pool_bytes != broker->pool_bytes || lent != broker->lent_bytes ||
            dram != broker->dram_granted)
                return broker_fail(
                    err, 1,
                    "the pool counts %zu chunks, %zu leases, %" PRIu64 " bytes, %" PRIu64
                    " lent, %" PRIu64 " of DRAM; its objects %zu, %zu, %" PRIu64 ", %" PRIu64
                    ", %" PRIu64,
                    broker->n_chunks, broker->n_leases, broker->pool_bytes, broker->lent_bytes,
                    broker->dram_granted, n_chunks, n_leases, pool_bytes, lent, dram);
        return 0;
}
