/*
 * A log line budget: at most burst lines per interval; what is held back is counted and said
 * with the next line that may be logged, so a flood costs a few lines and still adds up.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct ratelimit {
        uint64_t interval_ns;
        unsigned burst;
        uint64_t begin_ns; /* start of the current interval, 0: none yet */
        unsigned n;        /* lines logged in it */
        uint64_t held;     /* lines held back since the last one logged */
};

#define RATELIMIT_INIT(interval, b) ((struct ratelimit){.interval_ns = (interval), .burst = (b)})

/*
 * Whether one more line may be logged at now_ns (monotonic). When it may, *ret_held is the number
 * of lines held back before it (to be said with it) and the count starts again.
 */
bool ratelimit_take(struct ratelimit *rl, uint64_t now_ns, uint64_t *ret_held);
