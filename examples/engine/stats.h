/* Latency samples and their percentiles, for the engine's TTFT/TBT report. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growable array of nanosecond samples. Zero-initialise, then stats_add(). */
struct stats {
        uint64_t *v;
        size_t n, allocated;
        bool sorted;
};

int stats_add(struct stats *s, uint64_t ns);
void stats_clear(struct stats *s);

/*
 * The p-th percentile (0 <= p <= 100) by linear interpolation between the two
 * closest ranks (the "linear" method of numpy and of Excel's PERCENTILE.INC):
 * rank = p/100 * (n-1). Sorts the samples on first use. Returns 0 and the
 * value in *ret_ns, or -EINVAL for p out of range, -ENODATA with no samples.
 */
int stats_percentile(struct stats *s, double p, uint64_t *ret_ns);
/* The arithmetic mean, or -ENODATA with no samples. */
int stats_mean(const struct stats *s, uint64_t *ret_ns);
