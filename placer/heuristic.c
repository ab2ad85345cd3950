/*
 * The heuristic for large clusters: a greedy fill that keeps every server near its share of
 * memory and roles, then local search (moves and swaps) that lowers the worst server without
 * raising either largest imbalance, with restarts while time allows.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "place.h"

#define HEURISTIC_BUDGET 0.8 /* seconds */
/*
 * Role imbalance is hard to repair by swaps without upsetting memory (a producer for a
 * consumer moves both), so the greedy fill weighs it more than the objective does.
 */
#define ROLE_FIRST 1.0
#define MAX_RUNS 16

struct state {
        const struct place_problem *p;
        unsigned *server_of;
        int64_t *mem;
        int *bal;
        unsigned *free_gpus;
        unsigned *first; /* [n_servers]: where a server's members start in member[] */
        unsigned *n_members;
        unsigned *member;
        double target_mem, target_bal; /* per server */
};

static double phi(const struct place_problem *p, int64_t mem, int bal)
{
        double m = p->w_memory * (double)mem / 1024.0, b = p->w_balance * (double)bal;

        return m * m + b * b;
}

static bool allowed(const struct state *st, unsigned model, unsigned server)
{
        const struct place_problem *p = st->p;

        return p->types[p->models[model].type].kinds & (UINT64_C(1) << p->servers[server].kind);
}

static void add(struct state *st, unsigned i, unsigned s)
{
        const struct place_type *t = &st->p->types[st->p->models[i].type];

        st->server_of[i] = s;
        st->mem[s] += t->memory;
        st->bal[s] += t->balance;
        st->free_gpus[s] -= t->tp;
        st->member[st->first[s] + st->n_members[s]++] = i;
}

static void del(struct state *st, unsigned i)
{
        const struct place_type *t = &st->p->types[st->p->models[i].type];
        unsigned s = st->server_of[i];
        unsigned *m = &st->member[st->first[s]];

        st->mem[s] -= t->memory;
        st->bal[s] -= t->balance;
        st->free_gpus[s] += t->tp;
        for (unsigned j = 0; j < st->n_members[s]; j++)
                if (m[j] == i) {
                        m[j] = m[--st->n_members[s]];
                        break;
                }
}

static unsigned long next_random(unsigned long *x)
{
        /* xorshift: restarts only need different tie-breaks, not quality randomness. */
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        return *x;
}

struct order_key {
        unsigned model;
        unsigned tp;
        int64_t size;
        unsigned long noise;
};

static int cmp_order(const void *a, const void *b)
{
        const struct order_key *x = a, *y = b;

        if (x->tp != y->tp)
                return x->tp > y->tp ? -1 : 1;
        if (x->size != y->size)
                return x->size > y->size ? -1 : 1;
        if (x->noise != y->noise)
                return x->noise < y->noise ? -1 : 1;
        return x->model < y->model ? -1 : x->model > y->model;
}

/*
 * Largest TP groups first, then the largest memory: each goes where the server stays closest
 * to its share for the GPUs it has filled so far.
 */
static int construct(struct state *st, unsigned long seed, char **ret_error)
{
        const struct place_problem *p = st->p;
        _cleanup_free_ struct order_key *order = calloc(p->n_models + 1, sizeof(*order));
        unsigned long rnd = seed * 2654435761UL + 88172645463325252UL;

        if (!order)
                return -ENOMEM;
        for (unsigned s = 0; s < p->n_servers; s++) {
                st->mem[s] = 0;
                st->bal[s] = 0;
                st->free_gpus[s] = p->kinds[p->servers[s].kind].gpus;
                st->n_members[s] = 0;
        }
        for (unsigned i = 0; i < p->n_models; i++) {
                int64_t m = p->models[i].memory;
                order[i] = (struct order_key){.model = i, .tp = p->models[i].tp,
                                              .size = m < 0 ? -m : m,
                                              .noise = seed > 1 ? next_random(&rnd) : 0};
        }
        qsort(order, p->n_models, sizeof(*order), cmp_order);

        for (unsigned k = 0; k < p->n_models; k++) {
                unsigned i = order[k].model;
                const struct place_type *t = &p->types[p->models[i].type];
                double best = INFINITY;
                unsigned best_s = UINT32_MAX, start = (unsigned)(next_random(&rnd) % p->n_servers);

                for (unsigned n = 0; n < p->n_servers; n++) {
                        unsigned s = (start + n) % p->n_servers;
                        unsigned gpus = p->kinds[p->servers[s].kind].gpus;
                        double fill, dm, db, cost;

                        if (st->free_gpus[s] < t->tp || !allowed(st, i, s))
                                continue;
                        fill = (double)(gpus - st->free_gpus[s] + t->tp) / gpus;
                        dm = p->w_memory * ((double)(st->mem[s] + t->memory) -
                                            st->target_mem * fill) / 1024.0;
                        db = p->w_balance * ((double)(st->bal[s] + t->balance) -
                                             st->target_bal * fill);
                        /* Prefer emptier servers on ties, so large groups still find room. */
                        cost = dm * dm + ROLE_FIRST * db * db - 1e-9 * st->free_gpus[s];
                        if (cost < best) {
                                best = cost;
                                best_s = s;
                        }
                }
                if (best_s == UINT32_MAX)
                        return place_error(ret_error, PLACE_E_INFEASIBLE,
                                    "the heuristic found no server with %u free GPUs for model "
                                    "'%s' (the tensor-parallel groups fragment the servers); "
                                    "try --solver exact",
                                    t->tp, p->models[i].name);
                add(st, i, best_s);
        }
        return 0;
}

static void maxima(const struct state *st, int64_t *ret_m, int *ret_e)
{
        int64_t m = 0;
        int e = 0;

        for (unsigned s = 0; s < st->p->n_servers; s++) {
                m = MAX(m, st->mem[s] < 0 ? -st->mem[s] : st->mem[s]);
                e = MAX(e, abs(st->bal[s]));
        }
        *ret_m = m;
        *ret_e = e;
}

struct move {
        double gain;
        unsigned i, j; /* j == UINT32_MAX: move i to server to */
        unsigned to;
};

static inline bool within(int64_t mem, int bal, int64_t cap_m, int cap_e)
{
        return (mem < 0 ? -mem : mem) <= cap_m && abs(bal) <= cap_e;
}

/*
 * Partners worth trying for a worst server: on large clusters only the servers at the
 * extremes of memory and role balance and those with the most free GPUs, so that one move
 * costs a few thousand evaluations rather than one per model in the cluster.
 */
#define ALL_PARTNERS_UP_TO 64
#define PARTNERS_PER_END   6

static void keep_top(unsigned *top, double *key, unsigned *n, unsigned s, double k)
{
        unsigned i;

        if (*n == PARTNERS_PER_END && k <= key[*n - 1])
                return;
        if (*n < PARTNERS_PER_END)
                (*n)++;
        for (i = *n - 1; i > 0 && key[i - 1] < k; i--) {
                top[i] = top[i - 1];
                key[i] = key[i - 1];
        }
        top[i] = s;
        key[i] = k;
}

static unsigned partners(const struct state *st, unsigned *out)
{
        const struct place_problem *p = st->p;
        unsigned top[5][PARTNERS_PER_END], n[5] = {0}, count = 0;
        double key[5][PARTNERS_PER_END];

        if (p->n_servers <= ALL_PARTNERS_UP_TO) {
                for (unsigned s = 0; s < p->n_servers; s++)
                        out[s] = s;
                return p->n_servers;
        }
        for (unsigned s = 0; s < p->n_servers; s++) {
                double m = (double)st->mem[s], b = st->bal[s];
                keep_top(top[0], key[0], &n[0], s, m);
                keep_top(top[1], key[1], &n[1], s, -m);
                keep_top(top[2], key[2], &n[2], s, b);
                keep_top(top[3], key[3], &n[3], s, -b);
                keep_top(top[4], key[4], &n[4], s, st->free_gpus[s]);
        }
        for (unsigned l = 0; l < 5; l++)
                for (unsigned i = 0; i < n[l]; i++) {
                        bool dup = false;
                        for (unsigned j = 0; j < count && !dup; j++)
                                dup = out[j] == top[l][i];
                        if (!dup)
                                out[count++] = top[l][i];
                }
        return count;
}

/* The best move or swap between s1 and a partner server that keeps both caps. */
static struct move best_move(const struct state *st, unsigned s1, const unsigned *partner,
                             unsigned n_partners, int64_t cap_m, int cap_e)
{
        const struct place_problem *p = st->p;
        struct move best = {.gain = 1e-12, .i = UINT32_MAX};
        double phi1 = phi(p, st->mem[s1], st->bal[s1]);
        const unsigned *m1 = &st->member[st->first[s1]];

        for (unsigned k = 0; k < n_partners; k++) {
                unsigned s2 = partner[k];
                const unsigned *m2 = &st->member[st->first[s2]];
                double before;

                if (s2 == s1)
                        continue;
                before = phi1 + phi(p, st->mem[s2], st->bal[s2]);
                /* Swaps and moves out of s1. */
                for (unsigned a = 0; a < st->n_members[s1]; a++) {
                        unsigned i = m1[a];
                        const struct place_type *ti = &p->types[p->models[i].type];
                        bool i_fits = allowed(st, i, s2);

                        if (i_fits && st->free_gpus[s2] >= ti->tp) {
                                int64_t x1 = st->mem[s1] - ti->memory, x2 = st->mem[s2] + ti->memory;
                                int b1 = st->bal[s1] - ti->balance, b2 = st->bal[s2] + ti->balance;
                                double g = before - phi(p, x1, b1) - phi(p, x2, b2);

                                if (g > best.gain && within(x1, b1, cap_m, cap_e) &&
                                    within(x2, b2, cap_m, cap_e))
                                        best = (struct move){g, i, UINT32_MAX, s2};
                        }
                        if (!i_fits)
                                continue;
                        for (unsigned b = 0; b < st->n_members[s2]; b++) {
                                unsigned j = m2[b];
                                const struct place_type *tj = &p->types[p->models[j].type];

                                if (tj == ti || st->free_gpus[s2] + tj->tp < ti->tp ||
                                    st->free_gpus[s1] + ti->tp < tj->tp || !allowed(st, j, s1))
                                        continue;
                                int64_t d = tj->memory - ti->memory;
                                int e = tj->balance - ti->balance;
                                int64_t x1 = st->mem[s1] + d, x2 = st->mem[s2] - d;
                                int b1 = st->bal[s1] + e, b2 = st->bal[s2] - e;
                                double g = before - phi(p, x1, b1) - phi(p, x2, b2);

                                if (g > best.gain && within(x1, b1, cap_m, cap_e) &&
                                    within(x2, b2, cap_m, cap_e))
                                        best = (struct move){g, i, j, s2};
                        }
                }
                /* Moves into s1. */
                for (unsigned b = 0; b < st->n_members[s2]; b++) {
                        unsigned j = m2[b];
                        const struct place_type *tj = &p->types[p->models[j].type];

                        if (st->free_gpus[s1] < tj->tp || !allowed(st, j, s1))
                                continue;
                        int64_t x1 = st->mem[s1] + tj->memory, x2 = st->mem[s2] - tj->memory;
                        int b1 = st->bal[s1] + tj->balance, b2 = st->bal[s2] - tj->balance;
                        double g = before - phi(p, x1, b1) - phi(p, x2, b2);

                        if (g > best.gain && within(x1, b1, cap_m, cap_e) &&
                            within(x2, b2, cap_m, cap_e))
                                best = (struct move){g, j, UINT32_MAX, s1};
                }
        }
        return best;
}

static void apply(struct state *st, const struct move *mv)
{
        if (mv->j == UINT32_MAX) {
                del(st, mv->i);
                add(st, mv->i, mv->to);
        } else {
                unsigned s1 = st->server_of[mv->i], s2 = st->server_of[mv->j];

                del(st, mv->i);
                del(st, mv->j);
                add(st, mv->i, s2);
                add(st, mv->j, s1);
        }
}

/*
 * Improve the servers at either maximum first; when none of them can improve, smooth the
 * rest (which makes room for the next round), until nothing improves or time is up.
 */
static void local_search(struct state *st, unsigned *partner, double deadline)
{
        const struct place_problem *p = st->p;

        for (;;) {
                int64_t cap_m;
                int cap_e;
                bool moved = false;
                unsigned n_partners;

                if (place_now() > deadline)
                        return;
                maxima(st, &cap_m, &cap_e);
                n_partners = partners(st, partner);
                for (int pass = 0; pass < 2 && !moved; pass++)
                        for (unsigned s = 0; s < p->n_servers; s++) {
                                bool worst = (st->mem[s] < 0 ? -st->mem[s] : st->mem[s]) == cap_m ||
                                             abs(st->bal[s]) == cap_e;
                                struct move mv;

                                if ((pass == 0) != worst)
                                        continue;
                                mv = best_move(st, s, partner, n_partners, cap_m, cap_e);
                                if (mv.i == UINT32_MAX)
                                        continue;
                                apply(st, &mv);
                                moved = true;
                                if (pass == 0)
                                        break;
                                if (place_now() > deadline)
                                        return;
                        }
                if (!moved)
                        return;
        }
}

static void state_done(struct state *st)
{
        free(st->mem);
        free(st->bal);
        free(st->free_gpus);
        free(st->first);
        free(st->n_members);
        free(st->member);
}

int place_heuristic(const struct place_problem *p, const struct place_options *o,
                    struct place_assignment *a, char **ret_error)
{
        struct state st = {.p = p};
        _cleanup_free_ unsigned *trial = NULL, *partner = NULL;
        size_t gpus = 0;
        double start = place_now(), deadline, best = INFINITY;
        int64_t total_mem = 0;
        long total_bal = 0;
        int r = 0;

        if (!p || !p->finished || !o || !a || !a->server_of)
                return -EINVAL;
        st.mem = calloc(p->n_servers, sizeof(*st.mem));
        st.bal = calloc(p->n_servers, sizeof(*st.bal));
        st.free_gpus = calloc(p->n_servers, sizeof(unsigned));
        st.first = calloc(p->n_servers, sizeof(unsigned));
        st.n_members = calloc(p->n_servers, sizeof(unsigned));
        for (unsigned s = 0; s < p->n_servers; s++) {
                st.first[s] = (unsigned)gpus;
                gpus += p->kinds[p->servers[s].kind].gpus;
        }
        st.member = calloc(gpus, sizeof(unsigned));
        trial = calloc(p->n_models + 1, sizeof(unsigned));
        partner = calloc(p->n_servers + 1, sizeof(unsigned));
        if (!partner ||!st.mem || !st.bal || !st.free_gpus || !st.first || !st.n_members || !st.member ||
            !trial) {
                state_done(&st);
                return -ENOMEM;
        }
        st.server_of = trial;
        for (unsigned i = 0; i < p->n_models; i++) {
                total_mem += p->models[i].memory;
                total_bal += p->types[p->models[i].type].balance;
        }
        st.target_mem = (double)total_mem / p->n_servers;
        st.target_bal = (double)total_bal / p->n_servers;

        /*
         * The heuristic is for when the exact solver is too slow, so it keeps itself short: a
         * first run gets HEURISTIC_BUDGET (or the time limit if smaller), restarts only what
         * is left of it.
         */
        deadline = start + (o->time_limit > 0 ? MIN(o->time_limit, HEURISTIC_BUDGET)
                                              : HEURISTIC_BUDGET);
        double bound = place_simple_bound(p);
        for (unsigned long run = 0;; run++) {
                struct place_assignment got = {.server_of = trial};
                double t0 = place_now();

                r = construct(&st, o->seed + run, ret_error);
                if (r != 0)
                        break;
                local_search(&st, partner, deadline);
                r = place_assignment_measure(p, &got);
                if (r < 0)
                        break;
                if (got.objective < best) {
                        best = got.objective;
                        memcpy(a->server_of, trial, p->n_models * sizeof(unsigned));
                }
                double took = place_now() - t0;
                /* Stop at the bound, after MAX_RUNS, or when another run would not fit. */
                if (best <= bound + 1e-9 || run + 1 >= MAX_RUNS || place_now() + took > deadline)
                        break;
        }
        state_done(&st);
        if (r != 0 && best == INFINITY)
                return r;
        r = place_assignment_measure(p, a);
        if (r < 0)
                return r;
        a->bound = MIN(bound, a->objective);
        return 0;
}
