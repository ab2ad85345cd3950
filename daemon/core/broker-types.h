/*
 * The broker core's value types: outcomes, roles, a registration's identity and custody, the
 * states of chunks and leases, a client's load report, notices, settings and statistics, and the
 * core's objects by name only. No functions: broker.h (the core's calls) and broker-private.h
 * (the objects' bodies, inside the core) both build on it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "events.h"
#include "journal.h"
#include "journal.pb-c.h"
#include "list.h"
#include "proc.h"

#define BROKER_ERR_MAX 256
/* A fabric handle (CUmemFabricHandle): opaque bytes aquad keeps and passes on, never reads. */
#define BROKER_FABRIC_HANDLE_SIZE 64
/* The custody secret a Welcome carries, and its hash, the only form aquad keeps or journals. */
#define BROKER_SECRET_LEN      32
#define BROKER_SECRET_HASH_LEN 32
/* A CURVE public key in Z85 (40 characters) and its NUL. */
#define BROKER_KEY_TEXT 41
/* A tenant's name as the config gives it, or the default "user:UID" / "key:KEY", and its NUL. */
#define BROKER_TENANT_TEXT 64

/* Outcomes a caller must handle, each with a message that names the problem. */
enum broker_error {
        BROKER_E_INVALID = 1, /* a value out of range or inconsistent */
        BROKER_E_UNKNOWN_GPU,
        BROKER_E_UNKNOWN_LEASE,
        BROKER_E_UNKNOWN_CHUNK,
        BROKER_E_LIMIT,      /* a configured limit (chunks, leases) reached */
        BROKER_E_WRONG_ROLE, /* e.g. draining a consumer */
        BROKER_E_NO_MEMORY,  /* nothing at all could be granted */
        BROKER_E_BARRED,     /* a consumer that missed a reclaim deadline */
        BROKER_E_BUSY,       /* the GPU is registered by another live client */
        BROKER_E_DRAINING,   /* an operator drained the producer's GPU: no offers until undrained */
        BROKER_E_PERMISSION, /* the identity may not do it: a GPU it shows no evidence it may use */
        _BROKER_E_MAX,
};

enum gpu_role {
        GPU_ROLE_UNSPECIFIED, /* known from the journal only, before its client registers */
        GPU_ROLE_PRODUCER,    /* lends its memory */
        GPU_ROLE_CONSUMER,    /* borrows */
        GPU_ROLE_NEUTRAL,     /* registered, neither lends nor borrows */
        _GPU_ROLE_MAX,
};

/* The transport's connection a GPU is registered by; the pool never looks inside. */
struct client;

/* The core's objects: their bodies are in broker-private.h, which only daemon/core/ includes;
 * code outside the core reaches them through the functions below and view.c's values. */
struct broker;
struct gpu;
struct chunk;
struct lease;

/*
 * Who a registration belongs to (daemon/README.md, "Who may hold what"): on this host the uid
 * the kernel gave for the side channel and the process (pid, start time, boot), on another host
 * the CURVE public key its connection authenticated with.
 */
struct broker_identity {
        bool remote;
        uid_t uid;                 /* local */
        struct proc_id process;    /* local; pid 0: the kernel could not say */
        char key[BROKER_KEY_TEXT]; /* remote */
        /*
         * Its tenant (daemon/README.md, "Who may hold what"): a consumer borrows only from lenders
         * of its own tenant. Empty: the default, a tenant of its own user (local) or key (remote).
         */
        char tenant[BROKER_TENANT_TEXT];
        /* Root or aquad's own user, on this host: it can read any process's memory already, so
         * what it lends exposes nobody and it lends to every tenant. */
        bool lends_to_all;
};

/* Custody of a GPU's state: the identity that holds it and the hash of the secret it was given. */
#define CUSTODY_UID_UNKNOWN ((uid_t)-1) /* state journaled before custody: the uid is not known */

struct custody {
        bool held; /* false: nobody's (nothing to inherit, or never registered) */
        struct broker_identity who;
        bool has_secret; /* false only for state journaled before secrets existed */
        uint8_t secret_hash[BROKER_SECRET_HASH_LEN];
};
/* How often a silent holder's process is looked at after a restart. */
#define BROKER_LIVENESS_RECHECK_NS (UINT64_C(1000) * 1000 * 1000)

enum chunk_state {
        CHUNK_FREE,       /* in the pool, grantable when the daemon holds its fd */
        CHUNK_LEASED,     /* mapped by a consumer */
        CHUNK_RECLAIMING, /* its consumer was asked to return it */
        _CHUNK_STATE_MAX,
};

enum lease_state {
        LEASE_GRANTED,
        LEASE_RECLAIMING, /* some of its chunks are being reclaimed */
        LEASE_RETURNED,   /* all chunks back: about to be freed */
        LEASE_LOST,       /* could not be reconciled after a restart */
        _LEASE_STATE_MAX,
};

/* What a GPU's client last reported of its engine (LoadReport); aquad only shows it. */
struct broker_load {
        double load; /* 0..1 */
        uint64_t used_bytes, free_bytes;
        uint64_t migrations, bytes_moved; /* since the client started */
        uint64_t dram_bytes;              /* kept in DRAM fallback */
};

enum notice_kind {
        NOTICE_RECLAIM,      /* ReclaimNotice to a consumer */
        NOTICE_RECLAIMED,    /* Reclaimed to a producer */
        NOTICE_PAIR_CHANGED, /* PairChanged to either */
        NOTICE_SCRUB,        /* ScrubRequest to a producer */
        _NOTICE_KIND_MAX,
};

struct notice {
        struct list_node node;
        enum notice_kind kind;
        struct gpu *gpu; /* recipient; the pool never frees a GPU with notices queued */
        uint64_t lease_id;
        uint64_t *chunk_ids;
        size_t n_chunk_ids;
        uint64_t deadline_ms;
        char *text; /* reason, or the new pair */
};

struct broker_settings {
        uint64_t dram_budget;
        uint64_t reclaim_deadline_ns;
        uint64_t reconcile_timeout_ns;
        uint64_t max_chunks;
        uint64_t max_leases;
        uint64_t max_grant_chunks; /* chunks in one Grant (the peer's repeated-field limit) */
        bool auto_pairing;
        const struct topology
            *links;    /* bandwidths for links GPUs report without one; may be NULL */
        bool scrub;    /* chunks a consumer mapped are scrubbed before another consumer gets them */
        bool colocate; /* producer and consumer registrations of one GPU are separate GPUs */
        /* Whether a holder that has not re-registered after a restart is provably gone
         * (proc_liveness by default; tests replace it). */
        enum proc_liveness (*liveness)(const struct proc_id *id);
};

struct broker_stats {
        uint64_t deadline_misses;
        uint64_t leases_granted;
        uint64_t leases_lost;
        uint64_t chunks_offered;
        uint64_t journal_errors;
        uint64_t journal_commits; /* records written: one write and one fdatasync each */
        uint64_t compaction_failures;
        uint64_t scrubs_requested; /* chunks producers were asked to scrub */
        uint64_t chunks_scrubbed;
        uint64_t scrub_failures;
        uint64_t chunks_unusable; /* consumers could not import them (dropped) */
        uint64_t custody_refused; /* Hellos for a GPU whose state another identity holds */
        /* Chunks (and their bytes) consumers returned in answer to reclaims: what moved off peer
         * memory. Also per consumer GPU, but those go with the GPU when aquad forgets it. */
        uint64_t reclaim_returned_chunks, reclaim_returned_bytes;
};

typedef void (*broker_reclaimed_fn)(void *userdata, uint64_t latency_ns);
