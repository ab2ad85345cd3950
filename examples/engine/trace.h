/*
 * Request traces: what arrives when and how long it is. Read from CSV or YAML,
 * written as CSV, and generated with ShareGPT-like lengths and bursty arrivals.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define TRACE_MAX_REQUESTS 1000000
#define TRACE_MAX_TOKENS   1048576

struct trace_request {
        uint64_t arrival_ns; /* since the start of the trace */
        uint32_t prompt_tokens;
        uint32_t output_tokens;
};

struct trace {
        struct trace_request *req;
        size_t n;
};

void trace_clear(struct trace *t);

/*
 * CSV: one request per line, "arrival_s,prompt_tokens,output_tokens"; arrival
 * in (fractional) seconds, non-decreasing. Blank lines and lines starting with
 * '#' are skipped; a first line that starts with a letter is a header.
 * On failure returns -EINVAL (bad content), -E2BIG (too many requests) or
 * -ENOMEM, and when ret_error is not NULL a heap message "name:line: problem".
 */
int trace_parse_csv(const char *name, const char *data, size_t size, struct trace *ret,
                    char **ret_error);
/*
 * YAML (common/conf.h): a top-level key "requests" with a list of mappings
 * {arrival: DURATION, prompt: N, output: N}; a bare arrival number is seconds.
 */
int trace_parse_yaml(const char *name, const char *data, size_t size, struct trace *ret,
                     char **ret_error);
/* Read path; ".yaml"/".yml" files are YAML, anything else CSV. Errors as above, or -errno. */
int trace_load(const char *path, struct trace *ret, char **ret_error);
/* Write the trace as CSV with a header. Returns 0 or -EIO. */
int trace_write_csv(const struct trace *t, FILE *f);

/*
 * ShareGPT-like lengths: prompt and output are log-normal (median and sigma of
 * the underlying normal), clipped to [min, max]. Arrivals follow an on/off
 * process: Poisson at rate_on during "on" periods, rate_off during "off"
 * periods, with exponentially distributed period lengths.
 */
struct trace_gen {
        size_t n;
        uint64_t seed;
        double rate_on, rate_off; /* requests per second */
        double on_s, off_s;       /* mean period lengths, seconds */
        double prompt_median, prompt_sigma;
        double output_median, output_sigma;
        uint32_t prompt_min, prompt_max, output_min, output_max;
};

void trace_gen_defaults(struct trace_gen *g);
/* -EINVAL for parameters that cannot produce a trace (n == 0, rates <= 0, min > max, ...). */
int trace_generate(const struct trace_gen *g, struct trace *ret);
