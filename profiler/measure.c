/* Per-request observations and their summary: latency percentiles, throughput, KV demand. */
#include "measure.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

int run_init(struct run *run, size_t n, double duration)
{
        *run = (struct run){.duration = duration, .kv_usage_peak = -1};
        run->samples = calloc(n ? n : 1, sizeof(*run->samples));
        if (!run->samples)
                return -ENOMEM;
        run->n = n;
        for (size_t i = 0; i < n; i++)
                run->samples[i].first_token = run->samples[i].finish = -1;
        return 0;
}

void run_done(struct run *run)
{
        if (run->samples)
                for (size_t i = 0; i < run->n; i++)
                        free(run->samples[i].token_times);
        free(run->samples);
        free(run->first_error);
        free(run->metrics_error);
        *run = (struct run){.kv_usage_peak = -1};
}

int sample_add_token(struct sample *s, double t)
{
        if (s->n_tokens == s->cap_tokens) {
                uint32_t cap = s->cap_tokens ? s->cap_tokens * 2 : 64;
                double *p = realloc(s->token_times, cap * sizeof(*p));
                if (!p)
                        return -ENOMEM;
                s->token_times = p;
                s->cap_tokens = cap;
        }
        if (s->n_tokens == 0)
                s->first_token = t;
        s->token_times[s->n_tokens++] = t;
        return 0;
}

void run_note_error(struct run *run, const char *msg)
{
        if (!run->first_error && msg)
                run->first_error = strdup(msg);
}

void run_notes_add(struct run_notes *to, const struct run_notes *n)
{
#define ADD(f, name) to->f += n->f;
        RUN_NOTES_FIELDS(ADD)
#undef ADD
}

bool run_notes_any(const struct run_notes *n)
{
#define ANY(f, name)                                                                               \
        if (n->f)                                                                                  \
                return true;
        RUN_NOTES_FIELDS(ANY)
#undef ANY
        return false;
}

static uint32_t output_tokens(const struct sample *s)
{
        return MAX(s->n_tokens, s->output_tokens);
}

static int cmp_double(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;

        return (x > y) - (x < y);
}

double percentile(double *v, size_t n, double p)
{
        size_t rank;

        if (n == 0)
                return 0;
        qsort(v, n, sizeof(*v), cmp_double);
        rank = (size_t)ceil(p / 100.0 * (double)n);
        rank = rank < 1 ? 1 : rank > n ? n : rank;
        return v[rank - 1];
}

struct kv_event {
        double t;
        int64_t delta; /* tokens */
};

static int cmp_event(const void *a, const void *b)
{
        const struct kv_event *x = a, *y = b;

        /* At equal times, releases go first: a slot freed and reused at once is not a peak. */
        if (x->t != y->t)
                return (x->t > y->t) - (x->t < y->t);
        return (x->delta > y->delta) - (x->delta < y->delta);
}

/*
 * A request holds its prompt's KV from arrival (queued or not, a scheduler that
 * serves everyone must keep it somewhere), grows by a token with each token, and
 * releases all of it when it finishes or the run ends.
 */
static int peak_demand(const struct run *run, uint64_t *ret_tokens)
{
        _cleanup_free_ struct kv_event *ev = NULL;
        size_t n = 0, cap = 0;
        int64_t cur = 0, peak = 0;

        for (size_t i = 0; i < run->n; i++)
                cap += 3 + run->samples[i].n_tokens;
        ev = malloc(cap * sizeof(*ev));
        if (!ev)
                return -ENOMEM;
        for (size_t i = 0; i < run->n; i++) {
                const struct sample *s = &run->samples[i];
                double end = s->finish >= 0 ? s->finish : run->end;

                ev[n++] = (struct kv_event){s->arrival, s->prompt_tokens};
                for (uint32_t k = 0; k < s->n_tokens; k++)
                        ev[n++] = (struct kv_event){s->token_times[k], 1};
                /* Tokens the server counted beyond its events arrived with its last one. */
                if (output_tokens(s) > s->n_tokens)
                        ev[n++] = (struct kv_event){s->n_tokens ? s->token_times[s->n_tokens - 1]
                                                                : s->arrival,
                                                    (int64_t)(output_tokens(s) - s->n_tokens)};
                ev[n++] = (struct kv_event){MAX(end, s->arrival),
                                            -(int64_t)s->prompt_tokens - output_tokens(s)};
        }
        qsort(ev, n, sizeof(*ev), cmp_event);
        for (size_t i = 0; i < n; i++) {
                cur += ev[i].delta;
                peak = MAX(peak, cur);
        }
        *ret_tokens = (uint64_t)peak;
        return 0;
}

int run_summarize(const struct run *run, double warmup, double ttft_percentile,
                  double tbt_percentile, uint64_t kv_bytes_per_token,
                  struct run_summary *ret_summary)
{
        _cleanup_free_ double *ttft = NULL, *tbt = NULL;
        struct run_summary s = {0};
        size_t n_ttft = 0, n_tbt = 0, n_tbt_cap = 0, completed = 0;
        uint64_t tokens = 0, peak;
        double span;
        int r;

        for (size_t i = 0; i < run->n; i++)
                if (run->samples[i].n_tokens > 1)
                        n_tbt_cap += run->samples[i].n_tokens - 1;
        ttft = malloc((run->n ? run->n : 1) * sizeof(*ttft));
        tbt = malloc((n_tbt_cap ? n_tbt_cap : 1) * sizeof(*tbt));
        if (!ttft || !tbt)
                return -ENOMEM;

        for (size_t i = 0; i < run->n; i++) {
                const struct sample *x = &run->samples[i];

                tokens += output_tokens(x);
                if (x->finish >= 0 && !x->error)
                        completed++;
                if (x->arrival < warmup)
                        continue;
                s.n_requests++;
                if (x->error) {
                        s.n_failed++;
                        continue;
                }
                ttft[n_ttft++] = (x->first_token >= 0 ? x->first_token : run->end) - x->arrival;
                for (uint32_t k = 1; k < x->n_tokens; k++)
                        tbt[n_tbt++] = x->token_times[k] - x->token_times[k - 1];
        }

        s.failure_rate = s.n_requests ? (double)s.n_failed / (double)s.n_requests : 0;
        /* Sorting is idempotent, so asking for several percentiles of one array is fine. */
        s.ttft_p50 = percentile(ttft, n_ttft, 50);
        s.ttft_p99 = percentile(ttft, n_ttft, 99);
        s.ttft_sla = percentile(ttft, n_ttft, ttft_percentile);
        s.tbt_p50 = percentile(tbt, n_tbt, 50);
        s.tbt_p99 = percentile(tbt, n_tbt, 99);
        s.tbt_sla = percentile(tbt, n_tbt, tbt_percentile);
        span = MAX(run->end, run->duration);
        if (span > 0) {
                s.throughput = (double)completed / span;
                s.token_throughput = (double)tokens / span;
        }
        r = peak_demand(run, &peak);
        if (r < 0)
                return r;
        s.peak_kv_demand = peak * kv_bytes_per_token;
        *ret_summary = s;
        return 0;
}
