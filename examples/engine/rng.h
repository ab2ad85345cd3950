/* A small deterministic random source (splitmix64) so generated traces repeat for a given seed. */
#pragma once

#include <math.h>
#include <stdint.h>

struct rng {
        uint64_t state;
};

static inline uint64_t rng_next(struct rng *r)
{
        uint64_t z = (r->state += UINT64_C(0x9e3779b97f4a7c15));
        z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
        return z ^ (z >> 31);
}

/* Uniform in (0, 1): never 0, so log() of it is finite. */
static inline double rng_uniform(struct rng *r)
{
        return ((double)(rng_next(r) >> 11) + 0.5) * 0x1.0p-53;
}

static inline double rng_exponential(struct rng *r, double mean)
{
        return -mean * log(rng_uniform(r));
}

/* Standard normal by Box-Muller (one of the pair is enough here). */
static inline double rng_normal(struct rng *r)
{
        double u1 = rng_uniform(r), u2 = rng_uniform(r);
        return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}
