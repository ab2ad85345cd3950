/*
 * aqua-lend's policy: what to lend and what to take back, decided from the device's free memory
 * alone, so that it works beside a workload nobody modified. Pure: the caller passes the time and
 * the free bytes it read (cuMemGetInfo, device-wide), and tells it what happened.
 *
 *   - keep `headroom` free for the workload at all times;
 *   - lend, in whole chunks, what is free beyond headroom + lend_above, once that has held for
 *     `settle` (so after a lend the workload has headroom + lend_above free, and may grow by
 *     lend_above before anything is asked back);
 *   - as soon as free memory is below headroom, reclaim the shortfall, plus what the workload
 *     grew by since the last decision (it is still growing: ask for the next step's worth too),
 *     less what is already on its way back. The workload's growth is the fall of free + lent:
 *     the memory it does not use, whatever lending did meanwhile;
 *   - never more lent than max_lend; offers and reclaims at most their rate (token buckets of one
 *     second's worth).
 * A breach is free memory below headroom: it begins, has a largest shortfall, and ends when free
 * memory is back at headroom; the decision says when, for the log and the metrics.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct lend_policy {
        uint64_t headroom;     /* kept free for the workload */
        uint64_t lend_above;   /* lend only what is free beyond headroom + lend_above */
        uint64_t settle_ns;    /* ... once it has stayed beyond it this long */
        uint64_t max_lend;     /* most lent at once (UINT64_MAX: no limit) */
        uint64_t chunk;        /* the unit of lending and reclaiming (libaqua's chunk size) */
        uint64_t lend_rate;    /* bytes per second offered at most; 0: no limit */
        uint64_t reclaim_rate; /* bytes per second asked back at most; 0: no limit */
};

/* -EINVAL with *ret_what naming the setting when p cannot work (no chunk, ...). */
int lend_policy_check(const struct lend_policy *p, const char **ret_what);

struct lend_books {
        uint64_t lent;       /* allocated for lending, not yet freed: offered and reclaiming */
        uint64_t reclaiming; /* asked back, not yet freed */
        bool above;          /* free has been beyond headroom + lend_above since above_since_ns */
        uint64_t above_since_ns;
        bool have_prev;
        uint64_t prev_idle; /* free + lent at the previous decision */
        uint64_t last_ns; /* of the previous decision, for the token buckets */
        double lend_tokens, reclaim_tokens;
        bool breach; /* free below headroom since breach_since_ns */
        uint64_t breach_since_ns;
        uint64_t breach_peak; /* the largest shortfall of this breach */
};

void lend_books_init(struct lend_books *s);

enum lend_verb {
        LEND_HOLD,
        LEND_OFFER,
        LEND_RECLAIM,
};

const char *lend_verb_to_string(enum lend_verb v);

struct lend_decision {
        enum lend_verb verb;
        uint64_t bytes; /* OFFER, RECLAIM: whole chunks */
        uint64_t want;  /* what the verb would take without max_lend and the rate limits */
        /* A breach began at this decision, or ended (after breach_ns, its largest shortfall
         * breach_peak). shortfall: headroom - free now (0 outside a breach). */
        bool breach_began, breach_ended;
        uint64_t shortfall;
        uint64_t breach_ns, breach_peak;
};

/* Decide at now_ns (non-decreasing from call to call) with `free` bytes free on the device. */
void lend_policy_decide(const struct lend_policy *p, struct lend_books *s, uint64_t now_ns,
                 uint64_t free, struct lend_decision *ret);

/* What happened: bytes offered (they are lent now), asked back, freed on the device. */
void lend_note_offered(struct lend_books *s, uint64_t bytes);
void lend_note_reclaiming(struct lend_books *s, uint64_t bytes);
void lend_note_freed(struct lend_books *s, uint64_t bytes);
/* The books as libaqua keeps them (aqua_info.offered_bytes: offered or reclaiming, not freed):
 * lent follows it, and nothing can be on its way back beyond it. */
void lend_note_lent(struct lend_books *s, uint64_t lent);
/* Forget what was on its way back (a reclaim aquad refused, or one that never completed): the
 * next decision asks again for whatever is still short. */
void lend_forget_reclaiming(struct lend_books *s);
