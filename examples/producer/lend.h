/*
 * What a producer keeps and what it lends as its load changes: the working
 * set for a load, reclaim at once when it grows into lent memory, re-offer
 * with hysteresis (a load band and a hold time) so the pool does not flap.
 */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

struct lend_config {
        uint64_t capacity;        /* the producer GPU's HBM */
        uint64_t weights;         /* always kept: model weights and fixed buffers */
        uint64_t activation_peak; /* what its own serving uses on top at load 1.0 */
        uint64_t margin;          /* headroom always kept */
        uint64_t chunk;           /* lending granularity (power of two, e.g. 2 MiB) */
        double band;              /* offer only what stays lendable if load rises by this much */
        uint64_t hold_ns;         /* and only once that has been true for this long */
        uint64_t min_offer;       /* never offer less than this at once */
};

void lend_config_defaults(struct lend_config *c);
/* -EINVAL when the numbers cannot describe a GPU (chunk not a power of two, band outside [0, 1],
 * ...). */
int lend_config_check(const struct lend_config *c);

/* Memory the producer must keep at load (0..1): weights + activations + margin, at most capacity.
 */
uint64_t lend_working_set(const struct lend_config *c, double load);
/* What it could lend at load: the rest, rounded down to whole chunks. */
uint64_t lend_lendable(const struct lend_config *c, double load);

enum lend_action {
        LEND_NONE,
        LEND_OFFER,
        LEND_RECLAIM,
        _LEND_ACTION_MAX,
        _LEND_ACTION_INVALID = -EINVAL,
};

const char *lend_action_to_string(enum lend_action a);

struct lend_state {
        uint64_t lent; /* bytes in the pool (offered and not reclaimed) */
        bool ever_offered;
        bool pending; /* the offer condition holds, since pending_since_ns */
        uint64_t pending_since_ns;
};

/*
 * Decide at time now_ns (non-decreasing from call to call) with the current
 * load. Reclaim fires at once when the working set grows into lent memory.
 * An offer fires when lendable(load + band) exceeds what is lent by at least
 * min_offer and has done so for hold_ns (the very first offer does not wait:
 * nothing was lent, so nothing can flap). Writes the action and its size.
 */
void lend_decide(const struct lend_config *c, struct lend_state *s, uint64_t now_ns, double load,
                 enum lend_action *ret_action, uint64_t *ret_bytes);
/* Record what the lending backend actually did (it may offer or return less). */
void lend_commit(struct lend_state *s, enum lend_action a, uint64_t bytes);

/*
 * The lending calls, behind an interface so the policy runs without a
 * daemon. offer: put bytes more into the pool; *ret_bytes is what really
 * went in. reclaim: take bytes back; returns once they are free for the
 * producer's own use (a consumer still mapping them has moved off);
 * *ret_bytes is what left the pool. report_load: tell the coordinator the load
 * (may be NULL). poll: handle what the coordinator sent, once per step (may
 * be NULL). Negative errno on failure.
 */
struct lend_ops {
        const char *name;
        int (*offer)(void *ctx, uint64_t bytes, uint64_t *ret_bytes);
        int (*reclaim)(void *ctx, uint64_t bytes, uint64_t *ret_bytes);
        int (*report_load)(void *ctx, double load);
        int (*poll)(void *ctx);
        void (*free)(void *ctx);
};

struct lend_backend {
        const struct lend_ops *ops;
        void *ctx;
};

void lend_backend_free(struct lend_backend *b);

/* A dry-run backend: keeps the books only (everything offered is taken, everything reclaimed
 * returns). */
int lend_dry_run_new(struct lend_backend *ret);

/*
 * The aqua backend (lend-aqua.c): a libaqua producer context on a CUDA device.
 * offer allocates exportable chunks of `chunk` bytes and offers them to aquad;
 * reclaim asks for them back and waits (up to reclaim_timeout_ns) for the
 * consumers to move off: what is still on its way then counts as reclaimed
 * (it has left the pool) and is released later inside poll (aqua_poll());
 * report_load sends the load with the working set the policy keeps.
 */
struct lend_aqua_config {
        const char *endpoint; /* NULL: $AQUA_ENDPOINT or libaqua's default */
        int device;
        uint64_t reclaim_timeout_ns;
        const struct lend_config *policy; /* for the used/free bytes of load reports */
};

/* Errors of aqua_open(): -ECONNREFUSED or -ENOENT (no aquad), -ELIBACC (no driver), ... */
int lend_aqua_new(const struct lend_aqua_config *c, struct lend_backend *ret);

/* What the aqua backend saw: bytes freed after their reclaim call returned (inside poll). */
uint64_t lend_aqua_late_reclaimed(const struct lend_backend *b);
