/* aqua-lend's policy: each rule of policy.h, then its invariants over random workloads. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>

#include "policy.h"
#include "time-util.h"

#define GiB (UINT64_C(1) << 30)
#define MiB (UINT64_C(1) << 20)
#define SEC NSEC_PER_SEC
#define MS  NSEC_PER_MSEC

static struct lend_policy pol;
static struct lend_books bk;

static void init(void)
{
        pol = (struct lend_policy){
            .headroom = 2 * GiB,
            .lend_above = 1 * GiB,
            .settle_ns = 2 * SEC,
            .max_lend = UINT64_MAX,
            .chunk = 64 * MiB,
        };
        lend_books_init(&bk);
}

TestSuite(policy, .init = init);

/* Decide at `seconds` with `free` bytes free; an offer or reclaim is noted as sent. */
static struct lend_decision at(double seconds, uint64_t free)
{
        struct lend_decision d;

        lend_policy_decide(&pol, &bk, (uint64_t)(seconds * SEC), free, &d);
        if (d.verb == LEND_OFFER)
                lend_note_offered(&bk, d.bytes);
        else if (d.verb == LEND_RECLAIM)
                lend_note_reclaiming(&bk, d.bytes);
        return d;
}

Test(policy, lends_what_is_beyond_headroom_and_lend_above_once_it_has_settled)
{
        cr_assert_eq(at(0, 10 * GiB).verb, LEND_HOLD);
        cr_assert_eq(at(1.9, 10 * GiB).verb, LEND_HOLD, "offered before settle");
        struct lend_decision d = at(2, 10 * GiB + 100 * MiB);
        cr_assert_eq(d.verb, LEND_OFFER);
        /* 10 GiB + 100 MiB - 3 GiB, down to whole 64 MiB chunks. */
        cr_assert_eq(d.bytes, 7 * GiB + 64 * MiB);
        /* Lent: free is now about headroom + lend_above; nothing more to lend. */
        cr_assert_eq(at(2.1, 3 * GiB + 36 * MiB).verb, LEND_HOLD);
}

Test(policy, a_dip_restarts_the_settle_time)
{
        at(0, 10 * GiB);
        at(1.5, 3 * GiB); /* not beyond headroom + lend_above */
        cr_assert_eq(at(2.5, 10 * GiB).verb, LEND_HOLD);
        cr_assert_eq(at(4.4, 10 * GiB).verb, LEND_HOLD);
        cr_assert_eq(at(4.5, 10 * GiB).verb, LEND_OFFER);
}

Test(policy, never_lends_more_than_max_lend)
{
        pol.max_lend = 1 * GiB + 100 * MiB;
        at(0, 10 * GiB);
        struct lend_decision d = at(2, 10 * GiB);
        cr_assert_eq(d.verb, LEND_OFFER);
        cr_assert_eq(d.bytes, 1 * GiB + 64 * MiB, "max-lend in whole chunks");
        cr_assert_eq(d.want, 7 * GiB);
        cr_assert_eq(at(3, 9 * GiB).verb, LEND_HOLD);
}

Test(policy, reclaims_the_shortfall_and_the_growth_at_once)
{
        at(0, 10 * GiB);
        at(2, 10 * GiB); /* lends 7 GiB */
        cr_assert_eq(at(3, 3 * GiB).verb, LEND_HOLD, "its own offer is not the workload growing");
        /* The workload takes 1.5 GiB: free 1.5 GiB, 0.5 GiB short, and it grew by 1.5 GiB. */
        struct lend_decision d = at(3.1, 1536 * MiB);
        cr_assert_eq(d.verb, LEND_RECLAIM);
        cr_assert_eq(d.bytes, 2 * GiB);
        cr_assert(d.breach_began);
        cr_assert_eq(d.shortfall, 512 * MiB);
        /* Still short, not growing: what is on its way back covers it. */
        d = at(3.2, 1536 * MiB);
        cr_assert_eq(d.verb, LEND_HOLD);
        cr_assert(!d.breach_began);
        /* It keeps growing, by 1.25 GiB: 1.75 GiB short + 1.25 GiB - 2 GiB on its way. */
        d = at(3.3, 256 * MiB);
        cr_assert_eq(d.verb, LEND_RECLAIM);
        cr_assert_eq(d.bytes, 1 * GiB);
        cr_assert_eq(bk.reclaiming, 3 * GiB);
}

Test(policy, asks_only_for_what_is_not_already_on_its_way)
{
        at(0, 10 * GiB);
        at(2, 10 * GiB); /* lends 7 GiB */
        struct lend_decision d = at(3, 1 * GiB);
        cr_assert_eq(d.verb, LEND_RECLAIM);
        /* 1 GiB short, and it grew by 2 GiB: 3 GiB. */
        cr_assert_eq(d.bytes, 3 * GiB);
        cr_assert_eq(at(3.1, 512 * MiB).verb, LEND_HOLD, "1.5 GiB short + 0.5 GiB is within 3");
        cr_assert_eq(at(3.2, 0).verb, LEND_HOLD, "2 GiB short + 0.5 GiB is within 3");
        /* The 3 GiB are freed: free is back above headroom and the breach is over. */
        lend_note_freed(&bk, 3 * GiB);
        cr_assert_eq(bk.reclaiming, 0);
        cr_assert_eq(bk.lent, 4 * GiB);
        d = at(3.3, 3 * GiB);
        cr_assert_eq(d.verb, LEND_HOLD);
        cr_assert(d.breach_ended);
        cr_assert_eq(d.breach_peak, 2 * GiB);
}

Test(policy, never_asks_back_more_than_is_lent)
{
        at(0, 4 * GiB);
        at(2, 4 * GiB); /* lends 1 GiB */
        cr_assert_eq(bk.lent, 1 * GiB);
        struct lend_decision d = at(3, 0);
        cr_assert_eq(d.verb, LEND_RECLAIM);
        cr_assert_eq(d.want, 1 * GiB);
        cr_assert_eq(d.bytes, 1 * GiB);
        cr_assert_eq(d.shortfall, 2 * GiB, "the shortfall is reported, not hidden");
        cr_assert_eq(at(3.1, 0).verb, LEND_HOLD, "nothing left to ask for");
}

Test(policy, does_not_lend_while_taking_back)
{
        at(0, 10 * GiB);
        at(2, 10 * GiB);
        at(3, 1 * GiB);
        cr_assert_gt(bk.reclaiming, 0);
        cr_assert_eq(at(4, 8 * GiB).verb, LEND_HOLD);
        cr_assert_eq(at(9, 8 * GiB).verb, LEND_HOLD);
        lend_note_freed(&bk, bk.reclaiming);
        cr_assert_eq(at(10, 8 * GiB).verb, LEND_HOLD, "settles again first");
        cr_assert_eq(at(12, 8 * GiB).verb, LEND_OFFER);
}

Test(policy, offers_no_faster_than_lend_rate)
{
        uint64_t total = 0;

        pol.lend_rate = 1 * GiB;
        pol.settle_ns = 0;
        /* 7 GiB to lend; one second's worth at first, then a chunk per 64 ms. */
        for (int i = 0; i <= 40; i++) {
                struct lend_decision d = at(i * 0.1, 10 * GiB - total);
                if (d.verb == LEND_OFFER)
                        total += d.bytes;
                cr_assert_leq(total, 1 * GiB + (uint64_t)(i * 0.1 * GiB) + 64 * MiB,
                              "%d: %lu lent", i, (unsigned long)total);
        }
        cr_assert_geq(total, 4 * GiB, "the rate limit stopped lending altogether");
}

Test(policy, reclaims_no_faster_than_reclaim_rate)
{
        pol.reclaim_rate = 512 * MiB;
        at(0, 10 * GiB);
        at(2, 10 * GiB);
        struct lend_decision d = at(3, 0);
        cr_assert_eq(d.verb, LEND_RECLAIM);
        cr_assert_eq(d.bytes, 512 * MiB);
        cr_assert_gt(d.want, 512 * MiB);
        d = at(3.5, 0);
        cr_assert_eq(d.bytes, 256 * MiB, "half a second refills half the bucket");
}

Test(policy, a_breach_ends_with_its_length_and_largest_shortfall)
{
        at(0, 10 * GiB);
        at(2, 10 * GiB);
        cr_assert(at(3, 1 * GiB).breach_began);
        cr_assert(!at(3.2, 512 * MiB).breach_ended);
        struct lend_decision d = at(3.5, 2 * GiB);
        cr_assert(d.breach_ended);
        cr_assert_eq(d.breach_ns, 500 * MS);
        cr_assert_eq(d.breach_peak, 1536 * MiB);
        cr_assert_eq(d.shortfall, 0);
}

Test(policy, the_check_names_what_cannot_work)
{
        const char *what;

        cr_assert_eq(lend_policy_check(&pol, &what), 0);
        cr_assert_null(what);
        pol.headroom = 0;
        cr_assert_eq(lend_policy_check(&pol, &what), -EINVAL);
        cr_assert(strstr(what, "headroom"));
        init();
        pol.lend_rate = 1 * MiB;
        cr_assert_eq(lend_policy_check(&pol, &what), -EINVAL);
        cr_assert(strstr(what, "lend-rate"));
        init();
        pol.chunk = 0;
        cr_assert_eq(lend_policy_check(&pol, &what), -EINVAL);
        cr_assert(strstr(what, "chunk"));
}

/*
 * The invariants, over random workloads on a 16 GiB device whose reclaims complete within one
 * decision (a consumer that moves off at once): the workload is never refused what fits beside
 * headroom; nothing lent beyond max-lend; an offer never leaves less than headroom + lend_above
 * free; the books never ask back more than is lent.
 */
Test(policy, invariants_over_random_workloads)
{
        const uint64_t total = 16 * GiB;
        unsigned seed = 12345;

        for (int run = 0; run < 200; run++) {
                uint64_t used = 2 * GiB, now = 0, refused = 0;

                init();
                pol.headroom = (1 + rand_r(&seed) % 8) * 256 * MiB;
                pol.lend_above = (rand_r(&seed) % 8) * 128 * MiB;
                pol.settle_ns = (rand_r(&seed) % 3) * 500 * MS;
                pol.max_lend = rand_r(&seed) % 2 ? UINT64_MAX : (1 + rand_r(&seed) % 12) * GiB;
                pol.lend_rate = rand_r(&seed) % 2 ? 0 : (1 + rand_r(&seed) % 4) * GiB;
                for (int step = 0; step < 2000; step++) {
                        struct lend_decision d;
                        uint64_t free;
                        /* The workload: a random walk, sometimes a burst no bigger than the
                         * headroom, and it lets go as often as it grows. */
                        int64_t delta = ((int64_t)(rand_r(&seed) % 129) - 64) * (int64_t)MiB;
                        if (rand_r(&seed) % 50 == 0)
                                delta = (int64_t)(rand_r(&seed) % (pol.headroom / MiB + 1)) *
                                        (int64_t)MiB;
                        if (delta < 0 && (uint64_t)-delta > used - 1 * GiB)
                                delta = 0;
                        /* It gets what the device has free. */
                        if (delta > 0 && used + (uint64_t)delta + bk.lent > total) {
                                refused++;
                                delta = 0;
                        }
                        used += (uint64_t)delta;
                        if (used > total - pol.headroom) /* it never asks beyond the headroom */
                                used = total - pol.headroom;
                        now += 100 * MS;
                        free = total - used - bk.lent;
                        lend_policy_decide(&pol, &bk, now, free, &d);
                        cr_assert_leq(bk.reclaiming, bk.lent);
                        if (d.verb == LEND_OFFER) {
                                cr_assert_geq(free - d.bytes, pol.headroom + pol.lend_above);
                                lend_note_offered(&bk, d.bytes);
                        } else if (d.verb == LEND_RECLAIM) {
                                cr_assert_leq(d.bytes, bk.lent - bk.reclaiming);
                                lend_note_reclaiming(&bk, d.bytes);
                                /* The consumer moves off at once: the chunks are freed. */
                                lend_note_freed(&bk, d.bytes);
                        }
                        cr_assert_leq(bk.lent, pol.max_lend, "run %d step %d", run, step);
                        /* After the decision, with its reclaim done, headroom is free again. */
                        cr_assert_geq(total - used - bk.lent, pol.headroom,
                                      "run %d step %d: %lu free after the decision", run, step,
                                      (unsigned long)(total - used - bk.lent));
                }
                cr_assert_eq(refused, 0, "run %d: the workload was refused %lu times", run,
                             (unsigned long)refused);
        }
}
