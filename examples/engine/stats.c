/* Latency samples and their percentiles, for the engine's TTFT/TBT report. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "stats.h"
#include "example-util.h"

int stats_add(struct stats *s, uint64_t ns)
{
        if (s->n == s->allocated) {
                size_t n = MAX(s->allocated * 2, (size_t)64);
                uint64_t *v = reallocarray(s->v, n, sizeof(*v));
                if (!v)
                        return -ENOMEM;
                s->v = v;
                s->allocated = n;
        }
        s->v[s->n++] = ns;
        s->sorted = false;
        return 0;
}

void stats_clear(struct stats *s)
{
        free(s->v);
        *s = (struct stats){};
}

static int cmp_u64(const void *a, const void *b)
{
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return x < y ? -1 : x > y;
}

int stats_percentile(struct stats *s, double p, uint64_t *ret_ns)
{
        if (!(p >= 0.0 && p <= 100.0))
                return -EINVAL;
        if (s->n == 0)
                return -ENODATA;
        if (!s->sorted) {
                qsort(s->v, s->n, sizeof(*s->v), cmp_u64);
                s->sorted = true;
        }

        double rank = p / 100.0 * (double)(s->n - 1);
        size_t lo = (size_t)floor(rank);
        size_t hi = MIN(lo + 1, s->n - 1);
        double frac = rank - (double)lo;
        /* Interpolate on the difference so large values keep their precision. */
        *ret_ns = s->v[lo] + (uint64_t)llround(frac * (double)(s->v[hi] - s->v[lo]));
        return 0;
}

int stats_mean(const struct stats *s, uint64_t *ret_ns)
{
        if (s->n == 0)
                return -ENODATA;
        long double sum = 0;
        for (size_t i = 0; i < s->n; i++)
                sum += s->v[i];
        *ret_ns = (uint64_t)llroundl(sum / s->n);
        return 0;
}
