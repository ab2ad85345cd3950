/* aqua-place: place models on a cluster's servers from a YAML description; see placer/README.md. */
#include <errno.h>
#include <getopt.h>
#include <glpk.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "parse-util.h"
#include "place.h"
#include "time-util.h"

static void help(void)
{
        printf("Usage: aqua-place [OPTIONS] INPUT.yaml\n"
               "Place models on servers so that each server's producers can lend what its\n"
               "consumers need, one producer GPU per consumer GPU.\n\n"
               "  -o, --output FILE         write the placement to FILE (default: stdout)\n"
               "  -p, --pairs-dir DIR       also write DIR/<server>.yaml: that server's pairs,\n"
               "                            for aquad\n"
               "  -s, --solver NAME         auto (default), exact, heuristic, reference\n"
               "  -t, --time-limit TIME     stop the search after TIME (default 60s; 0: none)\n"
               "      --memory-weight W     objective weight per GiB of memory imbalance\n"
               "      --balance-weight W    objective weight per GPU of role imbalance\n"
               "      --seed N              heuristic restarts' seed (default 1)\n"
               "      --max-configurations N  exact: enumerate at most N server configurations,\n"
               "                            generate them as columns above (default 400000)\n"
               "  -v, --verbose             show the solver's progress on stderr\n"
               "  -h, --help                show this help\n"
               "      --version             print the version\n");
}

/* GLPK prints to stdout, where the placement may be going: send it to stderr. */
static int glpk_to_stderr(void *info, const char *s)
{
        (void)info;
        fputs(s, stderr);
        return 1;
}

int main(int argc, char **argv)
{
        enum { ARG_MEMORY_WEIGHT = 0x100, ARG_BALANCE_WEIGHT, ARG_SEED, ARG_MAX_CONFIGURATIONS };
        static const struct option options[] = {
                {"output", required_argument, NULL, 'o'},
                {"pairs-dir", required_argument, NULL, 'p'},
                {"solver", required_argument, NULL, 's'},
                {"time-limit", required_argument, NULL, 't'},
                {"memory-weight", required_argument, NULL, ARG_MEMORY_WEIGHT},
                {"balance-weight", required_argument, NULL, ARG_BALANCE_WEIGHT},
                {"seed", required_argument, NULL, ARG_SEED},
                {"max-configurations", required_argument, NULL, ARG_MAX_CONFIGURATIONS},
                {"verbose", no_argument, NULL, 'v'},
                {"help", no_argument, NULL, 'h'},
                {"version", no_argument, NULL, 'V'},
                {},
        };
        _cleanup_(place_problem_freep) struct place_problem *p = NULL;
        struct place_options o = PLACE_OPTIONS_DEFAULT;
        struct place_result res = {};
        _cleanup_free_ char *error = NULL;
        const char *output = NULL, *pairs_dir = NULL;
        double w_mem = -1, w_bal = -1;
        uint64_t ns;
        int64_t seed;
        int c, r;

        log_setup("aqua-place", LOG_LEVEL_INFO);
        while ((c = getopt_long(argc, argv, "o:p:s:t:vh", options, NULL)) >= 0) {
                switch (c) {
                case 'o':
                        output = optarg;
                        break;
                case 'p':
                        pairs_dir = optarg;
                        break;
                case 's':
                        o.solver = _PLACE_SOLVER_INVALID;
                        for (int i = 0; place_solver_names[i]; i++)
                                if (strcmp(optarg, place_solver_names[i]) == 0)
                                        o.solver = i;
                        if (o.solver < 0) {
                                log_error("--solver: expected auto, exact, heuristic or "
                                          "reference, got '%s'",
                                          optarg);
                                return 2;
                        }
                        break;
                case 't':
                        if (parse_duration(optarg, &ns) < 0) {
                                log_error("--time-limit: expected a duration such as 30s, "
                                          "got '%s'",
                                          optarg);
                                return 2;
                        }
                        o.time_limit = (double)ns / 1e9;
                        break;
                case ARG_MEMORY_WEIGHT:
                case ARG_BALANCE_WEIGHT: {
                        double w;
                        if (parse_double(optarg, &w) < 0 || w < 0) {
                                log_error("%s: expected a number >= 0, got '%s'",
                                          c == ARG_MEMORY_WEIGHT ? "--memory-weight"
                                                                 : "--balance-weight",
                                          optarg);
                                return 2;
                        }
                        *(c == ARG_MEMORY_WEIGHT ? &w_mem : &w_bal) = w;
                        break;
                }
                case ARG_SEED:
                        if (parse_int64(optarg, 0, &seed) < 0 || seed < 0) {
                                log_error("--seed: expected a number >= 0, got '%s'", optarg);
                                return 2;
                        }
                        o.seed = (unsigned long)seed;
                        break;
                case ARG_MAX_CONFIGURATIONS:
                        if (parse_int64(optarg, 0, &seed) < 0 || seed < 1) {
                                log_error("--max-configurations: expected a number >= 1, got "
                                          "'%s'",
                                          optarg);
                                return 2;
                        }
                        o.max_configurations = (size_t)seed;
                        break;
                case 'v':
                        o.verbose = true;
                        log_set_max_level(LOG_LEVEL_DEBUG);
                        break;
                case 'h':
                        help();
                        return 0;
                case 'V':
                        printf("aqua-place %s\n", AQUA_PACKAGE_VERSION);
                        return 0;
                default:
                        return 2;
                }
        }
        if (optind != argc - 1) {
                log_error("expected one input file; see --help");
                return 2;
        }
        glp_term_hook(glpk_to_stderr, NULL);

        r = place_problem_load(argv[optind], &p, &error);
        if (r != 0) {
                log_error("%s", error ? error : strerror(-r));
                return 1;
        }
        if (w_mem >= 0)
                p->w_memory = w_mem;
        if (w_bal >= 0)
                p->w_balance = w_bal;
        if (p->w_memory + p->w_balance <= 0) {
                log_error("the memory and balance weights cannot both be 0");
                return 2;
        }

        r = place_solve(p, &o, &res, &error);
        if (r != 0) {
                log_error("%s", error ? error : strerror(-r));
                return 1;
        }
        log_info("%s: %s, objective %.6g (memory %.6g GiB, roles %d), gap %.2f%%, %.2f s",
                 place_solver_names[res.solver], place_status_names[res.status], res.objective,
                 (double)res.max_memory / 1024.0, res.max_balance, 100.0 * res.gap, res.seconds);
        if (res.n_split_tp)
                log_warning("%u tensor-parallel groups span GPUs without a common peer link",
                            res.n_split_tp);

        if (output && strcmp(output, "-") != 0) {
                FILE *f = fopen(output, "we");
                if (!f) {
                        r = log_error_errno(errno, "Failed to open %s: %m", output);
                        goto out;
                }
                r = place_write_yaml(f, p, &res);
                if (fclose(f) != 0 && r == 0)
                        r = -errno;
                if (r < 0) {
                        log_error_errno(r, "Failed to write %s: %m", output);
                        goto out;
                }
        } else {
                r = place_write_yaml(stdout, p, &res);
                if (r < 0) {
                        log_error_errno(r, "Failed to write the placement: %m");
                        goto out;
                }
        }
        if (pairs_dir) {
                r = place_write_pairs(pairs_dir, p, &res, &error);
                if (r < 0)
                        log_error("%s", error ? error : strerror(-r));
        }
out:
        place_result_free(&res);
        return r < 0 ? 1 : 0;
}
