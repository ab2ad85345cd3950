/* The SLA search on the engine model: a rate known in closed form, roles, bursts, impossible SLAs. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "engine-model.h"
#include "search.h"
#include "time-util.h"
#include "util.h"

/*
 * No prefill cost, fixed output length O, uniform arrivals at rate L: in steady
 * state the batch holds n = L * O * T sequences and an iteration takes
 * T = base + s * n, so T = base / (1 - L * O * s). The TBT limit is met while
 * T <= tbt, that is up to L* = (1 - base / tbt) / (O * s).
 * base 50 ms, s 0.25 ms, O 20, tbt 100 ms: L* = 0.5 / 0.005 = 100 req/s.
 * (The batch settles with time constant O * T^2 / base = 4 s, well inside the
 * 20 s warm-up; about 200 sequences run, so one more or less moves T by 0.25%.)
 */
static const double analytic_rate = 100.0;

static struct engine_params big_engine(void)
{
        return (struct engine_params){
                .decode_base = 50 * NSEC_PER_MSEC,
                .decode_per_seq = 250 * NSEC_PER_USEC,
                .max_batch = 100000,
                .gpu_memory = UINT64_C(1) << 40,
                .tp = 1,
                .memory_utilization = 1.0,
                .kv_bytes_per_token = 1,
        };
}

static struct search_params base_params(void)
{
        static const double bursts[] = {2, 4, 8};

        return (struct search_params){
                .sla = {.ttft = 1, .ttft_percentile = 99, .tbt = 0.1, .tbt_percentile = 99,
                        .max_failure_rate = 0},
                .start_rate = 1,
                .min_rate = 0.1,
                .max_rate = 1000,
                .tolerance = 0.002,
                .max_steps = 40,
                .arrival = ARRIVAL_UNIFORM,
                .duration = 60,
                .warmup = 20,
                .min_requests = 20,
                .seed = 1,
                .producer_threshold = UINT64_C(1) << 30,
                .bursts = bursts,
                .n_bursts = 3,
                .burst_duration = 10,
        };
}

static void pool_fixed(struct request_pool *pool, int prompt, int output)
{
        struct length_spec p = {LENGTH_FIXED, prompt, 1, 1 << 20};
        struct length_spec o = {LENGTH_FIXED, output, 1, 1 << 20};

        cr_assert_eq(request_pool_synthetic(&p, &o, 16, 1, pool), 0);
}

Test(search, converges_to_the_analytic_rate_of_the_engine_model)
{
        _cleanup_(target_freep) struct target *t = NULL;
        _cleanup_(request_pool_done) struct request_pool pool = {0};
        struct engine_params ep = big_engine();
        struct search_params p = base_params();
        struct search st = {0};

        pool_fixed(&pool, 10, 20);
        cr_assert_eq(engine_model_new(&ep, &t), 0);
        cr_assert_eq(search_run(t, &pool, &p, NULL, NULL, NULL, &st), 0, "%s", st.error);
        cr_assert(st.found && st.complete && !st.capped);
        cr_assert(fabs(st.rate - analytic_rate) / analytic_rate < 0.01, "found %.4f req/s",
                  st.rate);
        cr_assert(st.points[st.best].s.tbt_p99 <= 0.1);
        cr_assert_eq(st.role, ROLE_PRODUCER, "a TiB of KV cache is mostly free");
        cr_assert_eq(st.n_bursts, 0, "producers need no swap");
        search_done(&st);
}

Test(search, a_tight_kv_cache_makes_a_consumer_whose_swap_grows_with_the_burst)
{
        _cleanup_(target_freep) struct target *t = NULL;
        _cleanup_(request_pool_done) struct request_pool pool = {0};
        struct engine_params ep = big_engine();
        struct search_params p = base_params();
        struct search st = {0};

        /* 30 tokens a request, ~200 in flight at the rate: ~6k tokens; give it 8k. */
        ep.gpu_memory = 8000;
        p.tolerance = 0.02;
        pool_fixed(&pool, 10, 20);
        cr_assert_eq(engine_model_new(&ep, &t), 0);
        cr_assert_eq(search_run(t, &pool, &p, NULL, NULL, NULL, &st), 0, "%s", st.error);
        cr_assert_eq(st.role, ROLE_CONSUMER);
        cr_assert_eq(st.n_bursts, 3);
        cr_assert(st.bursts[0].peak_demand < st.bursts[1].peak_demand);
        cr_assert(st.bursts[1].peak_demand < st.bursts[2].peak_demand);
        cr_assert(st.bursts[2].swap > 0, "an 8x burst overflows the cache");
        cr_assert_eq(st.bursts[2].swap, st.bursts[2].peak_demand - st.kv_capacity);
        cr_assert_eq(st.points[st.n_points - 1].phase, PHASE_BURST);
        search_done(&st);
}

Test(search, an_impossible_sla_is_reported_with_the_figures_that_missed)
{
        _cleanup_(target_freep) struct target *t = NULL;
        _cleanup_(request_pool_done) struct request_pool pool = {0};
        struct engine_params ep = big_engine();
        struct search_params p = base_params();
        struct search st = {0};

        p.sla.tbt = 0.005; /* below the 50.25 ms an iteration of one costs */
        pool_fixed(&pool, 10, 100);
        cr_assert_eq(engine_model_new(&ep, &t), 0);
        cr_assert_eq(search_run(t, &pool, &p, NULL, NULL, NULL, &st), SEARCH_E_UNATTAINABLE);
        cr_assert_not_null(st.error);
        cr_assert(strstr(st.error, "not met even at 0.1 req/s"), "%s", st.error);
        cr_assert(strstr(st.error, "ms (limit 5.0 ms)"), "%s", st.error);
        cr_assert(strstr(st.error, "TBT p99 50."), "%s", st.error);
        cr_assert(!st.found);
        search_done(&st);
}

Test(search, requests_too_large_for_the_engine_fail_the_target)
{
        _cleanup_(target_freep) struct target *t = NULL;
        _cleanup_(request_pool_done) struct request_pool pool = {0};
        struct engine_params ep = big_engine();
        struct search_params p = base_params();
        struct search st = {0};

        ep.gpu_memory = 50;
        pool_fixed(&pool, 10, 100);
        cr_assert_eq(engine_model_new(&ep, &t), 0);
        cr_assert_eq(search_run(t, &pool, &p, NULL, NULL, NULL, &st), SEARCH_E_TARGET);
        cr_assert(strstr(st.error, "exceeds the KV cache"), "%s", st.error);
        search_done(&st);
}

static void cancel_after_two(const struct search *st, const struct search_point *pt, double lo,
                             double hi, void *userdata)
{
        volatile sig_atomic_t *cancel = userdata;

        if (st->n_points == 2)
                *cancel = 1;
}

Test(search, cancelling_keeps_the_points_measured_so_far)
{
        _cleanup_(target_freep) struct target *t = NULL;
        _cleanup_(request_pool_done) struct request_pool pool = {0};
        struct engine_params ep = big_engine();
        struct search_params p = base_params();
        volatile sig_atomic_t cancel = 0;
        struct search st = {0};

        pool_fixed(&pool, 10, 100);
        cr_assert_eq(engine_model_new(&ep, &t), 0);
        cr_assert_eq(search_run(t, &pool, &p, &cancel, cancel_after_two, (void *)&cancel, &st),
                     SEARCH_E_CANCELLED);
        cr_assert_eq(st.n_points, 2);
        cr_assert(!st.complete);
        search_done(&st);
}

Test(search, a_rate_above_the_ceiling_is_reported_as_capped)
{
        _cleanup_(target_freep) struct target *t = NULL;
        _cleanup_(request_pool_done) struct request_pool pool = {0};
        struct engine_params ep = big_engine();
        struct search_params p = base_params();
        struct search st = {0};

        p.max_rate = 4;
        pool_fixed(&pool, 10, 100);
        cr_assert_eq(engine_model_new(&ep, &t), 0);
        cr_assert_eq(search_run(t, &pool, &p, NULL, NULL, NULL, &st), 0);
        cr_assert(st.capped);
        cr_assert_float_eq(st.rate, 4, 1e-12);
        search_done(&st);
}
