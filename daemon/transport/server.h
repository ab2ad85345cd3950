/*
 * aquad's event loop: the ZeroMQ ROUTER, the side-channel listener and every client's side
 * socket, a signalfd and the pool's deadlines, all in one zmq_poll(). Single-threaded: nothing
 * here locks.
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
        struct gpu *gpu; /* producer, consumer or neutral */
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
        size_t n_outbox; /* both */
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

/* admission.c: a side channel that connects (accepted or refused), and one that is readable;
 * false: that client is gone. */
void admission_accept_side(struct server *s);
bool admission_read_side(struct server *s, struct client *c);

/* Set up from config (taken on success): sockets' locks, journal replay, sockets, signals. */
int server_new(struct config *config, const char *config_path, unsigned flags, struct server **ret);
struct server *server_free(struct server *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct server *, server_free);
void server_set_ready(struct server *s, server_ready_fn fn, void *userdata);
/* Serve until SIGTERM or SIGINT; returns 0 after a clean stop. */
int server_run(struct server *s);

/* reload.c: limits, budgets and pins from s->config (ops/settings.h); the SIGHUP reload. */
void server_apply_settings(struct server *s);
int server_apply_pins(struct server *s);
/* Load the config file again and apply what can change live (daemon/README.md, SIGHUP). On a
 * file with errors it keeps the running configuration and returns < 0 with the error in err;
 * on success kept names what waits for a restart ("" if nothing). err and kept may be NULL. */
int server_reload(struct server *s, char *err, size_t err_len, char *kept, size_t kept_len);

/* setup.c, for server_new(): each 0 or a negative errno, logged. */
int server_lock_sockets(struct server *s);
int server_open_journal(struct server *s, bool repair);
/* As many descriptors as aquad may hold; returns the limit (0: none it can tell). */
uint64_t server_raise_fd_limit(void);
int server_open_signals(struct server *s);
int server_open_side(struct server *s);
int server_open_router(struct server *s);
/* fdguard.c: the ROUTER's monitor, and descriptor headroom for its listeners. */
int fdguard_open(struct server *s);
/* A monitor event: its kind, value (a descriptor) and endpoint. */
void fdguard_event(struct server *s, uint16_t event, uint32_t value, const char *endpoint);
/* Pause or resume the listeners by the descriptors free at now. */
void fdguard_check(struct server *s, uint64_t now);
/* Before the ROUTER closes: the ipc:// socket under its own name again. */
void fdguard_close(struct server *s);
/* Whether a listener is paused (the loop then looks again soon). */
static inline bool fdguard_paused(const struct server *s)
{
        return s->fdg.ipc_paused || s->fdg.tcp_paused;
}

/* remote.c: ZAP, the handshake monitor and the CURVE bind of remote.endpoint (none: 0). */
int server_open_remote(struct server *s);
/* ZAP requests and handshake failures on remote.endpoint (server.c's loop calls these). */
void server_handle_zap(struct server *s);
void server_handle_monitor(struct server *s);

/* ------------------------------------------------------------ for dispatch.c and admin.c */

/* turn.c: what a turn says waits until the turn's one commit (server_end_turn); nothing here
 * touches the disk. Queue e to client c (-ENOTCONN before its Hello). */
int server_queue(struct server *s, struct client *c, Aqua__Envelope *e);
/* Queue e as the reply to request_id. */
void server_reply(struct server *s, struct client *c, uint64_t request_id, Aqua__Envelope *e);
/* Queue to a routing id (a peer that may not be registered). */
int server_queue_to(struct server *s, const void *routing_id, size_t len, Aqua__Envelope *e);
int server_queue_error(struct server *s, const void *routing_id, size_t len, uint64_t request_id,
                       int code, const char *fmt, ...) _printf_(6, 7);
/* An error to a client: "what: err", or err alone when what is NULL. */
int client_queue_error(struct server *s, struct client *c, uint64_t request_id, int code,
                       const char *what, const char *err);

/* A change that hands out custody, undone if its turn's commit is refused or its reply cannot
 * be sent. The caller fills kind and what it handed out; server_queue_custody the rest. */
enum custody_kind { CUSTODY_OFFER, CUSTODY_GRANT };
struct turn_change {
        struct list_node node;
        enum custody_kind kind;
        struct client *client;
        uint64_t request_id;
        struct broker_grant grant; /* CUSTODY_GRANT */
        uint64_t *ids;             /* CUSTODY_OFFER: the chunks taken (owned) */
        size_t n;
        struct queued *reply;
};
/* Queue e, the reply that acknowledges k (taken on success). */
int server_queue_custody(struct server *s, struct client *c, Aqua__Envelope *e,
                         struct turn_change *k);
void turn_change_free(struct turn_change *k);
/* Whether this turn granted lease_id (its return must wait for the turn's end). */
bool server_turn_granted(const struct server *s, uint64_t lease_id);
/* End the turn now if it holds a custody change: before what could touch that state. */
void server_turn_barrier(struct server *s);
/* Commit once (a degraded journal only when its probe is due), undo the turn's custody changes
 * if that was refused, then send: replies and grants' descriptors in order, then notices. */
void server_end_turn(struct server *s);
/* When the loop must end a turn with nothing to read (the probe, what sends journaled); 0: none. */
uint64_t server_turn_deadline(const struct server *s);
/* Forget what the turn holds, unsent (aquad is going). */
void server_turn_clear(struct server *s);
/* Send now, bypassing the turn: for the notices and deferred replies of server_flush_outboxes.
 * -EAGAIN: the ROUTER's queue to c is full (ZeroMQ's high-water mark); try again later. */
/* outbox.c: the ROUTER's sends (through s->sink in tests); a drop is counted and logged. */
int outbox_router_send(struct server *s, const void *rid, size_t rlen, const void *buf, size_t len,
                       const char *body);
void outbox_log_dropped(struct server *s, const void *rid, size_t len, const char *body,
                        const char *why);
/* Who a routing id names, for the log. */
const char *outbox_peer_text(struct server *s, const void *rid, size_t len, char *buf, size_t size);
int server_send_now(struct server *s, struct client *c, Aqua__Envelope *e);
int server_send_encoded(struct server *s, struct client *c, const void *buf, size_t len,
                        const char *body);
/* outbox.c: put the notices the core queued into their clients' outboxes; send what the
 * ROUTER takes of them now (at the end of a turn, after its commit). */
void server_stage_notices(struct server *s);
void server_flush_outboxes(struct server *s);
/* Keep a custody reply (encoded: buf is taken) the ROUTER could not take for c, in front of its
 * notices. Returns 0, or -ENOMEM (buf is the caller's still). */
int server_defer_reply(struct server *s, struct client *c, void *buf, size_t len,
                       const char *body);
/* Drop what c's outbox holds (c is going away). */
void server_outbox_clear(struct server *s, struct client *c);
struct client *server_find_by_routing(struct server *s, const void *routing_id, size_t len);
struct client *server_find_by_token(struct server *s, const void *token, size_t len);
void client_free_pending(struct client *c, struct pending *p);
/* Forget what c's HelloHeld parts said it holds (its Hello came, or it went). */
void client_free_held(struct server *s, struct client *c);
/* The process on the other end of the ZeroMQ connection a request came on (ipc:// only);
 * -ENOENT or another negative errno when that is not known. */
int origin_peer(const struct origin *o, struct side_cred *ret);
bool client_is_admin(const struct server *s, const struct client *c);
/* The role c registered as: its GPU's (the core keeps it), admin, or UNSPECIFIED before Hello. */
Aqua__Role client_role(const struct client *c);
/* Whether c may make aquad hold n more descriptors (its budget, the process's headroom). */
bool server_may_take_fds(struct server *s, const struct client *c, size_t n);

/* Forget a client (an unregistered one: nothing it holds is touched but its pending requests). */
void server_drop_client(struct server *s, struct client *c);
/* Forget a remote client that can no longer be heard; its GPU keeps what it holds. */
void server_detach_gpu(struct server *s, struct client *c);
/* A client that registered over tcp:// (dispatch.c); NULL after an error was sent. */
struct client *server_add_remote(struct server *s, const struct origin *o, uint64_t request_id);

/* dispatch.c */
void dispatch_envelope(struct server *s, const struct origin *o, const void *data, size_t size);
/* A request whose descriptors have all arrived (p is freed). */
void dispatch_complete(struct server *s, struct client *c, struct pending *p);
/* A frame of descriptors from the client's side channel: its request runs once they are all
 * there (descriptors.c matches them). */
void dispatch_side_frame(struct server *s, struct client *c, Aqua__SideFrame *frame, int *fds,
                         size_t n_fds);

/* descriptors.c: requests and the descriptors they wait for */
/* How many descriptors a waiting request needs. */
size_t pending_fds_needed(const Aqua__Envelope *e);
struct pending *pending_find(struct client *c, uint64_t request_id);
/* NULL over the client's pending limit (before its Hello: one), or out of memory. */
struct pending *pending_add(struct server *s, struct client *c, uint64_t request_id);
/* Take a side frame's descriptors for the request they belong to (a bad frame closes them and
 * says why); that request's pending entry when it now has every descriptor it needs, else NULL. */
struct pending *pending_take_fds(struct server *s, struct client *c, Aqua__SideFrame *frame,
                                 int *fds, size_t n_fds);
/* A request still waiting at now_ns past its deadline is answered with an error. */
void pending_expire(struct server *s, struct client *c, uint64_t now_ns);

/* admin.c */
void admin_handle(struct server *s, struct client *c, const Aqua__Envelope *e);
