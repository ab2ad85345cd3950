/* Percentiles and the summary of a hand-made run, with the KV demand worked out by hand. */
#include <criterion/criterion.h>
#include <errno.h>

#include "measure.h"

Test(measure, percentiles_are_nearest_rank)
{
        double v[] = {5, 1, 4, 2, 3, 10, 9, 8, 7, 6};

        cr_assert_float_eq(percentile(v, 10, 50), 5, 1e-12);
        cr_assert_float_eq(percentile(v, 10, 99), 10, 1e-12);
        cr_assert_float_eq(percentile(v, 10, 10), 1, 1e-12);
        cr_assert_float_eq(percentile(v, 0, 50), 0, 1e-12);
}

Test(measure, summary_counts_ttft_tbt_failures_and_kv_demand)
{
        struct run run;
        struct run_summary s;

        cr_assert_eq(run_init(&run, 3, 10), 0);
        /* Request 0: arrives at 0, tokens at 0.5, 0.6, 0.8; prompt 10. */
        run.samples[0].arrival = 0;
        run.samples[0].prompt_tokens = 10;
        sample_add_token(&run.samples[0], 0.5);
        sample_add_token(&run.samples[0], 0.6);
        sample_add_token(&run.samples[0], 0.8);
        run.samples[0].finish = 0.8;
        /* Request 1: arrives at 0.55, one token at 1.55; prompt 20. */
        run.samples[1].arrival = 0.55;
        run.samples[1].prompt_tokens = 20;
        sample_add_token(&run.samples[1], 1.55);
        run.samples[1].finish = 1.55;
        /* Request 2 failed. */
        run.samples[2].arrival = 2;
        run.samples[2].prompt_tokens = 5;
        run.samples[2].error = -EPROTO;
        run.samples[2].finish = 2.1;
        run.end = 2.1;

        cr_assert_eq(run_summarize(&run, 0, 99, 99, 1000, &s), 0);
        cr_assert_eq(s.n_requests, 3);
        cr_assert_eq(s.n_failed, 1);
        cr_assert_float_eq(s.failure_rate, 1.0 / 3, 1e-12);
        cr_assert_float_eq(s.ttft_p50, 0.5, 1e-12);
        cr_assert_float_eq(s.ttft_p99, 1.0, 1e-12);
        cr_assert_float_eq(s.tbt_p50, 0.1, 1e-9);
        cr_assert_float_eq(s.tbt_p99, 0.2, 1e-9);
        cr_assert_float_eq(s.throughput, 2 / 10.0, 1e-12);
        /* At 0.6: request 0 holds 10 + 2 tokens, request 1 holds 20: 32 tokens of 1000 bytes. */
        cr_assert_eq(s.peak_kv_demand, 32000);

        /* Warm-up leaves request 0 out of the latencies. */
        cr_assert_eq(run_summarize(&run, 0.1, 99, 99, 1000, &s), 0);
        cr_assert_eq(s.n_requests, 2);
        cr_assert_float_eq(s.ttft_p50, 1.0, 1e-12);
        run_done(&run);
}

Test(measure, a_request_without_a_first_token_counts_until_the_run_ends)
{
        struct run run;
        struct run_summary s;

        cr_assert_eq(run_init(&run, 1, 1), 0);
        run.samples[0].arrival = 0.5;
        run.samples[0].prompt_tokens = 1;
        run.end = 3.5;
        cr_assert_eq(run_summarize(&run, 0, 50, 50, 1, &s), 0);
        cr_assert_float_eq(s.ttft_p50, 3.0, 1e-12);
        cr_assert_eq(s.n_failed, 0);
        run_done(&run);
}
