/* Object lifecycle shared by the broker core's modules (broker.c, lease.c, register.c, scrub.c);
 * not for callers. */
#pragma once

#include "broker.h"

/* The GPU named exactly uuid (a registration's name), or NULL; gpu_ensure() makes it if none. */
struct gpu *gpu_find(struct broker *pool, const char *uuid);
struct gpu *gpu_ensure(struct broker *pool, const char *uuid);
/* Free g if nothing refers to it any more (no client, chunks, leases of its own or lent from
 * it, pins, budget or bar). */
void gpu_gc(struct broker *pool, struct gpu *g);
/* Set or clear g's pair; queues PairChanged for both sides that have a client. */
void gpu_set_pair(struct broker *pool, struct gpu *g, struct gpu *mate, const char *source,
                  double bandwidth);

struct chunk *chunk_new(struct broker *pool, struct gpu *producer, uint64_t id, uint64_t size,
                        uint64_t client_ref, int fd);
/* Remove a chunk from the pool for good: journaled, its handle closed. */
void chunk_drop(struct broker *pool, struct chunk *c);
/* FREE -> LEASED into l. */
void chunk_lease(struct broker *pool, struct chunk *c, struct lease *l);
/* LEASED or RECLAIMING -> FREE (back in its producer's free list when grantable). */
void chunk_release(struct broker *pool, struct chunk *c);
/* Whether the chunk can be granted: free, with a handle, producer connected and not draining,
 * not being scrubbed. */
bool chunk_grantable(const struct chunk *c);
/* Whether a grantable chunk may go to consumer: clean, or dirty with that consumer's own data. */
bool chunk_grantable_to(const struct chunk *c, const struct gpu *consumer);
/* Whether the daemon holds a handle for the chunk (a descriptor or a fabric handle). */
bool chunk_has_handle(const struct chunk *c);
/* Close or forget the chunk's handles. */
void chunk_drop_handle(struct chunk *c);
void chunk_set_free_listed(struct chunk *c);

struct lease *lease_new(struct broker *pool, uint64_t id, struct gpu *consumer,
                        struct gpu *producer);
/* Free an empty lease (remaining chunks are released first); journaled. */
void lease_free(struct broker *pool, struct lease *l);
/* Whether every chunk of l was being taken back (reclaimed, or its producer gone): a consumer
 * that no longer maps it has moved off all of it, which is no loss. */
bool lease_was_returned(const struct lease *l);
/* Derive the lease state from its chunks. */
void lease_update_state(struct lease *l);

void journal_chunk(struct broker *pool, const struct chunk *c);
void journal_lease(struct broker *pool, const struct lease *l);
void journal_gpu(struct broker *pool, const struct gpu *g);
void journal_del(struct broker *pool, bool chunk, uint64_t id);
void journal_pin(struct broker *pool, const char *producer, const char *consumer, bool del);

/* Destroy without journaling (replay, snapshots, teardown). */
void chunk_destroy(struct broker *pool, struct chunk *c);
void lease_destroy(struct broker *pool, struct lease *l);
/* Forget all chunks, leases and per-GPU state (not the pins). */
void broker_clear(struct broker *pool);
void pins_clear(struct broker *pool, const char *source); /* NULL: every pin */
void broker_ops_clear(struct broker *pool);

/* scrub.c: consumer stopped mapping c, which is free again: dirty with its data. */
void chunk_dirty(struct broker *pool, struct chunk *c, const struct gpu *consumer);
/* Ask producer to scrub its dirty chunks that its paired consumer did not leave (journaled). */
void scrub_check(struct broker *pool, struct gpu *producer);

void notice_queue(struct broker *pool, enum notice_kind kind, struct gpu *to, uint64_t lease_id,
                  const uint64_t *ids, size_t n, uint64_t deadline_ms, const char *text);

/* custody.c */
int custody_init(void);
/* A new custody of g for who; ret_secret gets the secret, of which g keeps only the hash. */
void custody_issue(struct gpu *g, const struct broker_identity *who,
                   uint8_t ret_secret[BROKER_SECRET_LEN]);
void custody_clear(struct gpu *g);
/* Whether who, presenting secret (NULL: none), is the holder of custody c. */
bool custody_matches(const struct custody *c, const struct broker_identity *who,
                     const uint8_t *secret);
/*
 * Whether consumer may borrow what producer lends (daemon/README.md, "Who may hold what"): the
 * lender maps what it lends, so only a lender of the consumer's own tenant, or one that can read
 * any memory already (root, aquad's user). false with why ("...") where it may not.
 */
bool custody_may_lend(const struct gpu *producer, const struct gpu *consumer, char *why,
                      size_t size);
/* Whether g has anything a newcomer could inherit: chunks it lends, leases, DRAM budget. */
bool gpu_holds_state(const struct gpu *g);
/* Whether g's holder is provably gone (never for a remote one). */
enum proc_liveness custody_liveness(const struct broker *pool, const struct gpu *g);
/* An operator ended c's lease while holder may still map it: out of everyone's reach. */
void chunk_quarantine(struct broker *pool, struct chunk *c, const struct proc_id *holder);
/* Quarantined chunks whose holder is gone are scrubbed (or go back to a producer that asked). */
void quarantine_tick(struct broker *pool, uint64_t now_ns);

/* Bring the pool's earliest deadline forward to at least deadline_ns. */
void broker_note_deadline(struct broker *pool, uint64_t deadline_ns);

/* lease.c, for departure.c: chunk ids that go back to one producer, for one Reclaimed notice. */
struct reclaimed {
        struct gpu *producer;
        uint64_t *ids;
        size_t n, alloc;
};
void reclaimed_flush(struct broker *pool, struct reclaimed *r);
/* A consumer no longer maps c (it returned it or died): orphans are dropped, reclaimed chunks go
 * back to their producer (collected in back), others to the pool. */
void chunk_unmapped(struct broker *pool, struct chunk *c, struct reclaimed *back);
/* Mark chunks of l reclaiming (all of them, or until *got reaches want); one notice. */
int reclaim_lease(struct broker *pool, struct lease *l, uint64_t want, uint64_t *got,
                  const char *reason, uint64_t deadline_ns, struct broker_reclaim *ret);
