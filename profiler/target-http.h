/* The HTTP target: an OpenAI-compatible streaming endpoint (vLLM's server, for one), driven with libcurl. */
#pragma once

#include <stdint.h>

#include "target.h"

enum http_api {
        HTTP_API_COMPLETIONS, /* POST /v1/completions, tokens in choices[0].text */
        HTTP_API_CHAT,        /* POST /v1/chat/completions, tokens in choices[0].delta.content */
        _HTTP_API_MAX,
};
extern const char *const http_api_names[];

struct http_params {
        const char *url;         /* the full endpoint URL */
        int api;
        const char *model;       /* "model" in the request body; NULL leaves it out */
        uint64_t timeout;        /* ns, per request */
        uint64_t drain;          /* ns after the last arrival before in-flight requests are cut off */
        const char *metrics_url; /* Prometheus text endpoint, or NULL */
        const char *metric;      /* gauge of KV cache in use, 0..1 (vLLM: vllm:gpu_cache_usage_perc) */
        uint64_t kv_bytes_per_token;
        uint64_t kv_capacity;
};

/*
 * Each request is a streaming (server-sent events) POST with max_tokens set to
 * the request's output length; every event that carries text counts as one
 * token. A request fails on a transport error, a non-200 status, an "error"
 * event, or a stream without text. Strings in p are copied.
 */
int http_target_new(const struct http_params *p, struct target **ret);
