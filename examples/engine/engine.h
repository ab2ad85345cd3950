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

/* When a newcomer's prefill may start. */
enum engine_admission {
        ADMIT_CHUNK,   /* its first prefill chunk fits (the simulator's original rule) */
        ADMIT_REQUEST, /* KV for its whole prompt fits, reserved at once (vLLM) */
        ADMIT_LAYER,   /* KV of admit_layers layers of the chunk fits (LayerKV) */
        _ADMIT_MAX,
        _ADMIT_INVALID = -EINVAL,
};

/* LayerKV: what a prefill does when its layers do not fit (the design source's two choices). */
enum engine_layer_full {
        LAYER_FULL_OFFLOAD, /* offload (swap out) lower-ranked requests' KV to make room */
        LAYER_FULL_WAIT,    /* wait until other requests finish and free memory */
        _LAYER_FULL_MAX,
        _LAYER_FULL_INVALID = -EINVAL,
};

/* "request", "layer:4" (K defaults to 4), "chunk". Returns 0 or -EINVAL. */
int engine_admission_from_string(const char *s, enum engine_admission *ret, uint32_t *ret_layers);
const char *engine_admission_to_string(enum engine_admission a);
enum engine_layer_full engine_layer_full_from_string(const char *s);
const char *engine_layer_full_to_string(enum engine_layer_full f);

struct engine_config {
        enum sched_kind sched;
        enum engine_admission admission;
        uint32_t n_layers;     /* the model's layers: KV is allocated and moved per layer */
        uint32_t admit_layers; /* ADMIT_LAYER: layers of a chunk's KV that must fit (>= 2) */
        enum engine_layer_full layer_full;
        /*
         * Fair: the TBT budget of a running decode (0: none). A decode that would miss it if it
         * skipped this iteration goes first (earliest deadline first), is never swapped out for
         * others, and keeps its place across time slices.
         */
        uint64_t tbt_budget_ns;
        uint64_t sla_ttft_ns, sla_tbt_ns; /* SLA attainment: TTFT and each request's TBT p99 */
        uint32_t decode_slots;            /* decodes per iteration */
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
        /* SLA: requests whose TTFT met it, whose own TBT p99 met it, and both. */
        uint64_t sla_ttft_met, sla_tbt_met, sla_met;
        /* LayerKV: KV offloaded layer by layer during prefill, prefetched before decode
         * (nominal bytes, by tier), and the transfer time hidden behind compute. */
        uint64_t layer_out_bytes[_KV_TIER_MAX], layer_in_bytes[_KV_TIER_MAX];
        uint64_t overlap_ns, hidden_ns;
        uint64_t layered_prefills; /* prefill chunks run through a K-layer window */
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
