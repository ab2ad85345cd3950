/*
 * Inside one server: which GPUs each model gets, and the one-to-one producer/consumer pairs,
 * only between GPUs that share a peer link (a peer group).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "place.h"

void place_result_free(struct place_result *r)
{
        if (!r)
                return;
        free(r->server_of);
        free(r->gpu_first);
        free(r->gpu_list);
        free(r->memory);
        free(r->balance);
        free(r->pair_first);
        free(r->pairs);
        memset(r, 0, sizeof(*r));
}

#define GPU_PAIRED (-2) /* gpu_role of a GPU already in a pair */

struct server_work {
        unsigned n_groups;
        unsigned *group_free; /* [n_groups] */
        int *group_bal;       /* [n_groups] */
        int *gpu_role;        /* [gpus]: -1 free, else the role of the model on it */
};

/* The group where a TP group of tp GPUs best evens out producers and consumers. */
static unsigned pick_group(const struct place_kind *k, const struct server_work *w, unsigned tp,
                           int bal)
{
        unsigned best = UINT32_MAX;
        int best_gain = 0;
        unsigned best_free = 0;

        (void)k;
        for (unsigned g = 0; g < w->n_groups; g++) {
                int gain;

                if (w->group_free[g] < tp)
                        continue;
                gain = abs(w->group_bal[g] + bal) - abs(w->group_bal[g]);
                /*
                 * On ties, TP groups take the best fit (leaving big holes for big groups);
                 * single GPUs the emptiest group, where a partner is still likely to come.
                 */
                if (best == UINT32_MAX || gain < best_gain ||
                    (gain == best_gain &&
                     (tp > 1 ? w->group_free[g] < best_free : w->group_free[g] > best_free))) {
                        best = g;
                        best_gain = gain;
                        best_free = w->group_free[g];
                }
        }
        return best;
}

/*
 * In a domain of several hosts, the host whose free GPUs of group g (any group: UINT32_MAX)
 * fit a TP group of tp most tightly, or UINT32_MAX for no host to keep to (one host, a single
 * GPU, or no host with room: then the TP group spans hosts over the NVLink fabric).
 */
static unsigned pick_host(const struct place_kind *k, const struct server_work *w, unsigned g,
                          unsigned tp)
{
        unsigned per_host = k->gpus / k->hosts, best = UINT32_MAX, best_free = 0;

        if (k->hosts == 1 || tp == 1)
                return UINT32_MAX;
        for (unsigned h = 0; h < k->hosts; h++) {
                unsigned n_free = 0;

                for (unsigned gpu = h * per_host; gpu < (h + 1) * per_host; gpu++)
                        n_free +=
                            w->gpu_role[gpu] < 0 && (g == UINT32_MAX || k->peer_group[gpu] == g);
                if (n_free >= tp && (best == UINT32_MAX || n_free < best_free)) {
                        best = h;
                        best_free = n_free;
                }
        }
        return best;
}

/*
 * Pair the free producers and consumers of group g within each span of GPUs (a host's, or
 * the whole server's), lowest producer with lowest consumer; paired GPUs are marked.
 */
static void pair_group(const struct place_kind *k, struct server_work *w, unsigned g, unsigned span,
                       unsigned s, struct place_result *r)
{
        for (unsigned first = 0; first < k->gpus; first += span) {
                unsigned end = first + span, prod = first, cons = first;

                for (;;) {
                        while (prod < end &&
                               (k->peer_group[prod] != g || w->gpu_role[prod] != PLACE_PRODUCER))
                                prod++;
                        while (cons < end &&
                               (k->peer_group[cons] != g || w->gpu_role[cons] != PLACE_CONSUMER))
                                cons++;
                        if (prod >= end || cons >= end)
                                break;
                        r->pairs[r->pair_first[s + 1]++] =
                            (struct place_gpu_pair){.producer = prod, .consumer = cons};
                        w->gpu_role[prod] = w->gpu_role[cons] = GPU_PAIRED;
                }
        }
}

static int cmp_by_tp(const void *a, const void *b, void *arg)
{
        const struct place_problem *p = arg;
        unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;

        if (p->models[x].tp != p->models[y].tp)
                return p->models[x].tp > p->models[y].tp ? -1 : 1;
        return x < y ? -1 : x > y;
}

/*
 * After the TP groups (sorted first), alternate single-GPU producers and consumers, starting
 * with the role the TP groups left short, so that each lands where the other role waits.
 */
static void interleave_singles(const struct place_problem *p, unsigned *members, unsigned n)
{
        unsigned first = 0, n_prod = 0, n_cons = 0, k;
        int bal = 0;

        while (first < n && p->models[members[first]].tp > 1) {
                const struct place_model *m = &p->models[members[first]];
                bal += m->role == PLACE_PRODUCER ? (int)m->tp : -(int)m->tp;
                first++;
        }
        unsigned prod[PLACE_MAX_GPUS], cons[PLACE_MAX_GPUS];
        for (k = first; k < n; k++) {
                if (p->models[members[k]].role == PLACE_PRODUCER)
                        prod[n_prod++] = members[k];
                else
                        cons[n_cons++] = members[k];
        }
        unsigned ip = 0, ic = 0;
        bool want_producer = bal <= 0;
        for (k = first; k < n; k++) {
                if ((want_producer && ip < n_prod) || ic == n_cons)
                        members[k] = prod[ip++];
                else
                        members[k] = cons[ic++];
                want_producer = !want_producer;
        }
}

static void lay_out_server(const struct place_problem *p, unsigned s, unsigned *members,
                           unsigned n_members, struct server_work *w, struct place_result *r)
{
        const struct place_kind *k = &p->kinds[p->servers[s].kind];

        w->n_groups = 0;
        for (unsigned i = 0; i < k->gpus; i++)
                w->n_groups = MAX(w->n_groups, k->peer_group[i] + 1);
        memset(w->group_free, 0, w->n_groups * sizeof(unsigned));
        memset(w->group_bal, 0, w->n_groups * sizeof(int));
        for (unsigned i = 0; i < k->gpus; i++) {
                w->group_free[k->peer_group[i]]++;
                w->gpu_role[i] = -1;
        }

        qsort_r(members, n_members, sizeof(unsigned), cmp_by_tp, (void *)p);
        interleave_singles(p, members, n_members);
        for (unsigned n = 0; n < n_members; n++) {
                unsigned i = members[n];
                const struct place_model *m = &p->models[i];
                int bal = m->role == PLACE_PRODUCER ? (int)m->tp : -(int)m->tp;
                unsigned g = pick_group(k, w, m->tp, bal), got = 0;
                unsigned h = pick_host(k, w, g, m->tp), per_host = k->gpus / k->hosts;

                if (g == UINT32_MAX)
                        r->n_split_tp++;
                /*
                 * Lowest free GPUs of the chosen group (and host, in a domain), or of any group
                 * when none has room.
                 */
                for (unsigned gpu = h == UINT32_MAX ? 0 : h * per_host;
                     gpu < (h == UINT32_MAX ? k->gpus : (h + 1) * per_host) && got < m->tp; gpu++) {
                        if (w->gpu_role[gpu] >= 0 || (g != UINT32_MAX && k->peer_group[gpu] != g))
                                continue;
                        w->gpu_role[gpu] = m->role;
                        w->group_free[k->peer_group[gpu]]--;
                        w->group_bal[k->peer_group[gpu]] += bal > 0 ? 1 : -1;
                        r->gpu_list[r->gpu_first[i] + got++] = gpu;
                }
        }

        /* Pair within each group, within each host first in a domain. */
        for (unsigned g = 0; g < w->n_groups; g++)
                pair_group(k, w, g, k->gpus / k->hosts, s, r);
        for (unsigned g = 0; k->hosts > 1 && g < w->n_groups; g++)
                pair_group(k, w, g, k->gpus, s, r);
}

int place_layout(const struct place_problem *p, const unsigned *server_of,
                 struct place_result *r)
{
        _cleanup_free_ unsigned *order = NULL, *start = NULL;
        _cleanup_free_ unsigned *group_free = NULL;
        _cleanup_free_ int *group_bal = NULL, *gpu_role = NULL;
        size_t total_gpus = 0, used = 0;

        for (unsigned i = 0; i < p->n_kinds; i++)
                total_gpus = MAX(total_gpus, p->kinds[i].gpus);
        r->server_of = malloc((p->n_models + 1) * sizeof(unsigned));
        r->gpu_first = malloc((p->n_models + 1) * sizeof(unsigned));
        r->memory = calloc(p->n_servers, sizeof(int64_t));
        r->balance = calloc(p->n_servers, sizeof(int));
        r->pair_first = calloc(p->n_servers + 1, sizeof(unsigned));
        order = malloc((p->n_models + 1) * sizeof(unsigned));
        start = calloc(p->n_servers + 1, sizeof(unsigned));
        group_free = calloc(total_gpus, sizeof(unsigned));
        group_bal = calloc(total_gpus, sizeof(int));
        gpu_role = calloc(total_gpus, sizeof(int));
        if (!r->server_of || !r->gpu_first || !r->memory || !r->balance || !r->pair_first ||
            !order || !start || !group_free || !group_bal || !gpu_role)
                return -ENOMEM;
        memcpy(r->server_of, server_of, p->n_models * sizeof(unsigned));
        for (unsigned i = 0; i < p->n_models; i++) {
                const struct place_model *m = &p->models[i];

                r->gpu_first[i] = (unsigned)used;
                used += m->tp;
                r->memory[server_of[i]] += m->memory;
                r->balance[server_of[i]] += m->role == PLACE_PRODUCER ? (int)m->tp : -(int)m->tp;
                start[server_of[i] + 1]++;
        }
        r->gpu_first[p->n_models] = (unsigned)used;
        r->gpu_list = calloc(used + 1, sizeof(unsigned));
        r->pairs = calloc(used / 2 + 1, sizeof(*r->pairs));
        if (!r->gpu_list || !r->pairs)
                return -ENOMEM;
        /* Models grouped by server: a counting sort. */
        for (unsigned s = 0; s < p->n_servers; s++)
                start[s + 1] += start[s];
        {
                _cleanup_free_ unsigned *fill = malloc((p->n_servers + 1) * sizeof(unsigned));
                if (!fill)
                        return -ENOMEM;
                memcpy(fill, start, (p->n_servers + 1) * sizeof(unsigned));
                for (unsigned i = 0; i < p->n_models; i++)
                        order[fill[server_of[i]]++] = i;
        }

        struct server_work w = {.group_free = group_free, .group_bal = group_bal,
                                .gpu_role = gpu_role};
        r->n_split_tp = 0;
        for (unsigned s = 0; s < p->n_servers; s++) {
                r->pair_first[s + 1] = r->pair_first[s];
                lay_out_server(p, s, order + start[s], start[s + 1] - start[s], &w, r);
        }
        return 0;
}
