/* The placer's input: YAML and profile loading, and a message naming the cause of every bad input. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "place.h"

static struct place_problem *p;
static char *error;

static void teardown(void)
{
        p = place_problem_free(p);
        free(error);
        error = NULL;
}

TestSuite(problem, .fini = teardown);

static int load_in(const char *base_dir, const char *yaml)
{
        return place_problem_load_buffer("in.yaml", yaml, strlen(yaml), base_dir, &p, &error);
}

static int load(const char *yaml)
{
        return load_in("/tmp", yaml);
}

/* Loading yaml (files it names relative to base_dir) fails with code and a message. */
static void expect_error_in(const char *base_dir, const char *yaml, int code, const char *needle)
{
        int r = load_in(base_dir, yaml);

        cr_assert_eq(r, code, "got %d (%s)", r, error ? error : "no message");
        cr_assert_not_null(error);
        cr_assert(strstr(error, needle), "message \"%s\" lacks \"%s\"", error, needle);
}

static void expect_error(const char *yaml, int code, const char *needle)
{
        expect_error_in("/tmp", yaml, code, needle);
}

Test(problem, loads_kinds_models_replicas_and_groups_interchangeable_models)
{
        cr_assert_eq(load("servers:\n"
                          "  - {kind: hgx, count: 2, gpus: 8, gpu-memory: 80GiB}\n"
                          "  - {kind: pcie, names: [a, b, c], gpus: 4, peer-groups: ['0-1', '2,3']}\n"
                          "models:\n"
                          "  - {name: v, role: producer, memory: 30GiB, count: 3}\n"
                          "  - {name: l, role: consumer, memory: 20GiB, tp: 2}\n"
                          "  - {name: w, role: producer, memory: 30GiB}\n"
                          "weights: {memory: 2, balance: 0.5}\n"),
                     0, "%s", error);
        cr_assert_eq(p->n_kinds, 2);
        cr_assert_eq(p->n_servers, 5);
        cr_assert_str_eq(p->servers[1].name, "hgx-1");
        cr_assert_str_eq(p->servers[4].name, "c");
        cr_assert_eq(p->kinds[1].peer_group[1], 0);
        cr_assert_eq(p->kinds[1].peer_group[2], 1);
        cr_assert_eq(p->n_models, 5);
        cr_assert_str_eq(p->models[2].name, "v-2");
        cr_assert_eq(p->models[3].memory, -20 * 1024);
        cr_assert_eq(p->models[3].tp, 2);
        /* v-0..2 and w are one type; l another. */
        cr_assert_eq(p->n_types, 2);
        cr_assert_eq(p->models[0].type, p->models[4].type);
        cr_assert_eq(p->types[p->models[0].type].count, 4);
        cr_assert_eq(p->types[p->models[3].type].balance, -2);
        cr_assert_float_eq(p->w_memory, 2.0, 1e-12);
        cr_assert_float_eq(p->w_balance, 0.5, 1e-12);
}

Test(problem, reads_role_memory_and_tp_from_a_profile_file)
{
        char path[] = "/tmp/aqua-profile-XXXXXX";
        int fd = mkstemp(path);
        const char *prof = "name: llama\nrole: consumer\nmemory: 12GiB\ntp: 2\n";
        char yaml[256];

        cr_assert_geq(fd, 0);
        cr_assert_eq(write(fd, prof, strlen(prof)), (ssize_t)strlen(prof));
        close(fd);
        snprintf(yaml, sizeof(yaml),
                 "servers: [{count: 1, gpus: 4}]\nmodels: [{name: a, profile: %s}]\n",
                 path + strlen("/tmp/"));
        cr_assert_eq(load(yaml), 0, "%s", error);
        cr_assert_eq(p->models[0].role, PLACE_CONSUMER);
        cr_assert_eq(p->models[0].memory, -12 * 1024);
        cr_assert_eq(p->models[0].tp, 2);
        unlink(path);
}

Test(problem, a_missing_profile_names_the_model_and_file)
{
        expect_error("servers: [{count: 1, gpus: 4}]\nmodels: [{name: a, profile: nope.yaml}]\n",
                     -ENOENT, "model 'a': cannot read profile /tmp/nope.yaml");
}

Test(problem, a_tp_group_larger_than_any_server_is_named)
{
        expect_error("servers: [{count: 4, gpus: 8}]\n"
                     "models: [{name: huge, role: consumer, memory: 1GiB, tp: 16}]\n",
                     PLACE_E_INFEASIBLE,
                     "model 'huge' fits no server: its tensor-parallel group needs 16 GPUs");
}

Test(problem, a_model_needing_larger_gpus_than_exist_is_named)
{
        expect_error("servers: [{count: 1, gpus: 8, gpu-memory: 40GiB}]\n"
                     "models: [{name: big, role: producer, memory: 1GiB, gpu-memory: 80GiB}]\n",
                     PLACE_E_INFEASIBLE, "model 'big' fits no server: it needs GPUs with 80 GiB, and the largest GPUs have 40 GiB");
}

Test(problem, a_model_whose_gpu_and_tp_needs_meet_on_no_kind_is_named)
{
        expect_error("servers:\n"
                     "  - {kind: a, count: 1, gpus: 8, gpu-memory: 40GiB}\n"
                     "  - {kind: b, count: 1, gpus: 2, gpu-memory: 80GiB}\n"
                     "models: [{name: m, role: producer, memory: 1GiB, gpu-memory: 80GiB, tp: 4}]\n",
                     PLACE_E_INFEASIBLE, "no server kind has both 4 GPUs and 80 GiB per GPU");
}

Test(problem, more_gpus_needed_than_exist)
{
        expect_error("servers: [{count: 2, gpus: 4}]\n"
                     "models: [{name: m, role: producer, memory: 1GiB, count: 9}]\n",
                     PLACE_E_INFEASIBLE,
                     "more GPUs needed than exist: the 9 models need 9 GPUs, the 2 servers have 8");
}

Test(problem, more_gpus_needed_than_the_kinds_a_model_set_may_use)
{
        expect_error("servers:\n"
                     "  - {kind: small, count: 4, gpus: 8, gpu-memory: 40GiB}\n"
                     "  - {kind: large, count: 1, gpus: 8, gpu-memory: 80GiB}\n"
                     "models: [{name: m, role: producer, memory: 1GiB, count: 3, tp: 4,\n"
                     "          gpu-memory: 80GiB}]\n",
                     PLACE_E_INFEASIBLE,
                     "the 3 models that run only on server kind 'large' need 12 GPUs, those "
                     "servers have 8");
}

Test(problem, too_many_tp_groups_over_half_a_server)
{
        expect_error("servers: [{count: 2, gpus: 8}]\n"
                     "models: [{name: m, role: consumer, memory: 1GiB, count: 3, tp: 5}]\n",
                     PLACE_E_INFEASIBLE, "3 models have tensor-parallel groups larger than half");
}

Test(problem, inconsistent_input_is_named)
{
        expect_error("servers: [{count: 2, gpus: 8}]\n"
                     "models: [{name: m, role: consumer, memory: 1GiB},\n"
                     "         {name: m, role: producer, memory: 1GiB}]\n",
                     -EINVAL, "model name 'm' appears twice");
        teardown();
        expect_error("servers: [{count: 2, names: [a, b, c], gpus: 8}]\nmodels: []\n", -EINVAL,
                     "count is 2 but 3 names are given");
        teardown();
        expect_error("servers: [{gpus: 8}]\nmodels: []\n", -EINVAL,
                     "give a count or a list of names");
        teardown();
        expect_error("servers: [{names: [a, a], gpus: 8}]\nmodels: []\n", -EINVAL,
                     "server name 'a' appears twice");
        teardown();
        expect_error("servers: [{kind: x, count: 1, gpus: 8}, {kind: x, count: 1, gpus: 4}]\n"
                     "models: []\n",
                     -EINVAL, "server kind 'x' appears twice");
        teardown();
        expect_error("servers: [{count: 1, gpus: 8}]\nmodels: [{name: m, memory: 1GiB}]\n",
                     -EINVAL, "models[0] ('m'): missing role");
        teardown();
        expect_error("servers: [{count: 1, gpus: 8}]\n"
                     "models: [{name: m, role: lender, memory: 1GiB}]\n",
                     -EINVAL, "role: expected producer or consumer, got \"lender\"");
        teardown();
        expect_error("servers: [{count: 1, gpus: 8}]\n"
                     "models: [{name: m, role: producer, memory: lots}]\n",
                     -EINVAL, "memory: expected a size such as 20GiB");
        teardown();
        expect_error("servers: [{count: 1, gpus: 8}]\n"
                     "models: [{name: m, role: producer, memory: 1GiB, profile: x.yaml}]\n",
                     -EINVAL, "give either a profile or role and memory");
        teardown();
        expect_error("servers: [{count: 1, gpus: 8}]\n"
                     "models: [{name: m, role: producer, memory: 1GiB, colour: red}]\n",
                     -EINVAL, "in.yaml:2:");
        teardown();
        expect_error("servers: [{count: 1, gpus: 8}]\n"
                     "models: [{name: m, role: producer, memory: 1GiB}]\n"
                     "weights: {memory: 0, balance: 0}\n",
                     -EINVAL, "weights must be >= 0 and not both 0");
}

Test(problem, bad_peer_groups_are_named)
{
        expect_error("servers: [{kind: h, count: 1, gpus: 4, peer-groups: ['0-2', '2-3']}]\n"
                     "models: []\n",
                     -EINVAL, "server kind 'h': GPU 2 is in two peer groups");
        teardown();
        expect_error("servers: [{kind: h, count: 1, gpus: 4, peer-groups: ['0-4']}]\nmodels: []\n",
                     -EINVAL, "names GPU 4, but its servers have GPUs 0 to 3");
        teardown();
        expect_error("servers: [{kind: h, count: 1, gpus: 4, peer-groups: ['x']}]\nmodels: []\n",
                     -EINVAL, "expected GPU numbers such as");
}

Test(problem, a_role_and_memory_sign_that_disagree_are_refused)
{
        p = place_problem_new();
        cr_assert_eq(place_problem_add_model(p, "m", PLACE_CONSUMER, 1024, 1, 0, &error), -EINVAL);
        cr_assert(strstr(error, "model 'm': a consumer's memory must be needed"), "%s", error);
}

Test(problem, the_averaging_bound_uses_all_servers)
{
        cr_assert_eq(load("servers: [{count: 4, gpus: 2}]\n"
                          "models: [{name: a, role: producer, memory: 10GiB, count: 3},\n"
                          "         {name: b, role: consumer, memory: 2GiB}]\n"),
                     0, "%s", error);
        /* memory 28 GiB over 4 servers, balance 2 over 4 servers rounds up to 1. */
        cr_assert_float_eq(place_simple_bound(p), 7.0 + 1.0, 1e-9);
}

/*
 * testdata/probe-6gpu.yaml is what `aqua-profile probe` wrote on simcuda for six GPUs with links
 * 0-1, 0-2, 1-2 (a clique), 3-4 and 4-5 (a path, which is no clique: 3 and 5 share no link).
 */
static const unsigned probe_links[][2] = {{0, 1}, {0, 2}, {1, 2}, {3, 4}, {4, 5}};

static bool probe_linked(unsigned a, unsigned b)
{
        for (size_t i = 0; i < sizeof(probe_links) / sizeof(probe_links[0]); i++)
                if ((probe_links[i][0] == a && probe_links[i][1] == b) ||
                    (probe_links[i][0] == b && probe_links[i][1] == a))
                        return true;
        return false;
}

static void expect_probe_groups(const struct place_kind *k)
{
        const unsigned *g = k->peer_group;

        cr_assert_eq(k->gpus, 6);
        cr_assert_eq(k->gpu_memory, UINT64_C(1) << 30); /* the smallest device's memory */
        cr_assert(g[0] == g[1] && g[1] == g[2]);
        cr_assert(g[3] == g[4] && g[3] != g[0]);
        cr_assert(g[5] != g[3] && g[5] != g[0]);
}

Test(problem, takes_gpus_and_peer_groups_from_a_probe_topology_file)
{
        static const char yaml[] = "servers: [{kind: sim, count: 2, topology: probe-6gpu.yaml}]\n"
                                   "models:\n"
                                   "  - {name: p, role: producer, memory: 300MiB, count: 6}\n"
                                   "  - {name: c, role: consumer, memory: 200MiB, count: 6}\n";
        struct place_options o = PLACE_OPTIONS_DEFAULT;
        struct place_result res = {};
        char path[] = "/tmp/test-placer-topology-XXXXXX";
        FILE *f;
        int fd;

        cr_assert_eq(place_problem_load_buffer("in.yaml", yaml, sizeof(yaml) - 1, "testdata", &p,
                                               &error),
                     0, "%s", error);
        expect_probe_groups(&p->kinds[0]);

        /* Pairs only ever join GPUs with a link of their own. */
        o.time_limit = 10;
        cr_assert_eq(place_solve(p, &o, &res, &error), 0, "%s", error);
        for (unsigned s = 0; s < p->n_servers; s++)
                for (unsigned i = res.pair_first[s]; i < res.pair_first[s + 1]; i++)
                        cr_assert(probe_linked(res.pairs[i].producer, res.pairs[i].consumer),
                                  "pair %u-%u has no link", res.pairs[i].producer,
                                  res.pairs[i].consumer);
        place_result_free(&res);

        /* The same machine written back in the probe's format loads into the same groups. */
        fd = mkstemp(path);
        cr_assert_geq(fd, 0);
        f = fdopen(fd, "w");
        cr_assert_not_null(f);
        fprintf(f, "# written like aqua-profile probe does\ndevices:\n");
        for (unsigned i = 0; i < 6; i++)
                fprintf(f, "  - name: \"sim A\"   # GPU %u\n    pci-bus: 0x%x\n"
                           "    memory: %llu\n",
                        i, 0x10 + i, (unsigned long long)(i == 4 ? 2ULL << 30 : 1ULL << 30));
        fprintf(f, "all-linked: false\nlinks:\n");
        for (size_t i = 0; i < sizeof(probe_links) / sizeof(probe_links[0]); i++)
                fprintf(f, "  - {a: %u, b: %u, bandwidth: 8.30GB}   # GB/s\n", probe_links[i][0],
                        probe_links[i][1]);
        cr_assert_eq(fclose(f), 0);
        teardown();
        char yaml2[256];
        snprintf(yaml2, sizeof(yaml2),
                 "servers: [{kind: sim, count: 1, gpus: 6, topology: %s}]\n"
                 "models: [{name: p, role: producer, memory: 1GiB}]\n",
                 path);
        cr_assert_eq(load(yaml2), 0, "%s", error);
        unlink(path);
        expect_probe_groups(&p->kinds[0]);
}

Test(problem, bad_topology_files_are_named)
{
        expect_error("servers: [{count: 1, gpus: 4, topology: /nonexistent/t.yaml}]\n"
                     "models: [{name: m, role: producer, memory: 1GiB}]\n",
                     -ENOENT, "/nonexistent/t.yaml");
        expect_error("servers: [{count: 1}]\nmodels: [{name: m, role: producer, memory: 1GiB}]\n",
                     -EINVAL, "missing gpus (or a topology)");
        teardown();
        static const char both[] = "servers: [{count: 1, topology: probe-6gpu.yaml, "
                                   "peer-groups: ['0-1']}]\n"
                                   "models: [{name: m, role: producer, memory: 1GiB}]\n";
        cr_assert_eq(place_problem_load_buffer("in.yaml", both, sizeof(both) - 1, "testdata", &p,
                                               &error),
                     -EINVAL);
        cr_assert(strstr(error, "peer-groups or a topology, not both"), "%s", error);
        teardown();
        static const char count[] = "servers: [{count: 1, gpus: 8, topology: probe-6gpu.yaml}]\n"
                                    "models: [{name: m, role: producer, memory: 1GiB}]\n";
        cr_assert_eq(place_problem_load_buffer("in.yaml", count, sizeof(count) - 1, "testdata",
                                               &p, &error),
                     -EINVAL);
        cr_assert(strstr(error, "gpus is 8 but topology testdata/probe-6gpu.yaml has 6 GPUs"),
                  "%s", error);
}

Test(problem, a_domain_of_hosts_is_one_server_of_all_their_gpus)
{
        cr_assert_eq(load("servers: [{kind: nvl, hosts: 18, gpus: 4, count: 2}]\n"
                          "models: [{name: m, role: producer, memory: 1GiB, tp: 8}]\n"),
                     0, "%s", error);
        cr_assert_eq(p->n_kinds, 1);
        cr_assert_eq(p->kinds[0].gpus, 72);
        cr_assert_eq(p->kinds[0].hosts, 18);
        cr_assert_eq(p->n_servers, 2);
        for (unsigned g = 0; g < 72; g++)
                cr_assert_eq(p->kinds[0].peer_group[g], 0, "the domain is one peer group");
        teardown();
        /* Peer groups, if given, number the domain's GPUs host by host. */
        cr_assert_eq(load("servers: [{hosts: 2, gpus: 4, count: 1, peer-groups: ['0-5']}]\n"
                          "models: [{name: m, role: producer, memory: 1GiB}]\n"),
                     0, "%s", error);
        cr_assert_eq(p->kinds[0].peer_group[5], 0);
        cr_assert_neq(p->kinds[0].peer_group[6], 0);
}

Test(problem, bad_domains_are_named)
{
        expect_error("servers: [{kind: big, hosts: 64, gpus: 4, count: 1}]\n"
                     "models: [{name: m, role: producer, memory: 1GiB}]\n",
                     -EINVAL, "server kind 'big': 64 hosts x 4 GPUs is more than 255 GPUs");
        teardown();
        expect_error("servers: [{kind: d, hosts: 2, gpus: 4, count: 1, peer-groups: ['0-8']}]\n"
                     "models: [{name: m, role: producer, memory: 1GiB}]\n",
                     -EINVAL, "names GPU 8, but its servers have GPUs 0 to 7");
        teardown();
        expect_error("servers: [{count: 1, hosts: 0, gpus: 4}]\n"
                     "models: [{name: m, role: producer, memory: 1GiB}]\n",
                     -EINVAL, "hosts");
        teardown();
        expect_error_in("testdata",
                        "servers: [{kind: t, count: 1, topology: probe-6gpu.yaml, hosts: 2}]\n"
                        "models: [{name: m, role: producer, memory: 1GiB}]\n",
                        -EINVAL, "server kind 't': give hosts or a topology, not both");
        teardown();
        p = place_problem_new();
        cr_assert_not_null(p);
        cr_assert_eq(place_problem_add_kind(p, "k", 6, 0, 1, NULL, NULL, &error), 0);
        cr_assert_eq(place_problem_set_hosts(p, 0, 4, &error), -EINVAL);
        cr_assert_str_eq(error, "server kind 'k': 4 hosts do not share its 6 GPUs evenly");
}
