/*
 * What the load generator replays: a pool of requests (from a ShareGPT JSON file or
 * synthetic length distributions) and their arrival times at a given rate.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Named outcomes. */
enum {
        WORKLOAD_E_MALFORMED = 1, /* the dataset or trace file is not what it should be */
};

enum length_dist {
        LENGTH_FIXED,       /* always mean */
        LENGTH_UNIFORM,     /* uniform in [min, max] */
        LENGTH_EXPONENTIAL, /* exponential with mean, clamped to [min, max] */
        _LENGTH_DIST_MAX,
};
extern const char *const length_dist_names[];

struct length_spec {
        int dist;
        int64_t mean, min, max;
};

enum arrival_kind {
        ARRIVAL_POISSON, /* exponential gaps */
        ARRIVAL_UNIFORM, /* constant gaps */
        ARRIVAL_TRACE,   /* the gaps of a recorded trace, scaled to the rate */
        _ARRIVAL_KIND_MAX,
};
extern const char *const arrival_kind_names[];

struct request {
        char *prompt; /* text sent to an HTTP target; NULL for synthetic pools (made on demand) */
        uint32_t prompt_tokens;
        uint32_t output_tokens;
};

struct request_pool {
        struct request *requests;
        size_t n;
};

/* One load: which request goes out when (seconds from the start of the run). */
struct load {
        double *arrival;
        const struct request **request;
        size_t n;
        double duration; /* the run's length; arrivals are all < duration */
};

/* splitmix64: small, seedable, identical everywhere, so runs repeat exactly. */
struct rng {
        uint64_t state;
};
void rng_seed(struct rng *r, uint64_t seed);
uint64_t rng_next(struct rng *r);
double rng_uniform(struct rng *r); /* in (0, 1) */

/*
 * Read a ShareGPT-format JSON file: an array of {"conversations": [{"from": "human",
 * "value": ...}, {"from": "gpt", "value": ...}, ...]}. Each entry's first human turn
 * is a prompt and the turn after it sets the output length. Tokens are estimated as
 * characters / 4 (at least 1). Entries with fewer than two turns are skipped.
 * Returns 0, -errno if unreadable, WORKLOAD_E_MALFORMED with *ret_error set
 * ("path: problem", caller frees) when the content is wrong.
 */
int request_pool_load_sharegpt(const char *path, size_t max_requests,
                               struct request_pool *ret_pool, char **ret_error);
/* The same on a buffer of size bytes; path names it in messages. */
int request_pool_parse_sharegpt(const char *path, const char *data, size_t size,
                                size_t max_requests, struct request_pool *ret_pool,
                                char **ret_error);
/* n requests whose lengths follow the two specs. */
int request_pool_synthetic(const struct length_spec *prompt, const struct length_spec *output,
                           size_t n, uint64_t seed, struct request_pool *ret_pool);
void request_pool_done(struct request_pool *pool);

/* Read a trace: one arrival time in seconds per line (# comments allowed), ascending. */
int trace_load(const char *path, double **ret_times, size_t *ret_n, char **ret_error);
/* The same on a NUL-terminated buffer, which it cuts up; path names it in messages. */
int trace_parse(const char *path, char *data, double **ret_times, size_t *ret_n,
                char **ret_error);

/*
 * Arrivals at rate req/s for duration seconds, drawing requests from pool in a
 * seeded random order. trace (ARRIVAL_TRACE only) is scaled so its mean rate is rate
 * and repeated as needed. An optional burst multiplies the rate by burst_factor
 * between burst_start and burst_start + burst_len (burst_factor 1 for none).
 */
struct load_spec {
        int arrival;
        double rate;
        double duration;
        uint64_t seed;
        const double *trace;
        size_t n_trace;
        double burst_factor, burst_start, burst_len;
};
int load_make(const struct load_spec *spec, const struct request_pool *pool, struct load *ret_load);
void load_done(struct load *load);
