/*
 * Request traces: what arrives when and how long it is. Read from CSV or YAML,
 * written as CSV, and generated with ShareGPT-like lengths and bursty arrivals.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "conf.h"
#include "parse-util.h"
#include "rng.h"
#include "time-util.h"
#include "trace.h"
#include "util.h"

void trace_clear(struct trace *t)
{
        free(t->req);
        *t = (struct trace){};
}

static int fail(char **ret_error, int r, const char *fmt, ...) _printf_(3, 4);
static int fail(char **ret_error, int r, const char *fmt, ...)
{
        if (ret_error) {
                va_list ap;
                va_start(ap, fmt);
                if (vasprintf(ret_error, fmt, ap) < 0)
                        *ret_error = NULL;
                va_end(ap);
        }
        return r;
}

static int trace_push(struct trace *t, size_t *allocated, const struct trace_request *r)
{
        if (t->n >= TRACE_MAX_REQUESTS)
                return -E2BIG;
        if (t->n == *allocated) {
                size_t n = MAX(*allocated * 2, (size_t)256);
                struct trace_request *v = reallocarray(t->req, n, sizeof(*v));
                if (!v)
                        return -ENOMEM;
                t->req = v;
                *allocated = n;
        }
        t->req[t->n++] = *r;
        return 0;
}

static char *strip(char *s)
{
        while (isspace((unsigned char)*s))
                s++;
        char *e = s + strlen(s);
        while (e > s && isspace((unsigned char)e[-1]))
                *--e = 0;
        return s;
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
        _cleanup_free_ char *copy = NULL;
        struct trace t = {};
        size_t allocated = 0, line_no = 0;
        bool seen_data = false;
        int r = 0;

        /* The input need not be NUL-terminated: copy it before splitting it in place. */
        if (memchr(data, 0, size))
                return fail(ret_error, -EINVAL, "%s: contains a NUL byte", name);
        copy = malloc(size + 1);
        if (!copy)
                return -ENOMEM;
        memcpy(copy, data, size);
        copy[size] = 0;

        for (char *next = copy; next;) {
                char *line = next;
                char *nl = strchr(line, '\n');
                next = nl ? nl + 1 : NULL;
                if (nl)
                        *nl = 0;
                line_no++;

                line = strip(line);
                if (!*line || *line == '#')
                        continue;
                if (!seen_data && isalpha((unsigned char)*line)) {
                        seen_data = true; /* the header */
                        continue;
                }
                seen_data = true;

                size_t n_fields = 1;
                for (const char *c = line; (c = strchr(c, ',')); c++)
                        n_fields++;
                if (n_fields != 3) {
                        r = fail(ret_error, -EINVAL,
                                 "%s:%zu: expected 3 fields "
                                 "(arrival_s,prompt_tokens,output_tokens), got %zu",
                                 name, line_no, n_fields);
                        goto out;
                }
                char *field[3];
                field[0] = line;
                field[1] = strchr(field[0], ',');
                *field[1]++ = 0;
                field[2] = strchr(field[1], ',');
                *field[2]++ = 0;

                struct trace_request req;
                double arrival;
                const char *a = strip(field[0]), *p = strip(field[1]), *o = strip(field[2]);
                if (parse_double(a, &arrival) < 0 || seconds_to_ns(arrival, &req.arrival_ns) < 0) {
                        r = fail(ret_error, -EINVAL,
                                 "%s:%zu: arrival_s: expected seconds >= 0, got \"%s\"", name,
                                 line_no, a);
                        goto out;
                }
                if (parse_tokens(p, &req.prompt_tokens) < 0) {
                        r = fail(ret_error, -EINVAL,
                                 "%s:%zu: prompt_tokens: expected an integer 1..%d, got \"%s\"",
                                 name, line_no, TRACE_MAX_TOKENS, p);
                        goto out;
                }
                if (parse_tokens(o, &req.output_tokens) < 0) {
                        r = fail(ret_error, -EINVAL,
                                 "%s:%zu: output_tokens: expected an integer 1..%d, got \"%s\"",
                                 name, line_no, TRACE_MAX_TOKENS, o);
                        goto out;
                }
                if (t.n > 0 && req.arrival_ns < t.req[t.n - 1].arrival_ns) {
                        r = fail(ret_error, -EINVAL,
                                 "%s:%zu: arrival_s %s is earlier than the previous request's; "
                                 "arrivals must not decrease",
                                 name, line_no, a);
                        goto out;
                }
                r = trace_push(&t, &allocated, &req);
                if (r == -E2BIG)
                        r = fail(ret_error, r, "%s:%zu: more than %d requests", name, line_no,
                                 TRACE_MAX_REQUESTS);
                if (r < 0)
                        goto out;
        }
        if (t.n == 0) {
                r = fail(ret_error, -EINVAL, "%s: no requests", name);
                goto out;
        }
        *ret = t;
        return 0;
out:
        trace_clear(&t);
        return r;
}

struct yaml_request {
        uint64_t arrival;
        int64_t prompt;
        int64_t output;
};

struct yaml_trace {
        struct yaml_request *requests;
        size_t n_requests;
};

static const struct conf_field yaml_request_fields[] = {
    CONF_FIELD_DURATION(struct yaml_request, arrival, "arrival", 0,
                        INT64_C(1000000000) * 1000000000, CONF_REQUIRED),
    CONF_FIELD_INT(struct yaml_request, prompt, "prompt", 1, TRACE_MAX_TOKENS, CONF_REQUIRED),
    CONF_FIELD_INT(struct yaml_request, output, "output", 1, TRACE_MAX_TOKENS, CONF_REQUIRED),
    CONF_FIELD_END,
};
static const struct conf_schema yaml_request_schema = {"request", yaml_request_fields};

static const struct conf_field yaml_trace_fields[] = {
    CONF_FIELD_LIST(struct yaml_trace, requests, n_requests, "requests",
                    CONF_ELEM_STRUCT(&yaml_request_schema), CONF_MAX_ITEMS, CONF_REQUIRED),
    CONF_FIELD_END,
};
static const struct conf_schema yaml_trace_schema = {"trace", yaml_trace_fields};

int trace_parse_yaml(const char *name, const char *data, size_t size, struct trace *ret,
                     char **ret_error)
{
        struct yaml_trace y = {};
        struct trace t = {};
        size_t allocated = 0;
        int r;

        r = conf_load_buffer(&yaml_trace_schema, name, data, size, &y, ret_error);
        if (r < 0)
                goto out;
        if (y.n_requests == 0) {
                r = fail(ret_error, -EINVAL, "%s: requests: no requests", name);
                goto out;
        }
        for (size_t i = 0; i < y.n_requests; i++) {
                const struct yaml_request *q = &y.requests[i];
                struct trace_request req = {
                    .arrival_ns = q->arrival,
                    .prompt_tokens = (uint32_t)q->prompt,
                    .output_tokens = (uint32_t)q->output,
                };
                if (t.n > 0 && req.arrival_ns < t.req[t.n - 1].arrival_ns) {
                        r = fail(ret_error, -EINVAL,
                                 "%s: requests[%zu].arrival: earlier than the previous request's; "
                                 "arrivals must not decrease",
                                 name, i);
                        goto out;
                }
                r = trace_push(&t, &allocated, &req);
                if (r < 0)
                        goto out;
        }
        *ret = t;
        t = (struct trace){};
out:
        trace_clear(&t);
        conf_free(&yaml_trace_schema, &y);
        return r;
}

static bool has_suffix(const char *s, const char *suffix)
{
        size_t n = strlen(s), m = strlen(suffix);
        return n >= m && strcmp(s + n - m, suffix) == 0;
}

int trace_load(const char *path, struct trace *ret, char **ret_error)
{
        _cleanup_close_ int fd = -1;
        _cleanup_free_ char *buf = NULL;
        struct stat st;
        size_t done = 0;

        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return fail(ret_error, -errno, "%s: %s", path, strerror(errno));
        if (fstat(fd, &st) < 0)
                return fail(ret_error, -errno, "%s: %s", path, strerror(errno));
        if (!S_ISREG(st.st_mode))
                return fail(ret_error, -EINVAL, "%s: not a regular file", path);
        if (st.st_size > 256 << 20)
                return fail(ret_error, -E2BIG, "%s: larger than 256 MiB", path);
        buf = malloc((size_t)st.st_size + 1);
        if (!buf)
                return -ENOMEM;
        while (done < (size_t)st.st_size) {
                ssize_t k = read(fd, buf + done, (size_t)st.st_size - done);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return fail(ret_error, -errno, "%s: %s", path, strerror(errno));
                if (k == 0)
                        break;
                done += (size_t)k;
        }

        if (has_suffix(path, ".yaml") || has_suffix(path, ".yml"))
                return trace_parse_yaml(path, buf, done, ret, ret_error);
        return trace_parse_csv(path, buf, done, ret, ret_error);
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
