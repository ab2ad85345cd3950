/*
 * The reference formulation (one binary per model and server, minimise the largest memory
 * plus the largest role imbalance) on GLPK. Kept to measure the configuration formulation
 * against; it does not scale, and `--solver reference` exists for that comparison only.
 */
#include <errno.h>
#include <glpk.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "place.h"

struct progress {
        double bound;
};

static void callback(glp_tree *tree, void *info)
{
        struct progress *pr = info;

        if (glp_ios_reason(tree) == GLP_ISELECT || glp_ios_reason(tree) == GLP_IBINGO) {
                int node = glp_ios_best_node(tree);
                if (node)
                        pr->bound = MAX(pr->bound, glp_ios_node_bound(tree, node));
        }
}

int place_reference(const struct place_problem *p, const struct place_options *o,
                    struct place_assignment *a, bool *ret_optimal, char **ret_error)
{
        _cleanup_free_ int *ia = NULL, *ja = NULL, *col_model = NULL, *col_server = NULL;
        _cleanup_free_ double *ar = NULL;
        size_t n_x = 0, k = 1, nnz;
        unsigned S = p->n_servers;
        struct progress pr = {.bound = -INFINITY};
        glp_prob *lp;
        glp_iocp parm;
        int r, status, term, col_m, col_e;

        if (!p || !p->finished || !o || !a || !a->server_of)
                return -EINVAL;
        for (unsigned i = 0; i < p->n_models; i++)
                for (unsigned s = 0; s < S; s++)
                        n_x += (p->types[p->models[i].type].kinds >> p->servers[s].kind) & 1;
        nnz = 6 * n_x + 4 * (size_t)S;
        if (nnz >= INT32_MAX)
                return -E2BIG;
        ia = malloc((nnz + 1) * sizeof(int));
        ja = malloc((nnz + 1) * sizeof(int));
        ar = malloc((nnz + 1) * sizeof(double));
        col_model = malloc((n_x + 1) * sizeof(int));
        col_server = malloc((n_x + 1) * sizeof(int));
        if (!ia || !ja || !ar || !col_model || !col_server)
                return -ENOMEM;

        /* Rows: models (=1), then per server: capacity, mem <= M, -mem <= M, bal <= E, -bal <= E. */
        lp = glp_create_prob();
        glp_set_obj_dir(lp, GLP_MIN);
        glp_add_rows(lp, (int)(p->n_models + 5 * S));
        for (unsigned i = 0; i < p->n_models; i++)
                glp_set_row_bnds(lp, (int)i + 1, GLP_FX, 1.0, 1.0);
        for (unsigned s = 0; s < S; s++) {
                int base = (int)(p->n_models + 5 * s) + 1;
                glp_set_row_bnds(lp, base, GLP_UP, 0.0, p->kinds[p->servers[s].kind].gpus);
                for (int j = 1; j < 5; j++)
                        glp_set_row_bnds(lp, base + j, GLP_UP, 0.0, 0.0);
        }
        glp_add_cols(lp, (int)n_x + 2);
        col_m = (int)n_x + 1;
        col_e = (int)n_x + 2;
        glp_set_col_bnds(lp, col_m, GLP_LO, 0.0, 0.0);
        glp_set_obj_coef(lp, col_m, p->w_memory / 1024.0);
        glp_set_col_bnds(lp, col_e, GLP_LO, 0.0, 0.0);
        glp_set_col_kind(lp, col_e, GLP_IV);
        glp_set_obj_coef(lp, col_e, p->w_balance);

        int col = 0;
        for (unsigned i = 0; i < p->n_models; i++) {
                const struct place_type *t = &p->types[p->models[i].type];
                for (unsigned s = 0; s < S; s++) {
                        int base = (int)(p->n_models + 5 * s) + 1;
                        if (!((t->kinds >> p->servers[s].kind) & 1))
                                continue;
                        col++;
                        col_model[col] = (int)i;
                        col_server[col] = (int)s;
                        glp_set_col_kind(lp, col, GLP_BV);
                        int rows[6] = {(int)i + 1, base, base + 1, base + 2, base + 3, base + 4};
                        double vals[6] = {1.0, t->tp, (double)t->memory, -(double)t->memory,
                                          t->balance, -t->balance};
                        for (int j = 0; j < 6; j++) {
                                ia[k] = rows[j];
                                ja[k] = col;
                                ar[k] = vals[j];
                                k++;
                        }
                }
        }
        for (unsigned s = 0; s < S; s++) {
                int base = (int)(p->n_models + 5 * s) + 1;
                int rows[4] = {base + 1, base + 2, base + 3, base + 4};
                int cols[4] = {col_m, col_m, col_e, col_e};
                for (int j = 0; j < 4; j++) {
                        ia[k] = rows[j];
                        ja[k] = cols[j];
                        ar[k] = -1.0;
                        k++;
                }
        }
        glp_load_matrix(lp, (int)(k - 1), ia, ja, ar);

        glp_init_iocp(&parm);
        parm.presolve = GLP_ON;
        parm.msg_lev = o->verbose ? GLP_MSG_ON : GLP_MSG_OFF;
        parm.cb_func = callback;
        parm.cb_info = &pr;
        if (o->time_limit > 0)
                parm.tm_lim = (int)MIN(o->time_limit * 1000.0, (double)INT32_MAX);
        term = glp_term_out(o->verbose ? GLP_ON : GLP_OFF);
        int rc = glp_intopt(lp, &parm);
        glp_term_out(term);
        status = glp_mip_status(lp);
        if (!(status == GLP_OPT || status == GLP_FEAS)) {
                glp_delete_prob(lp);
                if (rc == GLP_ETMLIM)
                        return place_error(ret_error, PLACE_E_TIMEOUT,
                                           "the time limit passed before the reference "
                                           "formulation found a placement");
                return place_error(ret_error, PLACE_E_INFEASIBLE,
                                   "the reference formulation found no placement (GLPK %d)", rc);
        }
        for (int c = 1; c <= (int)n_x; c++)
                if (glp_mip_col_val(lp, c) > 0.5)
                        a->server_of[col_model[c]] = (unsigned)col_server[c];
        glp_delete_prob(lp);

        r = place_assignment_measure(p, a);
        if (r < 0)
                return r;
        bool optimal = rc == 0 && status == GLP_OPT;
        a->bound = optimal ? a->objective : MAX(pr.bound, place_simple_bound(p));
        a->bound = MIN(a->bound, a->objective);
        if (ret_optimal)
                *ret_optimal = optimal;
        return 0;
}
