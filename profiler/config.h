/* aqua-profile's YAML configuration: what to profile, how to load it, the SLA and the outputs. */
#pragma once

#include <stdint.h>

#include "workload.h"

enum target_kind {
        TARGET_KIND_ENGINE_MODEL,
        TARGET_KIND_HTTP,
        _TARGET_KIND_MAX,
};
extern const char *const target_kind_names[];

enum plot_format {
        PLOT_PNG,
        PLOT_SVG,
        PLOT_NONE,
        _PLOT_FORMAT_MAX,
};
extern const char *const plot_format_names[];

struct profile_config {
        char *model;
        int64_t tp;
        uint64_t gpu_memory; /* per GPU */
        uint64_t kv_bytes_per_token;
        struct {
                int kind;
                char *url;
                int api;
                char *served_model;
                uint64_t timeout, drain;
                char *metrics_url, *metric;
                uint64_t kv_cache;
        } target;
        struct {
                uint64_t prefill_per_token, decode_base, decode_per_seq;
                int64_t max_batch;
                uint64_t weights;
                double memory_utilization;
        } engine;
        struct {
                char *dataset;
                int64_t max_requests;
                int64_t synthetic_requests;
                struct length_spec prompt, output;
                int arrivals;
                char *trace;
                uint64_t duration, warmup;
                int64_t min_requests;
                int64_t seed;
        } workload;
        struct {
                uint64_t ttft, tbt;
                double ttft_percentile, tbt_percentile, max_failure_rate;
        } sla;
        struct {
                double start_rate, min_rate, max_rate, tolerance;
                int64_t max_steps;
        } search;
        struct {
                uint64_t producer_threshold;
                double *bursts;
                size_t n_bursts;
                double plan_burst;
                uint64_t burst_duration;
        } roles;
        struct {
                char *directory;
                int plot;
        } output;
};

/* Defaults, then path's keys, then the checks that span keys. Errors name file and key. */
int profile_config_load(const char *path, struct profile_config *ret, char **ret_error);
/* The same from a buffer (tests); name stands for the path in messages. */
int profile_config_load_buffer(const char *name, const char *data, size_t size,
                               struct profile_config *ret, char **ret_error);
void profile_config_free(struct profile_config *c);
