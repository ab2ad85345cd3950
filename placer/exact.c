/*
 * The exact solver: a configuration formulation on GLPK. A configuration is a multiset of model
 * types one server of a kind can hold. For thresholds (M, E) on the largest memory and role
 * imbalance, "S configurations within the thresholds cover the models exactly" is a small
 * integer program; the smallest feasible thresholds, found in increasing objective order, are
 * a proven optimum.
 */
#include <errno.h>
#include <glpk.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "configs.h"
#include "place.h"

#define DEFAULT_MAX_CONFIGURATIONS 400000
#define EPS                        1e-9

/* Every way to fill a server of kind k with at most its GPUs, over the types allowed on it. */
static int enumerate(const struct place_problem *p, unsigned k, const unsigned *allowed,
                     unsigned n_allowed, unsigned j, unsigned gpus_left, uint8_t *a,
                     int64_t mem, int bal, struct configs *c)
{
        const struct place_type *t;
        unsigned most;
        int r;

        if (j == n_allowed)
                return configs_push(c, a, mem, bal, k);
        t = &p->types[allowed[j]];
        most = MIN(t->count, gpus_left / t->tp);
        for (unsigned n = 0; n <= most; n++) {
                a[allowed[j]] = (uint8_t)n;
                r = enumerate(p, k, allowed, n_allowed, j + 1, gpus_left - n * t->tp, a,
                              mem + (int64_t)n * t->memory, bal + (int)n * t->balance, c);
                if (r < 0) {
                        a[allowed[j]] = 0;
                        return r;
                }
        }
        a[allowed[j]] = 0;
        return 0;
}

static int build_configs(const struct place_problem *p, size_t max, struct configs *c)
{
        _cleanup_free_ uint8_t *a = calloc(p->n_types + 1, 1);
        _cleanup_free_ unsigned *allowed = calloc(p->n_types + 1, sizeof(unsigned));

        if (!a || !allowed)
                return -ENOMEM;
        *c = (struct configs){.n_types = p->n_types, .max = max};
        for (unsigned k = 0; k < p->n_kinds; k++) {
                unsigned n = 0;
                int r;

                for (unsigned t = 0; t < p->n_types; t++)
                        if (p->types[t].kinds & (UINT64_C(1) << k))
                                allowed[n++] = t;
                r = enumerate(p, k, allowed, n, 0, p->kinds[k].gpus, a, 0, 0, c);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int cmp_i64(const void *a, const void *b)
{
        int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

        return x < y ? -1 : x > y;
}

/* Sorted distinct values of |v[i]|. */
static int64_t *distinct_abs(const int64_t *v, const int *w, size_t n, size_t *ret_n)
{
        int64_t *out = malloc((n + 1) * sizeof(*out));
        size_t m = 0;

        if (!out)
                return NULL;
        for (size_t i = 0; i < n; i++) {
                int64_t x = v ? v[i] : (int64_t)w[i];
                out[i] = x < 0 ? -x : x;
        }
        qsort(out, n, sizeof(*out), cmp_i64);
        for (size_t i = 0; i < n; i++)
                if (m == 0 || out[m - 1] != out[i])
                        out[m++] = out[i];
        *ret_n = m;
        return out;
}

struct search {
        const struct place_problem *p;
        const struct place_options *o;
        struct configs c;
        glp_prob *lp;
        double deadline; /* place_now() seconds; INFINITY for none */
};

enum { TEST_FEASIBLE, TEST_INFEASIBLE, TEST_UNKNOWN };

/* Turn the solved x_c into server_of: configurations dealt to the servers of their kind. */
static int reconstruct(struct search *s, unsigned *server_of)
{
        _cleanup_free_ long *x = malloc((s->c.n + 1) * sizeof(long));

        if (!x)
                return -ENOMEM;
        for (size_t c = 0; c < s->c.n; c++)
                x[c] = lround(glp_mip_col_val(s->lp, (int)c + 1));
        return configs_deal(s->p, &s->c, x, server_of);
}

static int test(struct search *s, int64_t m, int e, unsigned *server_of)
{
        glp_iocp parm;
        double left;
        int r, status;

        for (size_t c = 0; c < s->c.n; c++) {
                int64_t mem = s->c.mem[c] < 0 ? -s->c.mem[c] : s->c.mem[c];
                bool in = mem <= m && abs(s->c.bal[c]) <= e;
                double ub = s->p->kinds[s->c.kind[c]].n_servers;

                glp_set_col_bnds(s->lp, (int)c + 1, in ? GLP_DB : GLP_FX, 0.0, in ? ub : 0.0);
        }
        glp_init_iocp(&parm);
        parm.presolve = GLP_ON;
        parm.msg_lev = s->o->verbose ? GLP_MSG_ON : GLP_MSG_OFF;
        parm.fp_heur = GLP_ON;
        if (isfinite(s->deadline)) {
                left = s->deadline - place_now();
                if (left <= 0)
                        return TEST_UNKNOWN;
                parm.tm_lim = (int)MIN(left * 1000.0 + 1, (double)INT32_MAX);
        }
        r = glp_intopt(s->lp, &parm);
        if (r == GLP_ENOPFS)
                return TEST_INFEASIBLE;
        status = glp_mip_status(s->lp);
        if ((r == 0 || r == GLP_ETMLIM || r == GLP_ESTOP) &&
            (status == GLP_OPT || status == GLP_FEAS)) {
                return reconstruct(s, server_of) < 0 ? TEST_UNKNOWN : TEST_FEASIBLE;
        }
        if (r == 0 && status == GLP_NOFEAS)
                return TEST_INFEASIBLE;
        return TEST_UNKNOWN;
}

static int build_lp(struct search *s)
{
        const struct place_problem *p = s->p;
        size_t nnz = 0;
        _cleanup_free_ int *ia = NULL, *ja = NULL;
        _cleanup_free_ double *ar = NULL;
        size_t k = 1;

        for (size_t c = 0; c < s->c.n; c++) {
                nnz++;
                for (unsigned t = 0; t < p->n_types; t++)
                        nnz += s->c.a[c * p->n_types + t] != 0;
        }
        if (nnz >= INT32_MAX || s->c.n >= INT32_MAX)
                return -E2BIG;
        ia = malloc((nnz + 1) * sizeof(int));
        ja = malloc((nnz + 1) * sizeof(int));
        ar = malloc((nnz + 1) * sizeof(double));
        if (!ia || !ja || !ar)
                return -ENOMEM;

        s->lp = glp_create_prob();
        glp_set_obj_dir(s->lp, GLP_MIN);
        glp_add_rows(s->lp, (int)(p->n_types + p->n_kinds));
        for (unsigned t = 0; t < p->n_types; t++)
                glp_set_row_bnds(s->lp, (int)t + 1, GLP_FX, p->types[t].count,
                                 p->types[t].count);
        for (unsigned kd = 0; kd < p->n_kinds; kd++)
                glp_set_row_bnds(s->lp, (int)(p->n_types + kd) + 1, GLP_UP, 0.0,
                                 p->kinds[kd].n_servers);
        glp_add_cols(s->lp, (int)s->c.n);
        for (size_t c = 0; c < s->c.n; c++) {
                int col = (int)c + 1;

                glp_set_col_kind(s->lp, col, GLP_IV);
                for (unsigned t = 0; t < p->n_types; t++) {
                        uint8_t a = s->c.a[c * p->n_types + t];
                        if (!a)
                                continue;
                        ia[k] = (int)t + 1;
                        ja[k] = col;
                        ar[k] = a;
                        k++;
                }
                ia[k] = (int)(p->n_types + s->c.kind[c]) + 1;
                ja[k] = col;
                ar[k] = 1.0;
                k++;
        }
        glp_load_matrix(s->lp, (int)nnz, ia, ja, ar);
        return 0;
}

static void search_done(struct search *s)
{
        if (s->lp)
                glp_delete_prob(s->lp);
        configs_done(&s->c);
}

int place_exact(const struct place_problem *p, const struct place_options *o,
                const struct place_assignment *incumbent, struct place_assignment *a,
                bool *ret_optimal, char **ret_error)
{
        struct search s = {.p = p, .o = o};
        _cleanup_free_ int64_t *mvals = NULL, *evals = NULL;
        _cleanup_free_ unsigned *trial = NULL;
        size_t n_m, n_e, max;
        int64_t total_mem = 0, lb_m;
        long total_bal = 0;
        double best = INFINITY, lb;
        bool have = false, stopped = false;
        int r, term;

        if (!p || !p->finished || !o || !a || !a->server_of)
                return -EINVAL;
        s.deadline = o->time_limit > 0 ? place_now() + o->time_limit : INFINITY;
        max = o->max_configurations ? o->max_configurations : DEFAULT_MAX_CONFIGURATIONS;

        r = build_configs(p, max, &s.c);
        if (r == -E2BIG) {
                /* Too many to enumerate: generate the useful ones. */
                search_done(&s);
                return place_colgen(p, o, incumbent, a, ret_optimal, ret_error);
        }
        if (r >= 0)
                r = build_lp(&s);
        trial = malloc((p->n_models + 1) * sizeof(unsigned));
        if (r >= 0 && !trial)
                r = -ENOMEM;
        if (r >= 0) {
                mvals = distinct_abs(s.c.mem, NULL, s.c.n, &n_m);
                evals = distinct_abs(NULL, s.c.bal, s.c.n, &n_e);
                if (!mvals || !evals)
                        r = -ENOMEM;
        }
        if (r < 0) {
                search_done(&s);
                return r;
        }

        if (incumbent && incumbent->server_of) {
                memcpy(a->server_of, incumbent->server_of, p->n_models * sizeof(unsigned));
                best = incumbent->objective;
                have = true;
        }

        /* No server can do better than the average. */
        for (unsigned i = 0; i < p->n_models; i++) {
                total_mem += p->types[p->models[i].type].memory;
                total_bal += p->types[p->models[i].type].balance;
        }
        total_mem = total_mem < 0 ? -total_mem : total_mem;
        total_bal = total_bal < 0 ? -total_bal : total_bal;
        lb_m = (total_mem + p->n_servers - 1) / p->n_servers;
        size_t m0 = lower_index(mvals, n_m, lb_m);
        size_t e0 = lower_index(evals, n_e, (total_bal + p->n_servers - 1) / p->n_servers);
        lb = INFINITY;

        term = glp_term_out(o->verbose ? GLP_ON : GLP_OFF);
        for (size_t ei = e0; ei < n_e && !stopped; ei++) {
                int e = (int)evals[ei];
                size_t lo = m0, hi;

                if (place_objective(p, 0, e) >= best - EPS)
                        break;
                /* Candidates for M that would beat the best so far. */
                hi = lo;
                while (hi < n_m && place_objective(p, mvals[hi], e) < best - EPS)
                        hi++;
                if (hi == lo)
                        continue;
                hi--;
                /* The largest first: if even that fails, this E is done in one test. */
                bool first = true;
                while (lo <= hi) {
                        size_t mid = first ? hi : lo + (hi - lo) / 2;
                        int t = test(&s, mvals[mid], e, trial);

                        first = false;
                        if (t == TEST_UNKNOWN) {
                                lb = MIN(lb, place_objective(p, mvals[lo], e));
                                if (ei + 1 < n_e)
                                        lb = MIN(lb, place_objective(p, mvals[m0],
                                                                     (int)evals[ei + 1]));
                                stopped = true;
                                break;
                        }
                        if (t == TEST_INFEASIBLE) {
                                lo = mid + 1;
                                continue;
                        }
                        struct place_assignment got = {.server_of = trial};
                        r = place_assignment_measure(p, &got);
                        if (r < 0)
                                break;
                        if (got.objective < best) {
                                best = got.objective;
                                memcpy(a->server_of, trial, p->n_models * sizeof(unsigned));
                                have = true;
                        }
                        /* The solution may be better than asked: skip what it already beats. */
                        size_t at = lower_index(mvals, n_m, got.max_memory);
                        if (at == 0 || at <= lo)
                                break;
                        hi = MIN(mid, at) - 1;
                }
                if (r < 0)
                        break;
        }
        glp_term_out(term);
        a->configurations = s.c.n;
        a->generated = false;
        search_done(&s);
        if (r < 0)
                return r;

        if (!have) {
                if (stopped)
                        return place_error(ret_error, PLACE_E_TIMEOUT,
                                    "the time limit passed before the exact solver found a "
                                    "placement");
                return place_error(ret_error, PLACE_E_INFEASIBLE,
                            "no placement exists: the models' tensor-parallel groups cannot be "
                            "packed into the servers' GPUs");
        }
        r = place_assignment_measure(p, a);
        if (r < 0)
                return r;
        a->bound = stopped ? MAX(MIN(lb, a->objective), place_simple_bound(p)) : a->objective;
        a->bound = MIN(a->bound, a->objective);
        if (ret_optimal)
                *ret_optimal = !stopped;
        return 0;
}
