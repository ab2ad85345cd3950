/* Shared by the placer's tests: random instances and a checker for any placement. */
#pragma once

#include <criterion/criterion.h>
#include <stdlib.h>

#include "place.h"

/* Servers of one kind; models with sizes from a seed, some with TP 2. */
static inline struct place_problem *random_instance(unsigned servers, unsigned gpus,
                                                    unsigned long seed, bool with_tp)
{
        static const int prod[] = {30, 20, 40, 35, 15}, cons[] = {20, 10, 30};
        struct place_problem *p = place_problem_new();
        unsigned long x = seed * 2862933555777941757UL + 3037000493UL;
        unsigned used = 0;
        char name[32];

        cr_assert_not_null(p);
        cr_assert_eq(place_problem_add_kind(p, "k", gpus, 0, servers, NULL, NULL, NULL), 0);
        for (unsigned i = 0; used < servers * gpus; i++) {
                unsigned tp;
                bool producer;
                int gib;

                x = x * 6364136223846793005UL + 1442695040888963407UL;
                producer = (x >> 40) & 1;
                gib = producer ? prod[(x >> 20) % 5] : cons[(x >> 20) % 3];
                tp = with_tp && ((x >> 50) % 4 == 0) && used + 2 <= servers * gpus ? 2 : 1;
                snprintf(name, sizeof(name), "m%u", i);
                cr_assert_eq(place_problem_add_model(p, name,
                                                     producer ? PLACE_PRODUCER : PLACE_CONSUMER,
                                                     (producer ? gib : -gib) * 1024 * (int)tp, tp,
                                                     0, NULL),
                             0);
                used += tp;
        }
        return p;
}

/* Every model on one allowed server, no server over its GPUs, measures as reported. */
static inline void check_assignment(const struct place_problem *p, const unsigned *server_of)
{
        unsigned *used = calloc(p->n_servers, sizeof(unsigned));

        cr_assert_not_null(used);
        for (unsigned i = 0; i < p->n_models; i++) {
                unsigned s = server_of[i];
                cr_assert_lt(s, p->n_servers);
                cr_assert(p->types[p->models[i].type].kinds & (UINT64_C(1) << p->servers[s].kind),
                          "model %s on a server kind it does not fit", p->models[i].name);
                used[s] += p->models[i].tp;
        }
        for (unsigned s = 0; s < p->n_servers; s++)
                cr_assert_leq(used[s], p->kinds[p->servers[s].kind].gpus, "server %s overfull",
                              p->servers[s].name);
        free(used);
}
