/*
 * Scrubbing: a chunk a consumer mapped may hold its data, so once free again it is dirty and goes
 * to no other consumer until its producer has zeroed and verified it (the daemon never maps GPU
 * memory; the producer does it through its own mapping). The consumer that left the data may
 * borrow it back as it is: with one-to-one pairs that is the common case, and it costs nothing.
 */
#include <inttypes.h>
#include <stdio.h>

#include "broker-private.h"
#include "broker.h"
#include "log.h"

void chunk_dirty(struct broker *broker, struct chunk *c, const struct gpu *consumer)
{
        if (!broker->settings.scrub)
                return;
        c->dirty = true;
        c->dirty_for = consumer ? consumer->serial : 0;
}

bool chunk_grantable_to(const struct chunk *c, const struct gpu *consumer)
{
        /* A consumer takes the kind of handle its transport carries. */
        if (consumer->fabric ? !c->fabric : c->fd < 0)
                return false;
        return !c->dirty || (c->dirty_for && c->dirty_for == consumer->serial);
}

void scrub_check(struct broker *broker, struct gpu *producer)
{
        struct gpu *mate = producer->paired;
        uint64_t keep = mate && mate->owner ? mate->serial : 0;
        _cleanup_free_ uint64_t *ids = NULL;
        size_t n = 0, alloc = 0;

        if (!producer->owner || producer->draining || producer->role != GPU_ROLE_PRODUCER)
                return;
        for (struct list_node *k = producer->chunks.next; k != &producer->chunks; k = k->next) {
                struct chunk *c = list_entry(k, struct chunk, producer_node);

                /* What the paired consumer left stays for it; everything else gets ready for
                 * whoever borrows next. */
                if (c->state != CHUNK_FREE || !c->dirty || c->scrubbing || !chunk_has_handle(c) ||
                    c->orphan || c->quarantined || (keep && c->dirty_for == keep))
                        continue;
                if (n == alloc) {
                        size_t a = alloc ? alloc * 2 : 16;
                        uint64_t *x = reallocarray(ids, a, sizeof(*x));
                        if (!x) {
                                log_error("Out of memory asking %s to scrub chunks",
                                          producer->uuid);
                                break;
                        }
                        ids = x;
                        alloc = a;
                }
                ids[n++] = c->id;
                c->scrubbing = true;
                chunk_set_free_listed(c);
        }
        if (n == 0)
                return;
        broker->stats.scrubs_requested += n;
        notice_queue(broker, NOTICE_SCRUB, producer, 0, ids, n, 0, NULL);
        events_add(&broker->events, "scrub", "%s asked to scrub %zu chunks", producer->uuid, n);
}

int broker_scrub_done(struct broker *broker, struct gpu *producer, const uint64_t *ids, size_t n,
                      const uint64_t *failed, size_t n_failed, uint32_t *ret_done,
                      char err[BROKER_ERR_MAX])
{
        _cleanup_free_ uint64_t *back = calloc(n_failed + 1, sizeof(uint64_t));
        uint32_t done = 0;
        size_t n_back = 0;

        if (!back)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                struct chunk *c = broker_find_chunk(broker, ids[i]);

                /* Another producer's chunk, one never asked about, or one gone meanwhile. */
                if (!c || c->producer != producer || !c->scrubbing)
                        continue;
                c->scrubbing = c->dirty = false;
                c->dirty_for = 0;
                chunk_set_free_listed(c);
                journal_chunk(broker, c);
                done++;
        }
        for (size_t i = 0; i < n_failed; i++) {
                struct chunk *c = broker_find_chunk(broker, failed[i]);

                if (!c || c->producer != producer || !c->scrubbing)
                        continue;
                log_warning("Producer %s could not scrub chunk %" PRIu64 "; it leaves the pool",
                            producer->uuid, c->id);
                back[n_back++] = c->id;
                chunk_drop(broker, c);
        }
        broker->stats.chunks_scrubbed += done;
        broker->stats.scrub_failures += n_back;
        if (n_back) {
                notice_queue(broker, NOTICE_RECLAIMED, producer, 0, back, n_back, 0, NULL);
                events_add(&broker->events, "scrub", "%s failed to scrub %zu chunks; dropped",
                           producer->uuid, n_back);
        }
        if (ret_done)
                *ret_done = done;
        return 0;
}
