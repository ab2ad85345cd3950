/*
 * Server configurations (multisets of model types one server of a kind holds), shared by the
 * exact solver's two ways of getting them: enumerating all, or generating them as columns.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "place.h"

struct configs {
        unsigned n_types;
        size_t n, cap, max; /* max: pushing past it is -E2BIG */
        uint8_t *a;         /* [n * n_types] models of each type */
        int64_t *mem;       /* MiB balance of the configuration */
        int *bal;           /* producer GPUs - consumer GPUs */
        unsigned *kind;
};

void configs_done(struct configs *c);
int configs_push(struct configs *c, const uint8_t *a, int64_t mem, int bal, unsigned kind);
/* Index of the configuration equal to a[] on kind, or -1. */
long configs_find(const struct configs *c, const uint8_t *a, unsigned kind);

/*
 * Deal x[c] servers of configuration c to the servers of its kind, and the models of each type
 * in problem order to them. Returns 0, -ENOMEM, or -EINVAL when x does not cover every model
 * exactly or uses more servers of a kind than there are.
 */
int configs_deal(const struct place_problem *p, const struct configs *c, const long *x,
                 unsigned *server_of);

/* Index of the first value >= x in sorted v[0..n), or n. */
size_t lower_index(const int64_t *v, size_t n, int64_t x);

/* The averaging bounds on the largest |memory| (MiB) and |role| imbalance, rounded up. */
void place_average_bounds(const struct place_problem *p, int64_t *ret_memory, int *ret_balance);

/*
 * The exact search over configurations generated as columns, for instances with too many to
 * enumerate (colgen.c). Same contract as place_exact().
 */
int place_colgen(const struct place_problem *p, const struct place_options *o,
                 const struct place_assignment *incumbent, struct place_assignment *a,
                 bool *ret_optimal, char **ret_error);
