/* The exact solver: hand-checked optima, TP groups, server kinds, infeasibility, limits. */
#include <criterion/criterion.h>
#include <string.h>

#include "place.h"
#include "test-helpers.h"

static struct place_problem *p;
static struct place_result res;
static char *error;

static void teardown(void)
{
        place_result_free(&res);
        p = place_problem_free(p);
        free(error);
        error = NULL;
}

TestSuite(exact, .fini = teardown);

static void load(const char *yaml)
{
        int r = place_problem_load_buffer("in.yaml", yaml, strlen(yaml), NULL, &p, &error);
        cr_assert_eq(r, 0, "%s", error ? error : "");
}

static int solve(enum place_solver solver, double limit)
{
        struct place_options o = PLACE_OPTIONS_DEFAULT;

        o.solver = solver;
        o.time_limit = limit;
        return place_solve(p, &o, &res, &error);
}

static unsigned model(const char *name)
{
        for (unsigned i = 0; i < p->n_models; i++)
                if (strcmp(p->models[i].name, name) == 0)
                        return i;
        cr_assert_fail("no model %s", name);
        return 0;
}

/*
 * 40+40+10+10-30-30 = 40 GiB and 4-2 = 2 producer GPUs over two servers: no server can do
 * better than 20 GiB and 1 GPU, and {40, 10, -30} on each reaches both.
 */
Test(exact, proves_a_hand_checked_optimum)
{
        load("servers: [{count: 2, gpus: 4}]\n"
             "models:\n"
             "  - {name: p40, role: producer, memory: 40GiB, count: 2}\n"
             "  - {name: p10, role: producer, memory: 10GiB, count: 2}\n"
             "  - {name: c30, role: consumer, memory: 30GiB, count: 2}\n");
        cr_assert_eq(solve(PLACE_SOLVER_EXACT, 30), 0, "%s", error);
        cr_assert_eq(res.status, PLACE_STATUS_OPTIMAL);
        cr_assert_float_eq(res.objective, 21.0, 1e-9);
        cr_assert_eq(res.max_memory, 20 * 1024);
        cr_assert_eq(res.max_balance, 1);
        cr_assert_float_eq(res.gap, 0.0, 1e-12);
        check_assignment(p, res.server_of);
        cr_assert_neq(res.server_of[model("p40-0")], res.server_of[model("p40-1")]);
}

/* With memory free, only the role imbalance counts: one producer too many somewhere. */
Test(exact, weights_change_what_is_minimised)
{
        load("servers: [{count: 2, gpus: 4}]\n"
             "models:\n"
             "  - {name: p40, role: producer, memory: 40GiB, count: 2}\n"
             "  - {name: p10, role: producer, memory: 10GiB, count: 2}\n"
             "  - {name: c30, role: consumer, memory: 30GiB, count: 2}\n"
             "weights: {memory: 0, balance: 1}\n");
        cr_assert_eq(solve(PLACE_SOLVER_EXACT, 30), 0, "%s", error);
        cr_assert_float_eq(res.objective, 1.0, 1e-9);
}

/* Two TP-2 consumers of 40 GiB and four 20 GiB producers: each server balances exactly. */
Test(exact, keeps_tp_groups_on_one_server_and_balances_them)
{
        load("servers: [{count: 2, gpus: 4}]\n"
             "models:\n"
             "  - {name: llm, role: consumer, memory: 40GiB, tp: 2, count: 2}\n"
             "  - {name: v, role: producer, memory: 20GiB, count: 4}\n");
        cr_assert_eq(solve(PLACE_SOLVER_EXACT, 30), 0, "%s", error);
        cr_assert_float_eq(res.objective, 0.0, 1e-9);
        cr_assert_eq(res.status, PLACE_STATUS_OPTIMAL);
        cr_assert_neq(res.server_of[model("llm-0")], res.server_of[model("llm-1")]);
        for (unsigned i = 0; i < p->n_models; i++)
                cr_assert_eq(res.gpu_first[i + 1] - res.gpu_first[i], p->models[i].tp);
}

/* A TP-4 consumer fills a server alone: the imbalance is forced on both servers. */
Test(exact, accepts_an_imbalance_that_tp_forces)
{
        load("servers: [{count: 2, gpus: 4}]\n"
             "models:\n"
             "  - {name: llm, role: consumer, memory: 40GiB, tp: 4}\n"
             "  - {name: v, role: producer, memory: 10GiB, count: 4}\n");
        cr_assert_eq(solve(PLACE_SOLVER_EXACT, 30), 0, "%s", error);
        cr_assert_float_eq(res.objective, 44.0, 1e-9);
        cr_assert_eq(res.status, PLACE_STATUS_OPTIMAL);
}

/* The large model may only go on the one large server; the rest balance around it. */
Test(exact, respects_server_kinds_and_gpu_memory)
{
        load("servers:\n"
             "  - {kind: large, count: 1, gpus: 8, gpu-memory: 80GiB}\n"
             "  - {kind: small, count: 2, gpus: 2, gpu-memory: 40GiB}\n"
             "models:\n"
             "  - {name: llm, role: consumer, memory: 30GiB, tp: 4, gpu-memory: 80GiB}\n"
             "  - {name: v, role: producer, memory: 15GiB, count: 4}\n"
             "  - {name: c, role: consumer, memory: 10GiB, count: 2}\n");
        cr_assert_eq(solve(PLACE_SOLVER_EXACT, 30), 0, "%s", error);
        cr_assert_eq(res.status, PLACE_STATUS_OPTIMAL);
        cr_assert_str_eq(p->servers[res.server_of[model("llm")]].name, "large-0");
        check_assignment(p, res.server_of);
        /* The reference formulation, which proves such small optima, agrees. */
        double objective = res.objective;
        place_result_free(&res);
        cr_assert_eq(solve(PLACE_SOLVER_REFERENCE, 60), 0, "%s", error);
        cr_assert_eq(res.status, PLACE_STATUS_OPTIMAL);
        cr_assert_float_eq(res.objective, objective, 1e-6);
}

Test(exact, agrees_with_the_reference_formulation_on_small_random_instances)
{
        for (unsigned long seed = 1; seed <= 6; seed++) {
                double objective;

                p = random_instance(2, 4, seed, true);
                cr_assert_eq(place_problem_finish(p, &error), 0, "%s", error);
                cr_assert_eq(solve(PLACE_SOLVER_EXACT, 30), 0, "%s", error);
                cr_assert_eq(res.status, PLACE_STATUS_OPTIMAL);
                check_assignment(p, res.server_of);
                objective = res.objective;
                place_result_free(&res);
                cr_assert_eq(solve(PLACE_SOLVER_REFERENCE, 60), 0, "%s", error);
                cr_assert_eq(res.status, PLACE_STATUS_OPTIMAL, "seed %lu", seed);
                cr_assert_float_eq(res.objective, objective, 1e-6, "seed %lu: %g vs %g", seed,
                                   res.objective, objective);
                teardown();
        }
}

/* Ten GPUs for five TP-2 groups, but a 5-GPU server holds only two of them. */
Test(exact, names_tp_groups_that_cannot_be_packed)
{
        load("servers: [{count: 2, gpus: 5}]\n"
             "models: [{name: m, role: consumer, memory: 1GiB, tp: 2, count: 5}]\n");
        cr_assert_eq(solve(PLACE_SOLVER_AUTO, 30), PLACE_E_INFEASIBLE);
        cr_assert(strstr(error, "tensor-parallel groups cannot be packed"), "%s", error);
        cr_assert_eq(solve(PLACE_SOLVER_HEURISTIC, 30), PLACE_E_INFEASIBLE);
        cr_assert(strstr(error, "found no server with 2 free GPUs"), "%s", error);
}

/* Solve with the configurations enumerated, then generated as columns: both must agree. */
static void compare_generated(size_t max_configurations)
{
        struct place_options o = PLACE_OPTIONS_DEFAULT;
        double optimum;

        o.solver = PLACE_SOLVER_EXACT;
        cr_assert_eq(place_solve(p, &o, &res, &error), 0, "%s", error);
        cr_assert_eq(res.status, PLACE_STATUS_OPTIMAL);
        cr_assert_not(res.generated);
        optimum = res.objective;
        place_result_free(&res);

        o.max_configurations = max_configurations;
        cr_assert_eq(place_solve(p, &o, &res, &error), 0, "%s", error);
        cr_assert_eq(res.solver, PLACE_SOLVER_EXACT);
        cr_assert(res.generated);
        cr_assert_gt(res.configurations, 0);
        check_assignment(p, res.server_of);
        /* Whatever it proves must hold; here its bound is tight enough to prove the optimum. */
        cr_assert_leq(res.bound, optimum + 1e-6);
        cr_assert_geq(res.objective, optimum - 1e-6);
        cr_assert_eq(res.status, PLACE_STATUS_OPTIMAL, "objective %g bound %g optimum %g",
                     res.objective, res.bound, optimum);
        cr_assert_float_eq(res.objective, optimum, 1e-6);
}

Test(exact, generates_configurations_when_there_are_too_many_to_enumerate)
{
        p = random_instance(8, 8, 3, false);
        cr_assert_eq(place_problem_finish(p, &error), 0, "%s", error);
        compare_generated(10);
}

/* Many types (sizes, TP degrees, two kinds of servers) with the enumeration limit lowered. */
Test(exact, generated_configurations_handle_many_types_and_kinds)
{
        load("servers:\n"
             "  - {kind: big, count: 3, gpus: 8, gpu-memory: 80GiB}\n"
             "  - {kind: small, count: 4, gpus: 4, gpu-memory: 40GiB}\n"
             "models:\n"
             "  - {name: p1, role: producer, memory: 11GiB, count: 3}\n"
             "  - {name: p2, role: producer, memory: 17GiB, count: 2}\n"
             "  - {name: p3, role: producer, memory: 23GiB, count: 3}\n"
             "  - {name: p4, role: producer, memory: 29GiB, count: 2}\n"
             "  - {name: p5, role: producer, memory: 31GiB, count: 2}\n"
             "  - {name: p6, role: producer, memory: 60GiB, tp: 2, count: 2}\n"
             "  - {name: p7, role: producer, memory: 7GiB, count: 3}\n"
             "  - {name: c1, role: consumer, memory: 13GiB, count: 3}\n"
             "  - {name: c2, role: consumer, memory: 19GiB, count: 3}\n"
             "  - {name: c3, role: consumer, memory: 41GiB, tp: 2, count: 1}\n"
             "  - {name: c4, role: consumer, memory: 5GiB, count: 2}\n"
             "  - {name: c5, role: consumer, memory: 70GiB, tp: 4, gpu-memory: 80GiB}\n");
        cr_assert_geq(p->n_types, 12);
        compare_generated(50);
}

/* Ten GPUs for five TP-2 groups on two 5-GPU servers: the LP over all columns proves it. */
Test(exact, generated_configurations_prove_infeasibility)
{
        struct place_options o = PLACE_OPTIONS_DEFAULT;

        load("servers: [{count: 2, gpus: 5}]\n"
             "models: [{name: m, role: consumer, memory: 1GiB, tp: 2, count: 5}]\n");
        o.solver = PLACE_SOLVER_EXACT;
        o.max_configurations = 1;
        cr_assert_eq(place_solve(p, &o, &res, &error), PLACE_E_INFEASIBLE);
        cr_assert(strstr(error, "tensor-parallel groups cannot be packed"), "%s", error);
}

/*
 * The reference formulation does not prove optimality for 4 x 8 within a fraction of a
 * second: it must say so, with a bound below its placement, and the configuration
 * formulation's proven optimum lies between them.
 */
Test(exact, a_time_limit_reports_the_gap_to_a_proven_bound)
{
        double optimum;

        p = random_instance(4, 8, 1, false);
        cr_assert_eq(place_problem_finish(p, &error), 0, "%s", error);
        cr_assert_eq(solve(PLACE_SOLVER_EXACT, 60), 0, "%s", error);
        cr_assert_eq(res.status, PLACE_STATUS_OPTIMAL);
        optimum = res.objective;
        place_result_free(&res);

        cr_assert_eq(solve(PLACE_SOLVER_REFERENCE, 0.3), 0, "%s", error);
        cr_assert_eq(res.solver, PLACE_SOLVER_REFERENCE);
        if (res.status == PLACE_STATUS_FEASIBLE) {
                cr_assert_gt(res.gap, 0.0);
                cr_assert_float_eq(res.gap, (res.objective - res.bound) / res.objective, 1e-9);
        }
        cr_assert_leq(res.bound, optimum + 1e-6);
        cr_assert_geq(res.objective, optimum - 1e-6);
        check_assignment(p, res.server_of);
}
