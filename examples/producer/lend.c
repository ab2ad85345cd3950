/*
 * What a producer keeps and what it lends as its load changes: the working
 * set for a load, reclaim at once when it grows into lent memory, re-offer
 * with hysteresis (a load band and a hold time) so the pool does not flap.
 */
#include <math.h>
#include <stdlib.h>

#include "lend.h"
#include "example-util.h"

void lend_config_defaults(struct lend_config *c)
{
        /* An 80 GiB GPU serving a vision model: 16 GiB weights, up to 40 GiB of activations. */
        *c = (struct lend_config){
            .capacity = UINT64_C(80) << 30,
            .weights = UINT64_C(16) << 30,
            .activation_peak = UINT64_C(40) << 30,
            .margin = UINT64_C(2) << 30,
            .chunk = UINT64_C(2) << 20,
            .band = 0.1,
            .hold_ns = 2 * NSEC_PER_SEC,
            .min_offer = UINT64_C(256) << 20,
        };
}

int lend_config_check(const struct lend_config *c)
{
        if (!c || c->capacity == 0 || c->chunk == 0 || (c->chunk & (c->chunk - 1)) != 0 ||
            !(c->band >= 0 && c->band <= 1))
                return -EINVAL;
        return 0;
}

static double clamp01(double x)
{
        return !(x > 0) ? 0 : x > 1 ? 1 : x;
}

uint64_t lend_working_set(const struct lend_config *c, double load)
{
        /* To the nearest byte: 0.2 + 0.1 must mean 0.3, not one byte more and a chunk less. */
        long double need = (long double)c->weights + c->margin +
                           roundl((long double)c->activation_peak * clamp01(load));
        return need >= c->capacity ? c->capacity : (uint64_t)need;
}

uint64_t lend_lendable(const struct lend_config *c, double load)
{
        uint64_t free = c->capacity - lend_working_set(c, load);
        return free & ~(c->chunk - 1);
}

static const char *const action_names[_LEND_ACTION_MAX] = {
    [LEND_NONE] = "none",
    [LEND_OFFER] = "offer",
    [LEND_RECLAIM] = "reclaim",
};

const char *lend_action_to_string(enum lend_action a)
{
        return a >= 0 && a < _LEND_ACTION_MAX ? action_names[a] : NULL;
}

void lend_decide(const struct lend_config *c, struct lend_state *s, uint64_t now_ns, double load,
                 enum lend_action *ret_action, uint64_t *ret_bytes)
{
        uint64_t now_lendable = lend_lendable(c, load);

        /* The producer's own load always wins, without delay. */
        if (s->lent > now_lendable) {
                s->pending = false;
                *ret_action = LEND_RECLAIM;
                *ret_bytes = s->lent - now_lendable;
                return;
        }

        /* Offer only what would survive a rise of band: reclaim then offer again is what flaps. */
        uint64_t target = lend_lendable(c, clamp01(load + c->band));
        if (target <= s->lent || target - s->lent < MAX(c->min_offer, c->chunk)) {
                s->pending = false;
                *ret_action = LEND_NONE;
                *ret_bytes = 0;
                return;
        }
        if (!s->pending) {
                s->pending = true;
                s->pending_since_ns = now_ns;
        }
        if (s->ever_offered && now_ns - s->pending_since_ns < c->hold_ns) {
                *ret_action = LEND_NONE;
                *ret_bytes = 0;
                return;
        }
        s->pending = false;
        *ret_action = LEND_OFFER;
        *ret_bytes = target - s->lent;
}

void lend_commit(struct lend_state *s, enum lend_action a, uint64_t bytes)
{
        if (a == LEND_OFFER) {
                s->lent += bytes;
                s->ever_offered = true;
        } else if (a == LEND_RECLAIM) {
                s->lent -= MIN(bytes, s->lent);
        }
}

void lend_backend_free(struct lend_backend *b)
{
        if (b && b->ops) {
                b->ops->free(b->ctx);
                *b = (struct lend_backend){};
        }
}

struct dry_run {
        uint64_t in_pool;
};

static int dry_offer(void *ctx, uint64_t bytes, uint64_t *ret_bytes)
{
        ((struct dry_run *)ctx)->in_pool += bytes;
        *ret_bytes = bytes;
        return 0;
}

static int dry_reclaim(void *ctx, uint64_t bytes, uint64_t *ret_bytes)
{
        struct dry_run *d = ctx;
        uint64_t n = MIN(bytes, d->in_pool);
        d->in_pool -= n;
        *ret_bytes = n;
        return 0;
}

static void dry_free(void *ctx)
{
        free(ctx);
}

static const struct lend_ops dry_run_ops = {
    .name = "dry-run",
    .offer = dry_offer,
    .reclaim = dry_reclaim,
    .report_load = NULL,
    .poll = NULL,
    .free = dry_free,
};

int lend_dry_run_new(struct lend_backend *ret)
{
        struct dry_run *d = calloc(1, sizeof(*d));
        if (!d)
                return -ENOMEM;
        *ret = (struct lend_backend){&dry_run_ops, d};
        return 0;
}
