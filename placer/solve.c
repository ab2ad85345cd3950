/* Choosing the solver: the heuristic first (fast, an incumbent), then the exact search. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "place.h"

static void finish(const struct place_problem *p, const struct place_assignment *a,
                   enum place_solver solver, bool proven, double start, struct place_result *r)
{
        r->solver = solver;
        r->objective = a->objective;
        r->bound = MIN(a->bound, a->objective);
        r->max_memory = a->max_memory;
        r->max_balance = a->max_balance;
        /* Equal to the bound is optimal whoever found it. */
        if (proven || r->objective <= r->bound + 1e-9 * MAX(1.0, fabs(r->objective))) {
                r->status = PLACE_STATUS_OPTIMAL;
                r->bound = r->objective;
                r->gap = 0;
        } else {
                r->status = PLACE_STATUS_FEASIBLE;
                r->gap = r->objective > 0 ? (r->objective - r->bound) / r->objective : 0;
        }
        r->seconds = place_now() - start;
        r->configurations = a->configurations;
        r->generated = a->generated;
        (void)p;
}

int place_solve(const struct place_problem *p, const struct place_options *o,
                struct place_result *ret, char **ret_error)
{
        struct place_result res = {};
        _cleanup_free_ unsigned *h_of = NULL, *x_of = NULL;
        struct place_assignment h = {}, x = {};
        struct place_options sub;
        double start = place_now();
        bool proven = false, have_h = false;
        int r;

        if (!p || !p->finished || !o || !ret || o->solver < 0 || o->solver >= _PLACE_SOLVER_MAX)
                return -EINVAL;
        h_of = calloc(p->n_models + 1, sizeof(unsigned));
        x_of = calloc(p->n_models + 1, sizeof(unsigned));
        if (!h_of || !x_of)
                return -ENOMEM;
        h.server_of = h_of;
        x.server_of = x_of;

        if (o->solver == PLACE_SOLVER_REFERENCE) {
                r = place_reference(p, o, &x, &proven, ret_error);
                if (r != 0)
                        return r;
                finish(p, &x, PLACE_SOLVER_REFERENCE, proven, start, &res);
                goto layout;
        }

        r = place_heuristic(p, o, &h, ret_error);
        if (r < 0)
                return r;
        have_h = r == 0;
        if (o->solver == PLACE_SOLVER_HEURISTIC) {
                if (!have_h)
                        return r;
                finish(p, &h, PLACE_SOLVER_HEURISTIC, false, start, &res);
                goto layout;
        }
        /* auto stops here when the heuristic already meets the bound. */
        if (o->solver == PLACE_SOLVER_AUTO && have_h &&
            h.objective <= h.bound + 1e-9 * MAX(1.0, h.objective)) {
                finish(p, &h, PLACE_SOLVER_HEURISTIC, true, start, &res);
                goto layout;
        }

        sub = *o;
        if (o->time_limit > 0)
                sub.time_limit = MAX(o->time_limit - (place_now() - start), 0.001);
        /* The exact search may succeed where the heuristic failed: drop its message. */
        if (!have_h && ret_error) {
                free(*ret_error);
                *ret_error = NULL;
        }
        r = place_exact(p, &sub, have_h ? &h : NULL, &x, &proven, ret_error);
        if (r < 0)
                return r;
        if (r != 0)
                return r;
        finish(p, &x, PLACE_SOLVER_EXACT, proven, start, &res);

layout:
        r = place_layout(p, res.solver == PLACE_SOLVER_HEURISTIC ? h_of : x_of, &res);
        if (r < 0) {
                place_result_free(&res);
                return r;
        }
        res.seconds = place_now() - start;
        *ret = res;
        return 0;
}
