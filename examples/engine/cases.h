/*
 * The two workloads where the link to lent memory is on the critical path, modelled with the
 * same care as the burst engine (engine.h): one long prompt whose KV cache outgrows the GPU
 * (FlexGen-style layer streaming, the Aqua paper's long-prompt case), and multi-turn
 * conversations whose finished turns are offloaded and loaded back on the next turn's TTFT path
 * (vLLM's OffloadingConnector, aqua.vllm). Time is modelled; the real bytes (samples of every
 * token's KV) are moved by the caller through hooks and checked there.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvswap.h"
#include "stats.h"

/* ---------------------------------------------------------------------- one long prompt */

#define LP_MAX_LAYERS 256

/* The model's shape and the GPU. Defaults (lp_model_defaults): Llama-3-8B's shape on an H100. */
struct lp_model {
        unsigned layers;                   /* 32 */
        uint64_t kv_bytes_per_token_layer; /* K and V: 2 x 8 KV heads x 128 x 2 bytes = 4 KiB */
        uint64_t hidden_bytes_per_token;   /* one layer's input, 4096 x 2 bytes (recompute) */
        double weight_bytes;               /* 8.03e9 parameters x 2 bytes */
        double hbm_bytes;                  /* H100 SXM: 80 GB */
        double mem_util;                   /* vLLM's gpu_memory_utilization default: 0.9 */
        double activation_bytes;           /* workspace besides weights and KV: 2 GB (assumed) */
        double hbm_gbps;                   /* HBM3 as decode kernels see it: 3000 GB/s */
        unsigned buffers;                  /* HBM buffers that offloaded layers stream through */
};

void lp_model_defaults(struct lp_model *m);

/* Where one context's KV lives: which layers stay in HBM, which stream from the tier. */
struct lp_plan {
        uint64_t context;        /* tokens */
        uint64_t kv_layer_bytes; /* one layer's KV at this context */
        double kv_budget_bytes;  /* HBM left for KV */
        unsigned resident, offloaded;
        bool offload[LP_MAX_LAYERS]; /* spread evenly, so transfers overlap resident compute */
};

/* 0, -EINVAL (a bad model), -E2BIG (not even `buffers` layers fit: no plan). */
int lp_plan(const struct lp_model *m, uint64_t context, struct lp_plan *ret);

struct lp_step {
        double step_ns;      /* one decode step in the steady state */
        double tokens_per_s; /* 1e9 / step_ns */
        double compute_ns;   /* the step's compute alone (every layer's weights and KV read) */
        double transfer_ns;  /* the offloaded layers' transfers alone, back to back */
        double link_bytes;   /* over the tier's link per step, both directions */
};

/*
 * The decode step on a link (NULL or no offloaded layer: all in HBM): two streams, compute in
 * layer order and prefetch in offloaded-layer order; a prefetch needs a free buffer (freed when
 * its layer's compute ends, so at most `buffers` ahead), and an offloaded layer computes once
 * its prefetch is done; the new token's KV of an offloaded layer goes back on the other direction.
 * Simulated over several steps, the last one reported.
 */
void lp_step(const struct lp_model *m, const struct lp_plan *p, const struct kv_tier_cost *link,
             struct lp_step *ret);

/* ---------------------------------------------------------------------- multi-turn */

enum mt_tier {
        MT_NONE, /* no offload: a prefix evicted from HBM is recomputed */
        MT_DRAM, /* host DRAM within the DRAM budget, over PCIe */
        MT_PEER, /* a lender's spare HBM, over NVLink */
        MT_AQUA, /* what aqua does: the lender's HBM first, then DRAM within the budget */
        _MT_TIER_MAX,
};

const char *mt_tier_to_string(enum mt_tier t);

/*
 * Conversations: Poisson arrivals; a first prompt (system prompt, document, question) and then
 * follow-ups of a user message each, log-normal lengths; think time between a reply and the next
 * turn; a conversation ends after its turns or when its context would pass context_max.
 */
struct mt_trace_gen {
        size_t conversations;
        uint64_t seed;
        double rate;                   /* conversations per second */
        unsigned turns_min, turns_max; /* uniform */
        double first_median, first_sigma;
        double user_median, user_sigma;
        double output_median, output_sigma;
        uint32_t first_min, first_max, user_min, user_max, output_min, output_max;
        uint32_t context_max;
        double think_mean_s; /* exponential */
};

void mt_trace_gen_defaults(struct mt_trace_gen *g);

/* The hooks that move the real bytes: a conversation's KV sample over `tokens` tokens. */
struct mt_bytes {
        void *userdata;
        /* The finished turn's context goes to the tier (replacing what the tier held). */
        int (*store)(void *userdata, uint32_t conv, uint64_t tokens);
        /* It comes back for the next turn: must return 0 only when the bytes checked out. */
        int (*load)(void *userdata, uint32_t conv, uint64_t tokens);
        /* The tier dropped it (capacity). */
        void (*evict)(void *userdata, uint32_t conv);
        /* A safe point, once per iteration (reclaims, demo holds); virtual now. May be NULL. */
        int (*poll)(void *userdata, uint64_t now_ns);
};

struct mt_config {
        struct mt_trace_gen gen;
        enum mt_tier tier;
        /* The serving GPU, as the burst engine models it (engine_config_defaults's figures). */
        uint64_t bytes_per_token; /* 128 KiB */
        double hbm_kv_bytes;      /* HBM for KV: running requests and cached prefixes */
        uint64_t iter_ns, prefill_token_ns, decode_seq_ns;
        uint32_t decode_slots, batch_tokens, prefill_chunk;
        uint32_t block_tokens; /* what the tier stores in: whole blocks of this many tokens */
        double peer_capacity_bytes, dram_capacity_bytes;
        struct kv_tier_cost peer, dram; /* dram: its share of the shared host link */
        uint64_t sla_ttft_ns;
        const struct mt_bytes *bytes; /* NULL: no real bytes */
};

void mt_config_defaults(struct mt_config *c);

struct mt_result {
        uint64_t conversations, turns, follow_ups, done;
        /* Where each follow-up's prefix came from. */
        uint64_t hit_local, hit_peer, hit_dram, miss;
        uint64_t recomputed_tokens, loaded_tokens, prefill_tokens;
        /* Modelled bytes over each link, loads and stores. */
        double load_bytes[_KV_TIER_MAX], store_bytes[_KV_TIER_MAX];
        uint64_t evictions;
        double peak_tier_bytes[_KV_TIER_MAX];
        struct stats ttft_first, ttft_follow; /* ns */
        uint64_t sla_met_follow, sla_met;     /* turns with TTFT within the SLA */
        uint64_t first_arrival_ns, last_finish_ns;
        uint64_t iterations;
        uint64_t bytes_errors; /* the hooks' failures */
};

/* Run the trace. 0, -EINVAL, -ENOMEM, or a hook's negative error (the run stops). */
int mt_run(const struct mt_config *c, struct mt_result *ret);
void mt_result_clear(struct mt_result *r);
