/* The heuristic: valid placements, and the exact optimum within the gap it reports. */
#include <criterion/criterion.h>

#include "place.h"
#include "test-helpers.h"

Test(heuristic, agrees_with_the_exact_optimum_within_its_reported_gap)
{
        for (unsigned long seed = 1; seed <= 8; seed++) {
                _cleanup_(place_problem_freep) struct place_problem *p =
                        random_instance(2 + seed % 5, 8, seed, seed % 2);
                struct place_options o = PLACE_OPTIONS_DEFAULT;
                struct place_result h = {}, x = {};
                char *error = NULL;

                cr_assert_eq(place_problem_finish(p, &error), 0, "%s", error);
                o.solver = PLACE_SOLVER_HEURISTIC;
                cr_assert_eq(place_solve(p, &o, &h, &error), 0, "%s", error);
                o.solver = PLACE_SOLVER_EXACT;
                cr_assert_eq(place_solve(p, &o, &x, &error), 0, "%s", error);
                cr_assert_eq(x.status, PLACE_STATUS_OPTIMAL);
                check_assignment(p, h.server_of);
                /* bound <= optimum <= heuristic objective, and gap as defined. */
                cr_assert_leq(h.bound, x.objective + 1e-9, "seed %lu", seed);
                cr_assert_geq(h.objective, x.objective - 1e-9, "seed %lu", seed);
                cr_assert_float_eq(h.gap, h.objective > 0 ? (h.objective - h.bound) / h.objective : 0,
                                   1e-9);
                cr_assert_eq(h.solver, PLACE_SOLVER_HEURISTIC);
                place_result_free(&h);
                place_result_free(&x);
                free(error);
        }
}

Test(heuristic, places_a_large_cluster_with_tp_groups)
{
        _cleanup_(place_problem_freep) struct place_problem *p = random_instance(256, 8, 7, true);
        struct place_options o = PLACE_OPTIONS_DEFAULT;
        struct place_result h = {};
        char *error = NULL;

        cr_assert_eq(place_problem_finish(p, &error), 0, "%s", error);
        o.solver = PLACE_SOLVER_HEURISTIC;
        cr_assert_eq(place_solve(p, &o, &h, &error), 0, "%s", error);
        check_assignment(p, h.server_of);
        cr_assert_geq(h.objective, h.bound);
        place_result_free(&h);
}

Test(heuristic, reaches_the_bound_when_it_is_reachable_and_says_optimal)
{
        _cleanup_(place_problem_freep) struct place_problem *p = place_problem_new();
        struct place_options o = PLACE_OPTIONS_DEFAULT;
        struct place_result h = {};

        cr_assert_eq(place_problem_add_kind(p, "k", 2, 0, 3, NULL, NULL, NULL), 0);
        for (int i = 0; i < 3; i++) {
                char n[8];
                snprintf(n, sizeof(n), "p%d", i);
                cr_assert_eq(place_problem_add_model(p, n, PLACE_PRODUCER, 10240, 1, 0, NULL), 0);
                snprintf(n, sizeof(n), "c%d", i);
                cr_assert_eq(place_problem_add_model(p, n, PLACE_CONSUMER, -10240, 1, 0, NULL), 0);
        }
        cr_assert_eq(place_problem_finish(p, NULL), 0);
        o.solver = PLACE_SOLVER_HEURISTIC;
        cr_assert_eq(place_solve(p, &o, &h, NULL), 0);
        cr_assert_float_eq(h.objective, 0.0, 1e-12);
        cr_assert_eq(h.status, PLACE_STATUS_OPTIMAL);
        place_result_free(&h);
}

/*
 * Quality on fixed instances whose optimum the exact search proves: within 5% of it (the
 * target in ARCHITECTURE.md). 8 servers of 8 GPUs with the reference placer's model sizes,
 * with and without TP groups. Single moves and swaps stopped 14% to 33% above the optimum on
 * seeds 2 to 4.
 */
Test(heuristic, comes_within_five_percent_of_the_proven_optimum)
{
        for (unsigned long seed = 1; seed <= 4; seed++) {
                _cleanup_(place_problem_freep) struct place_problem *p =
                        random_instance(8, 8, 100 + seed, seed > 2);
                struct place_options o = PLACE_OPTIONS_DEFAULT;
                _cleanup_free_ unsigned *h_of = NULL, *x_of = NULL;
                struct place_assignment h = {}, x = {};
                bool optimal = false;
                char *error = NULL;

                cr_assert_eq(place_problem_finish(p, &error), 0, "%s", error);
                h.server_of = h_of = calloc(p->n_models, sizeof(unsigned));
                x.server_of = x_of = calloc(p->n_models, sizeof(unsigned));
                cr_assert(h_of && x_of);
                cr_assert_eq(place_heuristic(p, &o, &h, &error), 0, "%s", error);
                check_assignment(p, h.server_of);
                /* Seeded with the heuristic's placement, the exact search proves faster. */
                cr_assert_eq(place_exact(p, &o, &h, &x, &optimal, &error), 0, "%s", error);
                cr_assert(optimal);
                cr_assert_leq(h.objective, 1.05 * x.objective + 1e-9,
                              "seed %lu: heuristic %g, optimum %g", seed, h.objective,
                              x.objective);
                free(error);
        }
}
