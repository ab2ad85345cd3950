/*
 * Prometheus text exposition (families, samples, histograms) and an HTTP endpoint serving it
 * with libmicrohttpd in external-select mode: the caller's poll loop polls one descriptor and
 * calls prom_server_dispatch(), which never blocks.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "util.h"

/* ------------------------------------------------------------------ exposition text */

struct prom_text;

struct prom_label {
        const char *name;
        const char *value; /* escaped when written */
};

/* Start a metric family: its # HELP and # TYPE lines (type: counter, gauge, histogram). */
void prom_family(struct prom_text *t, const char *name, const char *type, const char *help);
/* One sample line. Integers are written exactly; n_labels may be 0. */
void prom_sample_u64(struct prom_text *t, const char *name, const struct prom_label *labels,
                     size_t n_labels, uint64_t value);
void prom_sample_double(struct prom_text *t, const char *name, const struct prom_label *labels,
                        size_t n_labels, double value);

/* ------------------------------------------------------------------ histograms */

#define PROM_HISTOGRAM_MAX_BUCKETS 24

struct prom_histogram {
        const double *bounds; /* upper bounds, ascending; +Inf is implied */
        size_t n_bounds;
        uint64_t counts[PROM_HISTOGRAM_MAX_BUCKETS + 1]; /* per bucket, not cumulative */
        uint64_t count;
        double sum;
};

void prom_histogram_init(struct prom_histogram *h, const double *bounds, size_t n_bounds);
void prom_histogram_observe(struct prom_histogram *h, double value);
/* The family's _bucket (cumulative, with le), _sum and _count lines. */
void prom_histogram_write(struct prom_text *t, const char *name, const char *help,
                          const struct prom_histogram *h);

/* ------------------------------------------------------------------ the HTTP endpoint */

/* Write the whole exposition for one scrape; 0 or a negative errno (the scrape gets a 500). */
typedef int (*prom_render_fn)(struct prom_text *t, void *userdata);

struct prom_server;

/*
 * Listen on address ("127.0.0.1:9464", "[::1]:9464", "localhost:9464"; port 0 picks one) and
 * serve GET /metrics by calling render. Nothing is served until the caller runs
 * prom_server_dispatch(). On failure err says what, naming the address.
 */
int prom_server_new(const char *address, prom_render_fn render, void *userdata,
                    struct prom_server **ret, char *err, size_t err_len);
struct prom_server *prom_server_free(struct prom_server *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct prom_server *, prom_server_free);

/*
 * The descriptor to poll for input (an epoll set of the listener and its connections); -1 while
 * the endpoint rests after running out of descriptors (poll nothing for it then).
 */
int prom_server_fd(const struct prom_server *m);
/* Milliseconds until prom_server_dispatch() is due even without input: at most a second. */
int prom_server_timeout_ms(const struct prom_server *m);
/* Accept, read, answer and time out connections; never blocks. */
int prom_server_dispatch(struct prom_server *m);
/* The port actually bound (what port 0 became). */
uint16_t prom_server_port(const struct prom_server *m);
/* Scrapes answered so far (for tests and logs). */
uint64_t prom_server_scrapes(const struct prom_server *m);

/* Render into a malloc'd string (what a scrape would get), for tests and debugging. */
int prom_render_string(prom_render_fn render, void *userdata, char **ret, size_t *ret_len);
