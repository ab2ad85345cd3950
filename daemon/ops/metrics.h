/*
 * aquad's Prometheus metrics (config key `metrics: HOST:PORT`, off unless set): GPUs by role,
 * the pool's chunks and bytes, leases, bytes lent, borrowed and in DRAM fallback, reclaim
 * latency, deadline misses, lost leases, migrations and bytes moved as clients report them,
 * clients, and error replies by code.
 *
 * Served from aquad's own poll loop rather than a thread of its own: aquad is single-threaded
 * and its state is not locked. From the loop, a scrape reads the live pool between two requests,
 * so every figure of one scrape describes the same moment, and the request path pays nothing (no
 * locks, no snapshot copies). libmicrohttpd never blocks there (epoll, non-blocking sockets, a
 * connection limit and timeout), so a slow scraper cannot stall aquad; a render walks the GPUs
 * once, O(GPUs).
 */
#pragma once

#include <stdint.h>

#include "util.h"

struct server;
struct metrics;

/*
 * Serve s's metrics on address, and observe reclaims in s's pool. Returns 0 or a negative
 * errno, logged with the address.
 */
int metrics_new(struct server *s, const char *address, struct metrics **ret);
struct metrics *metrics_free(struct metrics *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct metrics *, metrics_free);

/* For the loop: the descriptor to poll for input, and when to dispatch without input (-1). */
int metrics_fd(const struct metrics *m);
int metrics_timeout_ms(const struct metrics *m);
/* Answer what scrapers sent; never blocks. */
void metrics_dispatch(struct metrics *m);

