/* aqua-lend's policy (policy.h says what it promises). */
#include "policy.h"

#include <errno.h>
#include <string.h>

#include "time-util.h"
#include "util.h"

int lend_policy_check(const struct lend_policy *p, const char **ret_what)
{
        const char *what = NULL;

        if (p->chunk == 0)
                what = "chunk must be more than 0";
        else if (p->headroom < p->chunk)
                what = "headroom must be at least one chunk (nothing could be reclaimed in time "
                       "for a workload given less)";
        else if (p->max_lend < p->chunk)
                what = "max-lend must be at least one chunk";
        else if (p->lend_rate != 0 && p->lend_rate < p->chunk)
                what = "lend-rate must be 0 (no limit) or at least one chunk per second";
        else if (p->reclaim_rate != 0 && p->reclaim_rate < p->chunk)
                what = "reclaim-rate must be 0 (no limit) or at least one chunk per second";
        else if (p->headroom > UINT64_MAX / 4 || p->lend_above > UINT64_MAX / 4)
                what = "headroom and lend-above must be sizes a device can have";
        if (ret_what)
                *ret_what = what;
        return what ? -EINVAL : 0;
}

void lend_books_init(struct lend_books *s)
{
        *s = (struct lend_books){0};
}

const char *lend_verb_to_string(enum lend_verb v)
{
        switch (v) {
        case LEND_HOLD:
                return "hold";
        case LEND_OFFER:
                return "offer";
        case LEND_RECLAIM:
                return "reclaim";
        }
        return "?";
}

static uint64_t chunks_down(uint64_t bytes, uint64_t chunk)
{
        return bytes / chunk * chunk;
}

static uint64_t chunks_up(uint64_t bytes, uint64_t chunk)
{
        uint64_t n = bytes / chunk + (bytes % chunk != 0);
        return n > UINT64_MAX / chunk ? chunks_down(UINT64_MAX, chunk) : n * chunk;
}

/* Refill a bucket of one second's worth at `rate` bytes per second for dt_ns. */
static void refill(double *tokens, uint64_t rate, uint64_t dt_ns, bool first)
{
        if (rate == 0)
                return;
        *tokens = first ? (double)rate : *tokens + (double)rate * (double)dt_ns / NSEC_PER_SEC;
        if (*tokens > (double)rate)
                *tokens = (double)rate;
}

/* bytes limited to what the bucket holds, in whole chunks. */
static uint64_t limit(uint64_t bytes, uint64_t rate, double tokens, uint64_t chunk)
{
        if (rate == 0 || tokens >= (double)bytes)
                return bytes;
        return chunks_down(tokens > 0 ? (uint64_t)tokens : 0, chunk);
}

static void track_breach(const struct lend_policy *p, struct lend_books *s, uint64_t now_ns,
                         uint64_t free, struct lend_decision *d)
{
        if (free < p->headroom) {
                d->shortfall = p->headroom - free;
                if (!s->breach) {
                        s->breach = true;
                        s->breach_since_ns = now_ns;
                        s->breach_peak = 0;
                        d->breach_began = true;
                }
                s->breach_peak = MAX(s->breach_peak, d->shortfall);
        } else if (s->breach) {
                s->breach = false;
                d->breach_ended = true;
                d->breach_ns = now_ns - s->breach_since_ns;
                d->breach_peak = s->breach_peak;
        }
}

static void decide_reclaim(const struct lend_policy *p, struct lend_books *s, uint64_t free,
                           uint64_t fall, struct lend_decision *d)
{
        uint64_t need = p->headroom - free + fall, held = s->lent - s->reclaiming;

        need = need > s->reclaiming ? chunks_up(need - s->reclaiming, p->chunk) : 0;
        d->want = MIN(need, held);
        d->bytes = limit(d->want, p->reclaim_rate, s->reclaim_tokens, p->chunk);
        if (d->bytes == 0)
                return;
        d->verb = LEND_RECLAIM;
        if (p->reclaim_rate)
                s->reclaim_tokens -= (double)d->bytes;
}

static void decide_offer(const struct lend_policy *p, struct lend_books *s, uint64_t now_ns,
                         uint64_t free, struct lend_decision *d)
{
        uint64_t threshold = p->headroom + p->lend_above, room;

        if (free <= threshold || s->reclaiming > 0) {
                s->above = false;
                return;
        }
        if (!s->above) {
                s->above = true;
                s->above_since_ns = now_ns;
        }
        if (now_ns - s->above_since_ns < p->settle_ns)
                return;
        d->want = chunks_down(free - threshold, p->chunk);
        room = p->max_lend > s->lent ? chunks_down(p->max_lend - s->lent, p->chunk) : 0;
        d->bytes = limit(MIN(d->want, room), p->lend_rate, s->lend_tokens, p->chunk);
        if (d->bytes == 0)
                return;
        d->verb = LEND_OFFER;
        if (p->lend_rate)
                s->lend_tokens -= (double)d->bytes;
}

void lend_policy_decide(const struct lend_policy *p, struct lend_books *s, uint64_t now_ns,
                 uint64_t free, struct lend_decision *ret)
{
        bool first = !s->have_prev;
        uint64_t dt = first ? 0 : now_ns - s->last_ns, idle = free + s->lent;
        uint64_t fall = !first && s->prev_idle > idle ? s->prev_idle - idle : 0;

        *ret = (struct lend_decision){.verb = LEND_HOLD};
        refill(&s->lend_tokens, p->lend_rate, dt, first);
        refill(&s->reclaim_tokens, p->reclaim_rate, dt, first);
        s->last_ns = now_ns;
        s->have_prev = true;
        s->prev_idle = idle;

        track_breach(p, s, now_ns, free, ret);
        if (free < p->headroom) {
                s->above = false;
                decide_reclaim(p, s, free, fall, ret);
        } else
                decide_offer(p, s, now_ns, free, ret);
}

void lend_note_offered(struct lend_books *s, uint64_t bytes)
{
        s->lent += bytes;
}

void lend_note_reclaiming(struct lend_books *s, uint64_t bytes)
{
        s->reclaiming = MIN(s->reclaiming + bytes, s->lent);
}

void lend_note_freed(struct lend_books *s, uint64_t bytes)
{
        s->lent -= MIN(bytes, s->lent);
        s->reclaiming -= MIN(bytes, s->reclaiming);
}

void lend_note_lent(struct lend_books *s, uint64_t lent)
{
        s->lent = lent;
        s->reclaiming = MIN(s->reclaiming, lent);
}

void lend_forget_reclaiming(struct lend_books *s)
{
        s->reclaiming = 0;
}
