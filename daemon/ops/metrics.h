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

#include "domain.h"
#include "util.h"

struct broker;
struct metrics;

/* The transport's counters, which metrics render. */
struct server_stats {
        uint64_t requests;
        uint64_t errors;
        uint64_t refused;            /* side-channel connections refused */
        uint64_t send_dropped;       /* replies the ROUTER could not queue (notices wait) */
        uint64_t replies_deferred;   /* custody replies that waited for a full queue to drain */
        uint64_t notices_deferred;   /* times a client's notices had to wait in its outbox */
        uint64_t errors_by_code[32]; /* error replies, indexed by Aqua__ErrorCode */
        uint64_t throttled;          /* requests refused over a client's request rate */
        uint64_t hijacks;            /* Hellos from another process than the token's side channel */
        uint64_t side_malformed;     /* side frames that did not decode (ignored) */
        uint64_t evicted;            /* side channels closed for others before their Hello */
        uint64_t share_refused;      /* side channels refused over a user's share */
        uint64_t ipc_share_refused;  /* ipc:// connections closed over a user's share */
        uint64_t fd_exhausted;       /* times aquad ran out of descriptors accepting a connection */
        uint64_t fds_refused;        /* descriptors refused over a budget or the headroom */
        uint64_t remote_refused;     /* tcp peers refused: unknown keys, failed handshakes */
        uint64_t custody_undelivered; /* grants and offers taken back: their reply was not sent */
};

/* What the transport shows at each scrape (metrics_view_fn fills it). */
struct metrics_view {
        uint64_t start_ns; /* when aquad started (monotonic) */
        const struct server_stats *stats;
        uint64_t clients_by_role[5]; /* unregistered, producer, consumer, neutral, admin */
        bool in_domain;              /* domain: set, else a single aquad */
        struct domain_view domain;
};
typedef void (*metrics_view_fn)(void *userdata, struct metrics_view *view);

/*
 * Serve s's metrics on address, and observe reclaims in s's pool. Returns 0 or a negative
 * errno, logged with the address.
 */
int metrics_new(struct broker *broker, const char *address, metrics_view_fn view, void *userdata,
                struct metrics **ret);
struct metrics *metrics_free(struct metrics *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct metrics *, metrics_free);

/* For the loop: the descriptor to poll for input, and when to dispatch without input (-1). */
int metrics_fd(const struct metrics *m);
int metrics_timeout_ms(const struct metrics *m);
/* Answer what scrapers sent; never blocks. */
void metrics_dispatch(struct metrics *m);
