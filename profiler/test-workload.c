/* Request pools from ShareGPT files and synthetic specs, traces, and arrival schedules. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"
#include "workload.h"

static char *write_temp(const char *content)
{
        char *path = strdup("/tmp/aqua-test-workload-XXXXXX");
        int fd = mkstemp(path);

        cr_assert(fd >= 0);
        cr_assert_eq(write(fd, content, strlen(content)), (ssize_t)strlen(content));
        close(fd);
        return path;
}

static int load_json(const char *content, struct request_pool *pool, char **error)
{
        _cleanup_free_ char *path = write_temp(content);
        int r = request_pool_load_sharegpt(path, 0, pool, error);

        unlink(path);
        return r;
}

Test(workload, sharegpt_turns_become_prompts_and_output_lengths)
{
        struct request_pool pool = {0};
        char *error = NULL;

        cr_assert_eq(load_json("[{\"id\": \"a\", \"conversations\": ["
                               "{\"from\": \"human\", \"value\": \"0123456789abcdef\"},"
                               "{\"from\": \"gpt\", \"value\": \"01234567\"}]},"
                               "{\"id\": \"b\", \"conversations\": [{\"from\": \"human\", "
                               "\"value\": \"only one turn\"}]},"
                               "{\"id\": \"c\", \"conversations\": ["
                               "{\"from\": \"human\", \"value\": \"hi\"},"
                               "{\"from\": \"gpt\", \"value\": \"\"}]}]",
                               &pool, &error),
                     0);
        cr_assert_eq(pool.n, 2, "the one-turn entry is skipped");
        cr_assert_str_eq(pool.requests[0].prompt, "0123456789abcdef");
        cr_assert_eq(pool.requests[0].prompt_tokens, 4);
        cr_assert_eq(pool.requests[0].output_tokens, 2);
        cr_assert_eq(pool.requests[1].prompt_tokens, 1, "never fewer than one token");
        cr_assert_eq(pool.requests[1].output_tokens, 1);
        request_pool_done(&pool);
}

Test(workload, truncated_json_names_the_byte_where_it_broke)
{
        struct request_pool pool = {0};
        char *error = NULL;

        cr_assert_eq(load_json("[{\"conversations\": [", &pool, &error), WORKLOAD_E_MALFORMED);
        cr_assert(strstr(error, "malformed JSON at byte"), "%s", error);
        cr_assert(strstr(error, "unexpected end of file"), "%s", error);
        free(error);
}

Test(workload, json_that_is_not_sharegpt_is_refused_with_a_reason)
{
        struct request_pool pool = {0};
        char *error = NULL;

        cr_assert_eq(load_json("{\"a\": 1}", &pool, &error), WORKLOAD_E_MALFORMED);
        cr_assert(strstr(error, "expected a JSON array"), "%s", error);
        free(error);
        error = NULL;
        cr_assert_eq(load_json("[{\"id\": 1}]", &pool, &error), WORKLOAD_E_MALFORMED);
        cr_assert(strstr(error, "entry 0 has no \"conversations\" list"), "%s", error);
        free(error);
        error = NULL;
        cr_assert_eq(load_json("[{\"conversations\": [{\"value\": 3}, {\"value\": \"x\"}]}]", &pool,
                               &error),
                     WORKLOAD_E_MALFORMED);
        cr_assert(strstr(error, "turn 0 has no string \"value\""), "%s", error);
        free(error);
        error = NULL;
        cr_assert_eq(load_json("[]", &pool, &error), WORKLOAD_E_MALFORMED);
        cr_assert(strstr(error, "no conversation"), "%s", error);
        free(error);
}

Test(workload, a_missing_dataset_is_an_errno)
{
        struct request_pool pool = {0};
        char *error = NULL;

        cr_assert_eq(request_pool_load_sharegpt("/nonexistent/x.json", 0, &pool, &error), -ENOENT);
        cr_assert_null(error);
}

Test(workload, synthetic_lengths_follow_their_distribution)
{
        struct length_spec fixed = {LENGTH_FIXED, 100, 1, 1000};
        struct length_spec uni = {LENGTH_UNIFORM, 0, 10, 20};
        struct length_spec expo = {LENGTH_EXPONENTIAL, 200, 1, 100000};
        struct request_pool pool = {0};
        double sum = 0;

        cr_assert_eq(request_pool_synthetic(&fixed, &uni, 5000, 7, &pool), 0);
        for (size_t i = 0; i < pool.n; i++) {
                cr_assert_eq(pool.requests[i].prompt_tokens, 100);
                cr_assert(pool.requests[i].output_tokens >= 10 &&
                          pool.requests[i].output_tokens <= 20);
        }
        request_pool_done(&pool);
        cr_assert_eq(request_pool_synthetic(&expo, &fixed, 5000, 7, &pool), 0);
        for (size_t i = 0; i < pool.n; i++)
                sum += pool.requests[i].prompt_tokens;
        cr_assert(fabs(sum / 5000 - 200) < 20, "mean %g", sum / 5000);
        request_pool_done(&pool);
}

Test(workload, uniform_arrivals_are_evenly_spaced_and_bursts_compress_them)
{
        struct length_spec fixed = {LENGTH_FIXED, 10, 1, 100};
        struct request_pool pool = {0};
        struct load load = {0};
        struct load_spec spec = {.arrival = ARRIVAL_UNIFORM, .rate = 10, .duration = 10};
        size_t in_burst = 0;

        cr_assert_eq(request_pool_synthetic(&fixed, &fixed, 4, 1, &pool), 0);
        cr_assert_eq(load_make(&spec, &pool, &load), 0);
        cr_assert_eq(load.n, 99, "arrivals at 0.1 .. 9.9 s");
        cr_assert_float_eq(load.arrival[1] - load.arrival[0], 0.1, 1e-9);
        load_done(&load);

        spec.burst_factor = 4;
        spec.burst_start = 2;
        spec.burst_len = 1;
        cr_assert_eq(load_make(&spec, &pool, &load), 0);
        for (size_t i = 0; i < load.n; i++)
                in_burst += load.arrival[i] >= 2 && load.arrival[i] < 3;
        cr_assert(in_burst >= 39 && in_burst <= 41, "%zu arrivals in the burst second", in_burst);
        cr_assert(load.n >= 128 && load.n <= 130, "%zu arrivals", load.n);
        load_done(&load);
        request_pool_done(&pool);
}

Test(workload, poisson_arrivals_average_the_rate)
{
        struct length_spec fixed = {LENGTH_FIXED, 10, 1, 100};
        struct request_pool pool = {0};
        struct load load = {0};
        struct load_spec spec = {.arrival = ARRIVAL_POISSON, .rate = 50, .duration = 100, .seed = 3};

        cr_assert_eq(request_pool_synthetic(&fixed, &fixed, 4, 1, &pool), 0);
        cr_assert_eq(load_make(&spec, &pool, &load), 0);
        cr_assert(load.n > 4700 && load.n < 5300, "%zu arrivals", load.n);
        for (size_t i = 1; i < load.n; i++)
                cr_assert(load.arrival[i] >= load.arrival[i - 1]);
        load_done(&load);
        request_pool_done(&pool);
}

Test(workload, traces_are_scaled_to_the_rate)
{
        _cleanup_free_ char *path = write_temp("# seconds\n0\n1\n1.5\n3\n4\n");
        struct length_spec fixed = {LENGTH_FIXED, 10, 1, 100};
        struct request_pool pool = {0};
        struct load load = {0};
        double *times = NULL;
        size_t n = 0;
        char *error = NULL;

        cr_assert_eq(trace_load(path, &times, &n, &error), 0);
        unlink(path);
        cr_assert_eq(n, 5);
        cr_assert_eq(request_pool_synthetic(&fixed, &fixed, 4, 1, &pool), 0);
        /* Mean gap 1 s in the trace; at 2 req/s it becomes 0.5 s: 8 gaps fit in 4 s. */
        struct load_spec spec = {.arrival = ARRIVAL_TRACE, .rate = 2, .duration = 4.01,
                                 .trace = times, .n_trace = n};
        cr_assert_eq(load_make(&spec, &pool, &load), 0);
        cr_assert_eq(load.n, 8);
        cr_assert_float_eq(load.arrival[0], 0.5, 1e-9);
        cr_assert_float_eq(load.arrival[1], 0.75, 1e-9);
        cr_assert_float_eq(load.arrival[3], 2.0, 1e-9);
        load_done(&load);
        request_pool_done(&pool);
        free(times);
}

Test(workload, a_trace_going_backwards_names_its_line)
{
        _cleanup_free_ char *path = write_temp("0\n2\n1\n");
        double *times = NULL;
        size_t n = 0;
        char *error = NULL;

        cr_assert_eq(trace_load(path, &times, &n, &error), WORKLOAD_E_MALFORMED);
        unlink(path);
        cr_assert(strstr(error, ":3: "), "%s", error);
        free(error);
}
