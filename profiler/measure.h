/* What one run at one rate observed, per request, and the summary the SLA is judged on. */
#pragma once

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sample {
        double arrival;      /* seconds from the run's start */
        double first_token;  /* < 0: none arrived */
        double finish;       /* < 0: did not finish before the run was cut off */
        double *token_times; /* n_tokens times, first_token included */
        uint32_t n_tokens, cap_tokens;
        uint32_t prompt_tokens;
        uint32_t output_tokens; /* the server's usage.completion_tokens; 0: count n_tokens */
        int error; /* 0, or a negative errno / target error; the request counts as failed */
};

/*
 * What the target saw that a server is not supposed to do, counted per request.
 * Each failed request is in exactly one of the failure counts; a completed one
 * may be in no_usage and ended_early.
 */
struct run_notes {
        /* failures */
        size_t http_status; /* answered a status other than 200 (429 and 503 below) */
        size_t overloaded;  /* answered 429 or 503: the server shed load */
        size_t transport;   /* no connection, a timeout, or the connection broke mid-stream */
        size_t dropped;     /* the stream ended cleanly but without [DONE] or a finish reason */
        size_t cut_short;   /* [DONE] without a finish reason before max_tokens (interrupted) */
        size_t error_event; /* an error event inside the stream */
        size_t bad_event;   /* a payload that is not JSON */
        size_t no_tokens;   /* a clean stream without text */
        /* completed requests */
        size_t no_usage;    /* no usage object: prompt tokens estimated, tokens counted as events */
        size_t ended_early; /* finished ("stop") before max_tokens: ignore_eos not honoured */
};
/* X(field, name in the summary) for each count, in order. */
/* clang-format off */
#define RUN_NOTES_FIELDS(X)                     \
        X(http_status, "http-status")           \
        X(overloaded, "overloaded")             \
        X(transport, "transport")               \
        X(dropped, "dropped")                   \
        X(cut_short, "cut-short")               \
        X(error_event, "error-event")           \
        X(bad_event, "bad-event")               \
        X(no_tokens, "no-tokens")               \
        X(no_usage, "no-usage")                 \
        X(ended_early, "ended-early")
/* clang-format on */

void run_notes_add(struct run_notes *to, const struct run_notes *n);
bool run_notes_any(const struct run_notes *n);

struct run {
        struct sample *samples;
        size_t n;
        double duration;      /* the arrival window */
        double end;           /* when the last observation was made */
        double kv_usage_peak; /* from the engine's metrics, fraction 0..1; < 0 if not sampled */
        char *first_error;    /* the first failure's message, for the user */
        char *metrics_error;  /* why the metrics endpoint gave no gauge, if it did not */
        struct run_notes notes;
};

int run_init(struct run *run, size_t n, double duration);
void run_done(struct run *run);
int sample_add_token(struct sample *s, double t);
/* Remember msg as the run's first error, if it has none yet. */
void run_note_error(struct run *run, const char *msg);

struct run_summary {
        size_t n_requests; /* those counted: arrived after warm-up */
        size_t n_failed;
        double failure_rate;
        double ttft_p50, ttft_p99, ttft_sla; /* ttft_sla: at the SLA's percentile */
        double tbt_p50, tbt_p99, tbt_sla;
        double throughput;        /* completed requests per second over the run */
        double token_throughput;  /* output tokens per second */
        uint64_t peak_kv_demand;  /* bytes: max over time of the KV every request in flight needs */
};

/*
 * Summarise run: requests arriving before warmup seconds are left out of the
 * latency figures (the engine is still filling), a request that got no first
 * token before the run ended counts with TTFT = end - arrival. Percentiles are
 * nearest-rank. kv_bytes_per_token sizes the KV demand.
 */
int run_summarize(const struct run *run, double warmup, double ttft_percentile,
                  double tbt_percentile, uint64_t kv_bytes_per_token,
                  struct run_summary *ret_summary);

/* Nearest-rank percentile (0 < p <= 100) of v[0..n), sorting v in place; 0 for n == 0. */
double percentile(double *v, size_t n, double p);
