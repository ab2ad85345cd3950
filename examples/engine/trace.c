/*
 * Request traces: what arrives when and how long it is. Read from CSV or YAML,
 * written as CSV, and generated with ShareGPT-like lengths and bursty arrivals.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "csv.h"
#include "example-parse.h"
#include "example-util.h"
#include "rng.h"
#include "trace.h"
#include "yaml-list.h"

void trace_clear(struct trace *t)
{
        free(t->req);
        *t = (struct trace){};
}

static int trace_push(struct trace *t, size_t *allocated, const struct trace_request *r)
{
        int k = csv_reserve((void **)&t->req, allocated, t->n, sizeof(*r), 256, TRACE_MAX_REQUESTS);
        if (k < 0)
                return k;
        t->req[t->n++] = *r;
        return 0;
}

static int parse_tokens(const char *s, uint32_t *ret)
{
        int64_t v;
        if (parse_int64(s, 10, &v) < 0 || v < 1 || v > TRACE_MAX_TOKENS)
                return -EINVAL;
        *ret = (uint32_t)v;
        return 0;
}

/* Seconds as a double into nanoseconds; rejects negative, NaN and absurdly large values. */
static int seconds_to_ns(double s, uint64_t *ret)
{
        if (!(s >= 0.0) || s > 1e9)
                return -EINVAL;
        *ret = (uint64_t)llround(s * (double)NSEC_PER_SEC);
        return 0;
}

int trace_parse_csv(const char *name, const char *data, size_t size, struct trace *ret,
                    char **ret_error)
{
        struct csv_lines lines;
        struct trace t = {};
        size_t allocated = 0;
        char *field[3];
        int r;

        r = csv_lines_init(&lines, name, data, size, ret_error);
        if (r < 0)
                return r;
        while ((r = csv_lines_fields(&lines, "arrival_s,prompt_tokens,output_tokens", field, 3,
                                     ret_error)) > 0) {
                size_t line_no = lines.line_no;
                struct trace_request req;
                double arrival;
                const char *a = field[0], *p = field[1], *o = field[2];
                if (parse_double(a, &arrival) < 0 || seconds_to_ns(arrival, &req.arrival_ns) < 0) {
                        r = csv_fail(ret_error, -EINVAL,
                                     "%s:%zu: arrival_s: expected seconds >= 0, got \"%s\"", name,
                                     line_no, a);
                        goto out;
                }
                if (parse_tokens(p, &req.prompt_tokens) < 0) {
                        r = csv_fail(ret_error, -EINVAL,
                                     "%s:%zu: prompt_tokens: expected an integer 1..%d, got \"%s\"",
                                     name, line_no, TRACE_MAX_TOKENS, p);
                        goto out;
                }
                if (parse_tokens(o, &req.output_tokens) < 0) {
                        r = csv_fail(ret_error, -EINVAL,
                                     "%s:%zu: output_tokens: expected an integer 1..%d, got \"%s\"",
                                     name, line_no, TRACE_MAX_TOKENS, o);
                        goto out;
                }
                if (t.n > 0 && req.arrival_ns < t.req[t.n - 1].arrival_ns) {
                        r = csv_fail(ret_error, -EINVAL,
                                     "%s:%zu: arrival_s %s is earlier than the previous request's; "
                                     "arrivals must not decrease",
                                     name, line_no, a);
                        goto out;
                }
                r = trace_push(&t, &allocated, &req);
                if (r == -E2BIG)
                        r = csv_fail(ret_error, r, "%s:%zu: more than %d requests", name, line_no,
                                     TRACE_MAX_REQUESTS);
                if (r < 0)
                        goto out;
        }
        if (r < 0)
                goto out;
        if (t.n == 0) {
                r = csv_fail(ret_error, -EINVAL, "%s: no requests", name);
                goto out;
        }
        csv_lines_done(&lines);
        *ret = t;
        return 0;
out:
        csv_lines_done(&lines);
        trace_clear(&t);
        return r;
}

static const struct yaml_field yaml_request_fields[] = {
    {"arrival", YAML_DURATION, 0, 1e18},
    {"prompt", YAML_UINT, 1, TRACE_MAX_TOKENS},
    {"output", YAML_UINT, 1, TRACE_MAX_TOKENS},
};

int trace_parse_yaml(const char *name, const char *data, size_t size, struct trace *ret,
                     char **ret_error)
{
        _cleanup_free_ struct yaml_value *v = NULL;
        struct trace t = {};
        size_t allocated = 0, n;
        int r;

        r = yaml_read_list(name, data, size, "requests", yaml_request_fields,
                           ARRAY_SIZE(yaml_request_fields), &v, &n, ret_error);
        if (r < 0)
                return r;
        if (n == 0)
                return csv_fail(ret_error, -EINVAL, "%s: requests: no requests", name);
        for (size_t i = 0; i < n; i++) {
                struct trace_request req = {
                    .arrival_ns = v[3 * i].u,
                    .prompt_tokens = (uint32_t)v[3 * i + 1].u,
                    .output_tokens = (uint32_t)v[3 * i + 2].u,
                };
                if (t.n > 0 && req.arrival_ns < t.req[t.n - 1].arrival_ns) {
                        r = csv_fail(
                            ret_error, -EINVAL,
                            "%s: requests[%zu].arrival: earlier than the previous request's; "
                            "arrivals must not decrease",
                            name, i);
                        break;
                }
                r = trace_push(&t, &allocated, &req);
                if (r < 0)
                        break;
        }
        if (r < 0) {
                trace_clear(&t);
                return r;
        }
        *ret = t;
        return 0;
}

int trace_load(const char *path, struct trace *ret, char **ret_error)
{
        _cleanup_free_ char *buf = NULL;
        size_t size;
        int r;

        r = csv_read_file(path, 256, &buf, &size, ret_error);
        if (r < 0)
                return r;
        if (csv_path_is_yaml(path))
                return trace_parse_yaml(path, buf, size, ret, ret_error);
        return trace_parse_csv(path, buf, size, ret, ret_error);
}

int trace_write_csv(const struct trace *t, FILE *f)
{
        fprintf(f, "arrival_s,prompt_tokens,output_tokens\n");
        for (size_t i = 0; i < t->n; i++)
                fprintf(f, "%.6f,%u,%u\n", (double)t->req[i].arrival_ns / NSEC_PER_SEC,
                        t->req[i].prompt_tokens, t->req[i].output_tokens);
        return fflush(f) == 0 && !ferror(f) ? 0 : -EIO;
}

void trace_gen_defaults(struct trace_gen *g)
{
        /*
         * Lengths close to the ShareGPT conversations serving benchmarks replay:
         * mean prompt ~220 and mean output ~210 tokens with long tails. Bursts of
         * 30 req/s for ~4 s between quiet stretches of 2 req/s for ~8 s.
         */
        *g = (struct trace_gen){
            .n = 2000,
            .seed = 1,
            .rate_on = 30.0,
            .rate_off = 2.0,
            .on_s = 4.0,
            .off_s = 8.0,
            .prompt_median = 120.0,
            .prompt_sigma = 1.1,
            .output_median = 130.0,
            .output_sigma = 1.0,
            .prompt_min = 4,
            .prompt_max = 2048,
            .output_min = 4,
            .output_max = 1024,
        };
}

static uint32_t lognormal_tokens(struct rng *r, double median, double sigma, uint32_t lo,
                                 uint32_t hi)
{
        double v = median * exp(sigma * rng_normal(r));
        if (!(v >= lo))
                return lo;
        if (v > hi)
                return hi;
        return (uint32_t)lround(v);
}

int trace_generate(const struct trace_gen *g, struct trace *ret)
{
        if (g->n == 0 || g->n > TRACE_MAX_REQUESTS || !(g->rate_on > 0) || !(g->rate_off > 0) ||
            !(g->on_s > 0) || !(g->off_s > 0) || !(g->prompt_median >= 1) ||
            !(g->output_median >= 1) || !(g->prompt_sigma >= 0) || !(g->output_sigma >= 0) ||
            g->prompt_min < 1 || g->prompt_min > g->prompt_max || g->output_min < 1 ||
            g->output_min > g->output_max || g->prompt_max > TRACE_MAX_TOKENS ||
            g->output_max > TRACE_MAX_TOKENS)
                return -EINVAL;

        struct trace_request *req = calloc(g->n, sizeof(*req));
        if (!req)
                return -ENOMEM;

        struct rng rng = {g->seed};
        bool on = true;
        double t = 0, period_end = rng_exponential(&rng, g->on_s);
        for (size_t i = 0; i < g->n; i++) {
                /* Memoryless: when a gap crosses a period boundary, restart it in the new period.
                 */
                for (;;) {
                        double gap = rng_exponential(&rng, 1.0 / (on ? g->rate_on : g->rate_off));
                        if (t + gap <= period_end) {
                                t += gap;
                                break;
                        }
                        t = period_end;
                        on = !on;
                        period_end = t + rng_exponential(&rng, on ? g->on_s : g->off_s);
                }
                req[i].arrival_ns = (uint64_t)llround(t * (double)NSEC_PER_SEC);
                req[i].prompt_tokens = lognormal_tokens(&rng, g->prompt_median, g->prompt_sigma,
                                                        g->prompt_min, g->prompt_max);
                req[i].output_tokens = lognormal_tokens(&rng, g->output_median, g->output_sigma,
                                                        g->output_min, g->output_max);
        }
        *ret = (struct trace){req, g->n};
        return 0;
}
