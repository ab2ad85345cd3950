/*
 * The state of one aqua_ctx: the session's (session.c: open, close, registration, reconnecting,
 * pending requests, the event queue, aqua_poll), what both roles use (the GPU, the transport,
 * batched copies), and each role's own (struct producer_state, struct consumer_state). The
 * session reaches a role only through struct role_ops: its messages, what it says in
 * aqua_get_info() and load reports, its work in aqua_poll(), and freeing it in aqua_close().
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "aqua.pb-c.h"
#include "aqua/aqua.h"
#include "gpu.h"
#include "lease.h"
#include "move.h"
#include "offers.h"
#include "transport.h"

/* An asynchronous request whose reply aqua_poll() will meet. */
enum pending_kind {
        PENDING_HELLO,   /* re-registration after a reconnect */
        PENDING_RECLAIM, /* aqua_reclaim() or aqua_reclaim_async() */
        PENDING_RETURN,  /* chunks returned after a reclaim notice */
        PENDING_OFFER,   /* an offer whose caller timed out: its chunks wait for ids */
        PENDING_BORROW,  /* a borrow whose caller timed out: a late grant must go back */
};

struct ctx_pending {
        uint64_t request_id;
        enum pending_kind kind;
        /* PENDING_OFFER: the offers ref of the batch's first chunk; PENDING_RECLAIM: the token
         * of the blocking aqua_reclaim() it is for, 0: none (async) */
        uint64_t arg;
};

/* What a client holds, for re-registering after the daemon restarted. */
struct held {
        Aqua__HeldChunk *items;
        Aqua__HeldChunk **ptrs;
        size_t n;
        int *fds; /* producer: an exported fd per item, for REREGISTER_FDS */
        uint8_t (*fabric)[GPU_FABRIC_HANDLE_LEN]; /* a fabric producer's handles instead */
        uint64_t *ids;                            /* producer: the chunk id per item */
};
void held_clear(struct held *h);

enum session_state {
        SESSION_CONNECTED,
        SESSION_RETRY,         /* lost: the timer says when to try again */
        SESSION_AWAIT_TOKEN,   /* side channel connected, waiting for HELLO */
        SESSION_AWAIT_WELCOME, /* Hello sent */
};

/* What a blocking call waits for, made done by the dispatch of the message it waits on. */
struct completion {
        bool done;
        int result; /* 0, or why it failed (the reply was an error) */
};
static inline void complete(struct completion *c, int result)
{
        c->done = true;
        c->result = result;
}

/* The blocking aqua_reclaim() in progress: its replies and the Reclaimed notices that free its
 * chunks are dispatched as any others, and tell it here. */
struct reclaim_wait {
        uint64_t token;             /* 0: none in progress; never reused */
        struct completion replied;  /* the reply to its latest request */
        uint64_t covered;           /* bytes that reply covered (free now and pending) */
        uint64_t freed;             /* bytes seen freed so far */
        size_t waiting;             /* its chunks still out */
        struct completion returned; /* done when none is out any more */
};

/* What only a producer keeps (producer.c). */
struct producer_state {
        struct offers offers;
        struct reclaim_wait reclaim;
        uint64_t last_token; /* of the last blocking reclaim */
        uint64_t *scrub_ids;    /* chunks the daemon asked to scrub, not yet done */
        size_t scrub_n, scrub_cap;
        void *scrub_buf; /* pinned host memory chunks are read back into */
};

/* What only a consumer keeps (consumer.c, tensor.c). */
struct consumer_state {
        struct lease_table leases;
        uint64_t dram_granted;
        uint64_t migrations, bytes_moved;
        /* aqua tensors (tensor.c), bytes of their chunks per tier */
        struct aqua_tensor *tensors;
        uint64_t tensor_bytes[4];
};

/* A copy batch libaqua queued that has not completed (copy.c keeps them). */
struct copy_inflight {
        uint64_t ticket;
        struct CUevent_st *ev;
        /* For a report if it fails: its first piece, how many pieces and bytes in all. */
        uint64_t dst, src, bytes;
        size_t n;
};

struct aqua_ctx {
        int device;
        enum aqua_role role;
        const struct role_ops *ops;               /* NULL: neutral */
        char *endpoint, *side_path, *client_name; /* side_path NULL: fabric */
        /* On another host than aquad (tcp:// and no side channel): chunk handles are fabric
         * handles in the messages, not descriptors. */
        bool fabric;
        char host[256]; /* gethostname(), sent in Hello */
        int timeout_ms;
        uint64_t chunk_bytes;

        struct gpu_dev *gpu;
        struct transport *t;

        enum session_state state;
        uint64_t hello_id;            /* request id of the asynchronous Hello */
        uint64_t session_deadline_ns; /* RETRY: when to try; AWAIT_*: when to give up */
        unsigned backoff_ms;
        uint64_t client_id;
        char paired_with[48];
        uint64_t dram_budget;
        uint64_t reclaim_deadline_ms;
        uint64_t keepalive_ms; /* fabric: Welcome.keepalive_ms */
        /* The custody secret aquad gave (Welcome.custody_secret), presented when registering
         * again: without it aquad gives what this GPU holds to nobody, this client included. */
        uint8_t custody_secret[32];
        bool has_custody_secret;
        uint64_t keepalive_due_ns; /* fabric: when the next Keepalive goes */

        struct producer_state producer;
        struct consumer_state consumer;

        /* batched copies still in flight, oldest first, and spare events (copy.c) */
        struct copy_inflight *copies;
        size_t n_copies, cap_copies;
        struct CUevent_st **spare_events;
        size_t n_spare, cap_spare;
        uint64_t next_ticket;
        uint64_t *failed_tickets; /* batches whose completion failed (reported once) */
        size_t n_failed;
        bool no_batch_copy; /* tests: behave as if the driver had no cuMemcpyBatchAsync */

        /* events not yet handed out, a ring */
        struct aqua_event *events;
        size_t ev_head, ev_n, ev_cap;

        struct ctx_pending *pending;
        size_t n_pending, cap_pending;
};

/* Now + the context's timeout, in CLOCK_MONOTONIC ns. */
uint64_t ctx_deadline(const aqua_ctx *ctx);

int ctx_push_event(aqua_ctx *ctx, const struct aqua_event *ev);
/* Drop queued events that name lease (it is being freed). */
void ctx_forget_lease_events(aqua_ctx *ctx, const aqua_lease *lease);

int ctx_add_pending(aqua_ctx *ctx, uint64_t request_id, enum pending_kind kind, uint64_t arg);
/* Remove and return the pending request with this id; false when unknown. */
bool ctx_take_pending(aqua_ctx *ctx, uint64_t request_id, struct ctx_pending *ret);

/* session.c: connect, register and wait for the Welcome before deadline_ns (aqua_open()); a
 * step of reconnecting when it is due; a keepalive when one is due (aqua_poll()). */
int session_connect(aqua_ctx *ctx, uint64_t deadline_ns);
void session_step(aqua_ctx *ctx);
void session_keepalive(aqua_ctx *ctx);
/* Tell aquad this context maps nothing any more (a client on tcp://, at close). */
void session_goodbye(aqua_ctx *ctx);

/* Reconnect (if the session was lost) before deadline_ns; 0 or -ENOTCONN. */
int ctx_ensure_connected(aqua_ctx *ctx, uint64_t deadline_ns);

/*
 * Send req and wait for its reply, reconnecting first if the session was lost. An Error reply
 * becomes its AQUA_* outcome or negative errno (the reply is freed); *ret_reply is set only on 0.
 * Loss of the daemon meanwhile gives -ENOTCONN and starts reconnecting.
 */
int ctx_call(aqua_ctx *ctx, Aqua__Envelope *req, uint64_t deadline_ns, Aqua__Envelope **ret_reply);

/* Handle one message outside of a call (aqua_poll(), or while a blocking call waits). */
int ctx_dispatch(aqua_ctx *ctx, Aqua__Envelope *e);
/* Read and dispatch what is already there without blocking. */
int ctx_pump(aqua_ctx *ctx);
/* Dispatch what arrives until c is done (0), the session is lost (-ENOTCONN), deadline_ns
 * passes (-ETIMEDOUT) or reading fails (its error). */
int ctx_wait(aqua_ctx *ctx, const struct completion *c, uint64_t deadline_ns);

/*
 * A role: what the session asks of the producer (producer.c) or the consumer (consumer.c).
 * Members may be NULL; a neutral context has no role (ctx->ops NULL).
 */
struct role_ops {
        /* What it holds, for re-registering after the daemon restarted. */
        int (*held)(aqua_ctx *ctx, struct held *ret);
        /* A notice (request id 0) the session does not handle itself. */
        int (*dispatch)(aqua_ctx *ctx, Aqua__Envelope *e, bool *ret_handled);
        /* The reply (or error) to a request the role tracks: PENDING_OFFER, PENDING_BORROW
         * (their callers stopped waiting) or PENDING_RECLAIM (aqua_reclaim's or async). */
        void (*reply)(aqua_ctx *ctx, const struct ctx_pending *p, Aqua__Envelope *e);
        /* The daemon went away: forget what only it knew. */
        void (*session_lost)(aqua_ctx *ctx);
        /* A restarted daemon does not know this lease any more. */
        void (*lease_lost)(aqua_ctx *ctx, uint64_t lease_id);
        /* aqua_get_info(): the role's own figures. */
        void (*info)(const aqua_ctx *ctx, struct aqua_info *ret);
        /* aqua_report_load(): what the role adds to the report. */
        void (*load)(const aqua_ctx *ctx, Aqua__LoadReport *lr);
        /* aqua_poll(): whether the role has work of its own, and a bounded step of it. */
        bool (*busy)(const aqua_ctx *ctx);
        void (*poll_step)(aqua_ctx *ctx);
        /* A failed copy's report: where addr lies in the role's terms, into buf; false: not
         * in its memory. */
        bool (*describe)(const aqua_ctx *ctx, uint64_t addr, char *buf, size_t len);
        /* aqua_close(): give back everything it holds, before the transport closes. */
        void (*free)(aqua_ctx *ctx);
};

/* producer.c: the chunks it holds are in the daemon's pool (re-registered with fresh fds); a
 * late OfferReply names the batch of a PENDING_OFFER; chunks still waiting for an id are
 * released when the daemon that would have named them is gone. */
extern const struct role_ops producer_role;

/* Drop queued events that name t (it is being freed). */
void ctx_forget_tensor_events(aqua_ctx *ctx, const struct aqua_tensor *t);

/* copy.c */
/* Wait for every batch libaqua queued that has not completed yet (before moving memory). */
int copies_wait_all(aqua_ctx *ctx);
/* Wait, then free the events (aqua_close). */
void copies_clear(aqua_ctx *ctx);

/* consumer.c: it holds the leased chunks still mapped from a producer; a late Grant goes
 * back; a lease the daemon lost has its data moved off and is forgotten there. */
extern const struct role_ops consumer_role;
