/* SLA search by doubling then bisection, then the free memory, the role and the burst needs. */
#include "search.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

const char *const role_names[] = {"producer", "consumer", NULL};

bool sla_met(const struct sla *sla, const struct run_summary *s)
{
        return s->n_requests > 0 && s->failure_rate <= sla->max_failure_rate &&
               s->ttft_sla <= sla->ttft && s->tbt_sla <= sla->tbt;
}

static int search_fail(struct search *st, int r, const char *fmt, ...) _printf_(3, 4);
static int search_fail(struct search *st, int r, const char *fmt, ...)
{
        va_list ap;

        free(st->error);
        va_start(ap, fmt);
        if (vasprintf(&st->error, fmt, ap) < 0)
                st->error = NULL;
        va_end(ap);
        return r;
}

static int add_point(struct search *st, const struct search_point *p)
{
        struct search_point *n = realloc(st->points, (st->n_points + 1) * sizeof(*n));

        if (!n)
                return -ENOMEM;
        st->points = n;
        st->points[st->n_points++] = *p;
        return 0;
}

/* What a run saw of the server beyond the figures: its odd answers and its first failure. */
static int search_take_notes(struct search *st, const struct run *run)
{
        run_notes_add(&st->notes, &run->notes);
        if (!st->first_failure && run->first_error) {
                st->first_failure = strdup(run->first_error);
                if (!st->first_failure)
                        return -ENOMEM;
        }
        if (!st->metrics_error && run->metrics_error && run->kv_usage_peak < 0) {
                st->metrics_error = strdup(run->metrics_error);
                if (!st->metrics_error)
                        return -ENOMEM;
        }
        return 0;
}

/* One run at rate (with an optional burst); appends its point. */
static int measure(struct target *t, const struct request_pool *pool, const struct search_params *p,
                   const volatile sig_atomic_t *cancel, struct search *st, int phase, double rate,
                   double burst)
{
        struct load_spec spec = {
                .arrival = p->arrival,
                .rate = rate,
                .duration = MAX(p->duration, p->warmup + (double)p->min_requests / rate),
                .seed = p->seed,
                .trace = p->trace,
                .n_trace = p->n_trace,
                .burst_factor = burst,
        };
        _cleanup_(load_done) struct load load = {0};
        _cleanup_(run_done) struct run run = {0};
        struct search_point pt = {.phase = phase, .rate = rate, .burst = burst};
        int r, rr;

        if (burst > 1) {
                /* The burst sits after warm-up, with the rest of the run to drain it. */
                spec.burst_start = p->warmup;
                spec.burst_len = p->burst_duration;
                spec.duration = MAX(spec.duration, p->warmup + 2 * p->burst_duration);
        }
        r = load_make(&spec, pool, &load);
        if (r < 0)
                return r;
        r = target_run(t, &load, cancel, &run);
        if (r < 0)
                return r;
        rr = run_summarize(&run, p->warmup, p->sla.ttft_percentile, p->sla.tbt_percentile,
                           t->kv_bytes_per_token, &pt.s);
        if (rr < 0)
                return rr;
        pt.meets = r == 0 && sla_met(&p->sla, &pt.s);
        pt.kv_usage_peak = run.kv_usage_peak;
        pt.notes = run.notes;
        rr = search_take_notes(st, &run);
        if (rr < 0)
                return rr;
        if (r == TARGET_E_CANCELLED)
                return SEARCH_E_CANCELLED;
        if (pt.s.n_requests > 0 && pt.s.n_failed == pt.s.n_requests)
                return search_fail(st, SEARCH_E_TARGET, "every request at %.3g req/s failed: %s",
                                   rate, run.first_error ? run.first_error : "unknown error");
        rr = add_point(st, &pt);
        return rr < 0 ? rr : 0;
}

/*
 * One request, alone: finds an unreachable or wrong endpoint before a long run
 * does. The run's window is what a target may wait for it, beyond its drain.
 */
#define PREFLIGHT_WAIT 60.0

static int preflight(struct target *t, const struct request_pool *pool,
                     const volatile sig_atomic_t *cancel, struct search *st)
{
        double at = 0;
        const struct request *q = &pool->requests[0];
        struct load load = {.arrival = &at, .request = &q, .n = 1, .duration = PREFLIGHT_WAIT};
        _cleanup_(run_done) struct run run = {0};
        int r;

        r = target_run(t, &load, cancel, &run);
        if (r < 0)
                return r;
        if (r == TARGET_E_CANCELLED)
                return SEARCH_E_CANCELLED;
        r = search_take_notes(st, &run);
        if (r < 0)
                return r;
        if (run.samples[0].error || run.samples[0].finish < 0)
                return search_fail(st, SEARCH_E_TARGET, "a single request failed: %s",
                                   run.first_error ? run.first_error : "no answer in time");
        return 0;
}

static const struct search_point *last(const struct search *st)
{
        return &st->points[st->n_points - 1];
}

static int find_rate(struct target *t, const struct request_pool *pool,
                     const struct search_params *p, const volatile sig_atomic_t *cancel,
                     search_progress_fn progress, void *userdata, struct search *st)
{
        double lo = -1, hi = -1, rate = MIN(MAX(p->start_rate, p->min_rate), p->max_rate);
        size_t lo_point = 0;
        int steps = 0, r;

        /* Bracket: double up from a passing rate, or halve down from a failing one. */
        for (;;) {
                r = measure(t, pool, p, cancel, st, PHASE_SEARCH, rate, 1);
                if (r != 0)
                        return r;
                steps++;
                if (last(st)->meets) {
                        lo = rate;
                        lo_point = st->n_points - 1;
                } else
                        hi = rate;
                if (progress)
                        progress(st, last(st), lo, hi, userdata);
                if (lo >= 0 && hi >= 0)
                        break;
                if (lo >= 0 && rate >= p->max_rate) {
                        st->capped = true;
                        break;
                }
                if (hi >= 0 && rate <= p->min_rate) {
                        const struct run_summary *s = &last(st)->s;
                        return search_fail(st, SEARCH_E_UNATTAINABLE,
                                           "the SLA is not met even at %.3g req/s: TTFT p%g "
                                           "%.3f s (limit %.3f s), TBT p%g %.1f ms (limit %.1f "
                                           "ms), %.1f%% failed (limit %.1f%%)",
                                           rate, p->sla.ttft_percentile, s->ttft_sla, p->sla.ttft,
                                           p->sla.tbt_percentile, s->tbt_sla * 1e3,
                                           p->sla.tbt * 1e3, s->failure_rate * 100,
                                           p->sla.max_failure_rate * 100);
                }
                if (steps >= p->max_steps)
                        break;
                rate = lo >= 0 ? MIN(rate * 2, p->max_rate) : MAX(rate / 2, p->min_rate);
        }

        while (lo >= 0 && hi >= 0 && hi - lo > p->tolerance * lo && steps < p->max_steps) {
                rate = (lo + hi) / 2;
                r = measure(t, pool, p, cancel, st, PHASE_SEARCH, rate, 1);
                if (r != 0)
                        return r;
                steps++;
                if (last(st)->meets) {
                        lo = rate;
                        lo_point = st->n_points - 1;
                } else
                        hi = rate;
                if (progress)
                        progress(st, last(st), lo, hi, userdata);
        }
        if (lo < 0)
                return search_fail(st, SEARCH_E_UNATTAINABLE,
                                   "no rate met the SLA within %d steps", p->max_steps);
        st->found = true;
        st->rate = lo;
        st->best = lo_point;
        return 0;
}

int search_run(struct target *t, const struct request_pool *pool, const struct search_params *p,
               const volatile sig_atomic_t *cancel, search_progress_fn progress, void *userdata,
               struct search *st)
{
        const struct search_point *best;
        int r;

        if (!t || !pool || pool->n == 0 || !p || p->min_rate <= 0 || p->max_rate < p->min_rate ||
            p->tolerance <= 0 || p->max_steps < 1 || p->duration <= 0)
                return -EINVAL;
        st->kv_capacity = t->kv_capacity;

        r = preflight(t, pool, cancel, st);
        if (r != 0)
                return r;
        r = find_rate(t, pool, p, cancel, progress, userdata, st);
        if (r != 0)
                return r;

        /* The engine's own gauge when there is one; else the KV the requests needed. */
        best = &st->points[st->best];
        st->kv_from_metrics = best->kv_usage_peak >= 0;
        if (st->kv_from_metrics)
                st->free_memory = (uint64_t)((double)t->kv_capacity *
                                             MAX(0.0, 1.0 - MIN(best->kv_usage_peak, 1.0)));
        else
                st->free_memory = t->kv_capacity > best->s.peak_kv_demand
                                          ? t->kv_capacity - best->s.peak_kv_demand
                                          : 0;
        st->role = st->free_memory >= p->producer_threshold ? ROLE_PRODUCER : ROLE_CONSUMER;

        if (st->role == ROLE_CONSUMER && p->n_bursts > 0) {
                st->bursts = calloc(p->n_bursts, sizeof(*st->bursts));
                if (!st->bursts)
                        return -ENOMEM;
                for (size_t i = 0; i < p->n_bursts; i++) {
                        const struct run_summary *s;

                        r = measure(t, pool, p, cancel, st, PHASE_BURST, st->rate, p->bursts[i]);
                        if (r != 0)
                                return r;
                        s = &last(st)->s;
                        st->bursts[i] = (struct burst_need){
                                .factor = p->bursts[i],
                                .peak_demand = s->peak_kv_demand,
                                .swap = s->peak_kv_demand > t->kv_capacity
                                                ? s->peak_kv_demand - t->kv_capacity
                                                : 0,
                        };
                        st->n_bursts = i + 1;
                        if (progress)
                                progress(st, last(st), st->rate, st->rate, userdata);
                }
        }
        st->complete = true;
        return 0;
}

void search_done(struct search *st)
{
        free(st->points);
        free(st->bursts);
        free(st->error);
        free(st->first_failure);
        free(st->metrics_error);
        *st = (struct search){0};
}
