/*
 * The two scheduling policies as orderings of requests: FCFS by arrival, and
 * the fair scheduler's "least served first" (decodes before prefills; fewest
 * generated tokens, least prefill progress).
 */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvswap.h"
#include "stats.h"

enum sched_kind {
        SCHED_FCFS,
        SCHED_FAIR,
        _SCHED_MAX,
        _SCHED_INVALID = -EINVAL,
};

const char *sched_to_string(enum sched_kind k);
enum sched_kind sched_from_string(const char *s);

/* One request as the engine tracks it. */
struct request {
        uint32_t id;
        uint64_t arrival_ns;
        uint32_t prompt, output;

        uint32_t prefilled; /* prompt tokens whose KV exists */
        uint32_t
            generated; /* output tokens produced; the first comes with the last prefill chunk */

        /* KV: resident in local blocks, or swapped out to one slot of the swap backend. */
        uint32_t *blocks;
        uint32_t n_blocks, blocks_allocated;
        void *swap_slot;
        uint32_t swapped_blocks;

        /* LayerKV: the prompt's KV goes layer by layer into swap_slot while prefilling
         * (layering); layered: swap_slot was written that way (its swap-in is a prefetch). */
        bool layering, layered;
        uint32_t layered_blocks; /* blocks of swap_slot */

        /* This request's own TBT samples, for its SLA check at completion. */
        struct stats gaps;

        /* Scheduling state. */
        bool urgent;   /* fair, SLA-aware: a streaming decode (its KV resident) */
        bool parked;   /* SLA-aware: it waited out of memory once already (one long gap) */
        size_t rank;   /* position in this iteration's order */
        bool selected; /* a member of the running set (its time slice is running) */
        bool in_batch; /* planned into the current iteration */
        bool done;
        uint32_t preemptions;

        uint64_t first_token_ns, last_token_ns, finish_ns;
};

static inline bool request_in_decode(const struct request *r)
{
        return r->prefilled == r->prompt;
}

/* Tokens whose KV the request holds: the prompt so far, and every output token but the newest. */
static inline uint32_t request_kv_tokens(const struct request *r)
{
        return r->prefilled + (r->generated > 0 ? r->generated - 1 : 0);
}

/* < 0 when a goes first, > 0 when b does; never 0 for two distinct requests (ties go by id). */
int sched_compare(enum sched_kind k, const struct request *a, const struct request *b);
/* Sort v into k's order and set each request's rank. */
void sched_rank(enum sched_kind k, struct request **v, size_t n);
