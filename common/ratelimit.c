/* A log line budget per interval (ratelimit.h). */
#include "ratelimit.h"

bool ratelimit_take(struct ratelimit *rl, uint64_t now_ns, uint64_t *ret_held)
{
        if (!rl->begin_ns || now_ns - rl->begin_ns >= rl->interval_ns) {
                rl->begin_ns = now_ns ? now_ns : 1;
                rl->n = 0;
        }
        if (rl->n >= rl->burst) {
                rl->held++;
                return false;
        }
        rl->n++;
        *ret_held = rl->held;
        rl->held = 0;
        return true;
}
