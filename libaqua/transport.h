/*
 * The client's two channels to aquad: a ZeroMQ DEALER carrying Envelopes, and the AF_UNIX
 * SOCK_SEQPACKET side channel carrying SideFrames with file descriptors. Requests are matched to
 * replies by request_id; whatever arrives while a caller waits for its reply is queued, in order,
 * for transport_next(). One epoll fd watches both channels (and a timer) for event loops.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "aqua.pb-c.h"
#include "side.h"
#include "util.h"
#include "wire.h"

/* Positive outcomes. */
enum {
        TRANSPORT_E_REJECTED = 1, /* the daemon refused our credentials on the side channel */
        TRANSPORT_E_CLOSED,       /* the side channel reached EOF: the daemon is gone */
        /* Several endpoints: a call saw a new connection made (another aquad leads now), so
         * the one its request went to is gone and no reply will come. */
        TRANSPORT_E_RECONNECTED,
};

struct transport;

/* A side frame that arrived while nobody was waiting for it, with its descriptors. */
struct side_msg {
        struct side_msg *next;
        Aqua__SideFrame *frame;
        size_t n_fds;
        int fds[];
};

/*
 * Create the DEALER (connected to endpoint; ZeroMQ connects in the background) and the epoll fd.
 * side_path is where transport_side_connect() goes; NULL: none (a client on another host, whose
 * chunk handles travel in the messages). No I/O happens here.
 */
/* CURVE keys (Z85) for the DEALER; all NULL: none. */
struct transport_curve {
        const char *server_key, *public_key, *secret_key;
};

int transport_new(const char *endpoint, const char *side_path, const struct transport_curve *curve,
                  struct transport **ret);
struct transport *transport_free(struct transport *t);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct transport *, transport_free);

/*
 * Connect the side channel (replacing a previous one) and wait until deadline_ns for the
 * daemon's HELLO frame; its token goes to ret_token. Returns 0, TRANSPORT_E_REJECTED (reason
 * from transport_reject_reason()), TRANSPORT_E_CLOSED, -ECONNREFUSED / -ENOENT (nobody
 * listening), -ETIMEDOUT.
 */
int transport_side_connect(struct transport *t, uint64_t deadline_ns,
                           uint8_t ret_token[SIDE_TOKEN_LEN]);
/* The same in two non-blocking halves, for reconnecting from a poll loop: start returns
 * 0 or a negative errno; finish returns 0, -EAGAIN (no frame yet), or as above. */
int transport_side_start(struct transport *t);
int transport_side_finish(struct transport *t, uint8_t ret_token[SIDE_TOKEN_LEN]);
/* Drop the side channel (after EOF); the DEALER stays. */
void transport_side_close(struct transport *t);
bool transport_side_connected(const struct transport *t);
const char *transport_reject_reason(const struct transport *t);
/* Why, as the daemon's REJECT frame said (UNSPECIFIED from an older daemon). */
Aqua__SideFrame__RejectReason transport_reject_code(const struct transport *t);

/* A fresh request id (never 0). */
uint64_t transport_next_id(struct transport *t);

/* Send e without waiting. Returns 0, -EAGAIN (the outgoing queue is full), -ENOMEM. */
int transport_send(struct transport *t, Aqua__Envelope *e);

/*
 * Send req (with a fresh request_id stored in req, unless it has one) and wait until deadline_ns
 * for the reply carrying the same id. Envelopes that arrive meanwhile are queued for
 * transport_next(). Returns 0, TRANSPORT_E_CLOSED (the daemon went away meanwhile), -ETIMEDOUT,
 * -EAGAIN, -ENOMEM.
 */
int transport_call(struct transport *t, Aqua__Envelope *req, uint64_t deadline_ns,
                   Aqua__Envelope **ret_reply);

/*
 * The next Envelope that arrived: queued ones first, then what ZeroMQ already holds. Never
 * blocks. Returns 0, -EAGAIN (nothing), -ENOMEM. Undecodable messages are dropped (counted in
 * transport_dropped()).
 */
int transport_next(struct transport *t, Aqua__Envelope **ret);

/*
 * Read what the side channel holds without blocking and queue it. Returns 0,
 * TRANSPORT_E_REJECTED, TRANSPORT_E_CLOSED (after which the side channel is closed), or a
 * negative errno.
 */
int transport_side_pump(struct transport *t);

/*
 * Take the queued side frame of `kind` for lease_id (GRANT_FDS) or request_id (others; 0
 * matches any), waiting until deadline_ns for it. The caller owns the result (side_msg_free).
 * Returns 0, TRANSPORT_E_CLOSED, TRANSPORT_E_REJECTED, -ETIMEDOUT.
 */
int transport_side_take(struct transport *t, Aqua__SideFrame__Kind kind, uint64_t id,
                        uint64_t deadline_ns, struct side_msg **ret);
struct side_msg *side_msg_free(struct side_msg *m);
/* Read what the side channel holds, then close every queued frame of kind (stale grants). */
void transport_side_drop(struct transport *t, Aqua__SideFrame__Kind kind);

/* Send a side frame with descriptors (they stay open in the caller). */
int transport_side_send(struct transport *t, Aqua__SideFrame *f, const int *fds, size_t n_fds);

/* Without a side channel: whether ZeroMQ connected again since the first connection (or the last
 * call), which aquad sees as a new client. */
bool transport_reconnected(struct transport *t);
/*
 * True when nothing can be pending: no queued envelope or side frame, ZeroMQ's and the side
 * channel's fds not readable, and the last receive drained ZeroMQ. One poll(2) with timeout 0.
 */
bool transport_idle(struct transport *t);

/* Wait until something may be readable, the timer fires, or deadline_ns. Returns 0 or
 * -ETIMEDOUT. */
int transport_wait(struct transport *t, uint64_t deadline_ns);

/* Arm the timer that makes transport_fd() readable at deadline_ns (0 disarms). */
int transport_set_timer(struct transport *t, uint64_t deadline_ns);
/* True (once) when the timer has fired since it was armed. */
bool transport_timer_fired(struct transport *t);

/* The epoll fd that watches the DEALER, the side channel and the timer. */
int transport_fd(const struct transport *t);

uint64_t transport_dropped(const struct transport *t);
