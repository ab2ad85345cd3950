#include <criterion/criterion.h>

#include "ratelimit.h"
#include "time-util.h"

Test(ratelimit, holds_back_past_the_burst_and_says_how_many_with_the_next_line)
{
        struct ratelimit rl = RATELIMIT_INIT(NSEC_PER_SEC, 2);
        uint64_t held = 99, t = 5 * NSEC_PER_SEC;

        cr_assert(ratelimit_take(&rl, t, &held));
        cr_assert_eq(held, 0);
        cr_assert(ratelimit_take(&rl, t + 1, &held));
        for (int i = 0; i < 7; i++)
                cr_assert_not(ratelimit_take(&rl, t + 2 + i, &held));
        cr_assert(ratelimit_take(&rl, t + NSEC_PER_SEC, &held), "a new interval");
        cr_assert_eq(held, 7, "the lines held back are said with the next one");
        cr_assert(ratelimit_take(&rl, t + NSEC_PER_SEC + 1, &held));
        cr_assert_eq(held, 0, "and counted once");
}

Test(ratelimit, a_first_line_at_time_zero_is_logged)
{
        struct ratelimit rl = RATELIMIT_INIT(NSEC_PER_SEC, 1);
        uint64_t held;

        cr_assert(ratelimit_take(&rl, 0, &held));
        cr_assert_not(ratelimit_take(&rl, 1, &held));
}
