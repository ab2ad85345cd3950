/*
 * The exact search when there are too many configurations to enumerate: they are generated as
 * columns of a restricted master LP (GLPK), priced by a small integer program per server kind,
 * and the integer problem per threshold pair is solved over the columns generated so far.
 */
#include <errno.h>
#include <glpk.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "configs.h"
#include "place.h"

#define EPS         1e-9
#define RC_TOL      1e-7   /* a column enters when its reduced cost is below -RC_TOL */
#define FEAS_TOL    1e-6   /* models left uncovered: above it, the LP is infeasible */
#define IP_LIMIT_MS 5000.0 /* per integer problem over the generated columns */

/*
 * The master, for thresholds (M, E): rows are the types (covered exactly) and the kinds (at most
 * S_k servers); columns 1..n_types are artificial "uncovered" variables u_t of cost 1, then one
 * column per generated configuration, fixed at 0 when outside the thresholds. Its LP optimum is
 * 0 exactly when the LP over all configurations within (M, E) is feasible.
 */
struct cg {
        const struct place_problem *p;
        const struct place_options *o;
        struct configs c;
        glp_prob *master;
        size_t n_master;    /* configurations already columns of the master */
        glp_prob **price;   /* per kind: max sum pi_t a_t over one server's configurations */
        unsigned **allowed; /* per kind: the types its pricing columns stand for */
        unsigned *n_allowed;
        long *fix; /* [n] lower bounds on configurations while diving, else 0 */
        size_t fix_cap;
        double deadline;
        unsigned lp_solves, pricings;
};

enum { CG_FEASIBLE, CG_INFEASIBLE, CG_UNKNOWN };

static void cg_done(struct cg *g)
{
        if (g->master)
                glp_delete_prob(g->master);
        for (unsigned k = 0; g->price && k < g->p->n_kinds; k++) {
                if (g->price[k])
                        glp_delete_prob(g->price[k]);
                free(g->allowed[k]);
        }
        free(g->price);
        free(g->allowed);
        free(g->n_allowed);
        free(g->fix);
        configs_done(&g->c);
}

static double left_ms(const struct cg *g)
{
        if (!isfinite(g->deadline))
                return INT32_MAX;
        return MAX(0.0, MIN((g->deadline - place_now()) * 1000.0, (double)INT32_MAX));
}

static void set_range(glp_prob *lp, int row, double bound)
{
        if (bound <= 0)
                glp_set_row_bnds(lp, row, GLP_FX, 0.0, 0.0);
        else
                glp_set_row_bnds(lp, row, GLP_DB, -bound, bound);
}

static bool within(const struct cg *g, size_t c, int64_t m, int e)
{
        int64_t mem = g->c.mem[c] < 0 ? -g->c.mem[c] : g->c.mem[c];

        return mem <= m && abs(g->c.bal[c]) <= e;
}

static void set_column_bounds(struct cg *g, size_t c, int64_t m, int e)
{
        int col = (int)(g->p->n_types + c) + 1;
        double ub = g->p->kinds[g->c.kind[c]].n_servers;

        double lb = c < g->fix_cap ? (double)g->fix[c] : 0.0;

        if (within(g, c, m, e))
                glp_set_col_bnds(g->master, col, lb < ub ? GLP_DB : GLP_FX, lb, ub);
        else
                glp_set_col_bnds(g->master, col, GLP_FX, 0.0, 0.0);
}

/* Add the configurations generated since the last call as columns of the master. */
static void sync_master(struct cg *g, int64_t m, int e)
{
        const struct place_problem *p = g->p;
        int ind[PLACE_MAX_GPUS + 2];
        double val[PLACE_MAX_GPUS + 2];

        if (g->n_master == g->c.n)
                return;
        glp_add_cols(g->master, (int)(g->c.n - g->n_master));
        for (size_t c = g->n_master; c < g->c.n; c++) {
                int col = (int)(p->n_types + c) + 1, n = 0;

                /* A server holds at most PLACE_MAX_GPUS models: so many nonzeros at most. */
                for (unsigned t = 0; t < p->n_types && n <= PLACE_MAX_GPUS; t++)
                        if (g->c.a[c * p->n_types + t]) {
                                ind[n + 1] = (int)t + 1;
                                val[n + 1] = g->c.a[c * p->n_types + t];
                                n++;
                        }
                ind[n + 1] = (int)(p->n_types + g->c.kind[c]) + 1;
                val[n + 1] = 1.0;
                n++;
                glp_set_mat_col(g->master, col, n, ind, val);
                glp_set_col_kind(g->master, col, GLP_IV);
                set_column_bounds(g, c, m, e);
        }
        g->n_master = g->c.n;
}

static int push_config(struct cg *g, const uint8_t *a, unsigned k, bool *ret_new)
{
        const struct place_problem *p = g->p;
        int64_t mem = 0;
        int bal = 0;
        int r;

        if (configs_find(&g->c, a, k) >= 0) {
                *ret_new = false;
                return 0;
        }
        for (unsigned t = 0; t < p->n_types; t++) {
                mem += (int64_t)a[t] * p->types[t].memory;
                bal += (int)a[t] * p->types[t].balance;
        }
        r = configs_push(&g->c, a, mem, bal, k);
        if (r < 0)
                return r;
        if (g->c.cap > g->fix_cap) {
                long *f = realloc(g->fix, g->c.cap * sizeof(long));

                if (!f)
                        return -ENOMEM;
                memset(f + g->fix_cap, 0, (g->c.cap - g->fix_cap) * sizeof(long));
                g->fix = f;
                g->fix_cap = g->c.cap;
        }
        *ret_new = true;
        return 0;
}

static int build(struct cg *g)
{
        const struct place_problem *p = g->p;

        g->master = glp_create_prob();
        glp_set_obj_dir(g->master, GLP_MIN);
        glp_add_rows(g->master, (int)(p->n_types + p->n_kinds));
        glp_add_cols(g->master, (int)p->n_types);
        for (unsigned t = 0; t < p->n_types; t++) {
                int ind[2] = {0, (int)t + 1};
                double val[2] = {0, 1.0};

                glp_set_row_bnds(g->master, (int)t + 1, GLP_FX, p->types[t].count,
                                 p->types[t].count);
                glp_set_mat_col(g->master, (int)t + 1, 1, ind, val);
                glp_set_obj_coef(g->master, (int)t + 1, 1.0);
                glp_set_col_bnds(g->master, (int)t + 1, GLP_LO, 0.0, 0.0);
        }
        for (unsigned k = 0; k < p->n_kinds; k++)
                glp_set_row_bnds(g->master, (int)(p->n_types + k) + 1, GLP_UP, 0.0,
                                 p->kinds[k].n_servers);

        /* Pricing per kind: GPUs, then |memory| <= M and |role| <= E, set per threshold. */
        g->price = calloc(p->n_kinds, sizeof(*g->price));
        g->allowed = calloc(p->n_kinds, sizeof(*g->allowed));
        g->n_allowed = calloc(p->n_kinds, sizeof(*g->n_allowed));
        if (!g->price || !g->allowed || !g->n_allowed)
                return -ENOMEM;
        for (unsigned k = 0; k < p->n_kinds; k++) {
                unsigned gpus = p->kinds[k].gpus, n = 0;
                glp_prob *lp;

                g->allowed[k] = calloc(p->n_types + 1, sizeof(unsigned));
                if (!g->allowed[k])
                        return -ENOMEM;
                for (unsigned t = 0; t < p->n_types; t++)
                        if (p->types[t].kinds & (UINT64_C(1) << k) && p->types[t].tp <= gpus)
                                g->allowed[k][n++] = t;
                g->n_allowed[k] = n;
                g->price[k] = lp = glp_create_prob();
                glp_set_obj_dir(lp, GLP_MAX);
                glp_add_rows(lp, 3);
                glp_set_row_bnds(lp, 1, GLP_UP, 0.0, gpus);
                if (n == 0)
                        continue;
                glp_add_cols(lp, (int)n);
                for (unsigned j = 0; j < n; j++) {
                        const struct place_type *t = &p->types[g->allowed[k][j]];
                        int ind[4] = {0, 1, 2, 3};
                        double val[4] = {0, t->tp, (double)t->memory, t->balance};

                        glp_set_mat_col(lp, (int)j + 1, 3, ind, val);
                        glp_set_col_kind(lp, (int)j + 1, GLP_IV);
                        glp_set_col_bnds(lp, (int)j + 1, GLP_DB, 0.0, MIN(t->count, gpus / t->tp));
                }
        }
        return 0;
}

/* Every configuration the incumbent uses, so that its thresholds are feasible over the pool. */
static int seed(struct cg *g, const unsigned *server_of)
{
        const struct place_problem *p = g->p;
        _cleanup_free_ uint8_t *a = calloc((size_t)p->n_servers * p->n_types + 1, 1);
        bool added;

        if (!a)
                return -ENOMEM;
        for (unsigned i = 0; i < p->n_models; i++)
                a[(size_t)server_of[i] * p->n_types + p->models[i].type]++;
        for (unsigned s = 0; s < p->n_servers; s++) {
                int r = push_config(g, a + (size_t)s * p->n_types, p->servers[s].kind, &added);
                if (r < 0)
                        return r;
        }
        return 0;
}

/*
 * Price one kind: the configuration within (M, E) with the largest sum of type duals. Returns
 * its value (>= 0: the empty server is one) in *ret_value and the configuration in a[], or
 * CG_UNKNOWN when GLPK did not solve it to optimality in time.
 */
static int price(struct cg *g, unsigned k, const double *pi, uint8_t *a, double *ret_value)
{
        glp_prob *lp = g->price[k];
        glp_iocp parm;
        int r;

        memset(a, 0, g->p->n_types);
        if (g->n_allowed[k] == 0) {
                *ret_value = 0;
                return CG_FEASIBLE;
        }
        for (unsigned j = 0; j < g->n_allowed[k]; j++)
                glp_set_obj_coef(lp, (int)j + 1, pi[g->allowed[k][j]]);
        glp_init_iocp(&parm);
        parm.presolve = GLP_ON;
        parm.msg_lev = GLP_MSG_OFF;
        parm.tm_lim = (int)left_ms(g) + 1;
        g->pricings++;
        r = glp_intopt(lp, &parm);
        if (r != 0 || glp_mip_status(lp) != GLP_OPT)
                return CG_UNKNOWN;
        for (unsigned j = 0; j < g->n_allowed[k]; j++)
                a[g->allowed[k][j]] = (uint8_t)lround(glp_mip_col_val(lp, (int)j + 1));
        *ret_value = glp_mip_obj_val(lp);
        return CG_FEASIBLE;
}

/*
 * Is the LP over all configurations within (M, E) feasible? Columns are generated until no
 * configuration prices out. Infeasibility is proven by the Lagrangian bound
 * z_RMP + sum_k S_k min(0, min reduced cost of kind k) > 0, which holds at every iteration, so a
 * hopeless threshold often stops early.
 */
static int lp_test(struct cg *g, int64_t m, int e)
{
        const struct place_problem *p = g->p;
        _cleanup_free_ double *pi = calloc(p->n_types + 1, sizeof(double));
        _cleanup_free_ uint8_t *a = calloc(p->n_types + 1, 1);
        glp_smcp parm;

        if (!pi || !a)
                return -ENOMEM;
        for (size_t c = 0; c < g->n_master; c++)
                set_column_bounds(g, c, m, e);
        for (unsigned k = 0; k < p->n_kinds; k++) {
                set_range(g->price[k], 2, (double)m);
                set_range(g->price[k], 3, e);
        }
        glp_init_smcp(&parm);
        parm.msg_lev = GLP_MSG_OFF;
        for (;;) {
                double z, lagrange;
                bool added = false, proof = true;
                int r;

                if (left_ms(g) <= 0)
                        return CG_UNKNOWN;
                parm.tm_lim = (int)left_ms(g) + 1;
                g->lp_solves++;
                r = glp_simplex(g->master, &parm);
                if (r != 0 || glp_get_status(g->master) != GLP_OPT) {
                        /* A numerical failure: start again from the standard basis once. */
                        glp_std_basis(g->master);
                        r = glp_simplex(g->master, &parm);
                        if (r != 0 || glp_get_status(g->master) != GLP_OPT)
                                return CG_UNKNOWN;
                }
                z = glp_get_obj_val(g->master);
                if (z <= FEAS_TOL)
                        return CG_FEASIBLE;
                lagrange = z;
                for (unsigned t = 0; t < p->n_types; t++)
                        pi[t] = glp_get_row_dual(g->master, (int)t + 1);
                for (unsigned k = 0; k < p->n_kinds; k++) {
                        double mu = glp_get_row_dual(g->master, (int)(p->n_types + k) + 1);
                        double value, rc;
                        bool is_new;

                        if (price(g, k, pi, a, &value) != CG_FEASIBLE)
                                return CG_UNKNOWN;
                        /* The bound needs mu <= 0 (an upper-bounded row of a minimum). */
                        if (mu > RC_TOL)
                                proof = false;
                        rc = -value - mu;
                        lagrange += p->kinds[k].n_servers * MIN(0.0, rc);
                        if (rc >= -RC_TOL)
                                continue;
                        r = push_config(g, a, k, &is_new);
                        if (r < 0)
                                return r;
                        added |= is_new;
                }
                if (proof && lagrange > FEAS_TOL)
                        return CG_INFEASIBLE;
                if (!added)
                        return CG_UNKNOWN; /* stalled within the tolerances: prove nothing */
                sync_master(g, m, e);
        }
}

/* The integer problem over the columns generated so far: a placement, or CG_UNKNOWN. */
static int ip_test(struct cg *g, int64_t m, int e, unsigned *server_of)
{
        const struct place_problem *p = g->p;
        _cleanup_free_ long *x = NULL;
        glp_iocp parm;
        int r, status, ret = CG_UNKNOWN;

        for (size_t c = 0; c < g->n_master; c++)
                set_column_bounds(g, c, m, e);
        for (unsigned t = 0; t < p->n_types; t++)
                glp_set_col_bnds(g->master, (int)t + 1, GLP_FX, 0.0, 0.0);
        glp_init_iocp(&parm);
        parm.presolve = GLP_ON;
        parm.msg_lev = g->o->verbose ? GLP_MSG_ON : GLP_MSG_OFF;
        parm.fp_heur = GLP_ON;
        /* A fallback after the dive: bounded, so that one hard pool does not take all the time. */
        parm.tm_lim = (int)MIN(left_ms(g), IP_LIMIT_MS) + 1;
        r = glp_intopt(g->master, &parm);
        status = glp_mip_status(g->master);
        if ((r == 0 || r == GLP_ETMLIM) && (status == GLP_OPT || status == GLP_FEAS)) {
                x = malloc((g->n_master + 1) * sizeof(long));
                if (!x)
                        ret = -ENOMEM;
                else {
                        for (size_t c = 0; c < g->n_master; c++)
                                x[c] =
                                    lround(glp_mip_col_val(g->master, (int)(p->n_types + c) + 1));
                        ret = configs_deal(p, &g->c, x, server_of) < 0 ? CG_UNKNOWN : CG_FEASIBLE;
                }
        }
        for (unsigned t = 0; t < p->n_types; t++)
                glp_set_col_bnds(g->master, (int)t + 1, GLP_LO, 0.0, 0.0);
        return ret;
}

/*
 * Price-and-dive: solve the LP with columns generated as needed, keep the whole servers it
 * assigns (x_c rounded down), else commit one more server to the most nearly whole
 * configuration, and repeat on what is left. A heuristic: a failed dive proves nothing.
 */
static int dive(struct cg *g, int64_t m, int e, unsigned *server_of)
{
        _cleanup_free_ long *x = NULL;
        int ret = CG_UNKNOWN;

        for (;;) {
                size_t best = SIZE_MAX;
                double best_frac = 0;
                bool whole = true, moved = false;
                int t = lp_test(g, m, e);

                if (t != CG_FEASIBLE) {
                        ret = t < 0 ? t : CG_UNKNOWN;
                        break;
                }
                for (size_t c = 0; c < g->n_master; c++) {
                        double v = glp_get_col_prim(g->master, (int)(g->p->n_types + c) + 1);
                        long down = (long)floor(v + 1e-6);

                        if (v - (double)down > 1e-6) {
                                whole = false;
                                if (v - (double)down > best_frac) {
                                        best_frac = v - (double)down;
                                        best = c;
                                }
                        }
                        if (down > g->fix[c]) {
                                g->fix[c] = down;
                                moved = true;
                        }
                }
                if (whole) {
                        x = malloc((g->n_master + 1) * sizeof(long));
                        if (!x) {
                                ret = -ENOMEM;
                                break;
                        }
                        for (size_t c = 0; c < g->n_master; c++)
                                x[c] = lround(
                                    glp_get_col_prim(g->master, (int)(g->p->n_types + c) + 1));
                        ret =
                            configs_deal(g->p, &g->c, x, server_of) < 0 ? CG_UNKNOWN : CG_FEASIBLE;
                        break;
                }
                if (!moved && best != SIZE_MAX)
                        g->fix[best]++;
        }
        memset(g->fix, 0, g->fix_cap * sizeof(long));
        for (size_t c = 0; c < g->n_master; c++)
                set_column_bounds(g, c, m, e);
        return ret;
}

static int64_t gcd64(int64_t a, int64_t b)
{
        a = a < 0 ? -a : a;
        b = b < 0 ? -b : b;
        while (b) {
                int64_t t = a % b;
                a = b;
                b = t;
        }
        return a;
}

/* The largest multiple of step up to cap whose objective with e stays below best. */
static int64_t below(const struct place_problem *p, int64_t step, int64_t cap, int e, double best)
{
        int64_t m = cap;

        if (isfinite(best) && p->w_memory > 0) {
                double room = (best - EPS - p->w_balance * e) / p->w_memory * 1024.0;
                if (room < 0)
                        return -1;
                m = MIN(cap, (int64_t)floor(room));
        }
        m = m / step * step;
        while (m >= 0 && place_objective(p, m, e) >= best - EPS)
                m -= step;
        return m;
}

int place_colgen(const struct place_problem *p, const struct place_options *o,
                 const struct place_assignment *incumbent, struct place_assignment *a,
                 bool *ret_optimal, char **ret_error)
{
        struct cg g = {.p = p, .o = o};
        _cleanup_free_ unsigned *trial = malloc((p->n_models + 1) * sizeof(unsigned));
        int64_t step_m = 0, cap_m = 0, m0;
        int step_e = 0, max_e = 0, e0, r = 0, t;
        double best = INFINITY, lb = INFINITY;
        bool have = false, stopped = false, unproven = false;

        if (!trial)
                return -ENOMEM;
        g.deadline = o->time_limit > 0 ? place_now() + o->time_limit : INFINITY;
        g.c = (struct configs){.n_types = p->n_types, .max = SIZE_MAX};

        /* Every configuration's memory and role balance are multiples of these. */
        for (unsigned t0 = 0; t0 < p->n_types; t0++) {
                const struct place_type *ty = &p->types[t0];

                step_m = gcd64(step_m, ty->memory);
                step_e = (int)gcd64(step_e, ty->balance);
        }
        step_m = MAX(step_m, 1);
        step_e = MAX(step_e, 1);
        for (unsigned k = 0; k < p->n_kinds; k++) {
                int64_t most = 0;

                for (unsigned t0 = 0; t0 < p->n_types; t0++) {
                        const struct place_type *ty = &p->types[t0];
                        int64_t mem = ty->memory < 0 ? -ty->memory : ty->memory;
                        most += mem * MIN(ty->count, p->kinds[k].gpus / ty->tp);
                }
                cap_m = MAX(cap_m, most);
                max_e = MAX(max_e, (int)p->kinds[k].gpus);
        }
        place_average_bounds(p, &m0, &e0);
        m0 = (m0 + step_m - 1) / step_m * step_m;
        e0 = (e0 + step_e - 1) / step_e * step_e;

        r = build(&g);
        if (r >= 0 && incumbent && incumbent->server_of) {
                memcpy(a->server_of, incumbent->server_of, p->n_models * sizeof(unsigned));
                best = incumbent->objective;
                have = true;
                r = seed(&g, incumbent->server_of);
        }
        if (r >= 0)
                sync_master(&g, cap_m, max_e);

        int term = glp_term_out(o->verbose ? GLP_ON : GLP_OFF);
        for (int e = e0; r >= 0 && e <= max_e; e += step_e) {
                int64_t lo = m0, hi = below(p, step_m, cap_m, e, best), l_e;

                if (place_objective(p, m0, e) >= best - EPS)
                        break;
                if (hi < lo)
                        continue;
                /* The LP boundary: the smallest M whose LP is feasible, proven both ways. */
                t = lp_test(&g, hi, e);
                if (t == CG_INFEASIBLE)
                        continue;
                while (t == CG_FEASIBLE && lo < hi) {
                        int64_t mid = lo + (hi - lo) / step_m / 2 * step_m;

                        t = lp_test(&g, mid, e);
                        if (t == CG_INFEASIBLE) {
                                lo = mid + step_m;
                                t = CG_FEASIBLE;
                        } else if (t == CG_FEASIBLE)
                                hi = mid;
                }
                if (t < 0 || t == CG_UNKNOWN) {
                        r = MIN(t, 0);
                        lb = MIN(lb, place_objective(p, lo, e));
                        stopped = t == CG_UNKNOWN;
                        break;
                }
                l_e = lo;
                /* Integer placements over the generated columns, from the boundary up. */
                bool found = false;
                for (int64_t m = l_e, step = step_m; m <= below(p, step_m, cap_m, e, best);
                     m += step, step *= 2) {
                        t = dive(&g, m, e, trial);
                        if (t == CG_UNKNOWN)
                                t = ip_test(&g, m, e, trial);
                        if (t < 0) {
                                r = t;
                                break;
                        }
                        if (t != CG_FEASIBLE)
                                continue;
                        struct place_assignment got = {.server_of = trial};
                        r = place_assignment_measure(p, &got);
                        if (r < 0)
                                break;
                        if (got.objective < best) {
                                best = got.objective;
                                memcpy(a->server_of, trial, p->n_models * sizeof(unsigned));
                                have = true;
                        }
                        found = true;
                        break;
                }
                if (r < 0)
                        break;
                /* Unless the boundary itself was reached, this E is only bounded by it. */
                if (!found || place_objective(p, l_e, e) < best - EPS) {
                        lb = MIN(lb, place_objective(p, l_e, e));
                        unproven = true;
                }
                if (left_ms(&g) <= 0) {
                        stopped = true;
                        if (e + step_e <= max_e)
                                lb = MIN(lb, place_objective(p, m0, e + step_e));
                        break;
                }
        }
        glp_term_out(term);
        a->configurations = g.c.n;
        a->generated = true;
        cg_done(&g);
        if (r < 0)
                return r;

        if (!have) {
                if (stopped)
                        return place_error(ret_error, PLACE_E_TIMEOUT,
                                           "the time limit passed before the exact solver found a "
                                           "placement");
                if (unproven)
                        return place_error(
                            ret_error, PLACE_E_INFEASIBLE,
                            "the exact solver found no placement over the server "
                            "configurations it generated, and could not prove that none "
                            "exists");
                return place_error(
                    ret_error, PLACE_E_INFEASIBLE,
                    "no placement exists: the models' tensor-parallel groups cannot be "
                    "packed into the servers' GPUs");
        }
        r = place_assignment_measure(p, a);
        if (r < 0)
                return r;
        a->bound = MIN(MAX(MIN(lb, a->objective), place_simple_bound(p)), a->objective);
        if (ret_optimal)
                *ret_optimal = !stopped && a->bound >= a->objective - EPS;
        return 0;
}
