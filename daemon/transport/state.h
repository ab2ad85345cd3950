/*
 * The transport's state: the server (sockets, clients, limits, the turn's lists, statistics) and
 * each client with what it waits for and holds. Data only: every transport file reads it, and
 * each module's functions are declared in its own header.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "aqua.pb-c.h"
#include "broker.h"
#include "config.h"
#include "list.h"
#include "metrics.h"
#include "proc.h"
#include "ratelimit.h"
#include "side.h"
#include "wire.h"

#define CLIENT_MAX_GROUPS  64
#define CLIENT_MAX_ROUTING 256

struct server;

/* A request waiting for its descriptors, or descriptors waiting for their request. */
struct pending {
        struct list_node node;
        uint64_t request_id;
        Aqua__Envelope *env; /* NULL while only fds have arrived */
        int *fds;
        size_t n_fds;
        uint64_t deadline_ns;
};

/* A chunk a re-registering client holds, from a HelloHeld before its Hello; a remote producer's
 * fabric handle is kept with it. */
struct held_part {
        struct broker_held held; /* held.fabric is set from fabric when the Hello arrives */
        bool has_fabric;
        uint8_t fabric[BROKER_FABRIC_HANDLE_SIZE];
};

struct client {
        struct list_node node;
        uint64_t id;
        int side_fd;
        struct side_cred cred;
        struct proc_id process; /* pid 0: cannot be told (then its memory outlives silence) */
        gid_t groups[CLIENT_MAX_GROUPS];
        size_t n_groups;
        uint8_t token[SIDE_TOKEN_LEN];
        uint8_t routing_id[CLIENT_MAX_ROUTING];
        size_t routing_id_len; /* 0 until Hello */
        bool registered;
        /* Registered over tcp:// with CURVE: no side channel, no descriptors, no process aquad
         * can see; remote_user is the identity its key authenticated (remote.clients). */
        bool remote;
        char remote_user[64];
        char remote_key[BROKER_KEY_TEXT]; /* its identity: the CURVE public key, Z85 */
        char remote_addr[64];
        uint64_t last_seen_ns; /* remote: its last message, for remote.grace */
        struct gpu *gpu;       /* producer, consumer or neutral */
        uint64_t hello_deadline_ns;
        uint64_t accepted_ns;
        struct list_node pending;
        size_t n_pending;
        struct held_part *held; /* from HelloHeld before its Hello: the first of what it holds */
        size_t n_held;
        struct list_node outbox; /* notices (struct notice) not yet taken by the ROUTER */
        /* Replies that hand over custody (a Grant, an OfferReply) the ROUTER could not take at
         * the end of their turn (its queue to the client was full): sent before the notices. */
        struct list_node deferred;
        size_t n_outbox;    /* both */
        double credit;      /* requests it may send now (limits.request-rate, -burst) */
        uint64_t credit_ns; /* when credit was last topped up; 0: never */

        /* Side frames that did not decode: in all, not yet logged, when last logged (0: never). */
        uint64_t side_malformed, side_malformed_unlogged, side_malformed_log_ns;
};

/* Where the end of a turn sends a message: the ROUTER unless a test or fuzzer says otherwise;
 * 0 or a negative errno (-EAGAIN: the peer's high-water mark). */
typedef int (*server_sink_fn)(struct server *s, const void *routing_id, size_t routing_len,
                              const void *buf, size_t len);

/* Where a request came from: its routing id and what ZeroMQ tells of its connection. */
struct origin {
        const void *rid;
        size_t rlen;
        int fd;           /* the connection it came on; -1: unknown */
        bool remote;      /* ... and it is a tcp:// connection */
        const char *key;  /* its CURVE public key, Z85 (ZAP's User-Id); NULL: none */
        const char *addr; /* its peer address; NULL: unknown */
};

/* Called once aquad serves requests: where sd_notify(READY=1) belongs. */
typedef void (*server_ready_fn)(struct server *s, void *userdata);

/* Work done per wakeup before looking at the other sources again: no source starves another. */
#define SERVER_BATCH 256

/* Connections the ROUTER's listeners may have queued (ZMQ_BACKLOG): fewer than the descriptors
 * fdguard.c keeps free. */
#define FDGUARD_BACKLOG 16

struct fdguard {
        long counted;              /* descriptors open at the last count */
        uint64_t counted_ns;       /* when it was taken */
        uint64_t accepted, closed; /* ZeroMQ connections since */
        int pending[256];          /* tcp connections waiting for their CURVE handshake */
        size_t n_pending;
        bool ipc_paused, tcp_paused;
        uint64_t tcp_paused_ns;
        /* The executable's accept guard (daemon/accept-guard.h), where it has one: a user's
         * share of ipc:// connections, and how many it closed over a share so far. */
        void (*share)(long max);
        unsigned long (*share_refused)(void);
        uint64_t share_log_ns;
};

struct server {
        struct config *config;
        char *config_path;
        struct broker *broker;
        struct wire_limits limits;

        void *zctx;
        void *router;
        void *zap;     /* REP on inproc://zeromq.zap.01: who may finish a CURVE handshake */
        void *monitor; /* PAIR: the ROUTER's connections and handshakes (fdguard.c, remote.c) */
        struct fdguard fdg;
        int side_fd;
        int signal_fd;
        char *ipc_path;   /* file of an ipc:// endpoint, for its mode */
        int side_lock_fd; /* <side-socket>.lock: this aquad serves the side socket */
        int ipc_lock_fd;  /* <ipc file>.lock, where that is not the side socket */

        struct list_node clients;
        size_t n_clients;
        uint64_t next_client_id;

        bool stopping;
        bool verbose; /* -v: debug logging whatever the config says */
        int exit_status;
        uint64_t start_ns;
        server_ready_fn on_ready;
        void *ready_userdata;
        struct server_stats stats;
        struct metrics *metrics;       /* NULL unless the config names a metrics address */
        struct domain *domain;         /* NULL unless the config names a domain (etcd) */
        bool deposed;                  /* a commit's fence failed: this aquad leads no more */
        uint64_t journal_probe_ns;     /* degraded: when to try the journal again */
        struct list_node turn_out;     /* this turn's messages (turn.c), oldest first */
        server_sink_fn sink;           /* NULL: the ROUTER */
        struct list_node turn_custody; /* this turn's custody changes, oldest first */
        size_t n_outbox;               /* notices waiting in all clients' outboxes */
        size_t n_held_parts;       /* HelloHeld entries kept for all clients before their Hello */
        uint64_t fd_limit;         /* RLIMIT_NOFILE as aquad started (after raising it) */
        uint64_t accept_paused_ns; /* out of descriptors: no accepting before this */
        uint64_t evict_log_ns, fd_log_ns, share_log_ns;
        /* Every error reply and every dropped send has a line in the log (turn.c), within these
         * budgets; request: the kind of request being dispatched, which an error answers. */
        struct ratelimit error_log, drop_log;
        const char *request;
};

enum {
        /* A journal damaged before its tail is cut there (after a copy) instead of refused. */
        SERVER_REPAIR_JOURNAL = 1 << 0,
        /* No sockets, no signals, no lock: the journal and the core only, for dispatch driven by
         * a test or a fuzzer, whose sink takes what aquad sends (it cannot run its loop). */
        SERVER_UNBOUND = 1 << 1,
};
