/*
 * The broker core: aquad's model of the domain (GPUs, pairs, the lending pool of chunks, leases
 * and the DRAM budget), with every flow of the control plane as an operation on it. "Pool" is
 * only ever the lending pool: the chunks producers offered. No I/O here: operations
 * queue journal operations (written by broker_commit() before any reply) and notices for clients
 * (taken by the caller after the commit), so every flow can be tested without sockets.
 *
 * Outcomes: 0, a negative errno, or a positive enum broker_error with a message in err that names
 * the problem; the caller answers the client with it. The core speaks no wire protocol and holds
 * no sockets: its types are its own, and the transport translates (transport/translate.h).
 */
#pragma once

#include "broker-types.h"

/* ----------------------------------------------------------- broker.c: objects and persistence */

int broker_new(const struct broker_settings *settings, struct broker **ret);
struct broker *broker_free(struct broker *broker);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct broker *, broker_free);

/* Replace the pinned pairs (config pairs at start and on reload), keeping operator pins. */
int broker_set_config_pins(struct broker *broker, const char *const *producers,
                           const char *const *consumers, size_t n);

/* Pins by uuid: add one (replacing pins of either GPU), or remove those naming uuid. */
int broker_pins_add(struct broker *broker, const char *producer, const char *consumer,
                    const char *source);
size_t broker_pins_remove(struct broker *broker, const char *uuid);

/* Replay a journal record into an empty pool (the journal_open() callback). */
int broker_apply(const Aquaj__JournalRecord *rec, void *userdata);
/* After replay: take ownership of j, start the reconcile window for restored state. */
void broker_attach_journal(struct broker *broker, struct journal *j, uint64_t compact_threshold);
/*
 * Write the queued journal operations (one record, fsync'd); compact when the log has grown.
 * On failure the operations stay queued and go out with the next commit that succeeds, and
 * pool->journal_error says aquad is degraded; with none queued, an empty record probes the file.
 */
int broker_commit(struct broker *broker);
/* Why aquad is degraded, in a sentence, or NULL when it is not. */
const char *broker_degraded(const struct broker *broker, char *buf, size_t size);
/* The whole state as one snapshot record (freed with aquaj__journal_record__free_unpacked). */
int broker_snapshot(struct broker *broker, Aquaj__JournalRecord **ret);

/* Take the queued notices (append them to `into`, an initialized list head). */
void broker_take_notices(struct broker *broker, struct list_node *into);
struct notice *notice_free(struct notice *n);

/* Whether key names g: its name, its device's uuid, or its ordinal in decimal (as config pairs
 * and plans may), alone or as HOST:ORDINAL. */
bool gpu_is(const struct gpu *g, const char *key);
struct gpu *broker_find_gpu(struct broker *broker, const char *uuid_or_ordinal);
/* The one GPU key names (uuid, device uuid, ordinal or HOST:ORDINAL) for an operator's request
 * what: BROKER_E_UNKNOWN_GPU for none, BROKER_E_INVALID listing the candidates for several. */
int broker_lookup_gpu(struct broker *broker, const char *key, const char *what, struct gpu **ret,
                      char err[BROKER_ERR_MAX]);
struct chunk *broker_find_chunk(struct broker *broker, uint64_t id);
struct lease *broker_find_lease(struct broker *broker, uint64_t id);

/* snprintf into a BROKER_ERR_MAX buffer and return code: here a positive enum broker_error; the
 * transport uses it for its own (wire) codes too. Every `err` of the core is declared
 * char err[BROKER_ERR_MAX], so that gcc refuses a smaller array (-Wstringop-overflow under
 * -Werror); NULL: the caller wants no text. */
int broker_fail(char err[BROKER_ERR_MAX], int code, const char *fmt, ...) _printf_(3, 4);

/* broker-check.c: whether the books add up; 0, or 1 with the first inconsistency named in err. */
int broker_check(struct broker *broker, char err[BROKER_ERR_MAX]);

const char *chunk_state_to_string(enum chunk_state s);
const char *gpu_role_to_string(enum gpu_role r);
const char *lease_state_to_string(enum lease_state s);

/* ----------------------------------------------------- register.c: hello, reconcile, pairing */

/* A link the registering GPU reports to another GPU. */
struct broker_link {
        const char *uuid;
        double bandwidth; /* GB/s; 0 when unknown */
};

/* A chunk a re-registering client says it still holds. */
struct broker_held {
        uint64_t chunk_id;
        uint64_t size;
        uint64_t lease_id;     /* 0: held unleased (a producer's chunk in the pool) */
        const uint8_t *fabric; /* a fabric producer's handle for it (BROKER_FABRIC_HANDLE_SIZE) */
};

struct broker_hello {
        const struct broker_identity *who; /* required */
        const uint8_t *secret;             /* BROKER_SECRET_LEN bytes it was given; NULL: none */
        const char *uuid;
        enum gpu_role role;
        uint32_t ordinal;
        uint64_t capacity;
        uint64_t granularity;
        const char *client_name;
        const char *host; /* NULL or empty: not told */
        pid_t pid;
        const struct proc_id *process; /* NULL: not known (not on this host) */
        const struct broker_link *links;
        size_t n_links;
        const struct broker_held *held;
        size_t n_held;
        int *held_fds; /* producer: one per held chunk, taken (closed or kept) on any return */
        bool fabric;   /* handles travel as fabric handles (held[].fabric), not descriptors */
        /*
         * Whether the host shows that this process may use the GPU it names (daemon/README.md,
         * "Who may hold what"): the transport finds out (a device node the process passed, a
         * remote key's binding), the core refuses a registration without it; why says what the
         * transport found, for the refusal.
         */
        enum broker_evidence {
                BROKER_EVIDENCE_NOT_ASKED, /* the host has no such GPU, or checks are off */
                BROKER_EVIDENCE_SHOWN,
                BROKER_EVIDENCE_MISSING,
        } evidence;
        const char *evidence_why;
};

struct broker_welcome {
        struct gpu *gpu;
        uint64_t *lost_leases;
        size_t n_lost_leases;
        /* A new custody: the secret to give the client (it presents it when it registers again);
         * false when it re-registered with the one it has. */
        bool new_secret;
        uint8_t secret[BROKER_SECRET_LEN];
        /* The earlier connection of the same identity this registration replaces (the transport
         * forgets it without touching the GPU); NULL when none. */
        struct client *replaced;
};

/*
 * Register a client's GPU (owner: the client), reconciling what it says it holds. A GPU whose
 * state (chunks, leases, DRAM budget) another identity holds, or that identity without the
 * secret it was given, is refused BUSY, naming the holder, for as long as the holder may still
 * map its memory; a newcomer never inherits what another held.
 */
int broker_register(struct broker *broker, const struct broker_hello *h, struct client *owner,
                    struct broker_welcome *ret, char err[BROKER_ERR_MAX]);
/* The GPU's client is gone (side channel EOF, or the reconcile window closed without it). */
void broker_gpu_gone(struct broker *broker, struct gpu *g);
/*
 * g's client can no longer be heard, but nothing proves its process gone (a remote client silent
 * past remote.grace, or one whose new connection registers g again): g keeps what it holds as
 * after a restart, for a client whose process cannot be identified. A consumer's leases stay,
 * their chunks granted to nobody, until it re-registers them, or an operator releases it; a
 * producer's handles are dropped until it re-registers and passes them again.
 */
void broker_gpu_detach(struct broker *broker, struct gpu *g);
/*
 * Operator: g's client did not come back after a restart (or cannot be heard). Refused BUSY while
 * its process runs or nothing tells whether it does; with force, a live local holder's chunks are
 * quarantined until its process is gone, and an unknown one (remote, or pid unknown) is taken to
 * be gone on the operator's word. ret_quarantined (may be NULL) gets how many chunks were.
 */
int broker_release(struct broker *broker, struct gpu *g, bool force, size_t *ret_quarantined,
                   char err[BROKER_ERR_MAX]);
/* Who holds g's custody, for messages: "NAME (uid U, pid P)" or "NAME (key K)". */
const char *gpu_holder(const struct gpu *g, char *buf, size_t size);
/*
 * g's holder is now of tenant (the config's name, "" for its own) and lends_to_all or not, as
 * the config says after a reload. Leases that now cross two tenants are reclaimed (the consumer
 * moves its data off, as from any reclaim); pairs follow at the next broker_recompute_pairs().
 * Returns whether anything changed.
 */
bool broker_set_tenant(struct broker *broker, struct gpu *g, const char *tenant, bool lends_to_all);
/* The tenant of g's holder ("user:1000", "key:KEY", or the config's name); "" when not known. */
const char *gpu_tenant(const struct gpu *g, char *buf, size_t size);
/* Recompute pairs after registrations, departures, or operator changes; queues PairChanged. */
int broker_recompute_pairs(struct broker *broker);
/* Operator pairing: pin producer <-> consumer (either given as uuid or ordinal), or unpin one. */
int broker_pin(struct broker *broker, const char *producer, const char *consumer,
               char err[BROKER_ERR_MAX]);
int broker_unpin(struct broker *broker, const char *gpu, char err[BROKER_ERR_MAX]);

/* ------------------------------------------------------ lease.c: the lease state machine */

/*
 * Producer: put chunks into the pool; fds are taken on success. A fabric producer passes fabrics
 * (n handles of BROKER_FABRIC_HANDLE_SIZE bytes, copied) and fds NULL. ret_ids gets n daemon ids.
 */
int broker_offer(struct broker *broker, struct gpu *producer, const uint64_t *sizes,
                 const uint64_t *client_refs, int *fds, const uint8_t *fabrics, size_t n,
                 uint64_t *ret_ids, char err[BROKER_ERR_MAX]);

struct broker_grant {
        struct lease *lease; /* NULL when only DRAM was granted */
        uint64_t dram_bytes;
        bool partial;
};

/* Consumer: borrow chunks of the paired producer, DRAM making up the rest when allowed. */
int broker_borrow(struct broker *broker, struct gpu *consumer, uint64_t bytes, uint64_t min_bytes,
                  bool allow_dram, struct broker_grant *ret, char err[BROKER_ERR_MAX]);
/* Take a grant back that could not be delivered (its fds could not be sent, or not journaled). */
void broker_undo_grant(struct broker *broker, struct gpu *consumer, const struct broker_grant *g);
/* Take back an offer whose record could not be journaled: its chunks leave the pool. */
void broker_undo_offer(struct broker *broker, const uint64_t *ids, size_t n);

/*
 * Consumer: chunks of lease_id it could not import leave the pool (the producer hears of them in
 * a Reclaimed notice); the lease stays, empty or not, for broker_return() to finish. Returns 0 or
 * a positive error code (ids not in the lease are skipped).
 */
int broker_return_unusable(struct broker *broker, struct gpu *consumer, uint64_t lease_id,
                           const uint64_t *chunk_ids, size_t n, char err[BROKER_ERR_MAX]);
/* Consumer: give chunks back (n == 0: the whole lease) and/or DRAM budget. */
int broker_return(struct broker *broker, struct gpu *consumer, uint64_t lease_id,
                  const uint64_t *chunk_ids, size_t n, uint64_t dram_bytes, uint32_t *ret_returned,
                  char err[BROKER_ERR_MAX]);

struct broker_reclaim {
        uint64_t *free_ids; /* dropped from the pool now */
        size_t n_free;
        uint64_t *pending_ids; /* leased: will come back as Reclaimed notices */
        size_t n_pending;
        uint64_t deadline_ms; /* relative, as sent to consumers */
};
void broker_reclaim_clear(struct broker_reclaim *r);

/*
 * Producer (or an operator for it): take memory back. bytes == 0 && all: everything. With
 * leased_only, free chunks stay in the pool (an operator forcing leases back). At most
 * max_grant_chunks chunks in each list, so the reply fits the peer's limits: ask again for more.
 */
int broker_reclaim(struct broker *broker, struct gpu *producer, uint64_t bytes, bool all,
                   bool leased_only, const char *reason, struct broker_reclaim *ret,
                   char err[BROKER_ERR_MAX]);

/* Operator drain: no new offers or grants from producer; everything goes back to it. */
int broker_drain(struct broker *broker, struct gpu *producer, struct broker_reclaim *ret,
                 char err[BROKER_ERR_MAX]);
int broker_undrain(struct broker *broker, struct gpu *producer, char err[BROKER_ERR_MAX]);

/* ------------------------------------------------- admin.c: operators' requests (aquactl) */

/* The GPU is named by uuid or ordinal; BROKER_E_UNKNOWN_GPU when there is none. Reclaim and
 * drain take a producer (BROKER_E_WRONG_ROLE otherwise); reclaim with bytes == 0 takes all its
 * leased memory back, leaving free chunks in the pool. */
int broker_admin_reclaim(struct broker *broker, const char *gpu, uint64_t bytes,
                         struct broker_reclaim *ret, char err[BROKER_ERR_MAX]);
int broker_admin_drain(struct broker *broker, const char *gpu, struct broker_reclaim *ret,
                       char err[BROKER_ERR_MAX]);
/* End a drain: the GPU may offer again. BROKER_E_INVALID when it is not draining. */
int broker_admin_undrain(struct broker *broker, const char *gpu, char err[BROKER_ERR_MAX]);
int broker_admin_release(struct broker *broker, const char *gpu, bool force,
                         size_t *ret_quarantined, char err[BROKER_ERR_MAX]);

/* ------------------------------------------------------------ scrub.c: scrubbing chunks */

/*
 * Producer: these chunks are zeroed and verified (ids), or could not be (failed: they leave the
 * pool, the producer is told with Reclaimed). Only chunks of this producer that it was asked to
 * scrub count; ret_done gets how many did.
 */
int broker_scrub_done(struct broker *broker, struct gpu *producer, const uint64_t *ids, size_t n,
                      const uint64_t *failed, size_t n_failed, uint32_t *ret_done,
                      char err[BROKER_ERR_MAX]);

/* A ReclaimNotice for these chunks of lease_id reached its consumer: their deadline starts. */
void broker_reclaim_delivered(struct broker *broker, uint64_t lease_id, const uint64_t *ids,
                              size_t n, uint64_t deadline_ms);

/* Consumer missed deadlines, the reconcile window: act on what is due at now_ns. */
void broker_tick(struct broker *broker, uint64_t now_ns);

/* ------------------------------------ view.c: the pool as the code outside the core sees it */

/* The pool's counts and sums, for aquactl status and the metrics. */
struct broker_totals {
        size_t gpus, pairs, leases, chunks, chunks_quarantined;
        size_t pins; /* pinned pairs, standing or not */
        size_t gpus_silent; /* holders that did not come back whose process may still map */
        uint64_t pool_bytes, lent_bytes, dram_budget, dram_granted;
        bool degraded; /* the journal cannot be written or compacted */
        uint64_t gpus_by_role[_GPU_ROLE_MAX];
        uint64_t chunks_by_state[_CHUNK_STATE_MAX], chunk_bytes_by_state[_CHUNK_STATE_MAX];
        uint64_t leases_by_state[_LEASE_STATE_MAX];
        struct broker_stats stats;
};
void broker_totals(const struct broker *broker, struct broker_totals *ret);

/* The pool's running sums, read without walking it: the loop may ask every turn. */
struct broker_counts {
        size_t gpus, leases, chunks;
        uint64_t pool_bytes, lent_bytes, dram_granted, deadline_misses;
        int journal_error;         /* the last journal write failed (negative errno); 0: durable */
        int compact_error;         /* the last compaction failed; 0: it did not */
        uint64_t next_deadline_ns; /* earliest pending deadline (monotonic); 0: none */
        size_t uncommitted;        /* journal records of this turn not yet committed */
};
void broker_counts(const struct broker *broker, struct broker_counts *ret);
const struct broker_settings *broker_settings_in_force(const struct broker *broker);
/* The event ring aquactl events shows: the transport adds what it refuses and reloads. */
struct events *broker_events(struct broker *broker);
/* The pool's journal; NULL: nothing persists (tests). */
struct journal *broker_journal(struct broker *broker);

/*
 * One GPU, lease or chunk as values. Strings point into the pool: valid until the next operation
 * on it. Each broker_view_* fills at most max entries, in the pool's order, and returns how many;
 * the totals say how many there are.
 */
struct broker_gpu_view {
        const char *uuid;
        uint32_t ordinal;
        bool ordinal_known;
        enum gpu_role role;
        uint64_t capacity;
        const struct client *owner; /* the connected client; NULL when none */
        const char *client_name, *host; /* "" when not told */
        pid_t pid;
        const char *paired_with; /* "" when unpaired */
        const char *pair_source; /* "config", "auto", "aquactl" */
        double pair_bandwidth;
        uint64_t offered_bytes, lent_bytes, borrowed_bytes, dram_bytes;
        bool barred, draining, silent;
        /* Its holder (custody): held false when none is known; remote: by key, else by uid. */
        bool held, remote, lends_to_all;
        uid_t uid;
        const char *key;
        char tenant[BROKER_TENANT_TEXT + 48]; /* gpu_tenant(): "" when not known */
        struct broker_load reported;
        uint64_t reclaim_returned_chunks, reclaim_returned_bytes;
};
size_t broker_view_gpus(const struct broker *broker, struct broker_gpu_view *out, size_t max);
/* The name a GPU is registered under (its uuid, or "UUID/ROLE" with colocated lending). */
/* One GPU's fields the transport needs of the GPU its client registered. */
const char *broker_gpu_uuid(const struct gpu *g);
enum gpu_role broker_gpu_role(const struct gpu *g);
struct client *broker_gpu_owner(const struct gpu *g);      /* NULL: no client connected */
const char *broker_gpu_paired_device(const struct gpu *g); /* its mate's device; "": none */
uint64_t broker_gpu_dram_bytes(const struct gpu *g);       /* DRAM budget granted */
size_t broker_gpu_leases(const struct gpu *g);             /* leases it holds */

/* A pin that cannot stand now (its sides are of two tenants), and why. */
struct broker_refused_pin {
        const char *producer, *consumer, *source, *why;
};
size_t broker_view_refused_pins(const struct broker *broker, struct broker_refused_pin *out,
                                size_t max);

struct broker_lease_view {
        uint64_t id;
        const char *producer_uuid, *consumer_uuid;
        enum lease_state state;
        uint64_t bytes;
        size_t chunks;
        uint64_t age_ms;
        uint64_t deadline_ms; /* until the earliest reclaim deadline; 0: none running */
        bool notice_pending;  /* reclaimed, its notice not yet delivered */
        bool overdue;
};
size_t broker_view_leases(const struct broker *broker, uint64_t now_ns,
                          struct broker_lease_view *out, size_t max);

struct broker_chunk_view {
        uint64_t id;
        const char *producer_uuid;
        uint64_t size;
        const char *condition; /* leased, reclaiming, free, dirty, scrubbing, quarantined */
        uint64_t lease_id;     /* 0: none */
};
size_t broker_view_chunks(const struct broker *broker, struct broker_chunk_view *out, size_t max);

/* A grant's chunks, for its Grant message: broker_grant_size() of them. */
struct broker_granted_chunk {
        uint64_t id, size;
        const char *producer_uuid;
        const uint8_t *fabric; /* BROKER_FABRIC_HANDLE_SIZE bytes, or NULL */
        int fd;                /* the daemon's handle to pass on; -1: none */
};
size_t broker_grant_size(const struct broker_grant *grant);
uint64_t broker_grant_lease_id(const struct broker_grant *grant); /* 0: DRAM only */
size_t broker_grant_chunks(const struct broker_grant *grant, struct broker_granted_chunk *out,
                           size_t max);

/* g's client reported its engine's load. */
void broker_report_load(struct broker *broker, struct gpu *g, const struct broker_load *load);

/* New settings (a reload); compact_threshold: the journal size that starts a compaction. */
void broker_set_settings(struct broker *broker, const struct broker_settings *settings,
                         uint64_t compact_threshold);

/* Be told each reclaim latency (one observer; unobserving with another userdata does nothing). */
void broker_observe_reclaims(struct broker *broker, broker_reclaimed_fn fn, void *userdata);
void broker_unobserve_reclaims(struct broker *broker, void *userdata);
