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
