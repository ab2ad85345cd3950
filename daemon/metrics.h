/*
 * Prometheus metrics for aquad: an HTTP endpoint (libmicrohttpd) run from aquad's own poll loop,
 * a text exposition builder, and histograms.
 *
 * Why in the poll loop rather than in a thread of its own: aquad is single-threaded and its state
 * is not locked. Served from the loop, a scrape reads the live pool between two requests, so
 * every figure in one scrape describes the same moment, and the hot path pays nothing (no locks,
 * no snapshot copies). libmicrohttpd runs in its external-select mode with epoll: the loop polls
 * one descriptor, and MHD never blocks (non-blocking sockets, a connection limit and timeout), so
 * a slow scraper cannot stall aquad; a render is a walk over GPUs, O(GPUs), microseconds.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "util.h"

/* ------------------------------------------------------------------ exposition text */

struct metrics_text;

struct metrics_label {
        const char *name;
        const char *value; /* escaped when written */
};

/* Start a metric family: its # HELP and # TYPE lines (type: counter, gauge, histogram). */
void metrics_family(struct metrics_text *t, const char *name, const char *type, const char *help);
/* One sample line. Integers are written exactly; n_labels may be 0. */
void metrics_sample_u64(struct metrics_text *t, const char *name,
                        const struct metrics_label *labels, size_t n_labels, uint64_t value);
void metrics_sample_double(struct metrics_text *t, const char *name,
                           const struct metrics_label *labels, size_t n_labels, double value);

/* ------------------------------------------------------------------ histograms */

#define METRICS_HISTOGRAM_MAX_BUCKETS 24

struct metrics_histogram {
        const double *bounds; /* upper bounds, ascending; +Inf is implied */
        size_t n_bounds;
        uint64_t counts[METRICS_HISTOGRAM_MAX_BUCKETS + 1]; /* per bucket, not cumulative */
        uint64_t count;
        double sum;
};

/* Upper bounds in seconds for reclaim latency: 1 ms to 30 s. */
extern const double metrics_reclaim_bounds[];
extern const size_t metrics_n_reclaim_bounds;

void metrics_histogram_init(struct metrics_histogram *h, const double *bounds, size_t n_bounds);
void metrics_histogram_observe(struct metrics_histogram *h, double value);
/* The family's _bucket (cumulative, with le), _sum and _count lines. */
void metrics_histogram_write(struct metrics_text *t, const char *name, const char *help,
                             const struct metrics_histogram *h);

/* ------------------------------------------------------------------ the HTTP endpoint */

/* Write the whole exposition for one scrape; 0 or a negative errno (the scrape gets a 500). */
typedef int (*metrics_render_fn)(struct metrics_text *t, void *userdata);

struct metrics;

/*
 * Listen on address ("127.0.0.1:9464", "[::1]:9464", "localhost:9464"; port 0 picks one) and
 * serve GET /metrics by calling render. Nothing is served until the caller runs
 * metrics_dispatch(). On failure err says what, naming the address.
 */
int metrics_new(const char *address, metrics_render_fn render, void *userdata,
                struct metrics **ret, char *err, size_t err_len);
struct metrics *metrics_free(struct metrics *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct metrics *, metrics_free);

/* The descriptor to poll for input (an epoll set of the listener and its connections). */
int metrics_fd(const struct metrics *m);
/* Milliseconds until metrics_dispatch() is due even without input (-1: none). */
int metrics_timeout_ms(const struct metrics *m);
/* Accept, read, answer and time out connections; never blocks. */
int metrics_dispatch(struct metrics *m);
/* The port actually bound (what port 0 became). */
uint16_t metrics_port(const struct metrics *m);
/* Scrapes answered so far (for tests and logs). */
uint64_t metrics_scrapes(const struct metrics *m);

/* Render into a malloc'd string (what a scrape would get), for tests and debugging. */
int metrics_render_string(metrics_render_fn render, void *userdata, char **ret, size_t *ret_len);
