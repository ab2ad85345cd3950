/* aqua-profile's configuration schema, its defaults and the checks that span several keys. */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "target-http.h"
#include "time-util.h"
#include "util.h"

const char *const target_kind_names[] = {"engine-model", "http", NULL};
const char *const plot_format_names[] = {"png", "svg", "none", NULL};

typedef struct profile_config C;
#define BIG   (INT64_C(1) << 50)
#define HOUR  (INT64_C(3600) * 1000000000)

static const struct conf_field length_fields[] = {
        CONF_FIELD_ENUM(struct length_spec, dist, "distribution", length_dist_names, 0),
        CONF_FIELD_INT(struct length_spec, mean, "mean", 1, 1 << 20, 0),
        CONF_FIELD_INT(struct length_spec, min, "min", 1, 1 << 20, 0),
        CONF_FIELD_INT(struct length_spec, max, "max", 1, 1 << 20, 0),
        CONF_FIELD_END,
};
static const struct conf_schema length_schema = {"length", length_fields};

#define T(m) __typeof__(((C *)0)->m)
static const struct conf_field target_fields[] = {
        CONF_FIELD_ENUM(T(target), kind, "kind", target_kind_names, 0),
        CONF_FIELD_STRING(T(target), url, "url", 0),
        CONF_FIELD_ENUM(T(target), api, "api", http_api_names, 0),
        CONF_FIELD_STRING(T(target), served_model, "served-model", 0),
        CONF_FIELD_DURATION(T(target), timeout, "timeout", 1000000, HOUR, 0),
        CONF_FIELD_DURATION(T(target), drain, "drain", 0, HOUR, 0),
        CONF_FIELD_STRING(T(target), metrics_url, "metrics-url", 0),
        CONF_FIELD_STRING(T(target), metric, "metric", 0),
        CONF_FIELD_SIZE(T(target), kv_cache, "kv-cache", 0, BIG, 0),
        CONF_FIELD_END,
};
static const struct conf_schema target_schema = {"target", target_fields};

static const struct conf_field engine_fields[] = {
        CONF_FIELD_DURATION(T(engine), prefill_per_token, "prefill-per-token", 0, HOUR, 0),
        CONF_FIELD_DURATION(T(engine), decode_base, "decode-base", 0, HOUR, 0),
        CONF_FIELD_DURATION(T(engine), decode_per_seq, "decode-per-seq", 0, HOUR, 0),
        CONF_FIELD_INT(T(engine), max_batch, "max-batch", 1, 1 << 20, 0),
        CONF_FIELD_SIZE(T(engine), weights, "weights", 0, BIG, 0),
        CONF_FIELD_DOUBLE(T(engine), memory_utilization, "memory-utilization", 0.01, 1.0, 0),
        CONF_FIELD_END,
};
static const struct conf_schema engine_schema = {"engine", engine_fields};

static const struct conf_field workload_fields[] = {
        CONF_FIELD_STRING(T(workload), dataset, "dataset", 0),
        CONF_FIELD_INT(T(workload), max_requests, "max-requests", 0, INT32_MAX, 0),
        CONF_FIELD_INT(T(workload), synthetic_requests, "synthetic-requests", 1, 1 << 24, 0),
        CONF_FIELD_STRUCT(T(workload), prompt, "prompt-tokens", &length_schema, 0),
        CONF_FIELD_STRUCT(T(workload), output, "output-tokens", &length_schema, 0),
        CONF_FIELD_ENUM(T(workload), arrivals, "arrivals", arrival_kind_names, 0),
        CONF_FIELD_STRING(T(workload), trace, "trace", 0),
        CONF_FIELD_DURATION(T(workload), duration, "duration", NSEC_PER_MSEC, 24 * HOUR, 0),
        CONF_FIELD_DURATION(T(workload), warmup, "warmup", 0, 24 * HOUR, 0),
        CONF_FIELD_INT(T(workload), min_requests, "min-requests", 1, 1 << 24, 0),
        CONF_FIELD_INT(T(workload), seed, "seed", 0, INT64_MAX, 0),
        CONF_FIELD_END,
};
static const struct conf_schema workload_schema = {"workload", workload_fields};

static const struct conf_field sla_fields[] = {
        CONF_FIELD_DURATION(T(sla), ttft, "ttft", 1, HOUR, 0),
        CONF_FIELD_DOUBLE(T(sla), ttft_percentile, "ttft-percentile", 1, 100, 0),
        CONF_FIELD_DURATION(T(sla), tbt, "tbt", 1, HOUR, 0),
        CONF_FIELD_DOUBLE(T(sla), tbt_percentile, "tbt-percentile", 1, 100, 0),
        CONF_FIELD_DOUBLE(T(sla), max_failure_rate, "max-failure-rate", 0, 1, 0),
        CONF_FIELD_END,
};
static const struct conf_schema sla_schema = {"sla", sla_fields};

static const struct conf_field search_fields[] = {
        CONF_FIELD_DOUBLE(T(search), start_rate, "start-rate", 1e-6, 1e9, 0),
        CONF_FIELD_DOUBLE(T(search), min_rate, "min-rate", 1e-6, 1e9, 0),
        CONF_FIELD_DOUBLE(T(search), max_rate, "max-rate", 1e-6, 1e9, 0),
        CONF_FIELD_DOUBLE(T(search), tolerance, "tolerance", 1e-6, 1, 0),
        CONF_FIELD_INT(T(search), max_steps, "max-steps", 1, 1000, 0),
        CONF_FIELD_END,
};
static const struct conf_schema search_schema = {"search", search_fields};

static const struct conf_field burst_elem = {
        .type = CONF_DOUBLE, .flags = CONF_RANGE, .dmin = 1, .dmax = 1000};
static const struct conf_field roles_fields[] = {
        CONF_FIELD_SIZE(T(roles), producer_threshold, "producer-threshold", 0, BIG, 0),
        CONF_FIELD_LIST(T(roles), bursts, n_bursts, "bursts", &burst_elem, 16, 0),
        CONF_FIELD_DOUBLE(T(roles), plan_burst, "plan-burst", 1, 1000, 0),
        CONF_FIELD_DURATION(T(roles), burst_duration, "burst-duration", NSEC_PER_MSEC, HOUR, 0),
        CONF_FIELD_END,
};
static const struct conf_schema roles_schema = {"roles", roles_fields};

static const struct conf_field output_fields[] = {
        CONF_FIELD_STRING(T(output), directory, "directory", 0),
        CONF_FIELD_ENUM(T(output), plot, "plot", plot_format_names, 0),
        CONF_FIELD_END,
};
static const struct conf_schema output_schema = {"output", output_fields};
#undef T

static const struct conf_field config_fields[] = {
        CONF_FIELD_STRING(C, model, "model", CONF_REQUIRED),
        CONF_FIELD_INT(C, tp, "tp", 1, 1024, 0),
        CONF_FIELD_SIZE(C, gpu_memory, "gpu-memory", 0, BIG, 0),
        CONF_FIELD_SIZE(C, kv_bytes_per_token, "kv-bytes-per-token", 1, INT64_C(1) << 30, 0),
        CONF_FIELD_STRUCT(C, target, "target", &target_schema, 0),
        CONF_FIELD_STRUCT(C, engine, "engine", &engine_schema, 0),
        CONF_FIELD_STRUCT(C, workload, "workload", &workload_schema, 0),
        CONF_FIELD_STRUCT(C, sla, "sla", &sla_schema, 0),
        CONF_FIELD_STRUCT(C, search, "search", &search_schema, 0),
        CONF_FIELD_STRUCT(C, roles, "roles", &roles_schema, 0),
        CONF_FIELD_STRUCT(C, output, "output", &output_schema, 0),
        CONF_FIELD_END,
};
static const struct conf_schema config_schema = {"profiler config", config_fields};

/* The defaults describe a Llama-3-8B-like model on an 80 GiB GPU and the BRIEF's SLA. */
static int set_defaults(C *c)
{
        static const double bursts[] = {2, 4, 8};

        *c = (C){
                .tp = 1,
                .gpu_memory = UINT64_C(80) << 30,
                .kv_bytes_per_token = UINT64_C(128) << 10,
                .target = {.kind = TARGET_KIND_ENGINE_MODEL, .api = HTTP_API_COMPLETIONS,
                           .timeout = 300 * NSEC_PER_SEC, .drain = 30 * NSEC_PER_SEC},
                .engine = {.prefill_per_token = 40 * NSEC_PER_USEC,
                           .decode_base = 12 * NSEC_PER_MSEC,
                           .decode_per_seq = 100 * NSEC_PER_USEC,
                           .max_batch = 256,
                           .weights = UINT64_C(16) << 30,
                           .memory_utilization = 0.9},
                .workload = {.synthetic_requests = 1000,
                             .prompt = {LENGTH_EXPONENTIAL, 512, 16, 4096},
                             .output = {LENGTH_EXPONENTIAL, 256, 16, 2048},
                             .arrivals = ARRIVAL_POISSON,
                             .duration = 120 * NSEC_PER_SEC,
                             .warmup = 10 * NSEC_PER_SEC,
                             .min_requests = 50,
                             .seed = 1},
                .sla = {.ttft = NSEC_PER_SEC, .ttft_percentile = 99, .tbt = 100 * NSEC_PER_MSEC,
                        .tbt_percentile = 99, .max_failure_rate = 0.01},
                .search = {.start_rate = 1, .min_rate = 0.05, .max_rate = 10000,
                           .tolerance = 0.02, .max_steps = 30},
                .roles = {.producer_threshold = UINT64_C(4) << 30, .plan_burst = 4,
                          .burst_duration = 20 * NSEC_PER_SEC},
                .output = {.plot = PLOT_PNG},
        };
        c->roles.bursts = malloc(sizeof(bursts));
        if (!c->roles.bursts)
                return -ENOMEM;
        memcpy(c->roles.bursts, bursts, sizeof(bursts));
        c->roles.n_bursts = ARRAY_SIZE(bursts);
        return 0;
}

static int bad(char **ret_error, const char *name, const char *fmt, ...) _printf_(3, 4);
static int bad(char **ret_error, const char *name, const char *fmt, ...)
{
        _cleanup_free_ char *msg = NULL;
        va_list ap;

        va_start(ap, fmt);
        if (vasprintf(&msg, fmt, ap) < 0)
                msg = NULL;
        va_end(ap);
        if (ret_error && msg && asprintf(ret_error, "%s: %s", name, msg) < 0)
                *ret_error = NULL;
        return -EINVAL;
}

static int check(const char *name, C *c, char **ret_error)
{
        bool plan_found = false;

        if (c->target.kind == TARGET_KIND_HTTP) {
                if (!c->target.url)
                        return bad(ret_error, name, "target.url: required for an http target");
                if (c->target.kv_cache == 0)
                        return bad(ret_error, name,
                                   "target.kv-cache: required for an http target (the bytes of "
                                   "KV cache the engine allocated, e.g. from its start-up log)");
        }
        if (c->search.min_rate > c->search.max_rate)
                return bad(ret_error, name, "search.min-rate: above search.max-rate");
        for (int i = 0; i < 2; i++) {
                const struct length_spec *s = i ? &c->workload.output : &c->workload.prompt;
                if (s->min > s->max || (s->dist != LENGTH_UNIFORM && (s->mean < s->min ||
                                                                      s->mean > s->max)))
                        return bad(ret_error, name,
                                   "workload.%s-tokens: need min <= mean <= max",
                                   i ? "output" : "prompt");
        }
        if (c->workload.arrivals == ARRIVAL_TRACE && !c->workload.trace)
                return bad(ret_error, name, "workload.trace: required with arrivals: trace");
        if (c->workload.warmup >= c->workload.duration)
                return bad(ret_error, name, "workload.warmup: must be shorter than the duration");
        if (c->sla.ttft_percentile < 1 || c->sla.tbt_percentile < 1)
                return bad(ret_error, name, "sla: percentiles are in [1, 100]");
        for (size_t i = 0; i < c->roles.n_bursts; i++)
                plan_found |= c->roles.bursts[i] == c->roles.plan_burst;
        if (!plan_found)
                return bad(ret_error, name, "roles.plan-burst: %g is not one of roles.bursts",
                           c->roles.plan_burst);
        if (!c->output.directory && !(c->output.directory = strdup(".")))
                return -ENOMEM;
        return 0;
}

int profile_config_load_buffer(const char *name, const char *data, size_t size,
                               struct profile_config *ret, char **ret_error)
{
        int r = set_defaults(ret);

        if (r < 0)
                return r;
        r = conf_load_buffer(&config_schema, name, data, size, ret, ret_error);
        if (r < 0)
                return r;
        return check(name, ret, ret_error);
}

int profile_config_load(const char *path, struct profile_config *ret, char **ret_error)
{
        int r = set_defaults(ret);

        if (r < 0)
                return r;
        r = conf_load(&config_schema, path, ret, ret_error);
        if (r < 0)
                return r;
        return check(path, ret, ret_error);
}

void profile_config_free(struct profile_config *c)
{
        conf_free(&config_schema, c);
}
