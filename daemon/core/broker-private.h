/* The core's objects and their lifecycle, shared by the broker core's modules; code outside
 * daemon/core/ sees the objects only through broker.h's functions and view.c's values, and the
 * compiler keeps it so: this header builds only with AQUA_CORE_INTERNAL, which only the core's
 * library, tests and fuzzer define (daemon/meson.build, test core-is-private). */
#pragma once

#ifndef AQUA_CORE_INTERNAL
#error "broker-private.h is the core's own: outside daemon/core/ use broker.h and view.c"
#endif

#include "broker-types.h"

struct broker_reclaim; /* broker.h */

struct gpu_link {
        char *uuid;
        double bandwidth;
};

struct gpu {
        struct list_node node; /* broker.gpus */
        /* Its name in the pool: the device's uuid, or with colocated-lending "UUID/producer" or
         * "UUID/consumer" (one device, a registration per role). */
        char *uuid;
        char *device; /* the device's uuid */
        uint32_t ordinal;
        bool ordinal_known; /* registered (or restored from a journal that has it) */
        uint64_t capacity;
        uint64_t granularity;
        enum gpu_role role;
        struct client *owner; /* the connected client, NULL when none */
        uint64_t serial;      /* of this registration, never reused; 0 while none is connected */
        char *client_name;
        char *host; /* the host its client named; NULL: not told */
        pid_t pid;
        struct proc_id process; /* of the registering client, journaled; pid 0: none known */
        struct custody custody; /* journaled: who may register it again while it holds state */
        struct gpu_link *links;
        size_t n_links;

        struct gpu *paired;
        const char *pair_source; /* "config", "auto", "aquactl" (static strings) */
        double pair_bandwidth;

        struct list_node chunks;      /* producer: every chunk it offered (chunk.producer_node) */
        struct list_node free_chunks; /* producer: grantable chunks (chunk.free_node) */
        struct list_node leases;      /* consumer: its leases (lease.consumer_node) */
        uint64_t offered_bytes;       /* producer: chunks in the pool, leased or not */
        uint64_t lent_bytes;          /* producer: chunks leased out */
        uint64_t borrowed_bytes;      /* consumer */
        uint64_t dram_bytes;          /* consumer: DRAM budget granted */

        bool barred;   /* missed a reclaim deadline: no new leases */
        bool draining; /* operator drain: no new offers or grants, until undrained; it outlives
                        * the producer's client and is journaled */
        bool drain_refusal_logged; /* an offer refused by this drain was logged */
        bool restored;   /* known from the journal, its client has not re-registered yet */
        bool silent;     /* restored past the reconcile window: its process may still map */
        bool fabric;     /* its client passes fabric handles in messages, not descriptors */
        /* Detached (a remote client unheard): it must register again by then; 0: a restart's. */
        uint64_t detached_until_ns;

        struct broker_load reported; /* the client's last LoadReport */
        /* Consumer: chunks (and their bytes) it returned in answer to reclaims, counted here
         * from its Returns, whatever it reports; since aquad started. */
        uint64_t reclaim_returned_chunks, reclaim_returned_bytes;
};

struct chunk {
        uint64_t id; /* first member: the key of broker.chunks_by_id */
        struct gpu *producer;
        struct lease *lease; /* NULL when free */
        uint64_t size;
        uint64_t client_ref;
        int fd;          /* -1 while the daemon holds no handle (restored, or producer gone) */
        uint8_t *fabric; /* BROKER_FABRIC_HANDLE_SIZE bytes from a fabric producer, or NULL */
        enum chunk_state state;
        bool orphan;           /* producer gone: dropped once the consumer returns it */
        bool dirty;            /* free, last mapped by a consumer, not yet scrubbed */
        bool scrubbing;        /* dirty, its producer asked to scrub it: granted to nobody */
        uint64_t dirty_for;    /* serial of the consumer registration that last mapped it */
        uint64_t deadline_ns;  /* reclaiming: monotonic; 0: no deadline (or not started) */
        bool deadline_pending; /* reclaiming: its deadline starts when the notice is delivered */
        uint64_t deadline_wall_ms; /* the same in wall-clock ms, for the journal */
        uint64_t reclaim_start_ns; /* reclaiming: when the consumer was told (monotonic) */
        /* An operator ended its lease while the consumer's process still ran: granted to nobody,
         * scrubbed by nobody, handed back to nobody until that process is gone. */
        bool quarantined;
        struct proc_id quarantine; /* the process that may still map it */
        bool quarantine_back;      /* its producer asked for it: back to it, not to the pool */
        struct list_node producer_node, free_node, lease_node;
};

struct lease {
        uint64_t id; /* first member: the key of broker.leases_by_id */
        struct gpu *consumer;
        struct gpu *producer;
        enum lease_state state;
        struct list_node chunks;
        struct list_node consumer_node, broker_node;
        size_t n_chunks;
        uint64_t bytes;
        uint64_t created_ms; /* wall clock */
        uint64_t created_ns; /* monotonic */
        bool overdue;        /* a deadline passed with chunks still mapped */
        bool confirmed;      /* restored: its consumer re-registered it */
        char *reason;        /* why it is being reclaimed */
};

/* A pinned pair (from the config or an operator), by uuid: either GPU may not exist yet. */
struct broker_pin {
        char *producer, *consumer;
        const char *source;
        char *refused; /* why it cannot stand now (two tenants), NULL: it stands or waits */
};

struct broker {
        struct broker_settings settings;
        struct list_node gpus;
        size_t n_gpus;
        void *chunks_by_id;      /* tsearch tree of struct chunk * */
        void *leases_by_id;      /* tsearch tree of struct lease * */
        struct list_node leases; /* every lease, oldest first */
        size_t n_chunks, n_leases;
        uint64_t pool_bytes, lent_bytes;
        uint64_t next_chunk_id, next_lease_id;
        uint64_t next_serial; /* of GPU registrations */
        uint64_t dram_granted;
        struct broker_pin *pins;
        size_t n_pins;
        struct broker_stats stats;
        struct events events;

        uint64_t
            next_deadline_ns; /* earliest pending deadline, 0: none (may be early, never late) */
        uint64_t reconcile_deadline_ns;
        size_t n_quarantined;         /* chunks in quarantine */
        uint64_t quarantine_check_ns; /* when their processes are looked at next */

        bool replaying;
        struct journal *journal; /* NULL: nothing persists (tests) */
        int journal_error;       /* the last write failed (negative errno): degraded; 0: durable */
        int compact_error;       /* the last compaction failed; 0: it did not */
        uint64_t compact_retry_ns; /* no compaction before this (monotonic) after a failure */
        uint64_t compact_backoff_ns;
        uint64_t compact_threshold;
        Aquaj__JOp **ops; /* not yet committed */
        size_t n_ops, alloc_ops;
        struct list_node notices;

        /* Told each time a reclaimed chunk is back from its consumer (broker_observe_reclaims). */
        broker_reclaimed_fn on_reclaimed;
        void *on_reclaimed_userdata;
};

/* The GPU named exactly uuid (a registration's name), or NULL; gpu_ensure() makes it if none. */
struct gpu *gpu_find(struct broker *broker, const char *uuid);
struct gpu *gpu_ensure(struct broker *broker, const char *uuid);
/* Free g if nothing refers to it any more (no client, chunks, leases of its own or lent from
 * it, pins, budget or bar). */
void gpu_gc(struct broker *broker, struct gpu *g);
/* Set or clear g's pair; queues PairChanged for both sides that have a client. */
void gpu_set_pair(struct broker *broker, struct gpu *g, struct gpu *mate, const char *source,
                  double bandwidth);

struct chunk *chunk_new(struct broker *broker, struct gpu *producer, uint64_t id, uint64_t size,
                        uint64_t client_ref, int fd);
/* Remove a chunk from the pool for good: journaled, its handle closed. */
void chunk_drop(struct broker *broker, struct chunk *c);
/* FREE -> LEASED into l. */
void chunk_lease(struct broker *broker, struct chunk *c, struct lease *l);
/* LEASED or RECLAIMING -> FREE (back in its producer's free list when grantable). */
void chunk_release(struct broker *broker, struct chunk *c);
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

struct lease *lease_new(struct broker *broker, uint64_t id, struct gpu *consumer,
                        struct gpu *producer);
/* Free an empty lease (remaining chunks are released first); journaled. */
void lease_free(struct broker *broker, struct lease *l);
/* Whether every chunk of l was being taken back (reclaimed, or its producer gone): a consumer
 * that no longer maps it has moved off all of it, which is no loss. */
bool lease_was_returned(const struct lease *l);
/* Derive the lease state from its chunks. */
void lease_update_state(struct lease *l);

/* journal-ops.c: each object as a journal record (for its operation, and for snapshots). */
Aquaj__JChunk *jchunk_new(const struct chunk *c);
Aquaj__JLease *jlease_new(const struct lease *l);
Aquaj__JGpu *jgpu_new(const struct gpu *g);
Aquaj__JPair *jpair_new(const char *producer, const char *consumer, const char *source);
void journal_chunk(struct broker *broker, const struct chunk *c);
void journal_lease(struct broker *broker, const struct lease *l);
void journal_gpu(struct broker *broker, const struct gpu *g);
void journal_del(struct broker *broker, bool chunk, uint64_t id);
void journal_pin(struct broker *broker, const char *producer, const char *consumer, bool del);

/* Destroy without journaling (replay, snapshots, teardown). */
void chunk_destroy(struct broker *broker, struct chunk *c);
void lease_destroy(struct broker *broker, struct lease *l);
/* Forget all chunks, leases and per-GPU state (not the pins). */
void broker_clear(struct broker *broker);
void pins_clear(struct broker *broker, const char *source); /* NULL: every pin */
void pin_free(struct broker_pin *p);
void broker_ops_clear(struct broker *broker);

/* scrub.c: consumer stopped mapping c, which is free again: dirty with its data. */
void chunk_dirty(struct broker *broker, struct chunk *c, const struct gpu *consumer);
/* Ask producer to scrub its dirty chunks that its paired consumer did not leave (journaled). */
void scrub_check(struct broker *broker, struct gpu *producer);

void notice_queue(struct broker *broker, enum notice_kind kind, struct gpu *to, uint64_t lease_id,
                  const uint64_t *ids, size_t n, uint64_t deadline_ms, const char *text);

/* custody.c */
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
enum proc_liveness custody_liveness(const struct broker *broker, const struct gpu *g);
/* An operator ended c's lease while holder may still map it: out of everyone's reach. */
void chunk_quarantine(struct broker *broker, struct chunk *c, const struct proc_id *holder);
/* Quarantined chunks whose holder is gone are scrubbed (or go back to a producer that asked). */
void quarantine_tick(struct broker *broker, uint64_t now_ns);

/* Bring the pool's earliest deadline forward to at least deadline_ns. */
void broker_note_deadline(struct broker *broker, uint64_t deadline_ns);

/* lease.c, for departure.c: chunk ids that go back to one producer, for one Reclaimed notice. */
struct reclaimed {
        struct gpu *producer;
        uint64_t *ids;
        size_t n, alloc;
};
void reclaimed_flush(struct broker *broker, struct reclaimed *r);
/* A consumer no longer maps c (it returned it or died): orphans are dropped, reclaimed chunks go
 * back to their producer (collected in back), others to the pool. */
void chunk_unmapped(struct broker *broker, struct chunk *c, struct reclaimed *back);
/* Mark chunks of l reclaiming (all of them, or until *got reaches want); one notice. */
int reclaim_lease(struct broker *broker, struct lease *l, uint64_t want, uint64_t *got,
                  const char *reason, uint64_t deadline_ns, struct broker_reclaim *ret);
