/* The engine model's iteration timing, batching limits and KV admission, checked by hand. */
#include <criterion/criterion.h>

#include "engine-model.h"
#include "time-util.h"
#include "util.h"

static struct engine_params params(void)
{
        return (struct engine_params){
                .prefill_per_token = 1 * NSEC_PER_MSEC,
                .decode_base = 10 * NSEC_PER_MSEC,
                .decode_per_seq = 2 * NSEC_PER_MSEC,
                .max_batch = 8,
                .gpu_memory = 1000,
                .tp = 1,
                .weights = 0,
                .memory_utilization = 1.0,
                .kv_bytes_per_token = 1,
        };
}

static void run_one(const struct engine_params *p, struct request *reqs, double *arrivals,
                    size_t n, struct run *run)
{
        _cleanup_(target_freep) struct target *t = NULL;
        const struct request *rp[16];
        struct load load = {.arrival = arrivals, .request = rp, .n = n, .duration = 1};

        for (size_t i = 0; i < n; i++)
                rp[i] = &reqs[i];
        cr_assert_eq(engine_model_new(p, &t), 0);
        cr_assert_eq(target_run(t, &load, NULL, run), 0);
}

Test(engine_model, iterations_cost_base_plus_batch_plus_prefill)
{
        struct engine_params p = params();
        struct request reqs[] = {{NULL, 10, 3}, {NULL, 5, 2}};
        double arr[] = {0, 0.001};
        struct run run;

        run_one(&p, reqs, arr, 2, &run);
        /* Iteration 1 at 0: admits request 0: 10 + 2*1 + 10*1 = 22 ms -> first token at 0.022. */
        cr_assert_float_eq(run.samples[0].first_token, 0.022, 1e-9);
        /* Iteration 2 at 0.022 admits request 1 too: 10 + 2*2 + 5 = 19 ms. */
        cr_assert_float_eq(run.samples[0].token_times[1], 0.041, 1e-9);
        cr_assert_float_eq(run.samples[1].first_token, 0.041, 1e-9);
        /* Iteration 3: both decode: 14 ms; request 1 has its 2 tokens, request 0 its 3. */
        cr_assert_float_eq(run.samples[0].finish, 0.055, 1e-9);
        cr_assert_float_eq(run.samples[1].finish, 0.055, 1e-9);
        cr_assert_eq(run.samples[0].n_tokens, 3);
        cr_assert_eq(run.samples[1].n_tokens, 2);
        run_done(&run);
}

Test(engine_model, a_full_kv_cache_queues_the_next_request)
{
        struct engine_params p = params();
        struct request reqs[] = {{NULL, 550, 2}, {NULL, 450, 1}};
        double arr[] = {0, 0};
        struct run run;

        p.prefill_per_token = 0;
        run_one(&p, reqs, arr, 2, &run);
        /* 552 + 451 tokens > 1000: request 1 waits until request 0 is done at 0.024. */
        cr_assert_float_eq(run.samples[0].finish, 0.024, 1e-9);
        cr_assert_float_eq(run.samples[1].first_token, 0.024 + 0.012, 1e-9);
        run_done(&run);
}

Test(engine_model, a_request_larger_than_the_kv_cache_fails)
{
        struct engine_params p = params();
        struct request reqs[] = {{NULL, 990, 20}, {NULL, 5, 1}};
        double arr[] = {0, 0};
        struct run run;

        run_one(&p, reqs, arr, 2, &run);
        cr_assert_eq(run.samples[0].error, -E2BIG);
        cr_assert_eq(run.samples[1].error, 0);
        cr_assert_eq(run.samples[1].n_tokens, 1);
        cr_assert_not_null(run.first_error);
        run_done(&run);
}

Test(engine_model, weights_that_fill_the_gpu_are_refused)
{
        struct engine_params p = params();
        struct target *t = NULL;

        p.weights = 1000;
        cr_assert_eq(engine_model_new(&p, &t), -EINVAL);
        p.weights = 100;
        p.tp = 2;
        cr_assert_eq(engine_model_new(&p, &t), 0);
        cr_assert_eq(t->kv_capacity, 1900, "TP spans the memory of every GPU");
        target_free(t);
}
