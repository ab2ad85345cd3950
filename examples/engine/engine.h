/*
 * A simulated LLM-serving loop on a virtual clock: continuous batching,
 * chunked prefill, KV memory in blocks, preemption to a swap backend.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "kvswap.h"
#include "sched.h"
#include "stats.h"
#include "trace.h"

/* Positive outcomes. */
enum {
        ENGINE_DONE = 1,    /* engine_step(): nothing left to run or to arrive */
        ENGINE_E_TOO_LARGE, /* engine_add(): the request could never fit in local KV memory */
};

struct engine_config {
        enum sched_kind sched;
        uint32_t decode_slots;      /* decodes per iteration */
        uint32_t max_batch_tokens;  /* tokens per iteration, decodes (1 each) and prefill chunks */
        uint32_t max_prefill_chunk; /* prefill tokens of one request per iteration */
        uint32_t slice_iters;       /* fair: iterations between re-rankings */
        uint32_t block_tokens;      /* tokens per KV block */
        uint64_t bytes_per_token;   /* KV bytes per token, for memory and transfer sizes */
        uint64_t hbm_bytes;         /* local HBM for KV */
        uint32_t
            kv_sample_bytes; /* bytes of each token's KV really kept and copied (multiple of 8) */
        uint64_t iter_ns;    /* fixed cost of an iteration */
        uint64_t prefill_token_ns; /* per prefill token */
        uint64_t decode_seq_ns;    /* per decoding sequence */
        struct kv_tier_cost cost[_KV_TIER_MAX];
};

void engine_config_defaults(struct engine_config *c);

struct engine_result {
        struct stats ttft, tbt;           /* samples, ns */
        uint64_t requests, requests_done; /* queued by engine_add(), finished */
        uint64_t rejected;                /* refused by engine_add() as too large */
        uint64_t prompt_tokens, output_tokens;
        uint64_t iterations;
        uint64_t first_arrival_ns, last_finish_ns;
        uint64_t preemptions;
        uint64_t swap_out_bytes[_KV_TIER_MAX], swap_in_bytes[_KV_TIER_MAX];
        uint64_t swap_ns[_KV_TIER_MAX]; /* simulated transfer time */
        uint64_t
            integrity_errors; /* swap-ins that failed their checksum, requests whose KV was wrong */
};

/* One planned entry of the last iteration, for tests and traces. */
struct engine_item {
        uint32_t id;
        uint32_t tokens;
        bool prefill;
};

typedef void (*engine_token_fn)(void *userdata, uint32_t id, uint32_t index, uint64_t now_ns);

struct engine;

/* swap is borrowed: it must outlive the engine. -EINVAL for an unusable config. */
int engine_new(const struct engine_config *c, struct kv_swap *swap, struct engine **ret);
struct engine *engine_free(struct engine *e);

/*
 * Queue a request; arrivals must not decrease from one call to the next.
 * ENGINE_E_TOO_LARGE (and the request is not queued) when its prompt plus
 * output could never fit in local KV memory. *ret_id (optional) is its id.
 */
int engine_add(struct engine *e, const struct trace_request *r, uint32_t *ret_id);
void engine_set_token_callback(struct engine *e, engine_token_fn fn, void *userdata);

/* Run one iteration. 0, ENGINE_DONE, or a negative errno. */
int engine_step(struct engine *e);
/* Step until ENGINE_DONE. */
int engine_run(struct engine *e);

uint64_t engine_now(const struct engine *e);
/* The iteration engine_step() just ran (valid until the next step). */
const struct engine_item *engine_last_batch(const struct engine *e, size_t *ret_n);
/* A request by id, for inspection; NULL if unknown. */
const struct request *engine_request(const struct engine *e, uint32_t id);
const struct engine_result *engine_result(const struct engine *e);
/* Move the result (and its samples) out; the engine's own result is empty afterwards. */
void engine_take_result(struct engine *e, struct engine_result *ret);
