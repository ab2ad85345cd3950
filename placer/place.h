/*
 * Cluster placement: which server (and which GPUs) each model runs on, so that every server's
 * producers can lend about as much memory as its consumers need, one producer per consumer.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "util.h"

/* Expected outcomes, beside 0 and negative errnos. Each comes with a message naming the cause. */
enum {
        PLACE_E_INFEASIBLE = 1, /* no placement exists (or the heuristic found none) */
        PLACE_E_TIMEOUT = 2,    /* the time limit passed before any placement was found */
};

enum place_role {
        PLACE_PRODUCER,
        PLACE_CONSUMER,
        _PLACE_ROLE_MAX,
        _PLACE_ROLE_INVALID = -EINVAL,
};

enum place_solver {
        PLACE_SOLVER_AUTO,
        PLACE_SOLVER_EXACT,
        PLACE_SOLVER_HEURISTIC,
        PLACE_SOLVER_REFERENCE, /* one binary per model and server: for comparisons only */
        _PLACE_SOLVER_MAX,
        _PLACE_SOLVER_INVALID = -EINVAL,
};

enum place_status {
        PLACE_STATUS_OPTIMAL,   /* proven: objective == bound */
        PLACE_STATUS_FEASIBLE,  /* a placement, with the gap to the proven bound */
        _PLACE_STATUS_MAX,
};

extern const char *const place_role_names[];   /* NULL-terminated, for conf enums */
extern const char *const place_solver_names[]; /* "auto", "exact", "heuristic", "reference" */
extern const char *const place_status_names[];

#define PLACE_MAX_KINDS 64  /* allowed kinds are a bitmask per model type */
#define PLACE_MAX_GPUS  255 /* GPUs per server; configuration counts fit a byte */
#define PLACE_MIB       INT64_C(1048576)

struct place_kind {
        char *name;
        unsigned gpus;
        uint64_t gpu_memory; /* bytes per GPU, 0 when not given */
        unsigned n_servers;
        unsigned first_server; /* servers of a kind are contiguous */
        unsigned *peer_group;  /* [gpus]: GPUs with the same number share a peer link */
        unsigned hosts;        /* a server is an NVLink domain of this many hosts (1: one host);
                                * GPU g is GPU g % (gpus / hosts) of host g / (gpus / hosts) */
};

struct place_server {
        char *name;
        unsigned kind;
};

struct place_model {
        char *name;
        enum place_role role;
        int64_t memory;      /* MiB: positive for what a producer lends, negative for a need */
        unsigned tp;         /* GPUs, all on one server */
        uint64_t gpu_memory; /* bytes: smallest GPU it runs on, 0 for any */
        unsigned type;
};

/* Models that are interchangeable for placement: same role, memory, TP degree and kinds. */
struct place_type {
        int64_t memory;  /* MiB, signed, per model */
        int balance;     /* +tp for producers, -tp for consumers */
        unsigned tp;
        unsigned count;
        uint64_t kinds;  /* bit k: may run on kind k */
        unsigned model0; /* first model of this type in problem order */
};

struct place_problem {
        struct place_kind *kinds;
        unsigned n_kinds;
        struct place_server *servers;
        unsigned n_servers;
        struct place_model *models;
        unsigned n_models;
        struct place_type *types; /* built by place_problem_finish() */
        unsigned n_types;
        double w_memory;  /* objective weight per GiB of the largest memory imbalance */
        double w_balance; /* objective weight per GPU of the largest role imbalance */
        bool finished;
};

struct place_problem *place_problem_new(void);
struct place_problem *place_problem_free(struct place_problem *p);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct place_problem *, place_problem_free);

/*
 * Building a problem by hand (the YAML loader uses the same calls). Servers of a kind are
 * named from names[] when given, else "<kind>-<i>". peer_groups[] holds one group number
 * per GPU, or NULL for "all GPUs peer-linked". Models are added one at a time; memory is in
 * MiB and its sign must match the role. These return 0, -ENOMEM, or -EINVAL with a message.
 */
int place_problem_add_kind(struct place_problem *p, const char *name, unsigned gpus,
                           uint64_t gpu_memory, unsigned count, char *const *names,
                           const unsigned *peer_groups, char **ret_error);
/*
 * Make kind (an index) an NVLink domain of hosts hosts, each with gpus / hosts of its GPUs
 * (numbered host by host): the layout keeps TP groups and pairs within a host where it can.
 * Returns 0 or -EINVAL with a message when hosts does not divide the kind's GPUs.
 */
int place_problem_set_hosts(struct place_problem *p, unsigned kind, unsigned hosts,
                            char **ret_error);
int place_problem_add_model(struct place_problem *p, const char *name, enum place_role role,
                            int64_t memory_mib, unsigned tp, uint64_t gpu_memory,
                            char **ret_error);
/*
 * Check consistency and feasibility that can be seen without solving (names, a model that fits
 * no server, more GPUs needed than exist on the servers a set of models may use), and group
 * the models into types. Returns 0, -ENOMEM, -EINVAL (inconsistent) or PLACE_E_INFEASIBLE,
 * with *ret_error naming the cause.
 */
int place_problem_finish(struct place_problem *p, char **ret_error);

/* Load a problem from YAML (format in placer/README.md); profile paths are relative to it. */
int place_problem_load(const char *path, struct place_problem **ret, char **ret_error);
int place_problem_load_buffer(const char *name, const void *data, size_t size,
                              const char *base_dir, struct place_problem **ret,
                              char **ret_error);

/*
 * A server kind from a topology file as `aqua-profile probe` writes it: its number of GPUs,
 * the smallest GPU's memory in bytes, and a peer group number per GPU (GPUs joined by links:
 * connected components, split into cliques where they are not). Returns 0, -ENOMEM, or
 * another negative errno with a message naming the file.
 */
int place_topology_load(const char *path, unsigned *ret_gpus, uint64_t *ret_gpu_memory,
                        unsigned **ret_groups, char **ret_error);

/* A model-to-server assignment and its measures. */
struct place_assignment {
        unsigned *server_of; /* [n_models] */
        int64_t max_memory;  /* MiB: largest |memory balance| over servers */
        int max_balance;     /* GPUs: largest |producers - consumers| over servers */
        double objective;
        double bound; /* proven lower bound on the objective */
        size_t configurations; /* exact: server configurations it searched over */
        bool generated;        /* exact: they were generated as columns, not enumerated */
};

struct place_options {
        enum place_solver solver;
        double time_limit;    /* seconds for the whole solve; <= 0: none */
        unsigned long seed;   /* heuristic restarts */
        bool verbose;         /* let GLPK print its progress */
        size_t max_configurations; /* exact: above this, generate columns instead; 0: default */
};

#define PLACE_OPTIONS_DEFAULT                                                              \
        (struct place_options)                                                             \
        {                                                                                  \
                .solver = PLACE_SOLVER_AUTO, .time_limit = 60.0, .seed = 1, .verbose = false \
        }

struct place_gpu_pair {
        unsigned producer, consumer; /* GPU indices on the server */
};

struct place_result {
        enum place_solver solver; /* the one that produced the placement */
        enum place_status status;
        double objective, bound, gap; /* gap = (objective - bound) / objective, 0 if optimal */
        double seconds;
        int64_t max_memory; /* MiB */
        int max_balance;
        unsigned *server_of; /* [n_models] */
        unsigned *gpu_first; /* [n_models + 1]: model i owns gpu_list[gpu_first[i] .. i+1) */
        unsigned *gpu_list;
        int64_t *memory;            /* [n_servers] MiB balance */
        int *balance;               /* [n_servers] producer GPUs - consumer GPUs */
        unsigned *pair_first;       /* [n_servers + 1] into pairs */
        struct place_gpu_pair *pairs;
        unsigned n_split_tp;        /* TP groups that had to span peer groups */
        size_t configurations;      /* exact: as in struct place_assignment */
        bool generated;
};

void place_result_free(struct place_result *r);

/* Measures of an assignment (server_of filled): max_memory, max_balance, objective. */
int place_assignment_measure(const struct place_problem *p, struct place_assignment *a);
double place_objective(const struct place_problem *p, int64_t max_memory, int max_balance);
/* A trivial lower bound: the averages over all servers. */
double place_simple_bound(const struct place_problem *p);

/*
 * Solvers. Each fills a->server_of and the measures on success (0), and returns
 * PLACE_E_INFEASIBLE / PLACE_E_TIMEOUT with a message otherwise.
 * exact: incumbent may be NULL or a placement to beat (its objective bounds the search);
 * *ret_optimal tells whether the optimum was proven before the time limit. Above
 * o->max_configurations it generates configurations as columns (colgen.c).
 */
int place_heuristic(const struct place_problem *p, const struct place_options *o,
                    struct place_assignment *a, char **ret_error);
int place_exact(const struct place_problem *p, const struct place_options *o,
                const struct place_assignment *incumbent, struct place_assignment *a,
                bool *ret_optimal, char **ret_error);
int place_reference(const struct place_problem *p, const struct place_options *o,
                    struct place_assignment *a, bool *ret_optimal, char **ret_error);

/* GPU indices for each model on its server and the one-to-one pairs; fills r's layout. */
int place_layout(const struct place_problem *p, const unsigned *server_of,
                 struct place_result *r);

/* Choose and run solvers per o->solver, then lay out GPUs and pairs. */
int place_solve(const struct place_problem *p, const struct place_options *o,
                struct place_result *ret, char **ret_error);

/* The output YAML (format in placer/README.md), and one pairs file per server for aquad. */
int place_write_yaml(FILE *f, const struct place_problem *p, const struct place_result *r);
int place_write_pairs(const char *dir, const struct place_problem *p,
                      const struct place_result *r, char **ret_error);

/* Set *ret_error (when not NULL) to the formatted message and return r. */
int place_error(char **ret_error, int r, const char *fmt, ...) _printf_(3, 4);

/* Seconds on the monotonic clock, for time limits. */
double place_now(void);
