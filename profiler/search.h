/*
 * The SLA search: the highest request rate a target sustains within the SLA, the
 * memory it leaves free there, its role, and (for consumers) the swap space bursts need.
 */
#pragma once

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "measure.h"
#include "target.h"
#include "workload.h"

/* Named outcomes of search_run(). */
enum {
        SEARCH_E_UNATTAINABLE = 1, /* the SLA fails even at the lowest rate */
        SEARCH_E_TARGET,           /* every request failed: the target is broken or unreachable */
        SEARCH_E_CANCELLED,        /* stopped by *cancel; the result holds what was measured */
};

enum role {
        ROLE_PRODUCER,
        ROLE_CONSUMER,
        _ROLE_MAX,
        _ROLE_INVALID = -EINVAL,
};
extern const char *const role_names[];

struct sla {
        double ttft, ttft_percentile; /* seconds, percent */
        double tbt, tbt_percentile;
        double max_failure_rate; /* 0..1 */
};

struct search_params {
        struct sla sla;
        double start_rate, min_rate, max_rate; /* req/s */
        double tolerance;                      /* stop when (hi - lo) <= tolerance * lo */
        int max_steps;
        int arrival;
        double duration, warmup; /* seconds per run, and its head left out of the figures */
        int64_t min_requests;    /* a run lasts long enough for this many after warm-up */
        uint64_t seed;
        const double *trace;
        size_t n_trace;
        uint64_t producer_threshold; /* bytes free at the sustainable rate to count as producer */
        const double *bursts;        /* multiples of the sustainable rate */
        size_t n_bursts;
        double burst_duration;
};

enum point_phase { PHASE_PREFLIGHT, PHASE_SEARCH, PHASE_BURST };

struct search_point {
        int phase;
        double rate;  /* base rate of the run */
        double burst; /* burst factor, 1 for none */
        bool meets;
        struct run_summary s;
        double kv_usage_peak; /* from the engine's metrics; < 0 without */
        struct run_notes notes;
};

struct burst_need {
        double factor;
        uint64_t peak_demand; /* bytes of KV the burst needs at its peak */
        uint64_t swap;        /* of which beyond the KV cache: what must be swapped */
};

/* The state of a search, filled as it goes so a cancelled one still reports what it saw. */
struct search {
        struct search_point *points;
        size_t n_points;
        bool found;     /* rate and what follows are valid */
        double rate;    /* highest rate meeting the SLA */
        size_t best;    /* index of its point */
        bool capped;    /* rate is max_rate: the true limit may be higher */
        uint64_t kv_capacity;
        uint64_t free_memory;
        int role;
        struct burst_need *bursts;
        size_t n_bursts;
        bool complete;
        char *error; /* for SEARCH_E_*: what to tell the user */
        struct run_notes notes; /* over every run, the preflight's included */
        char *first_failure;    /* the first failed request's message, for the user */
        bool kv_from_metrics;   /* free_memory is from the engine's gauge, not the estimate */
        char *metrics_error;    /* why the gauge was not read, when a metrics URL was given */
};

typedef void (*search_progress_fn)(const struct search *s, const struct search_point *p,
                                   double lo, double hi, void *userdata);

/*
 * Run the search on target t with requests from pool. st must be zeroed; free it
 * with search_done() whatever the outcome. progress (may be NULL) is called after
 * every run with the bracket [lo, hi] (hi < 0 while unbounded).
 */
int search_run(struct target *t, const struct request_pool *pool, const struct search_params *p,
               const volatile sig_atomic_t *cancel, search_progress_fn progress, void *userdata,
               struct search *st);
void search_done(struct search *st);

bool sla_met(const struct sla *sla, const struct run_summary *s);
