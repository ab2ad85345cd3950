/*
 * The two scheduling policies as orderings of requests: FCFS by arrival, and
 * the fair scheduler's "least served first" (decodes before prefills; fewest
 * generated tokens, least prefill progress).
 */
#include <stdlib.h>
#include <string.h>

#include "sched.h"

static const char *const sched_names[_SCHED_MAX] = {
    [SCHED_FCFS] = "fcfs",
    [SCHED_FAIR] = "fair",
};

const char *sched_to_string(enum sched_kind k)
{
        return k >= 0 && k < _SCHED_MAX ? sched_names[k] : NULL;
}

enum sched_kind sched_from_string(const char *s)
{
        for (int i = 0; i < _SCHED_MAX; i++)
                if (s && strcmp(s, sched_names[i]) == 0)
                        return i;
        return _SCHED_INVALID;
}

#define CMP(a, b) ((a) < (b) ? -1 : (a) > (b))

static int by_arrival(const struct request *a, const struct request *b)
{
        int c = CMP(a->arrival_ns, b->arrival_ns);
        return c ? c : CMP(a->id, b->id);
}

int sched_compare(enum sched_kind k, const struct request *a, const struct request *b)
{
        if (k == SCHED_FAIR) {
                /* SLA-aware: decodes about to miss their TBT budget, earliest deadline first. */
                if (a->urgent != b->urgent)
                        return a->urgent ? -1 : 1;
                if (a->urgent) {
                        int c = CMP(a->last_token_ns, b->last_token_ns);
                        if (c)
                                return c;
                        return by_arrival(a, b);
                }
                bool da = request_in_decode(a), db = request_in_decode(b);
                /* Decode slots are filled first. */
                if (da != db)
                        return da ? -1 : 1;
                int c = da ? CMP(a->generated, b->generated) : CMP(a->prefilled, b->prefilled);
                if (c)
                        return c;
        }
        return by_arrival(a, b);
}

static _Thread_local enum sched_kind sort_kind;

static int cmp_ptr(const void *a, const void *b)
{
        return sched_compare(sort_kind, *(struct request *const *)a, *(struct request *const *)b);
}

void sched_rank(enum sched_kind k, struct request **v, size_t n)
{
        /*
         * From one iteration to the next the order barely changes (a few dozen
         * requests gain a token), so insertion sort from the previous order is
         * close to linear. A big reshuffle falls back to qsort.
         */
        size_t moves = 0, limit = 8 * n + 64;
        for (size_t i = 1; i < n && moves <= limit; i++) {
                struct request *x = v[i];
                size_t j = i;
                for (; j > 0 && sched_compare(k, v[j - 1], x) > 0; j--)
                        v[j] = v[j - 1];
                v[j] = x;
                moves += i - j;
        }
        if (moves > limit) {
                sort_kind = k;
                qsort(v, n, sizeof(*v), cmp_ptr);
        }
        for (size_t i = 0; i < n; i++)
                v[i]->rank = i;
}
