/* The placer's input YAML, read through the common schema loader, and the profiler's files. */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "parse-util.h"
#include "place.h"

struct in_kind {
        char *kind;
        int64_t count;
        char **names;
        size_t n_names;
        int64_t gpus;
        uint64_t gpu_memory;
        char **peer_groups;
        size_t n_peer_groups;
        char *topology;
        int64_t hosts;
};

struct in_model {
        char *name;
        char *role;
        char *memory;
        int64_t tp;
        int64_t count;
        uint64_t gpu_memory;
        char *profile;
};

struct in_weights {
        double memory, balance;
};

struct in_doc {
        struct in_kind *servers;
        size_t n_servers;
        struct in_model *models;
        size_t n_models;
        struct in_weights weights;
};

/* What the placer reads from a profile the profiler wrote. */
struct in_profile {
        char *name;
        int role;
        uint64_t memory;
        int64_t tp;
        uint64_t gpu_memory;
};

#define MAX_SIZE (INT64_C(1) << 50)

static const struct conf_field kind_fields[] = {
        CONF_FIELD_STRING(struct in_kind, kind, "kind", 0),
        CONF_FIELD_INT(struct in_kind, count, "count", 1, 1000000, 0),
        CONF_FIELD_LIST(struct in_kind, names, n_names, "names", &conf_elem_string, 1000000, 0),
        CONF_FIELD_INT(struct in_kind, gpus, "gpus", 1, PLACE_MAX_GPUS, 0),
        CONF_FIELD_SIZE(struct in_kind, gpu_memory, "gpu-memory", 0, MAX_SIZE, 0),
        CONF_FIELD_LIST(struct in_kind, peer_groups, n_peer_groups, "peer-groups",
                        &conf_elem_string, PLACE_MAX_GPUS, 0),
        CONF_FIELD_STRING(struct in_kind, topology, "topology", 0),
        CONF_FIELD_INT(struct in_kind, hosts, "hosts", 1, PLACE_MAX_GPUS, 0),
        CONF_FIELD_END,
};
static const struct conf_schema kind_schema = {"server kind", kind_fields};

static const struct conf_field model_fields[] = {
        CONF_FIELD_STRING(struct in_model, name, "name", CONF_REQUIRED),
        CONF_FIELD_STRING(struct in_model, role, "role", 0),
        CONF_FIELD_STRING(struct in_model, memory, "memory", 0),
        CONF_FIELD_INT(struct in_model, tp, "tp", 1, PLACE_MAX_GPUS, 0),
        CONF_FIELD_INT(struct in_model, count, "count", 1, 1000000, 0),
        CONF_FIELD_SIZE(struct in_model, gpu_memory, "gpu-memory", 0, MAX_SIZE, 0),
        CONF_FIELD_STRING(struct in_model, profile, "profile", 0),
        CONF_FIELD_END,
};
static const struct conf_schema model_schema = {"model", model_fields};

static const struct conf_field weights_fields[] = {
        CONF_FIELD_DOUBLE(struct in_weights, memory, "memory", 0.0, 1e9, 0),
        CONF_FIELD_DOUBLE(struct in_weights, balance, "balance", 0.0, 1e9, 0),
        CONF_FIELD_END,
};
static const struct conf_schema weights_schema = {"weights", weights_fields};

static const struct conf_field doc_fields[] = {
        CONF_FIELD_LIST(struct in_doc, servers, n_servers, "servers",
                        CONF_ELEM_STRUCT(&kind_schema), PLACE_MAX_KINDS, CONF_REQUIRED),
        CONF_FIELD_LIST(struct in_doc, models, n_models, "models", CONF_ELEM_STRUCT(&model_schema),
                        0, CONF_REQUIRED),
        CONF_FIELD_STRUCT(struct in_doc, weights, "weights", &weights_schema, 0),
        CONF_FIELD_END,
};
static const struct conf_schema doc_schema = {"placement input", doc_fields};

static const struct conf_field profile_fields[] = {
        CONF_FIELD_STRING(struct in_profile, name, "name", 0),
        CONF_FIELD_ENUM(struct in_profile, role, "role", place_role_names, CONF_REQUIRED),
        CONF_FIELD_SIZE(struct in_profile, memory, "memory", 0, MAX_SIZE, CONF_REQUIRED),
        CONF_FIELD_INT(struct in_profile, tp, "tp", 1, PLACE_MAX_GPUS, 0),
        CONF_FIELD_SIZE(struct in_profile, gpu_memory, "gpu-memory", 0, MAX_SIZE, 0),
        CONF_FIELD_END,
};
static const struct conf_schema profile_schema = {"profile", profile_fields};

static void doc_free(struct in_doc *d)
{
        conf_free(&doc_schema, d);
}

static void profile_free(struct in_profile *pr)
{
        conf_free(&profile_schema, pr);
}

/* Prefix the message in *error with "name: ". */
static int prefix(char **error, int r, const char *name)
{
        char *msg;

        if (!error || !*error)
                return r;
        if (asprintf(&msg, "%s: %s", name, *error) < 0)
                return r;
        free(*error);
        *error = msg;
        return r;
}

/* A file named in the input: relative to the input's folder unless absolute. */
static char *relative_path(const char *base_dir, const char *file)
{
        char *path = NULL;

        if (file[0] == '/' || !base_dir)
                return strdup(file);
        if (asprintf(&path, "%s/%s", base_dir, file) < 0)
                return NULL;
        return path;
}

/*
 * "0-3", "0,2,4-5": GPUs of one peer group, of the gpus of a server (of all its hosts). GPUs
 * given twice or out of range are errors.
 */
static int parse_peer_groups(const struct in_kind *k, const char *kname, unsigned gpus,
                             unsigned *group, char **ret_error)
{
        unsigned next = (unsigned)k->n_peer_groups;

        for (unsigned i = 0; i < gpus; i++)
                group[i] = UINT32_MAX;
        for (size_t g = 0; g < k->n_peer_groups; g++) {
                _cleanup_free_ char *copy = strdup(k->peer_groups[g]);
                char *save = NULL;

                if (!copy)
                        return -ENOMEM;
                for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                        int64_t lo, hi;
                        char *dash = strchr(tok + 1, '-');

                        while (*tok == ' ')
                                tok++;
                        if (dash)
                                *dash = '\0';
                        if (parse_int64(tok, 10, &lo) < 0 ||
                            (dash ? parse_int64(dash + 1, 10, &hi) : (hi = lo, 0)) < 0 ||
                            lo < 0 || hi < lo)
                                return place_error(ret_error, -EINVAL,
                                            "server kind '%s': peer group \"%s\": expected GPU "
                                            "numbers such as \"0-3\" or \"0,2,4-5\"",
                                            kname, k->peer_groups[g]);
                        if (hi >= (int64_t)gpus)
                                return place_error(ret_error, -EINVAL,
                                            "server kind '%s': peer group \"%s\" names GPU %lld, "
                                            "but its servers have GPUs 0 to %u",
                                            kname, k->peer_groups[g], (long long)hi, gpus - 1);
                        for (int64_t i = lo; i <= hi; i++) {
                                if (group[i] != UINT32_MAX)
                                        return place_error(ret_error, -EINVAL,
                                                    "server kind '%s': GPU %lld is in two peer "
                                                    "groups",
                                                    kname, (long long)i);
                                group[i] = (unsigned)g;
                        }
                }
        }
        /* A GPU in no group has a peer link to nothing. */
        for (unsigned i = 0; i < gpus; i++)
                if (group[i] == UINT32_MAX)
                        group[i] = k->n_peer_groups ? next++ : 0;
        return 0;
}

static int add_kinds(struct place_problem *p, const struct in_doc *d, const char *base_dir,
                     char **ret_error)
{
        for (size_t i = 0; i < d->n_servers; i++) {
                const struct in_kind *k = &d->servers[i];
                _cleanup_free_ unsigned *group = NULL;
                char fallback[32];
                const char *name = k->kind;
                unsigned count;
                int r;

                if (!name) {
                        snprintf(fallback, sizeof(fallback),
                                 d->n_servers == 1 ? "server" : "server%zu", i);
                        name = fallback;
                }
                if (k->count && k->n_names && (size_t)k->count != k->n_names)
                        return place_error(ret_error, -EINVAL,
                                    "servers[%zu] ('%s'): count is %lld but %zu names are given",
                                    i, name, (long long)k->count, k->n_names);
                if (!k->count && !k->n_names)
                        return place_error(ret_error, -EINVAL,
                                    "servers[%zu] ('%s'): give a count or a list of names", i,
                                    name);
                count = k->n_names ? (unsigned)k->n_names : (unsigned)k->count;
                unsigned gpus = (unsigned)k->gpus;
                uint64_t gpu_memory = k->gpu_memory;
                if (k->topology) {
                        _cleanup_free_ char *path = relative_path(base_dir, k->topology);
                        uint64_t smallest;

                        if (!path)
                                return -ENOMEM;
                        if (k->n_peer_groups || k->hosts)
                                return place_error(ret_error, -EINVAL,
                                            "server kind '%s': give %s or a topology, not both",
                                            name, k->hosts ? "hosts" : "peer-groups");
                        r = place_topology_load(path, &gpus, &smallest, &group, ret_error);
                        if (r < 0)
                                return prefix(ret_error, r, name);
                        if (k->gpus && (unsigned)k->gpus != gpus)
                                return place_error(ret_error, -EINVAL,
                                            "server kind '%s': gpus is %lld but topology %s "
                                            "has %u GPUs",
                                            name, (long long)k->gpus, path, gpus);
                        if (!gpu_memory)
                                gpu_memory = smallest;
                } else {
                        if (!k->gpus)
                                return place_error(ret_error, -EINVAL,
                                            "servers[%zu] ('%s'): missing gpus (or a topology)",
                                            i, name);
                        /* A domain: gpus per host, its GPUs numbered host by host. */
                        if (k->hosts && k->hosts * k->gpus > PLACE_MAX_GPUS)
                                return place_error(ret_error, -EINVAL,
                                            "server kind '%s': %lld hosts x %lld GPUs is more "
                                            "than %d GPUs",
                                            name, (long long)k->hosts, (long long)k->gpus,
                                            PLACE_MAX_GPUS);
                        gpus = (unsigned)(k->gpus * (k->hosts ? k->hosts : 1));
                        group = calloc(gpus, sizeof(unsigned));
                        if (!group)
                                return -ENOMEM;
                        r = parse_peer_groups(k, name, gpus, group, ret_error);
                        if (r < 0)
                                return r;
                }
                r = place_problem_add_kind(p, name, gpus, gpu_memory, count,
                                           k->n_names ? k->names : NULL, group, ret_error);
                if (r < 0)
                        return r;
                if (k->hosts) {
                        r = place_problem_set_hosts(p, p->n_kinds - 1, (unsigned)k->hosts,
                                                    ret_error);
                        if (r < 0)
                                return r;
                }
        }
        return 0;
}

static int add_model(struct place_problem *p, const struct in_model *m, size_t index,
                     const char *base_dir, char **ret_error)
{
        struct in_profile pr _cleanup_(profile_free) = {.role = -1};
        _cleanup_free_ char *path = NULL;
        enum place_role role;
        uint64_t memory;
        unsigned tp;
        uint64_t gpu_memory;
        int r;

        if (m->profile && (m->role || m->memory))
                return place_error(ret_error, -EINVAL,
                            "models[%zu] ('%s'): give either a profile or role and memory, "
                            "not both",
                            index, m->name);
        if (m->profile) {
                path = relative_path(base_dir, m->profile);
                if (!path)
                        return -ENOMEM;
                r = conf_load(&profile_schema, path, &pr, ret_error);
                if (r == -EINVAL)
                        return prefix(ret_error, r, m->name);
                if (r < 0)
                        return place_error(ret_error, r, "model '%s': cannot read profile %s: %s",
                                    m->name, path, strerror(-r));
                role = (enum place_role)pr.role;
                memory = pr.memory;
                tp = (unsigned)(m->tp ? m->tp : pr.tp ? pr.tp : 1);
                gpu_memory = m->gpu_memory ? m->gpu_memory : pr.gpu_memory;
        } else {
                if (!m->role || !m->memory)
                        return place_error(ret_error, -EINVAL,
                                    "models[%zu] ('%s'): missing %s (or a profile)", index,
                                    m->name, !m->role ? "role" : "memory");
                if (strcmp(m->role, "producer") == 0)
                        role = PLACE_PRODUCER;
                else if (strcmp(m->role, "consumer") == 0)
                        role = PLACE_CONSUMER;
                else
                        return place_error(ret_error, -EINVAL,
                                    "models[%zu] ('%s'): role: expected producer or consumer, "
                                    "got \"%.64s\"",
                                    index, m->name, m->role);
                if (parse_size(m->memory, &memory) < 0 || memory > (uint64_t)MAX_SIZE)
                        return place_error(ret_error, -EINVAL,
                                    "models[%zu] ('%s'): memory: expected a size such as 20GiB, "
                                    "got \"%.64s\"",
                                    index, m->name, m->memory);
                tp = (unsigned)(m->tp ? m->tp : 1);
                gpu_memory = m->gpu_memory;
        }

        /* Placement works in MiB: finer differences do not matter for balance. */
        int64_t mib = (int64_t)((memory + (uint64_t)PLACE_MIB / 2) / (uint64_t)PLACE_MIB);
        if (role == PLACE_CONSUMER)
                mib = -mib;
        for (int64_t i = 0; i < (m->count ? m->count : 1); i++) {
                _cleanup_free_ char *name = NULL;

                if (m->count > 1 ? asprintf(&name, "%s-%lld", m->name, (long long)i) < 0
                                 : !(name = strdup(m->name)))
                        return -ENOMEM;
                r = place_problem_add_model(p, name, role, mib, tp, gpu_memory, ret_error);
                if (r < 0)
                        return r;
        }
        return 0;
}

int place_problem_load_buffer(const char *name, const void *data, size_t size,
                              const char *base_dir, struct place_problem **ret,
                              char **ret_error)
{
        struct in_doc d _cleanup_(doc_free) = {.weights = {1.0, 1.0}};
        _cleanup_(place_problem_freep) struct place_problem *p = NULL;
        int r;

        r = conf_load_buffer(&doc_schema, name, data, size, &d, ret_error);
        if (r < 0)
                return r;
        p = place_problem_new();
        if (!p)
                return -ENOMEM;
        p->w_memory = d.weights.memory;
        p->w_balance = d.weights.balance;
        r = add_kinds(p, &d, base_dir, ret_error);
        if (r < 0)
                return prefix(ret_error, r, name);
        for (size_t i = 0; i < d.n_models; i++) {
                r = add_model(p, &d.models[i], i, base_dir, ret_error);
                if (r < 0)
                        return prefix(ret_error, r, name);
        }
        r = place_problem_finish(p, ret_error);
        if (r != 0)
                return prefix(ret_error, r, name);
        *ret = TAKE_PTR(p);
        return 0;
}

int place_problem_load(const char *path, struct place_problem **ret, char **ret_error)
{
        _cleanup_free_ char *data = NULL, *copy = NULL;
        FILE *f;
        size_t size = 0, cap = 0;

        f = fopen(path, "re");
        if (!f)
                return place_error(ret_error, -errno, "%s: %s", path, strerror(errno));
        for (;;) {
                size_t n;

                if (size == cap) {
                        char *a;

                        if (cap >= CONF_MAX_FILE) {
                                fclose(f);
                                return place_error(ret_error, -E2BIG, "%s: larger than %u bytes", path,
                                            CONF_MAX_FILE);
                        }
                        cap = cap ? 2 * cap : 65536;
                        a = realloc(data, cap);
                        if (!a) {
                                fclose(f);
                                return -ENOMEM;
                        }
                        data = a;
                }
                n = fread(data + size, 1, cap - size, f);
                size += n;
                if (n == 0)
                        break;
        }
        if (ferror(f)) {
                int e = errno ? errno : EIO;
                fclose(f);
                return place_error(ret_error, -e, "%s: %s", path, strerror(e));
        }
        fclose(f);
        copy = strdup(path);
        if (!copy)
                return -ENOMEM;
        return place_problem_load_buffer(path, data, size, dirname(copy), ret, ret_error);
}
