/* Request traces: CSV and YAML parsing, the message for each kind of bad input, and the generator.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "example-util.h"
#include "trace.h"

static struct trace t;

static void fini(void)
{
        trace_clear(&t);
}

TestSuite(trace, .fini = fini);

static int csv(const char *text, char **ret_error)
{
        return trace_parse_csv("t.csv", text, strlen(text), &t, ret_error);
}

static void expect_csv_error(const char *text, const char *message)
{
        _cleanup_free_ char *error = NULL;
        cr_assert_eq(csv(text, &error), -EINVAL);
        cr_assert_not_null(error);
        cr_assert_str_eq(error, message);
        cr_assert_null(t.req, "nothing is returned on failure");
}

Test(trace, reads_csv_with_header_comments_and_blank_lines)
{
        _cleanup_free_ char *error = NULL;
        int r = csv("# a comment\n"
                    "arrival_s,prompt_tokens,output_tokens\n"
                    "\n"
                    "0,128,64\n"
                    "  0.5 , 7 , 1 \n"
                    "0.5,300,20",
                    &error);
        cr_assert_eq(r, 0, "%s", error);
        cr_assert_eq(t.n, 3);
        cr_assert_eq(t.req[0].arrival_ns, 0);
        cr_assert_eq(t.req[0].prompt_tokens, 128);
        cr_assert_eq(t.req[1].arrival_ns, 500 * NSEC_PER_MSEC);
        cr_assert_eq(t.req[1].output_tokens, 1);
        cr_assert_eq(t.req[2].prompt_tokens, 300);
}

Test(trace, names_a_wrong_field_count)
{
        expect_csv_error(
            "arrival_s,prompt_tokens,output_tokens\n0,1,1\n1,2\n",
            "t.csv:3: expected 3 fields (arrival_s,prompt_tokens,output_tokens), got 2");
        expect_csv_error(
            "0,1,1,9\n",
            "t.csv:1: expected 3 fields (arrival_s,prompt_tokens,output_tokens), got 4");
}

Test(trace, names_a_bad_arrival)
{
        expect_csv_error("0,1,1\nsoon,1,1\n",
                         "t.csv:2: arrival_s: expected seconds >= 0, got \"soon\"");
        expect_csv_error("-1,1,1\n", "t.csv:1: arrival_s: expected seconds >= 0, got \"-1\"");
        expect_csv_error("0,1,1\nnan,1,1\n",
                         "t.csv:2: arrival_s: expected seconds >= 0, got \"nan\"");
}

Test(trace, names_bad_token_counts)
{
        expect_csv_error("0,0,1\n",
                         "t.csv:1: prompt_tokens: expected an integer 1..1048576, got \"0\"");
        expect_csv_error("0,12.5,1\n",
                         "t.csv:1: prompt_tokens: expected an integer 1..1048576, got \"12.5\"");
        expect_csv_error("0,1,\n",
                         "t.csv:1: output_tokens: expected an integer 1..1048576, got \"\"");
        expect_csv_error("0,1,9999999\n",
                         "t.csv:1: output_tokens: expected an integer 1..1048576, got \"9999999\"");
}

Test(trace, refuses_arrivals_that_go_back_in_time)
{
        expect_csv_error("1.0,1,1\n0.5,1,1\n",
                         "t.csv:2: arrival_s 0.5 is earlier than the previous request's; "
                         "arrivals must not decrease");
}

Test(trace, refuses_an_empty_trace)
{
        expect_csv_error("arrival_s,prompt_tokens,output_tokens\n# nothing\n",
                         "t.csv: no requests");
}

Test(trace, reads_yaml)
{
        const char *text = "requests:\n"
                           "  - {arrival: 0, prompt: 10, output: 5}\n"
                           "  - {arrival: 250ms, prompt: 20, output: 6}\n"
                           "  - {arrival: 1.5, prompt: 30, output: 7}\n";
        _cleanup_free_ char *error = NULL;
        int r = trace_parse_yaml("t.yaml", text, strlen(text), &t, &error);
        cr_assert_eq(r, 0, "%s", error);
        cr_assert_eq(t.n, 3);
        cr_assert_eq(t.req[1].arrival_ns, 250 * NSEC_PER_MSEC);
        cr_assert_eq(t.req[2].arrival_ns, 1500 * NSEC_PER_MSEC);
        cr_assert_eq(t.req[2].output_tokens, 7);
}

static void expect_yaml_error(const char *text, const char *message)
{
        _cleanup_free_ char *error = NULL;
        cr_assert_eq(trace_parse_yaml("t.yaml", text, strlen(text), &t, &error), -EINVAL);
        cr_assert_not_null(error);
        cr_assert_str_eq(error, message);
}

Test(trace, yaml_errors_name_the_request_and_key)
{
        expect_yaml_error("requests:\n  - {arrival: 0, prompt: 10}\n",
                          "t.yaml:2:5: requests[0]: missing required key 'output'");
        expect_yaml_error("requests:\n  - {arrival: 1s, prompt: 10, output: 1}\n"
                          "  - {arrival: 0s, prompt: 10, output: 1}\n",
                          "t.yaml: requests[1].arrival: earlier than the previous request's; "
                          "arrivals must not decrease");
        expect_yaml_error("requests: []\n", "t.yaml: requests: no requests");
}

Test(trace, load_picks_the_format_by_extension_and_names_the_file)
{
        char path[] = "/tmp/aqua-trace-XXXXXX.yaml";
        int fd = mkstemps(path, 5);
        cr_assert_geq(fd, 0);
        const char *text = "requests:\n  - {arrival: 0, prompt: 1, output: 0}\n";
        cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
        close(fd);

        _cleanup_free_ char *error = NULL;
        cr_assert_eq(trace_load(path, &t, &error), -EINVAL);
        _cleanup_free_ char *want = NULL;
        cr_assert_gt(
            asprintf(&want, "%s:2:37: requests[0].output: 0 is out of range [1, 1048576]", path),
            0);
        cr_assert_str_eq(error, want);
        unlink(path);

        char csv_path[] = "/tmp/aqua-trace-XXXXXX.csv";
        fd = mkstemps(csv_path, 4);
        cr_assert_geq(fd, 0);
        text = "0.25,3,4"; /* no final newline: the last line still counts */
        cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
        close(fd);
        _cleanup_free_ char *csv_error = NULL;
        cr_assert_eq(trace_load(csv_path, &t, &csv_error), 0, "%s", csv_error);
        cr_assert_eq(t.n, 1);
        cr_assert_eq(t.req[0].output_tokens, 4);
        unlink(csv_path);

        _cleanup_free_ char *missing = NULL;
        cr_assert_eq(trace_load("/nonexistent/trace.csv", &t, &missing), -ENOENT);
        cr_assert_str_eq(missing, "/nonexistent/trace.csv: No such file or directory");
}

Test(trace, the_shipped_yaml_example_loads)
{
        _cleanup_free_ char *error = NULL;
        cr_assert_eq(trace_load("trace-example.yaml", &t, &error), 0, "%s", error);
        cr_assert_eq(t.n, 5);
        cr_assert_eq(t.req[4].arrival_ns, 1500 * NSEC_PER_MSEC);
}

Test(trace, generated_traces_repeat_for_a_seed_and_round_trip_through_csv)
{
        struct trace_gen g;
        struct trace a = {}, b = {};
        trace_gen_defaults(&g);
        g.n = 500;
        cr_assert_eq(trace_generate(&g, &a), 0);
        cr_assert_eq(trace_generate(&g, &b), 0);
        cr_assert_eq(memcmp(a.req, b.req, a.n * sizeof(*a.req)), 0);

        uint64_t prompt = 0, output = 0;
        for (size_t i = 0; i < a.n; i++) {
                cr_assert_geq(a.req[i].prompt_tokens, g.prompt_min);
                cr_assert_leq(a.req[i].prompt_tokens, g.prompt_max);
                cr_assert_geq(a.req[i].output_tokens, g.output_min);
                cr_assert_leq(a.req[i].output_tokens, g.output_max);
                if (i > 0)
                        cr_assert_geq(a.req[i].arrival_ns, a.req[i - 1].arrival_ns);
                prompt += a.req[i].prompt_tokens;
                output += a.req[i].output_tokens;
        }
        /* Log-normal around a median of 120/130 with sigma ~1: means near 200. */
        cr_assert(prompt / a.n > 150 && prompt / a.n < 300, "mean prompt %lu", prompt / a.n);
        cr_assert(output / a.n > 150 && output / a.n < 300, "mean output %lu", output / a.n);

        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);
        cr_assert_eq(trace_write_csv(&a, f), 0);
        fclose(f);
        _cleanup_free_ char *error = NULL;
        cr_assert_eq(trace_parse_csv("mem", buf, size, &t, &error), 0, "%s", error);
        cr_assert_eq(t.n, a.n);
        for (size_t i = 0; i < a.n; i++) {
                /* Written with microsecond resolution. */
                cr_assert_leq(
                    llabs((long long)t.req[i].arrival_ns - (long long)a.req[i].arrival_ns), 1000);
                cr_assert_eq(t.req[i].prompt_tokens, a.req[i].prompt_tokens);
        }
        free(buf);
        trace_clear(&a);
        trace_clear(&b);
}

Test(trace, generated_arrivals_come_in_bursts)
{
        /* With quiet periods at 1/20 of the burst rate, gaps vary far more than a Poisson stream's.
         */
        struct trace_gen g;
        struct trace a = {};
        trace_gen_defaults(&g);
        g.n = 2000;
        g.rate_on = 40;
        g.rate_off = 2;
        cr_assert_eq(trace_generate(&g, &a), 0);
        double sum = 0, sum2 = 0;
        for (size_t i = 1; i < a.n; i++) {
                double gap = (double)(a.req[i].arrival_ns - a.req[i - 1].arrival_ns);
                sum += gap;
                sum2 += gap * gap;
        }
        double mean = sum / (a.n - 1), var = sum2 / (a.n - 1) - mean * mean;
        /* A Poisson stream has a coefficient of variation of 1. */
        cr_assert_gt(var / (mean * mean), 2.0);
        trace_clear(&a);
}

Test(trace, generator_refuses_impossible_parameters)
{
        struct trace_gen g;
        trace_gen_defaults(&g);
        g.prompt_min = 10;
        g.prompt_max = 5;
        cr_assert_eq(trace_generate(&g, &t), -EINVAL);
        trace_gen_defaults(&g);
        g.rate_on = 0;
        cr_assert_eq(trace_generate(&g, &t), -EINVAL);
}
