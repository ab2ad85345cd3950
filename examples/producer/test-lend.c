/* The producer's lending policy: working set, chunk rounding, and hysteresis on re-offers. */
#include <criterion/criterion.h>

#include "lend.h"
#include "example-util.h"

#define GiB (UINT64_C(1) << 30)
#define MiB (UINT64_C(1) << 20)
#define SEC NSEC_PER_SEC

static struct lend_config cfg;
static struct lend_state st;
static uint64_t now;

static void init(void)
{
        /* 100 GiB, 20 weights, 50 activations at peak, no margin: lendable = 80 - 50 * load. */
        cfg = (struct lend_config){
            .capacity = 100 * GiB,
            .weights = 20 * GiB,
            .activation_peak = 50 * GiB,
            .margin = 0,
            .chunk = 2 * MiB,
            .band = 0.1,
            .hold_ns = 2 * SEC,
            .min_offer = 256 * MiB,
        };
        st = (struct lend_state){};
        now = 0;
}

TestSuite(lend, .init = init);

/* Decide at now with load, apply the action as the backend would, return it. */
static enum lend_action at(double seconds, double load, uint64_t *ret_bytes)
{
        enum lend_action a;
        uint64_t bytes;
        now = (uint64_t)(seconds * SEC);
        lend_decide(&cfg, &st, now, load, &a, &bytes);
        lend_commit(&st, a, bytes);
        if (ret_bytes)
                *ret_bytes = bytes;
        return a;
}

Test(lend, keeps_weights_activations_and_margin)
{
        cfg.margin = 1 * GiB;
        cr_assert_eq(lend_working_set(&cfg, 0), 21 * GiB);
        cr_assert_eq(lend_working_set(&cfg, 0.5), 46 * GiB);
        cr_assert_eq(lend_working_set(&cfg, 1), 71 * GiB);
        cr_assert_eq(lend_working_set(&cfg, 7), 71 * GiB, "load is clamped to 1");
}

Test(lend, lends_whole_chunks_only_and_never_less_than_nothing)
{
        cr_assert_eq(lend_lendable(&cfg, 0.5), 55 * GiB);
        /* 0.3333 of 50 GiB is not chunk aligned: the rest rounds down to whole 2 MiB chunks. */
        uint64_t l = lend_lendable(&cfg, 1.0 / 3);
        cr_assert_eq(l % (2 * MiB), 0);
        cr_assert_leq(l, 100 * GiB - lend_working_set(&cfg, 1.0 / 3));
        cr_assert_gt(l + 2 * MiB, 100 * GiB - lend_working_set(&cfg, 1.0 / 3));
        cfg.weights = 90 * GiB;
        cr_assert_eq(lend_lendable(&cfg, 1), 0);
}

Test(lend, the_first_offer_goes_out_at_once)
{
        uint64_t b;
        /* At load 0.2 it offers what would survive 0.3: 80 - 15 = 65 GiB. */
        cr_assert_eq(at(0, 0.2, &b), LEND_OFFER);
        cr_assert_eq(b, 65 * GiB);
        cr_assert_eq(st.lent, 65 * GiB);
        cr_assert_eq(at(0.1, 0.2, NULL), LEND_NONE);
}

Test(lend, reclaims_at_once_when_load_grows_into_lent_memory)
{
        uint64_t b;
        at(0, 0.2, NULL); /* 65 GiB lent */
        cr_assert_eq(at(1, 0.25, NULL), LEND_NONE, "inside the band: nothing to do");
        cr_assert_eq(at(1.1, 0.8, &b), LEND_RECLAIM);
        cr_assert_eq(b, 25 * GiB); /* lendable at 0.8 is 40 */
        cr_assert_eq(st.lent, 40 * GiB);
}

Test(lend, does_not_offer_again_until_load_falls_by_more_than_the_band)
{
        at(0, 0.2, NULL);
        at(1, 0.8, NULL); /* 40 GiB lent */
        /* 0.75 + 0.1 = 0.85: less lendable than what is lent. Stays put however long. */
        for (double t = 1.1; t < 30; t += 0.1)
                cr_assert_eq(at(t, 0.75, NULL), LEND_NONE);
        /* At 0.7 exactly the band's worth lower: lendable(0.8) == lent, still nothing. */
        for (double t = 30; t < 40; t += 0.1)
                cr_assert_eq(at(t, 0.7, NULL), LEND_NONE);
        cr_assert_eq(st.lent, 40 * GiB);
}

Test(lend, offers_again_only_after_the_lower_load_held_for_the_hold_time)
{
        uint64_t b;
        at(0, 0.2, NULL);
        at(1, 0.8, NULL);
        cr_assert_eq(at(10, 0.3, NULL), LEND_NONE, "the hold starts");
        cr_assert_eq(at(11, 0.3, NULL), LEND_NONE);
        cr_assert_eq(at(11.9, 0.3, NULL), LEND_NONE);
        cr_assert_eq(at(12, 0.3, &b), LEND_OFFER);
        cr_assert_eq(b, 20 * GiB); /* lendable(0.4) = 60, 40 lent */
        cr_assert_eq(st.lent, 60 * GiB);
}

Test(lend, a_load_spike_during_the_hold_restarts_it)
{
        at(0, 0.2, NULL);
        at(1, 0.8, NULL);
        cr_assert_eq(at(10, 0.3, NULL), LEND_NONE);
        cr_assert_eq(at(11, 0.78, NULL), LEND_NONE, "back up: the condition no longer holds");
        cr_assert_eq(at(12, 0.3, NULL), LEND_NONE, "a new hold starts here");
        cr_assert_eq(at(13.9, 0.3, NULL), LEND_NONE);
        cr_assert_eq(at(14, 0.3, NULL), LEND_OFFER);
}

Test(lend, a_load_wobbling_inside_the_band_does_not_flap)
{
        unsigned transitions = 0;
        at(0, 0.5, NULL);
        for (int i = 1; i < 1000; i++) {
                double load = (i % 2) ? 0.55 : 0.47;
                if (at(i * 0.1, load, NULL) != LEND_NONE)
                        transitions++;
        }
        /* The first rise past 0.5 + band's worth is not reached: nothing ever happens. */
        cr_assert_eq(transitions, 0, "%u transitions", transitions);
}

Test(lend, small_gains_are_not_worth_an_offer)
{
        cfg.band = 0;
        cfg.hold_ns = 0;
        at(0, 0.5, NULL);
        cr_assert_eq(at(1, 0.499, NULL), LEND_NONE, "50 MiB more is under min_offer");
        cr_assert_eq(at(2, 0.49, NULL), LEND_OFFER, "500 MiB is over it");
}

Test(lend, commits_what_the_backend_really_did)
{
        struct lend_backend b;
        uint64_t done;
        cr_assert_eq(lend_dry_run_new(&b), 0);
        cr_assert_eq(b.ops->offer(b.ctx, 10 * GiB, &done), 0);
        cr_assert_eq(done, 10 * GiB);
        cr_assert_eq(b.ops->reclaim(b.ctx, 15 * GiB, &done), 0);
        cr_assert_eq(done, 10 * GiB, "only what is in the pool comes back");
        lend_backend_free(&b);
        cr_assert_null(b.ops);

        st.lent = 4 * GiB;
        lend_commit(&st, LEND_RECLAIM, 6 * GiB);
        cr_assert_eq(st.lent, 0);
}

Test(lend, rejects_configs_that_cannot_be_a_gpu)
{
        cr_assert_eq(lend_config_check(&cfg), 0);
        cfg.chunk = 3 * MiB;
        cr_assert_eq(lend_config_check(&cfg), -EINVAL);
        cfg.chunk = 2 * MiB;
        cfg.band = 1.5;
        cr_assert_eq(lend_config_check(&cfg), -EINVAL);
}
