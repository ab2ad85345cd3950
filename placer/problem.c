/*
 * The placement problem: building it, checking what can be seen without solving, grouping
 * interchangeable models into types, and measuring assignments.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parse-util.h"
#include "place.h"

const char *const place_role_names[] = {"producer", "consumer", NULL};
const char *const place_solver_names[] = {"auto", "exact", "heuristic", "reference", NULL};
const char *const place_status_names[] = {"optimal", "feasible", NULL};

int place_error(char **ret_error, int r, const char *fmt, ...)
{
        va_list ap;
        char *msg = NULL;

        va_start(ap, fmt);
        if (vasprintf(&msg, fmt, ap) < 0)
                msg = NULL;
        va_end(ap);
        if (ret_error) {
                free(*ret_error);
                *ret_error = msg;
        } else
                free(msg);
        return r;
}

double place_now(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct place_problem *place_problem_new(void)
{
        struct place_problem *p = calloc(1, sizeof(*p));

        if (!p)
                return NULL;
        p->w_memory = 1.0;
        p->w_balance = 1.0;
        return p;
}

struct place_problem *place_problem_free(struct place_problem *p)
{
        if (!p)
                return NULL;
        for (unsigned i = 0; i < p->n_kinds; i++) {
                free(p->kinds[i].name);
                free(p->kinds[i].peer_group);
        }
        for (unsigned i = 0; i < p->n_servers; i++)
                free(p->servers[i].name);
        for (unsigned i = 0; i < p->n_models; i++)
                free(p->models[i].name);
        free(p->kinds);
        free(p->servers);
        free(p->models);
        free(p->types);
        free(p);
        return NULL;
}

/* Grow an array by one element, zeroed; capacity doubles at powers of two. */
static void *grow(void *array, unsigned n, size_t size)
{
        void *a;

        if (n & (n - 1)) /* not a power of two: there is room */
                return array;
        a = realloc(array, (n ? 2 * (size_t)n : 1) * size);
        return a;
}

int place_problem_add_kind(struct place_problem *p, const char *name, unsigned gpus,
                           uint64_t gpu_memory, unsigned count, char *const *names,
                           const unsigned *peer_groups, char **ret_error)
{
        struct place_kind *k;
        void *a;

        if (!p || !name || p->finished)
                return -EINVAL;
        if (p->n_kinds >= PLACE_MAX_KINDS)
                return place_error(ret_error, -EINVAL, "too many server kinds (at most %d)",
                            PLACE_MAX_KINDS);
        if (gpus < 1 || gpus > PLACE_MAX_GPUS)
                return place_error(ret_error, -EINVAL, "server kind '%s': %u GPUs per server (1 to %d)",
                            name, gpus, PLACE_MAX_GPUS);
        if (count < 1)
                return place_error(ret_error, -EINVAL, "server kind '%s' has no servers", name);
        for (unsigned i = 0; i < p->n_kinds; i++)
                if (strcmp(p->kinds[i].name, name) == 0)
                        return place_error(ret_error, -EINVAL, "server kind '%s' appears twice", name);
        if (count > (unsigned)INT32_MAX - p->n_servers)
                return -E2BIG;

        a = grow(p->kinds, p->n_kinds, sizeof(*p->kinds));
        if (!a)
                return -ENOMEM;
        p->kinds = a;
        k = &p->kinds[p->n_kinds];
        *k = (struct place_kind){.gpus = gpus, .gpu_memory = gpu_memory, .n_servers = count,
                                 .first_server = p->n_servers, .hosts = 1};
        k->name = strdup(name);
        k->peer_group = calloc(gpus, sizeof(unsigned));
        if (!k->name || !k->peer_group) {
                free(k->name);
                free(k->peer_group);
                return -ENOMEM;
        }
        if (peer_groups)
                memcpy(k->peer_group, peer_groups, gpus * sizeof(unsigned));
        p->n_kinds++;

        a = realloc(p->servers, ((size_t)p->n_servers + count) * sizeof(*p->servers));
        if (!a)
                return -ENOMEM;
        p->servers = a;
        for (unsigned i = 0; i < count; i++) {
                struct place_server *s = &p->servers[p->n_servers];
                char *n = NULL;

                if (names)
                        n = strdup(names[i]);
                else if (asprintf(&n, "%s-%u", name, i) < 0)
                        n = NULL;
                if (!n)
                        return -ENOMEM;
                *s = (struct place_server){.name = n, .kind = p->n_kinds - 1};
                p->n_servers++;
        }
        return 0;
}

int place_problem_set_hosts(struct place_problem *p, unsigned kind, unsigned hosts,
                            char **ret_error)
{
        struct place_kind *k;

        if (!p || kind >= p->n_kinds || p->finished)
                return -EINVAL;
        k = &p->kinds[kind];
        if (hosts < 1 || k->gpus % hosts != 0)
                return place_error(ret_error, -EINVAL,
                            "server kind '%s': %u hosts do not share its %u GPUs evenly",
                            k->name, hosts, k->gpus);
        k->hosts = hosts;
        return 0;
}

int place_problem_add_model(struct place_problem *p, const char *name, enum place_role role,
                            int64_t memory_mib, unsigned tp, uint64_t gpu_memory,
                            char **ret_error)
{
        struct place_model *m;
        void *a;

        if (!p || !name || p->finished || role < 0 || role >= _PLACE_ROLE_MAX)
                return -EINVAL;
        if (tp < 1 || tp > PLACE_MAX_GPUS)
                return place_error(ret_error, -EINVAL, "model '%s': tensor-parallel degree %u (1 to %d)",
                            name, tp, PLACE_MAX_GPUS);
        if ((role == PLACE_PRODUCER && memory_mib < 0) ||
            (role == PLACE_CONSUMER && memory_mib > 0))
                return place_error(ret_error, -EINVAL,
                            "model '%s': a %s's memory must be %s (MiB %s)", name,
                            place_role_names[role], role == PLACE_PRODUCER ? "lent" : "needed",
                            role == PLACE_PRODUCER ? ">= 0" : "<= 0");
        if (p->n_models >= (unsigned)INT32_MAX)
                return -E2BIG;

        a = grow(p->models, p->n_models, sizeof(*p->models));
        if (!a)
                return -ENOMEM;
        p->models = a;
        m = &p->models[p->n_models];
        *m = (struct place_model){.role = role, .memory = memory_mib, .tp = tp,
                                  .gpu_memory = gpu_memory};
        m->name = strdup(name);
        if (!m->name)
                return -ENOMEM;
        p->n_models++;
        return 0;
}

static int cmp_names(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The first name that appears twice, or NULL. names is sorted in place. */
static const char *find_duplicate(char **names, size_t n)
{
        qsort(names, n, sizeof(*names), cmp_names);
        for (size_t i = 1; i < n; i++)
                if (strcmp(names[i - 1], names[i]) == 0)
                        return names[i];
        return NULL;
}

static uint64_t allowed_kinds(const struct place_problem *p, const struct place_model *m)
{
        uint64_t mask = 0;

        for (unsigned k = 0; k < p->n_kinds; k++) {
                const struct place_kind *kd = &p->kinds[k];

                if (m->tp > kd->gpus)
                        continue;
                if (m->gpu_memory && kd->gpu_memory && m->gpu_memory > kd->gpu_memory)
                        continue;
                mask |= UINT64_C(1) << k;
        }
        return mask;
}

/* Why a model fits no kind: the largest server and GPU on offer. */
static int explain_misfit(const struct place_problem *p, const struct place_model *m,
                          char **ret_error)
{
        unsigned max_gpus = 0;
        uint64_t max_mem = 0;
        char need[32], have[32];

        for (unsigned k = 0; k < p->n_kinds; k++) {
                max_gpus = MAX(max_gpus, p->kinds[k].gpus);
                max_mem = MAX(max_mem, p->kinds[k].gpu_memory);
        }
        if (m->tp > max_gpus)
                return place_error(ret_error, PLACE_E_INFEASIBLE,
                            "model '%s' fits no server: its tensor-parallel group needs %u GPUs "
                            "on one server, and the largest server has %u",
                            m->name, m->tp, max_gpus);
        if (m->gpu_memory > max_mem)
                return place_error(ret_error, PLACE_E_INFEASIBLE,
                            "model '%s' fits no server: it needs GPUs with %s, and the largest "
                            "GPUs have %s",
                            m->name, format_size(need, sizeof(need), m->gpu_memory),
                            format_size(have, sizeof(have), max_mem));
        return place_error(ret_error, PLACE_E_INFEASIBLE,
                    "model '%s' fits no server: no server kind has both %u GPUs and %s per GPU",
                    m->name, m->tp, format_size(need, sizeof(need), m->gpu_memory));
}

static void kind_list(const struct place_problem *p, uint64_t mask, char *buf, size_t len)
{
        size_t n = 0;

        buf[0] = '\0';
        for (unsigned k = 0; k < p->n_kinds && n < len; k++)
                if (mask & (UINT64_C(1) << k))
                        n += (size_t)snprintf(buf + n, len - n, "%s'%s'", n ? ", " : "",
                                              p->kinds[k].name);
}

/*
 * Hall's condition on GPUs: the models that may only use the kinds in a set must fit in those
 * kinds' GPUs, and the models whose TP group takes more than half a server need one server
 * each. All sets are checked for up to 12 kinds, otherwise each kind alone and all together.
 */
static int check_capacity(const struct place_problem *p, const uint64_t *mask, char **ret_error)
{
        uint64_t all = p->n_kinds == 64 ? UINT64_MAX : (UINT64_C(1) << p->n_kinds) - 1;
        uint64_t n_sets = p->n_kinds <= 12 ? (UINT64_C(1) << p->n_kinds) - 1 : p->n_kinds + 1;

        for (uint64_t i = 1; i <= n_sets; i++) {
                uint64_t set = p->n_kinds <= 12 ? i : i <= p->n_kinds ? UINT64_C(1) << (i - 1) : all;
                uint64_t need = 0, have = 0, big = 0, servers = 0;
                unsigned n_models = 0;
                char kinds[256];

                for (unsigned k = 0; k < p->n_kinds; k++)
                        if (set & (UINT64_C(1) << k)) {
                                have += (uint64_t)p->kinds[k].gpus * p->kinds[k].n_servers;
                                servers += p->kinds[k].n_servers;
                        }
                for (unsigned m = 0; m < p->n_models; m++) {
                        bool is_big = true;

                        if (mask[m] & ~set)
                                continue;
                        need += p->models[m].tp;
                        n_models++;
                        for (unsigned k = 0; k < p->n_kinds; k++)
                                if ((mask[m] & (UINT64_C(1) << k)) &&
                                    2 * p->models[m].tp <= p->kinds[k].gpus)
                                        is_big = false;
                        big += is_big;
                }
                if (need <= have && big <= servers)
                        continue;
                kind_list(p, set, kinds, sizeof(kinds));
                if (set == all && need > have)
                        return place_error(ret_error, PLACE_E_INFEASIBLE,
                                    "more GPUs needed than exist: the %u models need %llu GPUs, "
                                    "the %u servers have %llu",
                                    n_models, (unsigned long long)need, p->n_servers,
                                    (unsigned long long)have);
                if (need > have)
                        return place_error(ret_error, PLACE_E_INFEASIBLE,
                                    "more GPUs needed than exist: the %u models that run only on "
                                    "server kind%s %s need %llu GPUs, those servers have %llu",
                                    n_models, __builtin_popcountll(set) > 1 ? "s" : "", kinds,
                                    (unsigned long long)need, (unsigned long long)have);
                return place_error(ret_error, PLACE_E_INFEASIBLE,
                            "%llu models have tensor-parallel groups larger than half a server "
                            "of kind%s %s, so each needs a server of its own, and there are %llu",
                            (unsigned long long)big, __builtin_popcountll(set) > 1 ? "s" : "",
                            kinds, (unsigned long long)servers);
        }
        return 0;
}

struct type_key {
        const struct place_model *m;
        uint64_t mask;
        unsigned index;
};

static int cmp_type_key(const void *a, const void *b)
{
        const struct type_key *x = a, *y = b;

        if (x->m->role != y->m->role)
                return x->m->role < y->m->role ? -1 : 1;
        if (x->m->memory != y->m->memory)
                return x->m->memory < y->m->memory ? -1 : 1;
        if (x->m->tp != y->m->tp)
                return x->m->tp < y->m->tp ? -1 : 1;
        if (x->mask != y->mask)
                return x->mask < y->mask ? -1 : 1;
        return x->index < y->index ? -1 : x->index > y->index;
}

int place_problem_finish(struct place_problem *p, char **ret_error)
{
        _cleanup_free_ uint64_t *mask = NULL;
        _cleanup_free_ struct type_key *keys = NULL;
        _cleanup_free_ char **names = NULL;
        const char *dup;
        int r;

        if (!p || p->finished)
                return -EINVAL;
        if (p->n_servers == 0)
                return place_error(ret_error, -EINVAL, "no servers given");
        if (!isfinite(p->w_memory) || !isfinite(p->w_balance) || p->w_memory < 0 ||
            p->w_balance < 0 || p->w_memory + p->w_balance <= 0)
                return place_error(ret_error, -EINVAL, "weights must be >= 0 and not both 0");

        names = calloc(MAX(p->n_servers, p->n_models) + 1, sizeof(char *));
        mask = calloc(p->n_models + 1, sizeof(*mask));
        keys = calloc(p->n_models + 1, sizeof(*keys));
        if (!names || !mask || !keys)
                return -ENOMEM;

        for (unsigned i = 0; i < p->n_servers; i++)
                names[i] = p->servers[i].name;
        dup = find_duplicate(names, p->n_servers);
        if (dup)
                return place_error(ret_error, -EINVAL, "server name '%s' appears twice", dup);
        for (unsigned i = 0; i < p->n_models; i++)
                names[i] = p->models[i].name;
        dup = find_duplicate(names, p->n_models);
        if (dup)
                return place_error(ret_error, -EINVAL, "model name '%s' appears twice", dup);

        for (unsigned i = 0; i < p->n_models; i++) {
                mask[i] = allowed_kinds(p, &p->models[i]);
                if (!mask[i])
                        return explain_misfit(p, &p->models[i], ret_error);
        }
        r = check_capacity(p, mask, ret_error);
        if (r != 0)
                return r;

        for (unsigned i = 0; i < p->n_models; i++)
                keys[i] = (struct type_key){.m = &p->models[i], .mask = mask[i], .index = i};
        qsort(keys, p->n_models, sizeof(*keys), cmp_type_key);
        p->types = calloc(p->n_models + 1, sizeof(*p->types));
        if (!p->types)
                return -ENOMEM;
        p->n_types = 0;
        for (unsigned i = 0; i < p->n_models; i++) {
                const struct place_model *m = keys[i].m;
                struct place_type *t;

                if (i == 0 || cmp_type_key(&(struct type_key){.m = keys[i - 1].m,
                                                               .mask = keys[i - 1].mask},
                                           &(struct type_key){.m = m, .mask = keys[i].mask}) != 0) {
                        t = &p->types[p->n_types++];
                        *t = (struct place_type){
                                .memory = m->memory,
                                .balance = m->role == PLACE_PRODUCER ? (int)m->tp : -(int)m->tp,
                                .tp = m->tp,
                                .kinds = keys[i].mask,
                                .model0 = keys[i].index,
                        };
                }
                t = &p->types[p->n_types - 1];
                t->count++;
                t->model0 = MIN(t->model0, keys[i].index);
                p->models[keys[i].index].type = p->n_types - 1;
        }
        p->finished = true;
        return 0;
}

double place_objective(const struct place_problem *p, int64_t max_memory, int max_balance)
{
        return p->w_memory * ((double)max_memory / 1024.0) + p->w_balance * (double)max_balance;
}

int place_assignment_measure(const struct place_problem *p, struct place_assignment *a)
{
        _cleanup_free_ int64_t *mem = calloc(p->n_servers, sizeof(*mem));
        _cleanup_free_ int *bal = calloc(p->n_servers, sizeof(*bal));
        int64_t max_mem = 0;
        int max_bal = 0;

        if (!mem || !bal)
                return -ENOMEM;
        for (unsigned i = 0; i < p->n_models; i++) {
                const struct place_type *t = &p->types[p->models[i].type];

                mem[a->server_of[i]] += t->memory;
                bal[a->server_of[i]] += t->balance;
        }
        for (unsigned s = 0; s < p->n_servers; s++) {
                max_mem = MAX(max_mem, mem[s] < 0 ? -mem[s] : mem[s]);
                max_bal = MAX(max_bal, abs(bal[s]));
        }
        a->max_memory = max_mem;
        a->max_balance = max_bal;
        a->objective = place_objective(p, max_mem, max_bal);
        return 0;
}

double place_simple_bound(const struct place_problem *p)
{
        int64_t mem = 0;
        long bal = 0;

        for (unsigned i = 0; i < p->n_models; i++) {
                mem += p->models[i].memory;
                bal += p->types[p->models[i].type].balance;
        }
        mem = mem < 0 ? -mem : mem;
        bal = bal < 0 ? -bal : bal;
        return p->w_memory * ((double)mem / 1024.0 / p->n_servers) +
               p->w_balance * (double)((bal + p->n_servers - 1) / p->n_servers);
}
