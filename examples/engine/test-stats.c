/* Percentile maths: linear interpolation between closest ranks, on known data. */
#include <criterion/criterion.h>
#include <errno.h>

#include "stats.h"

static struct stats s;

static void fini(void)
{
        stats_clear(&s);
}

TestSuite(stats, .fini = fini);

static uint64_t pct(double p)
{
        uint64_t v;
        cr_assert_eq(stats_percentile(&s, p, &v), 0);
        return v;
}

Test(stats, one_sample_is_every_percentile)
{
        cr_assert_eq(stats_add(&s, 42), 0);
        cr_assert_eq(pct(0), 42);
        cr_assert_eq(pct(50), 42);
        cr_assert_eq(pct(99), 42);
        cr_assert_eq(pct(100), 42);
}

Test(stats, interpolates_between_the_two_closest_ranks)
{
        /* 1..100 times 10, added out of order: rank = p/100 * 99. */
        for (int i = 100; i >= 1; i--)
                cr_assert_eq(stats_add(&s, (uint64_t)i * 10), 0);
        cr_assert_eq(pct(0), 10);
        cr_assert_eq(pct(100), 1000);
        cr_assert_eq(pct(50), 505);   /* rank 49.5: between 500 and 510 */
        cr_assert_eq(pct(90), 901);   /* rank 89.1: 900 + 0.1 * 10 */
        cr_assert_eq(pct(99), 990);   /* rank 98.01: 990 + 0.1, rounded */
        cr_assert_eq(pct(99.5), 995); /* rank 98.505: 990 + 5.05, rounded */
}

Test(stats, matches_numpy_on_a_small_uneven_set)
{
        /* numpy.percentile([1, 2, 4, 8, 1000], [50, 90, 99]) = 4, 603.2, 960.32 */
        uint64_t v[] = {8, 1000, 1, 4, 2};
        for (size_t i = 0; i < 5; i++)
                stats_add(&s, v[i] * 1000);
        cr_assert_eq(pct(50), 4000);
        cr_assert_eq(pct(90), 603200);
        cr_assert_eq(pct(99), 960320);
}

Test(stats, keeps_precision_for_large_nanosecond_values)
{
        uint64_t base = UINT64_C(1) << 60;
        stats_add(&s, base);
        stats_add(&s, base + 2);
        cr_assert_eq(pct(50), base + 1);
}

Test(stats, sees_samples_added_after_a_query)
{
        stats_add(&s, 5);
        cr_assert_eq(pct(100), 5);
        stats_add(&s, 1);
        cr_assert_eq(pct(0), 1);
        cr_assert_eq(pct(100), 5);
}

Test(stats, refuses_empty_sets_and_bad_percentiles)
{
        uint64_t v = 7;
        cr_assert_eq(stats_percentile(&s, 50, &v), -ENODATA);
        cr_assert_eq(stats_mean(&s, &v), -ENODATA);
        stats_add(&s, 1);
        cr_assert_eq(stats_percentile(&s, -1, &v), -EINVAL);
        cr_assert_eq(stats_percentile(&s, 100.5, &v), -EINVAL);
        cr_assert_eq(stats_percentile(&s, 0.0 / 0.0, &v), -EINVAL);
        cr_assert_eq(v, 7, "outputs are written only on success");
}

Test(stats, mean_is_the_arithmetic_mean)
{
        uint64_t v;
        stats_add(&s, 1);
        stats_add(&s, 2);
        stats_add(&s, 6);
        cr_assert_eq(stats_mean(&s, &v), 0);
        cr_assert_eq(v, 3);
}
