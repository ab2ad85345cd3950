/*
 * A built-in model of an LLM engine with continuous batching, run in virtual time,
 * so profiles can be planned without hardware.
 */
#pragma once

#include <stdint.h>

#include "target.h"

struct engine_params {
        uint64_t prefill_per_token; /* ns of prefill per prompt token */
        uint64_t decode_base;       /* ns per iteration, whatever the batch */
        uint64_t decode_per_seq;    /* ns per sequence in the batch per iteration */
        int64_t max_batch;          /* sequences running at once */
        uint64_t gpu_memory;        /* bytes per GPU */
        int64_t tp;                 /* GPUs the model spans */
        uint64_t weights;           /* bytes of weights, all GPUs together */
        double memory_utilization;  /* share of GPU memory the engine takes (vLLM's 0.9) */
        uint64_t kv_bytes_per_token;
};

/*
 * Each iteration admits waiting requests (FIFO, while the batch has room and
 * their whole context fits in the KV cache), prefills them and decodes one token
 * for every running sequence. It costs
 *     decode_base + decode_per_seq * batch + prefill_per_token * prompt tokens admitted.
 * A request's first token comes at the end of the iteration that admitted it.
 * Returns -EINVAL if the weights do not leave room for KV cache.
 */
int engine_model_new(const struct engine_params *p, struct target **ret);
