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

struct pair;

struct state {
        const struct place_problem *p;
        unsigned *server_of;
        int64_t *mem;
        int *bal;
        unsigned *free_gpus;
        unsigned *first; /* [n_servers]: where a server's members start in member[] */
        unsigned *n_members;
        unsigned *member;
        unsigned *group_of;  /* [n_types]: scratch for pairs, UINT32_MAX between uses */
        struct pair *pairs;  /* [2]: the best step so far and the one being tried */
        double target_mem, target_bal; /* per server */
        unsigned long rnd;
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
        double progress; /* rank among the models of its TP degree and role, from 0 to 1 */
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

static int cmp_progress(const void *a, const void *b)
{
        const struct order_key *x = a, *y = b;

        if (x->tp != y->tp)
                return x->tp > y->tp ? -1 : 1;
        if (x->progress != y->progress)
                return x->progress < y->progress ? -1 : 1;
        return x->model < y->model ? -1 : x->model > y->model;
}

/*
 * Largest TP groups first, then the largest memory: each goes where the server stays closest
 * to its share for the GPUs it has filled so far. Producers and consumers are interleaved,
 * each role from its largest to its smallest at the same pace: placing all large producers
 * before any consumer leaves the last free GPUs to whatever is left, which on large clusters
 * put servers 100 GiB off their share.
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
        for (unsigned k = 0; k < p->n_models;) {
                unsigned end = k, n[_PLACE_ROLE_MAX] = {0}, rank[_PLACE_ROLE_MAX] = {0};

                while (end < p->n_models && order[end].tp == order[k].tp)
                        n[p->models[order[end++].model].role]++;
                for (; k < end; k++) {
                        enum place_role role = p->models[order[k].model].role;
                        /* Restarts jitter the interleaving, for other local optima. */
                        double at = seed > 1 ? (double)(next_random(&rnd) % 1024) / 1024 : 0.5;

                        order[k].progress = (rank[role]++ + at) / n[role];
                }
        }
        qsort(order, p->n_models, sizeof(*order), cmp_progress);

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

static inline bool within(int64_t mem, int bal, int64_t cap_m, int cap_e)
{
        return (mem < 0 ? -mem : mem) <= cap_m && abs(bal) <= cap_e;
}

/*
 * Partners worth trying for a worst server: on large clusters only the servers at the
 * extremes of memory and role balance and those with the most free GPUs, so that one step
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

/*
 * A step re-splits the models of two servers between them. Servers of a kind are identical and
 * models of a type interchangeable, so a split is how many models of each type the first server
 * keeps: two servers of 8 models of the benchmark's 8 types have at most a few thousand splits,
 * and trying them all escapes the local optima that single moves and swaps stop in (a server at
 * the maximum often needs two or three models exchanged at once). Where a pair has too many
 * splits to enumerate, only those that move at most FEW_CHANGES models are tried, which still
 * include every move and swap.
 */
#define MAX_PAIR_GROUPS (2 * PLACE_MAX_GPUS)
#define SPLIT_LIMIT     20000
#define FEW_CHANGES     3

struct pair {
        unsigned s[2];
        unsigned n_groups;
        unsigned type[MAX_PAIR_GROUPS];
        unsigned count[MAX_PAIR_GROUPS]; /* models of the type on the two servers */
        unsigned now[MAX_PAIR_GROUPS];   /* of which on s[0] now */
        unsigned take[MAX_PAIR_GROUPS];  /* of which on s[0] in the split being tried */
        unsigned best[MAX_PAIR_GROUPS];  /* ... and in the best split found */
        double gain;                     /* of the best split: sum of phi before - after */
};

struct split_search {
        const struct place_problem *p;
        struct pair *pr;
        unsigned gpus[2];              /* each server's GPUs */
        unsigned rest[MAX_PAIR_GROUPS + 1]; /* GPUs of groups g and after */
        unsigned kind[2];
        int64_t mem_total;
        int bal_total;
        int64_t cap_m;
        int cap_e;
        unsigned max_changes;
        bool sideways;          /* look for a split with the same sum of phi, not a lower one */
        unsigned long *rnd;     /* to pick one of several sideways splits */
        unsigned n_found;
        double before, best_phi;
};

static void split_dfs(struct split_search *x, unsigned g, unsigned used, int64_t mem, int bal,
                      unsigned changes)
{
        struct pair *pr = x->pr;
        const struct place_type *t;

        if (g == pr->n_groups) {
                int64_t mem1 = x->mem_total - mem;
                int bal1 = x->bal_total - bal;
                double v;

                if (changes == 0 || !within(mem, bal, x->cap_m, x->cap_e) ||
                    !within(mem1, bal1, x->cap_m, x->cap_e))
                        return;
                v = phi(x->p, mem, bal) + phi(x->p, mem1, bal1);
                if (x->sideways ? fabs(v - x->before) <= 1e-9 * MAX(1.0, x->before) &&
                                          next_random(x->rnd) % ++x->n_found == 0
                                : v < x->best_phi) {
                        x->best_phi = v;
                        x->n_found += !x->sideways;
                        memcpy(pr->best, pr->take, pr->n_groups * sizeof(*pr->take));
                }
                return;
        }
        t = &x->p->types[pr->type[g]];
        for (unsigned n = 0; n <= pr->count[g]; n++) {
                unsigned u = used + n * t->tp;
                unsigned diff = n > pr->now[g] ? n - pr->now[g] : pr->now[g] - n;

                if (u > x->gpus[0] || (n > 0 && !(t->kinds & (UINT64_C(1) << x->kind[0]))))
                        break;
                if (changes + diff > x->max_changes ||
                    (n < pr->count[g] && !(t->kinds & (UINT64_C(1) << x->kind[1]))))
                        continue;
                /* The second server gets at least what the first cannot take later. */
                if (u + x->rest[g + 1] + x->gpus[1] < x->rest[0])
                        continue;
                pr->take[g] = n;
                split_dfs(x, g + 1, u, mem + (int64_t)n * t->memory, bal + (int)n * t->balance,
                          changes + diff);
        }
}

/* Group the models of s0 and s1 by type; group_of[] is all UINT32_MAX before and after. */
static void pair_gather(const struct state *st, unsigned s0, unsigned s1, struct pair *pr)
{
        const struct place_problem *p = st->p;

        pr->s[0] = s0;
        pr->s[1] = s1;
        pr->n_groups = 0;
        for (unsigned side = 0; side < 2; side++) {
                unsigned s = pr->s[side];
                const unsigned *m = &st->member[st->first[s]];

                for (unsigned k = 0; k < st->n_members[s]; k++) {
                        unsigned t = p->models[m[k]].type, g = st->group_of[t];

                        if (g == UINT32_MAX) {
                                g = st->group_of[t] = pr->n_groups++;
                                pr->type[g] = t;
                                pr->count[g] = pr->now[g] = 0;
                        }
                        pr->count[g]++;
                        pr->now[g] += side == 0;
                }
        }
        for (unsigned g = 0; g < pr->n_groups; g++)
                st->group_of[pr->type[g]] = UINT32_MAX;
}

/*
 * The best split of s0 and s1 that keeps both caps and lowers the sum of phi, or with sideways
 * a random one that leaves it as it is; returns whether there is one.
 */
static bool pair_best(struct state *st, unsigned s0, unsigned s1, int64_t cap_m, int cap_e,
                      bool sideways, struct pair *pr)
{
        const struct place_problem *p = st->p;
        struct split_search x = {.p = p, .pr = pr, .cap_m = cap_m, .cap_e = cap_e,
                                 .sideways = sideways, .rnd = &st->rnd};
        double splits = 1;

        pair_gather(st, s0, s1, pr);
        for (unsigned side = 0; side < 2; side++) {
                unsigned s = pr->s[side];

                x.kind[side] = p->servers[s].kind;
                x.gpus[side] = p->kinds[x.kind[side]].gpus;
                x.mem_total += st->mem[s];
                x.bal_total += st->bal[s];
        }
        x.rest[pr->n_groups] = 0;
        for (unsigned g = pr->n_groups; g-- > 0;) {
                x.rest[g] = x.rest[g + 1] + pr->count[g] * p->types[pr->type[g]].tp;
                splits *= pr->count[g] + 1;
        }
        x.max_changes = splits <= SPLIT_LIMIT ? UINT32_MAX : FEW_CHANGES;
        x.before = phi(p, st->mem[s0], st->bal[s0]) + phi(p, st->mem[s1], st->bal[s1]);
        x.best_phi = x.before - 1e-9 * MAX(1.0, x.before);
        split_dfs(&x, 0, 0, 0, 0, 0);
        pr->gain = x.n_found && !sideways ? x.before - x.best_phi : 0;
        return x.n_found > 0;
}

static void pair_apply(struct state *st, const struct pair *pr)
{
        unsigned moved[MAX_PAIR_GROUPS], n = 0, left[MAX_PAIR_GROUPS];

        for (unsigned side = 0; side < 2; side++) {
                unsigned s = pr->s[side];

                while (st->n_members[s] > 0) {
                        moved[n] = st->member[st->first[s]];
                        del(st, moved[n++]);
                }
        }
        for (unsigned g = 0; g < pr->n_groups; g++) {
                st->group_of[pr->type[g]] = g;
                left[g] = pr->best[g];
        }
        for (unsigned k = 0; k < n; k++) {
                unsigned g = st->group_of[st->p->models[moved[k]].type];

                if (left[g] > 0) {
                        left[g]--;
                        add(st, moved[k], pr->s[0]);
                } else
                        add(st, moved[k], pr->s[1]);
        }
        for (unsigned g = 0; g < pr->n_groups; g++)
                st->group_of[pr->type[g]] = UINT32_MAX;
}

/* The server-to-server step that lowers the sum of phi most for server s, if any. */
static bool improve_server(struct state *st, unsigned s, const unsigned *partner,
                           unsigned n_partners, int64_t cap_m, int cap_e)
{
        struct pair *best = &st->pairs[0], *cand = &st->pairs[1];

        best->gain = 0;
        for (unsigned k = 0; k < n_partners; k++) {
                if (partner[k] == s)
                        continue;
                pair_best(st, s, partner[k], cap_m, cap_e, false, cand);
                if (cand->gain > best->gain) {
                        struct pair *tmp = best;
                        best = cand;
                        cand = tmp;
                }
        }
        if (best->gain <= 0)
                return false;
        pair_apply(st, best);
        return true;
}

static bool at_max(const struct state *st, unsigned s, int64_t cap_m, int cap_e)
{
        return (st->mem[s] < 0 ? -st->mem[s] : st->mem[s]) == cap_m || abs(st->bal[s]) == cap_e;
}

/*
 * A sideways step: a server at a maximum trades models with a random partner so that both
 * keep their imbalances (the sum of phi stays). When every server must land on the average
 * exactly, a server one step above it often has no partner whose models can even out the
 * difference (all its differences are twice that step); moving the excess to a server of
 * another composition lets it meet one that can.
 */
static bool sideways(struct state *st, const unsigned *partner, unsigned n_partners,
                     int64_t cap_m, int cap_e, unsigned ret_servers[static 2])
{
        const struct place_problem *p = st->p;
        unsigned n_worst = 0, pick = UINT32_MAX, start;

        for (unsigned s = 0; s < p->n_servers; s++)
                if (at_max(st, s, cap_m, cap_e) && next_random(&st->rnd) % ++n_worst == 0)
                        pick = s;
        if (pick == UINT32_MAX)
                return false;
        start = (unsigned)(next_random(&st->rnd) % n_partners);
        for (unsigned k = 0; k < n_partners; k++) {
                unsigned s2 = partner[(start + k) % n_partners];

                if (s2 != pick && pair_best(st, pick, s2, cap_m, cap_e, true, &st->pairs[0])) {
                        pair_apply(st, &st->pairs[0]);
                        ret_servers[0] = pick;
                        ret_servers[1] = s2;
                        return true;
                }
        }
        return false;
}

/*
 * Improve the servers at either maximum first; when none of them can improve, smooth the
 * rest (which makes room for the next round); when nothing improves, take sideways steps
 * (at most SIDEWAYS_PER_SERVER per server in a row) until something does, or time is up.
 * After a sideways step only pairs with one of its two servers can have become better, so
 * only those are tried.
 */
#define SIDEWAYS_PER_SERVER 20

static void local_search(struct state *st, unsigned *partner, double deadline)
{
        const struct place_problem *p = st->p;
        unsigned long side = 0;

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
                                if ((pass == 0) != at_max(st, s, cap_m, cap_e))
                                        continue;
                                /* One server's partners can take milliseconds: check often. */
                                if (place_now() > deadline)
                                        return;
                                if (!improve_server(st, s, partner, n_partners, cap_m, cap_e))
                                        continue;
                                moved = true;
                                if (pass == 0)
                                        break;
                        }
                if (moved) {
                        side = 0;
                        continue;
                }
                for (;;) {
                        unsigned two[2];

                        if (side++ >= (unsigned long)SIDEWAYS_PER_SERVER * p->n_servers ||
                            place_now() > deadline ||
                            !sideways(st, partner, n_partners, cap_m, cap_e, two))
                                return;
                        if (improve_server(st, two[0], partner, n_partners, cap_m, cap_e) ||
                            improve_server(st, two[1], partner, n_partners, cap_m, cap_e))
                                break;
                }
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
        free(st->group_of);
        free(st->pairs);
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
        st.group_of = malloc((p->n_types + 1) * sizeof(unsigned));
        st.pairs = calloc(2, sizeof(struct pair));
        trial = calloc(p->n_models + 1, sizeof(unsigned));
        partner = calloc(p->n_servers + 1, sizeof(unsigned));
        if (!partner ||!st.mem || !st.bal || !st.free_gpus || !st.first || !st.n_members || !st.member ||
            !trial || !st.group_of || !st.pairs) {
                state_done(&st);
                return -ENOMEM;
        }
        st.server_of = trial;
        st.rnd = o->seed * 0x9E3779B97F4A7C15UL + 1;
        for (unsigned t = 0; t < p->n_types; t++)
                st.group_of[t] = UINT32_MAX;
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
