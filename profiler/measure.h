/* What one run at one rate observed, per request, and the summary the SLA is judged on. */
#pragma once

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

struct sample {
        double arrival;      /* seconds from the run's start */
        double first_token;  /* < 0: none arrived */
        double finish;       /* < 0: did not finish before the run was cut off */
        double *token_times; /* n_tokens times, first_token included */
        uint32_t n_tokens, cap_tokens;
        uint32_t prompt_tokens;
        int error; /* 0, or a negative errno / target error; the request counts as failed */
};

struct run {
        struct sample *samples;
        size_t n;
        double duration;      /* the arrival window */
        double end;           /* when the last observation was made */
        double kv_usage_peak; /* from the engine's metrics, fraction 0..1; < 0 if not sampled */
        char *first_error;    /* the first failure's message, for the user */
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
