/*
 * Placer benchmark: random clusters drawn from the reference placer's model sizes, solved by
 * the exact search, the heuristic and (bounded) the reference formulation. Prints a table
 * ("#" and indented lines) and "name value" lines that bench/run turns into BENCH lines;
 * timings are never pass/fail tests.
 */
#include <getopt.h>
#include <glpk.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "place.h"

static const int producer_gib[] = {30, 20, 40, 35, 15};
static const int consumer_gib[] = {20, 10, 30};

static unsigned long rnd_next(unsigned long *x)
{
        *x = *x * 6364136223846793005UL + 1442695040888963407UL;
        return *x >> 33;
}

/*
 * S servers of hosts x gpus GPUs (one NVLink domain each) and a single-GPU model per GPU, half
 * producers and half consumers.
 */
static struct place_problem *domain_instance(unsigned servers, unsigned hosts, unsigned gpus,
                                             unsigned long seed)
{
        struct place_problem *p = place_problem_new();
        unsigned long x = seed * 0x9E3779B97F4A7C15UL + 1;
        unsigned n = hosts * gpus * servers;
        char name[32];

        if (!p || place_problem_add_kind(p, hosts > 1 ? "nvl" : "hgx", hosts * gpus, 0, servers,
                                         NULL, NULL, NULL) < 0 ||
            place_problem_set_hosts(p, 0, hosts, NULL) < 0)
                goto fail;
        for (unsigned i = 0; i < n; i++) {
                bool prod = i < n / 2;
                int gib = prod ? producer_gib[rnd_next(&x) % 5] : consumer_gib[rnd_next(&x) % 3];

                snprintf(name, sizeof(name), "m%u", i);
                if (place_problem_add_model(p, name, prod ? PLACE_PRODUCER : PLACE_CONSUMER,
                                            (prod ? gib : -gib) * 1024, 1, 0, NULL) < 0)
                        goto fail;
        }
        if (place_problem_finish(p, NULL) != 0)
                goto fail;
        return p;
fail:
        place_problem_free(p);
        return NULL;
}

/* S servers of 8 GPUs and 8 models per server, half producers and half consumers. */
static struct place_problem *instance(unsigned servers, unsigned long seed)
{
        return domain_instance(servers, 1, 8, seed);
}

static int run(struct place_problem *p, enum place_solver solver, double limit,
               size_t max_configurations, struct place_result *r)
{
        struct place_options o = PLACE_OPTIONS_DEFAULT;
        _cleanup_free_ char *error = NULL;
        int ret;

        o.solver = solver;
        o.time_limit = limit;
        o.max_configurations = max_configurations;
        ret = place_solve(p, &o, r, &error);
        if (ret != 0)
                fprintf(stderr, "bench-placer: %s solve failed: %s\n", place_solver_names[solver],
                        error ? error : "error");
        return ret;
}

/* Only NVLink domains of 18 hosts x 4 GPUs (GB200 NVL72), each a server of 72 GPUs. */
static int bench_nvl72(int seeds)
{
        double worst = 0;

        printf("# exact: NVL72 domains (18 hosts x 4 GPUs, one peer group), seeds 1..%d\n",
               seeds);
        printf("# %-8s %-5s %10s %10s %8s %9s %9s %14s\n", "domains", "seed", "objective",
               "bound", "gap", "seconds", "status", "configurations");
        for (unsigned s = 1; s <= 8; s *= 2)
                for (int seed = 1; seed <= seeds && seed <= 64; seed++) {
                        _cleanup_(place_problem_freep) struct place_problem *p =
                            domain_instance(s, 18, 4, seed);
                        struct place_result r = {};

                        if (!p || run(p, PLACE_SOLVER_EXACT, 60.0, 0, &r) != 0)
                                return 1;
                        printf("  %-8u %-5d %10.4g %10.4g %8.4f %9.3f %9s %10zu (%s)\n", s, seed,
                               r.objective, r.bound, r.gap, r.seconds,
                               place_status_names[r.status], r.configurations,
                               r.generated ? "generated" : "enumerated");
                        worst = MAX(worst, r.status == PLACE_STATUS_OPTIMAL ? r.seconds : INFINITY);
                        place_result_free(&r);
                }
        printf("exact_nvl72_seconds %.3f\n", isfinite(worst) ? worst : 999999.0);
        return 0;
}

int main(int argc, char **argv)
{
        double ref_limit = 20.0;
        bool reference = true, nvl72 = false;
        int seeds = 3;
        int c;

        static const struct option options[] = {
                {"reference-limit", required_argument, NULL, 'r'},
                {"no-reference", no_argument, NULL, 'n'},
                {"seeds", required_argument, NULL, 's'},
                {"nvl72", no_argument, NULL, 'd'},
                {},
        };
        while ((c = getopt_long(argc, argv, "r:ns:d", options, NULL)) >= 0) {
                switch (c) {
                case 'r':
                        ref_limit = atof(optarg);
                        break;
                case 'n':
                        reference = false;
                        break;
                case 's':
                        seeds = MAX(1, atoi(optarg));
                        break;
                case 'd':
                        nvl72 = true;
                        break;
                default:
                        fprintf(stderr, "usage: bench-placer [--reference-limit S] "
                                        "[--no-reference] [--seeds N] [--nvl72]\n");
                        return 2;
                }
        }
        glp_term_out(GLP_OFF);
        if (nvl72)
                return bench_nvl72(seeds);

        /* The reference sweep: exact solves of 2 to 32 servers, several seeds each. */
        printf("# exact: servers x 8 GPUs, seeds 1..%d\n", seeds);
        printf("# %-8s %-5s %10s %10s %8s %9s %9s\n", "servers", "seed", "objective", "bound",
               "gap", "seconds", "status");
        double worst_32 = 0, worst_ratio = 0;
        double exact_32_obj[64] = {0};
        for (unsigned s = 2; s <= 32; s *= 2)
                for (int seed = 1; seed <= seeds && seed <= 64; seed++) {
                        _cleanup_(place_problem_freep) struct place_problem *p = instance(s, seed);
                        struct place_result r = {};

                        if (!p || run(p, PLACE_SOLVER_EXACT, 60.0, 0, &r) != 0)
                                return 1;
                        printf("  %-8u %-5d %10.4g %10.4g %8.4f %9.3f %9s\n", s, seed,
                               r.objective, r.bound, r.gap, r.seconds,
                               place_status_names[r.status]);
                        if (s == 32) {
                                worst_32 = MAX(worst_32, r.status == PLACE_STATUS_OPTIMAL
                                                                 ? r.seconds
                                                                 : INFINITY);
                                exact_32_obj[seed - 1] = r.objective;
                        }
                        place_result_free(&r);
                }

        printf("# heuristic: servers x 8 GPUs (gap to the averaging bound)\n");
        printf("# %-8s %-5s %10s %10s %8s %9s\n", "servers", "seed", "objective", "bound", "gap",
               "seconds");
        double worst_1024 = 0;
        for (unsigned s = 32; s <= 1024; s *= 2)
                for (int seed = 1; seed <= seeds && seed <= 64; seed++) {
                        _cleanup_(place_problem_freep) struct place_problem *p = instance(s, seed);
                        struct place_result r = {};

                        if (!p || run(p, PLACE_SOLVER_HEURISTIC, 60.0, 0, &r) != 0)
                                return 1;
                        printf("  %-8u %-5d %10.4g %10.4g %8.4f %9.3f\n", s, seed, r.objective,
                               r.bound, r.gap, r.seconds);
                        if (s == 32 && exact_32_obj[seed - 1] > 0)
                                worst_ratio = MAX(worst_ratio,
                                                  r.objective / exact_32_obj[seed - 1]);
                        if (s == 1024)
                                worst_1024 = MAX(worst_1024, r.seconds);
                        place_result_free(&r);
                }

        if (reference) {
                _cleanup_(place_problem_freep) struct place_problem *p = instance(32, 1);
                struct place_result r = {};

                printf("# reference formulation (binary per model and server), 32 x 8, seed 1, "
                       "limit %.0f s\n",
                       ref_limit);
                if (p && run(p, PLACE_SOLVER_REFERENCE, ref_limit, 0, &r) == 0) {
                        printf("  objective %.4g bound %.4g gap %.4f seconds %.1f status %s; "
                               "exact optimum %.4g (incumbent/optimum %.3f)\n",
                               r.objective, r.bound, r.gap, r.seconds,
                               place_status_names[r.status], exact_32_obj[0],
                               r.objective / exact_32_obj[0]);
                        printf("reference_32x8_over_optimum %.4f\n",
                               r.objective / exact_32_obj[0]);
                        place_result_free(&r);
                } else
                        printf("  no placement within %.0f s (exact optimum %.4g)\n", ref_limit,
                               exact_32_obj[0]);
        }
        /* The configuration formulation does not grow with the number of servers. */
        for (unsigned s = 128; s <= 1024; s *= 8) {
                _cleanup_(place_problem_freep) struct place_problem *p = instance(s, 1);
                struct place_result r = {};

                if (!p || run(p, PLACE_SOLVER_EXACT, 60.0, 0, &r) != 0)
                        return 1;
                printf("# exact at %u x 8, seed 1: objective %.4g bound %.4g gap %.4f %.3f s %s\n",
                       s, r.objective, r.bound, r.gap, r.seconds, place_status_names[r.status]);
                place_result_free(&r);
        }
        /* The same 32 x 8 instances with the configurations generated as columns. */
        for (int seed = 1; seed <= seeds && seed <= 64; seed++) {
                _cleanup_(place_problem_freep) struct place_problem *p = instance(32, seed);
                struct place_result r = {};

                if (!p || run(p, PLACE_SOLVER_EXACT, 60.0, 1, &r) != 0)
                        return 1;
                printf("# exact at 32 x 8, seed %d, configurations generated as columns: "
                       "objective %.4g (enumerated: %.4g) bound %.4g gap %.4f %.3f s %s, %zu "
                       "columns\n",
                       seed, r.objective, exact_32_obj[seed - 1], r.bound, r.gap, r.seconds,
                       place_status_names[r.status], r.configurations);
                place_result_free(&r);
        }
        /* Not proven within the limit: no time to a proven optimum. */
        printf("exact_32x8_seconds %.3f\n", isfinite(worst_32) ? worst_32 : 999999.0);
        printf("heuristic_vs_exact_32x8 %.4f\n", worst_ratio);
        printf("heuristic_1024_seconds %.3f\n", worst_1024);
        return 0;
}
