/* GPUs and pairs inside a server, and the output files aquad reads back. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf.h"
#include "place.h"

struct pair {
        int64_t producer, consumer;
};
struct pairs_file {
        struct pair *pairs;
        size_t n_pairs;
};
static const struct conf_field pair_fields[] = {
        CONF_FIELD_INT(struct pair, producer, "producer", 0, 254, CONF_REQUIRED),
        CONF_FIELD_INT(struct pair, consumer, "consumer", 0, 254, CONF_REQUIRED),
        CONF_FIELD_END,
};
static const struct conf_schema pair_schema = {"pair", pair_fields};
static const struct conf_field pairs_fields[] = {
        CONF_FIELD_LIST(struct pairs_file, pairs, n_pairs, "pairs", CONF_ELEM_STRUCT(&pair_schema),
                        0, CONF_REQUIRED),
        CONF_FIELD_END,
};
static const struct conf_schema pairs_schema = {"pairs", pairs_fields};

static const char *input =
        "servers: [{kind: node, count: 1, gpus: 8, peer-groups: ['0-3', '4-7']}]\n"
        "models:\n"
        "  - {name: llm, role: consumer, memory: 40GiB, tp: 2}\n"
        "  - {name: c, role: consumer, memory: 10GiB, count: 2}\n"
        "  - {name: v, role: producer, memory: 20GiB, count: 3}\n"
        "  - {name: a, role: producer, memory: 5GiB}\n";

Test(layout, pairs_are_one_to_one_and_only_within_peer_groups)
{
        _cleanup_(place_problem_freep) struct place_problem *p = NULL;
        struct place_options o = PLACE_OPTIONS_DEFAULT;
        struct place_result r = {};
        char *error = NULL;
        unsigned owner[8];

        cr_assert_eq(place_problem_load_buffer("in", input, strlen(input), NULL, &p, &error), 0,
                     "%s", error);
        cr_assert_eq(place_solve(p, &o, &r, &error), 0, "%s", error);
        memset(owner, 0xff, sizeof(owner));
        for (unsigned i = 0; i < p->n_models; i++) {
                unsigned g0 = r.gpu_list[r.gpu_first[i]];
                for (unsigned g = r.gpu_first[i]; g < r.gpu_first[i + 1]; g++) {
                        unsigned gpu = r.gpu_list[g];
                        cr_assert_lt(gpu, 8);
                        cr_assert_eq(owner[gpu], UINT32_MAX, "GPU %u given twice", gpu);
                        owner[gpu] = i;
                        /* A TP group stays inside one peer group. */
                        cr_assert_eq(gpu / 4, g0 / 4);
                }
        }
        cr_assert_eq(r.n_split_tp, 0);
        /* 4 producer and 4 consumer GPUs, split evenly across the groups: 4 pairs. */
        cr_assert_eq(r.pair_first[1] - r.pair_first[0], 4);
        bool used[8] = {false};
        for (unsigned k = r.pair_first[0]; k < r.pair_first[1]; k++) {
                unsigned pr = r.pairs[k].producer, co = r.pairs[k].consumer;
                cr_assert_eq(p->models[owner[pr]].role, PLACE_PRODUCER);
                cr_assert_eq(p->models[owner[co]].role, PLACE_CONSUMER);
                cr_assert_eq(pr / 4, co / 4, "pair %u-%u without a peer link", pr, co);
                cr_assert(!used[pr] && !used[co]);
                used[pr] = used[co] = true;
        }
        place_result_free(&r);
        free(error);
}

Test(layout, unlinked_gpus_stay_unpaired)
{
        _cleanup_(place_problem_freep) struct place_problem *p = NULL;
        struct place_options o = PLACE_OPTIONS_DEFAULT;
        struct place_result r = {};
        const char *in = "servers: [{count: 1, gpus: 2, peer-groups: ['0']}]\n"
                         "models: [{name: a, role: producer, memory: 1GiB},\n"
                         "         {name: b, role: consumer, memory: 1GiB}]\n";

        cr_assert_eq(place_problem_load_buffer("in", in, strlen(in), NULL, &p, NULL), 0);
        cr_assert_eq(place_solve(p, &o, &r, NULL), 0);
        cr_assert_eq(r.pair_first[1], 0);
        place_result_free(&r);
}

Test(layout, aquad_can_load_the_pairs_files_and_the_output_is_yaml)
{
        _cleanup_(place_problem_freep) struct place_problem *p = NULL;
        struct place_options o = PLACE_OPTIONS_DEFAULT;
        struct place_result r = {};
        struct pairs_file pf = {};
        char dir[] = "/tmp/aqua-pairs-XXXXXX", path[128], *error = NULL, *buf = NULL;
        size_t len = 0;
        FILE *f;

        cr_assert_eq(place_problem_load_buffer("in", input, strlen(input), NULL, &p, &error), 0,
                     "%s", error);
        cr_assert_eq(place_solve(p, &o, &r, &error), 0, "%s", error);
        cr_assert_not_null(mkdtemp(dir));
        cr_assert_eq(place_write_pairs(dir, p, &r, &error), 0, "%s", error);
        snprintf(path, sizeof(path), "%s/node-0.yaml", dir);
        cr_assert_eq(conf_load(&pairs_schema, path, &pf, &error), 0, "%s", error);
        cr_assert_eq(pf.n_pairs, r.pair_first[1] - r.pair_first[0]);
        for (size_t k = 0; k < pf.n_pairs; k++) {
                cr_assert_eq(pf.pairs[k].producer, r.pairs[k].producer);
                cr_assert_eq(pf.pairs[k].consumer, r.pairs[k].consumer);
        }
        conf_free(&pairs_schema, &pf);
        unlink(path);
        rmdir(dir);

        /* The full output parses as YAML and names every model. */
        f = open_memstream(&buf, &len);
        cr_assert_eq(place_write_yaml(f, p, &r), 0);
        fclose(f);
        cr_assert(strstr(buf, "status: optimal\n"));
        cr_assert(strstr(buf, "  - model: \"llm\"\n    role: consumer\n    server: \"node-0\"\n"));
        free(buf);
        place_result_free(&r);
        free(error);
}

Test(layout, refuses_server_names_that_are_not_file_names)
{
        _cleanup_(place_problem_freep) struct place_problem *p = NULL;
        struct place_options o = PLACE_OPTIONS_DEFAULT;
        struct place_result r = {};
        const char *in = "servers: [{names: ['../x'], gpus: 2}]\n"
                         "models: [{name: a, role: producer, memory: 1GiB}]\n";
        char *error = NULL;

        cr_assert_eq(place_problem_load_buffer("in", in, strlen(in), NULL, &p, NULL), 0);
        cr_assert_eq(place_solve(p, &o, &r, NULL), 0);
        cr_assert_eq(place_write_pairs("/tmp", p, &r, &error), -EINVAL);
        cr_assert(strstr(error, "server name '../x' cannot be a file name"), "%s", error);
        free(error);
        place_result_free(&r);
}

/*
 * testdata/nvl72.yaml: two NVL72 domains (18 hosts x 4 GPUs each, one peer group), TP 4 and
 * TP 2 groups and single GPUs. TP groups stay inside a host; each host pairs what it can
 * inside itself before any pair crosses hosts over the fabric.
 */
Test(layout, a_domain_keeps_tp_groups_and_pairs_within_hosts_first)
{
        _cleanup_(place_problem_freep) struct place_problem *p = NULL;
        struct place_options o = PLACE_OPTIONS_DEFAULT;
        struct place_result r = {};
        char *error = NULL, *buf = NULL;
        size_t len = 0, crossing = 0;
        FILE *f;

        cr_assert_eq(place_problem_load("testdata/nvl72.yaml", &p, &error), 0, "%s", error);
        cr_assert_eq(p->kinds[0].gpus, 72);
        cr_assert_eq(place_solve(p, &o, &r, &error), 0, "%s", error);
        cr_assert_eq(r.n_split_tp, 0);
        for (unsigned s = 0; s < p->n_servers; s++) {
                int role[72];
                unsigned prod[18] = {0}, cons[18] = {0}, same[18] = {0}, n_prod = 0, n_cons = 0;

                for (unsigned g = 0; g < 72; g++)
                        role[g] = -1;
                for (unsigned i = 0; i < p->n_models; i++) {
                        unsigned g0 = r.gpu_list[r.gpu_first[i]];

                        if (r.server_of[i] != s)
                                continue;
                        for (unsigned g = r.gpu_first[i]; g < r.gpu_first[i + 1]; g++) {
                                unsigned gpu = r.gpu_list[g];

                                cr_assert_lt(gpu, 72);
                                cr_assert_eq(role[gpu], -1, "GPU %u given twice", gpu);
                                role[gpu] = (int)p->models[i].role;
                                cr_assert_eq(gpu / 4, g0 / 4, "%s spans hosts", p->models[i].name);
                                if (p->models[i].role == PLACE_PRODUCER)
                                        prod[gpu / 4]++, n_prod++;
                                else
                                        cons[gpu / 4]++, n_cons++;
                        }
                }
                cr_assert_eq(r.pair_first[s + 1] - r.pair_first[s], MIN(n_prod, n_cons),
                             "the whole domain pairs as one peer group");
                for (unsigned k = r.pair_first[s]; k < r.pair_first[s + 1]; k++) {
                        unsigned pr = r.pairs[k].producer, co = r.pairs[k].consumer;

                        cr_assert_eq(role[pr], PLACE_PRODUCER);
                        cr_assert_eq(role[co], PLACE_CONSUMER);
                        role[pr] = role[co] = -2;
                        if (pr / 4 == co / 4)
                                same[pr / 4]++;
                        else
                                crossing++;
                }
                for (unsigned h = 0; h < 18; h++)
                        cr_assert_eq(same[h], MIN(prod[h], cons[h]), "server %u host %u", s, h);
        }
        cr_assert_gt(crossing, 0, "TP 4 consumers fill hosts: some pairs must cross");

        f = open_memstream(&buf, &len);
        cr_assert_eq(place_write_yaml(f, p, &r), 0);
        fclose(f);
        cr_assert(strstr(buf, "    hosts: 18\n    gpus-per-host: 4\n"), "%s", buf);
        cr_assert(strstr(buf, "    gpus: [4, 5, 6, 7]\n    hosts: [1]\n"), "%s", buf);
        cr_assert(strstr(buf, "   # host "), "%s", buf);
        free(buf);
        place_result_free(&r);
        free(error);
}

/* Load the input and place it with the default options. */
static void place_text(const char *in, struct place_problem **ret_p, struct place_result *ret_r)
{
        struct place_options o = PLACE_OPTIONS_DEFAULT;
        _cleanup_free_ char *error = NULL;

        cr_assert_eq(place_problem_load_buffer("in", in, strlen(in), NULL, ret_p, &error), 0, "%s",
                     error);
        cr_assert_eq(place_solve(*ret_p, &o, ret_r, &error), 0, "%s", error);
}

/* Lowest producer with lowest consumer would pair GPU 0 (host 0) with GPU 2 (host 1). */
Test(layout, a_domain_pairs_within_a_host_before_the_lowest_gpus_across_hosts)
{
        _cleanup_(place_problem_freep) struct place_problem *p = NULL;
        struct place_result r = {};

        place_text("servers: [{kind: d, count: 1, hosts: 2, gpus: 2}]\n"
                   "models: [{name: tp, role: producer, memory: 2GiB, tp: 2},\n"
                   "         {name: p, role: producer, memory: 1GiB},\n"
                   "         {name: c, role: consumer, memory: 1GiB}]\n",
                   &p, &r);
        cr_assert_eq(r.gpu_list[r.gpu_first[0]] / 2, 0, "the TP group on host 0");
        cr_assert_eq(r.gpu_list[r.gpu_first[1]], 3);
        cr_assert_eq(r.gpu_list[r.gpu_first[2]], 2);
        cr_assert_eq(r.pair_first[1], 1);
        cr_assert_eq(r.pairs[0].producer, 3);
        cr_assert_eq(r.pairs[0].consumer, 2);
        place_result_free(&r);
}

/* Lowest free GPUs would give the TP 2 group GPUs 3 and 4, on two hosts. */
Test(layout, a_domain_puts_a_tp_group_on_the_host_it_fits)
{
        _cleanup_(place_problem_freep) struct place_problem *p = NULL;
        struct place_result r = {};

        place_text("servers: [{kind: d, count: 1, hosts: 2, gpus: 4}]\n"
                   "models: [{name: three, role: consumer, memory: 3GiB, tp: 3},\n"
                   "         {name: two, role: producer, memory: 2GiB, tp: 2}]\n",
                   &p, &r);
        cr_assert_eq(r.gpu_list[r.gpu_first[0]], 0);
        cr_assert_eq(r.gpu_list[r.gpu_first[0] + 2], 2);
        cr_assert_eq(r.gpu_list[r.gpu_first[1]], 4);
        cr_assert_eq(r.gpu_list[r.gpu_first[1] + 1], 5);
        place_result_free(&r);
}
