/*
 * A simulated LLM-serving loop on a virtual clock: continuous batching,
 * chunked prefill, KV memory in blocks, preemption to a swap backend.
 *
 * Each iteration ranks the live requests, plans a batch (decodes first, then
 * prefill chunks in the token budget left), makes room in KV memory by
 * swapping out lower-ranked requests, then advances the clock by the batch's
 * simulated compute plus transfer time. The KV bytes are real (a sample of
 * each token's KV, written with a pattern derived from request and position),
 * so a request that finishes with the wrong bytes is caught.
 */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "example-util.h"

enum plan_outcome {
        PLAN_NO_ROOM = 0, /* no budget or slot left in this iteration */
        PLAN_OK = 1,
        PLAN_NO_MEMORY = 2, /* not enough KV memory, even after the evictions allowed */
};

struct engine {
        struct engine_config cfg;
        struct kv_swap *swap;

        /* Local KV memory: n_blocks of block_bytes real bytes each, and a free stack. */
        uint8_t *pool;
        uint32_t n_blocks, n_free;
        uint32_t *free_blocks;
        size_t token_bytes, block_bytes;
        uint64_t block_nominal_bytes;
        void **scratch; /* n_blocks pointers, for handing blocks to the swap backend */

        struct request **all;
        size_t n_all, all_allocated, next_arrival;
        struct request **live; /* arrived and not done, in arrival order between steps */
        size_t n_live;

        uint64_t now, iter, last_reselect;
        bool any_selected;
        uint32_t empty_iters;

        struct engine_item *batch;
        struct request **batch_req;
        size_t n_batch;
        uint64_t iter_swap_ns;
        uint64_t iter_overlap_ns; /* layer-wise transfers, overlapped with the compute */
        uint64_t last_iter_ns;    /* how long the last iteration took: the SLA-aware estimate */

        /* LayerKV: per batch item, the window of local blocks its layers pass through. */
        uint32_t *win;               /* window blocks of this iteration, n_blocks at most */
        uint32_t *win_first, *win_n; /* per batch item */
        size_t n_win;
        void **segs;        /* n_blocks pointers to one layer's segments */
        size_t layer_bytes; /* real bytes of one token's KV in one layer */

        engine_token_fn on_token;
        void *userdata;
        struct engine_result res;
};

static const char *const admission_names[_ADMIT_MAX] = {
    [ADMIT_CHUNK] = "chunk",
    [ADMIT_REQUEST] = "request",
    [ADMIT_LAYER] = "layer",
};

const char *engine_admission_to_string(enum engine_admission a)
{
        return a >= 0 && a < _ADMIT_MAX ? admission_names[a] : NULL;
}

int engine_admission_from_string(const char *s, enum engine_admission *ret, uint32_t *ret_layers)
{
        uint32_t k = 4;

        if (!s)
                return -EINVAL;
        if (strncmp(s, "layer:", 6) == 0) {
                char *end;
                errno = 0;
                unsigned long v = strtoul(s + 6, &end, 10);
                if (errno || end == s + 6 || *end || v < 2 || v > 1u << 20)
                        return -EINVAL;
                k = (uint32_t)v;
                *ret = ADMIT_LAYER;
        } else {
                int i;
                for (i = 0; i < _ADMIT_MAX; i++)
                        if (strcmp(s, admission_names[i]) == 0)
                                break;
                if (i == _ADMIT_MAX)
                        return -EINVAL;
                *ret = i;
        }
        if (ret_layers)
                *ret_layers = k;
        return 0;
}

static const char *const layer_full_names[_LAYER_FULL_MAX] = {
    [LAYER_FULL_OFFLOAD] = "offload",
    [LAYER_FULL_WAIT] = "wait",
};

const char *engine_layer_full_to_string(enum engine_layer_full f)
{
        return f >= 0 && f < _LAYER_FULL_MAX ? layer_full_names[f] : NULL;
}

enum engine_layer_full engine_layer_full_from_string(const char *s)
{
        for (int i = 0; i < _LAYER_FULL_MAX; i++)
                if (s && strcmp(s, layer_full_names[i]) == 0)
                        return i;
        return _LAYER_FULL_INVALID;
}

void engine_config_defaults(struct engine_config *c)
{
        /*
         * Roughly an 8B model with grouped-query attention on one H100-class
         * GPU: 128 KiB of KV per token, a few GiB of HBM left for KV after the
         * weights and the activations, iteration costs of that size of model.
         */
        *c = (struct engine_config){
            .sched = SCHED_FAIR,
            .admission = ADMIT_CHUNK,
            .n_layers = 32,
            .admit_layers = 4,
            .layer_full = LAYER_FULL_OFFLOAD,
            .sla_ttft_ns = NSEC_PER_SEC,
            .sla_tbt_ns = 100 * NSEC_PER_MSEC,
            .decode_slots = 64,
            .max_batch_tokens = 1024,
            .max_prefill_chunk = 512,
            .slice_iters = 16,
            .block_tokens = 16,
            .bytes_per_token = 128 << 10,
            .hbm_bytes = UINT64_C(4) << 30,
            .kv_sample_bytes = 32,
            .iter_ns = 8 * NSEC_PER_MSEC,
            .prefill_token_ns = 40 * NSEC_PER_USEC,
            .decode_seq_ns = 300 * NSEC_PER_USEC,
        };
        kv_tier_cost_defaults(c->cost);
}

static uint32_t blocks_for(const struct engine *e, uint64_t tokens)
{
        return (uint32_t)((tokens + e->cfg.block_tokens - 1) / e->cfg.block_tokens);
}

int engine_new(const struct engine_config *c, struct kv_swap *swap, struct engine **ret)
{
        if (!c || !swap || !swap->ops || !ret || c->sched < 0 || c->sched >= _SCHED_MAX ||
            c->decode_slots == 0 || c->max_batch_tokens == 0 || c->max_prefill_chunk == 0 ||
            c->slice_iters == 0 || c->block_tokens == 0 || c->bytes_per_token == 0 ||
            c->kv_sample_bytes < 8 || c->kv_sample_bytes % 8 != 0 || c->n_layers == 0 ||
            c->n_layers > 4096 || c->admission < 0 || c->admission >= _ADMIT_MAX ||
            c->layer_full < 0 || c->layer_full >= _LAYER_FULL_MAX)
                return -EINVAL;
        if (c->admission == ADMIT_LAYER &&
            (c->admit_layers < 2 || c->admit_layers > c->n_layers || !swap->ops->reserve ||
             !swap->ops->write_layer || !swap->ops->seal))
                return -EINVAL;
        for (int t = 0; t < _KV_TIER_MAX; t++)
                if (!(c->cost[t].gbytes_per_s > 0))
                        return -EINVAL;

        uint64_t block_nominal = c->bytes_per_token * c->block_tokens;
        uint64_t n_blocks = c->hbm_bytes / block_nominal;
        if (n_blocks == 0 || n_blocks > UINT32_MAX / 2)
                return -EINVAL;

        struct engine *e = calloc(1, sizeof(*e));
        if (!e)
                return -ENOMEM;
        e->cfg = *c;
        e->swap = swap;
        e->n_blocks = (uint32_t)n_blocks;
        /* Each layer's share of a token's KV sample: whole words, at least one. */
        e->layer_bytes =
            MIN((uint64_t)c->kv_sample_bytes, c->bytes_per_token / 8 * 8) / c->n_layers / 8 * 8;
        if (e->layer_bytes < 8)
                e->layer_bytes = 8;
        e->token_bytes = e->layer_bytes * c->n_layers;
        e->block_bytes = e->token_bytes * c->block_tokens;
        e->block_nominal_bytes = block_nominal;
        e->pool = calloc(n_blocks, e->block_bytes);
        e->free_blocks = calloc(n_blocks, sizeof(*e->free_blocks));
        e->scratch = calloc(n_blocks, sizeof(*e->scratch));
        e->batch = calloc(n_blocks + c->decode_slots + c->max_batch_tokens, sizeof(*e->batch));
        e->batch_req =
            calloc(n_blocks + c->decode_slots + c->max_batch_tokens, sizeof(*e->batch_req));
        size_t items = n_blocks + c->decode_slots + c->max_batch_tokens;
        e->win = calloc(n_blocks, sizeof(*e->win));
        e->win_first = calloc(items, sizeof(*e->win_first));
        e->win_n = calloc(items, sizeof(*e->win_n));
        e->segs = calloc(n_blocks, sizeof(*e->segs));
        e->last_iter_ns = c->iter_ns;
        if (!e->pool || !e->free_blocks || !e->scratch || !e->batch || !e->batch_req || !e->win ||
            !e->win_first || !e->win_n || !e->segs) {
                engine_free(e);
                return -ENOMEM;
        }
        /* Stack order so the lowest block ids go out first: makes runs easy to follow in a
         * debugger. */
        for (uint32_t i = 0; i < e->n_blocks; i++)
                e->free_blocks[i] = e->n_blocks - 1 - i;
        e->n_free = e->n_blocks;
        *ret = e;
        return 0;
}

struct engine *engine_free(struct engine *e)
{
        if (!e)
                return NULL;
        for (size_t i = 0; i < e->n_all; i++) {
                struct request *r = e->all[i];
                if (r->swap_slot)
                        e->swap->ops->discard(e->swap->ctx, r->swap_slot);
                free(r->blocks);
                stats_clear(&r->gaps);
                free(r);
        }
        free(e->win);
        free(e->win_first);
        free(e->win_n);
        free(e->segs);
        free(e->all);
        free(e->live);
        free(e->pool);
        free(e->free_blocks);
        free(e->scratch);
        free(e->batch);
        free(e->batch_req);
        stats_clear(&e->res.ttft);
        stats_clear(&e->res.tbt);
        free(e);
        return NULL;
}

int engine_add(struct engine *e, const struct trace_request *t, uint32_t *ret_id)
{
        if (!e || !t || t->prompt_tokens == 0 || t->output_tokens == 0 || e->n_all >= UINT32_MAX)
                return -EINVAL;
        if (e->n_all > 0 && t->arrival_ns < e->all[e->n_all - 1]->arrival_ns)
                return -EINVAL;
        if (blocks_for(e, (uint64_t)t->prompt_tokens + t->output_tokens - 1) > e->n_blocks) {
                e->res.rejected++;
                return ENGINE_E_TOO_LARGE;
        }
        if (e->n_all == e->all_allocated) {
                size_t n = MAX(e->all_allocated * 2, (size_t)256);
                struct request **a = reallocarray(e->all, n, sizeof(*a));
                if (!a)
                        return -ENOMEM;
                e->all = a;
                struct request **l = reallocarray(e->live, n, sizeof(*l));
                if (!l)
                        return -ENOMEM;
                e->live = l;
                e->all_allocated = n;
        }
        struct request *r = calloc(1, sizeof(*r));
        if (!r)
                return -ENOMEM;
        r->id = (uint32_t)e->n_all;
        r->arrival_ns = t->arrival_ns;
        r->prompt = t->prompt_tokens;
        r->output = t->output_tokens;
        e->all[e->n_all++] = r;
        if (e->res.requests == 0)
                e->res.first_arrival_ns = r->arrival_ns;
        e->res.requests++;
        if (ret_id)
                *ret_id = r->id;
        return 0;
}

void engine_set_token_callback(struct engine *e, engine_token_fn fn, void *userdata)
{
        e->on_token = fn;
        e->userdata = userdata;
}

static void *block_mem(const struct engine *e, uint32_t b)
{
        return e->pool + (size_t)b * e->block_bytes;
}

/* What token pos of request id holds in its KV sample: distinct per (id, pos, word); a
 * layer's words follow on from the previous layer's. */
static uint64_t kv_word(uint32_t id, uint32_t pos, size_t word)
{
        uint64_t z = ((uint64_t)id << 32 | pos) * UINT64_C(0x9e3779b97f4a7c15) + word;
        z = (z ^ (z >> 29)) * UINT64_C(0xbf58476d1ce4e5b9);
        return z ^ (z >> 32);
}

/*
 * A block holds its tokens' KV layer by layer (layer-major), as an engine keeps one tensor per
 * layer: layer l of the block's token t is at l * block_tokens * layer_bytes + t * layer_bytes.
 * A layer's segment of a block is contiguous, so a layer moves as one piece per block.
 */
static uint8_t *kv_at(const struct engine *e, uint8_t *block, uint32_t pos, uint32_t layer)
{
        return block +
               ((size_t)layer * e->cfg.block_tokens + pos % e->cfg.block_tokens) * e->layer_bytes;
}

static void kv_write_layer(const struct engine *e, uint32_t id, uint32_t pos, uint32_t layer,
                           uint8_t *m)
{
        size_t words = e->layer_bytes / 8;
        for (size_t w = 0; w < words; w++) {
                uint64_t v = kv_word(id, pos, layer * words + w);
                memcpy(m + w * 8, &v, 8);
        }
}

static void kv_write(struct engine *e, const struct request *r, uint32_t from, uint32_t to)
{
        for (uint32_t p = from; p < to; p++) {
                uint8_t *b = block_mem(e, r->blocks[p / e->cfg.block_tokens]);
                for (uint32_t l = 0; l < e->cfg.n_layers; l++)
                        kv_write_layer(e, r->id, p, l, kv_at(e, b, p, l));
        }
}

static bool kv_intact(struct engine *e, const struct request *r)
{
        uint32_t n = request_kv_tokens(r);
        size_t words = e->layer_bytes / 8;
        for (uint32_t p = 0; p < n; p++) {
                uint8_t *b = block_mem(e, r->blocks[p / e->cfg.block_tokens]);
                for (uint32_t l = 0; l < e->cfg.n_layers; l++) {
                        const uint8_t *m = kv_at(e, b, p, l);
                        for (size_t w = 0; w < words; w++) {
                                uint64_t v = kv_word(r->id, p, l * words + w), got;
                                memcpy(&got, m + w * 8, 8);
                                if (got != v)
                                        return false;
                        }
                }
        }
        return true;
}

static int blocks_grow(struct engine *e, struct request *r, uint32_t n)
{
        if (n > e->n_free)
                return -ENOSPC; /* callers check first; this is a bug guard */
        if (r->n_blocks + n > r->blocks_allocated) {
                uint32_t want = MAX(r->n_blocks + n, r->blocks_allocated * 2);
                uint32_t *b = reallocarray(r->blocks, want, sizeof(*b));
                if (!b)
                        return -ENOMEM;
                r->blocks = b;
                r->blocks_allocated = want;
        }
        for (uint32_t i = 0; i < n; i++)
                r->blocks[r->n_blocks++] = e->free_blocks[--e->n_free];
        return 0;
}

static void blocks_release(struct engine *e, struct request *r)
{
        for (uint32_t i = 0; i < r->n_blocks; i++)
                e->free_blocks[e->n_free++] = r->blocks[i];
        r->n_blocks = 0;
}

static void charge(struct engine *e, enum kv_tier tier, uint64_t bytes, bool out)
{
        uint64_t ns = kv_tier_cost_ns(&e->cfg.cost[tier], bytes);
        e->iter_swap_ns += ns;
        e->res.swap_ns[tier] += ns;
        if (out)
                e->res.swap_out_bytes[tier] += bytes;
        else
                e->res.swap_in_bytes[tier] += bytes;
}

/* A layer-wise transfer: on its own stream, overlapped with the iteration's compute. */
static void charge_layered(struct engine *e, enum kv_tier tier, uint64_t bytes, bool out)
{
        struct kv_tier_cost c = e->cfg.cost[tier];
        /* One batched copy per layer. */
        uint64_t ns = c.call_ns * e->cfg.n_layers + kv_tier_cost_ns(&c, bytes) - c.call_ns;
        e->iter_overlap_ns += ns;
        e->res.swap_ns[tier] += ns;
        if (out)
                e->res.layer_out_bytes[tier] += bytes;
        else
                e->res.layer_in_bytes[tier] += bytes;
}

static int evict(struct engine *e, struct request *v)
{
        enum kv_tier tier;
        void *slot;
        int r;

        for (uint32_t i = 0; i < v->n_blocks; i++)
                e->scratch[i] = block_mem(e, v->blocks[i]);
        r = e->swap->ops->swap_out(e->swap->ctx, e->scratch, v->n_blocks, e->block_bytes, &slot,
                                   &tier);
        if (r < 0)
                return r;
        charge(e, tier, (uint64_t)v->n_blocks * e->block_nominal_bytes, true);
        v->swap_slot = slot;
        v->swapped_blocks = v->n_blocks;
        blocks_release(e, v);
        v->selected = false;
        v->preemptions++;
        e->res.preemptions++;
        return 0;
}

static int restore(struct engine *e, struct request *c)
{
        enum kv_tier tier = e->swap->ops->tier_of(e->swap->ctx, c->swap_slot);
        uint32_t n = c->swapped_blocks;
        int r;

        r = blocks_grow(e, c, n);
        if (r < 0)
                return r;
        for (uint32_t i = 0; i < n; i++)
                e->scratch[i] = block_mem(e, c->blocks[i]);
        r = e->swap->ops->swap_in(e->swap->ctx, c->swap_slot, e->scratch, n, e->block_bytes);
        c->swap_slot = NULL; /* released by swap_in whatever it returned */
        c->swapped_blocks = 0;
        if (r == -EIO)
                e->res.integrity_errors++;
        else if (r < 0)
                return r;
        /* A prefill's layers, offloaded as they were computed, come back layer by layer before
         * the decode's (the prefetch overlaps the compute); a preempted request all at once. */
        if (tier >= 0 && tier < _KV_TIER_MAX) {
                if (c->layered)
                        charge_layered(e, tier, (uint64_t)n * e->block_nominal_bytes, false);
                else
                        charge(e, tier, (uint64_t)n * e->block_nominal_bytes, false);
        }
        c->layered = false;
        return 0;
}

/*
 * Who may be swapped out to make room for c: resident requests not in this
 * iteration's batch that rank below c, or (fair) decodes outside the running
 * set once every decode slot is taken: their slice is not running anyway.
 * Lowest rank first.
 */
static struct request *pick_victim(struct engine *e, const struct request *c, uint32_t decodes_left)
{
        for (size_t i = e->n_live; i-- > 0;) {
                struct request *v = e->live[i];
                if (v == c || v->in_batch || v->n_blocks == 0 || v->urgent)
                        continue;
                if (v->rank > c->rank)
                        return v;
                if (e->cfg.sched == SCHED_FAIR && !v->selected && decodes_left == 0 &&
                    request_in_decode(v))
                        return v;
        }
        return NULL;
}

static uint32_t sat_sub(uint32_t a, uint32_t b)
{
        return a > b ? a - b : 0;
}

/* Evict until `need` blocks are free or nobody may go; false when they are not. */
static int make_room(struct engine *e, const struct request *c, uint32_t need, bool may_evict,
                     uint32_t decodes)
{
        while (e->n_free < need && may_evict) {
                struct request *v = pick_victim(e, c, decodes);
                if (!v)
                        break;
                int r = evict(e, v);
                if (r < 0)
                        return r;
        }
        return e->n_free >= need;
}

static void batch_add(struct engine *e, struct request *c, uint32_t want, bool prefill,
                      uint32_t *budget, uint32_t *decodes)
{
        e->win_n[e->n_batch] = 0;
        e->batch_req[e->n_batch] = c;
        e->batch[e->n_batch++] = (struct engine_item){c->id, want, prefill};
        c->in_batch = true;
        c->selected = true;
        *budget -= want;
        if (!prefill)
                (*decodes)--;
}

/* Full blocks that hold `layers` layers of n blocks' worth of KV. */
static uint32_t window_blocks(const struct engine *e, uint32_t n, uint32_t layers)
{
        return (uint32_t)(((uint64_t)n * layers + e->cfg.n_layers - 1) / e->cfg.n_layers);
}

/*
 * LayerKV: a prefill chunk whose KV goes through a window of admit_layers layers of local
 * memory: each layer is computed into the window and offloaded to the request's swap slot while
 * the next layer computes, so the prompt never holds more than the window. Chunks start on a
 * block boundary so that each writes whole blocks of the slot.
 */
static int plan_layered(struct engine *e, struct request *c, bool may_evict, uint32_t *budget,
                        uint32_t *decodes)
{
        uint32_t bt = e->cfg.block_tokens, k = e->cfg.admit_layers;
        uint32_t kv = c->prefilled;
        uint32_t want = MIN(MIN(c->prompt - kv, *budget), e->cfg.max_prefill_chunk);
        int r;

        if (kv + want < c->prompt)
                want = want / bt * bt;
        if (want == 0)
                return PLAN_NO_ROOM;
        bool evict_ok = may_evict && e->cfg.layer_full == LAYER_FULL_OFFLOAD;
        uint32_t n = blocks_for(e, (uint64_t)kv + want) - kv / bt;
        r = make_room(e, c, window_blocks(e, n, k), evict_ok, *decodes);
        if (r < 0)
                return r;
        if (r == 0) {
                /* A smaller chunk whose window fits, or the request waits. */
                uint32_t fit = (uint32_t)((uint64_t)e->n_free * e->cfg.n_layers / k);
                if (fit == 0)
                        return PLAN_NO_MEMORY;
                want = MIN(want, fit * bt);
                if (kv + want < c->prompt)
                        want = want / bt * bt;
                if (want == 0)
                        return PLAN_NO_MEMORY;
                n = blocks_for(e, (uint64_t)kv + want) - kv / bt;
        }
        if (!c->swap_slot) {
                enum kv_tier tier;
                uint32_t total = blocks_for(e, c->prompt);
                r = e->swap->ops->reserve(e->swap->ctx, total, e->block_bytes, e->cfg.n_layers,
                                          &c->swap_slot, &tier);
                if (r == -ENOSPC)
                        return PLAN_NO_MEMORY;
                if (r < 0)
                        return r;
                c->layering = true;
                c->layered_blocks = total;
        }
        uint32_t w = window_blocks(e, n, k);
        e->win_first[e->n_batch] = (uint32_t)e->n_win;
        for (uint32_t i = 0; i < w; i++)
                e->win[e->n_win++] = e->free_blocks[--e->n_free];
        size_t item = e->n_batch;
        batch_add(e, c, want, true, budget, decodes);
        e->win_n[item] = w;

        /* The chunk's layers go out; the earlier chunks' layers come in for its attention. */
        enum kv_tier tier = e->swap->ops->tier_of(e->swap->ctx, c->swap_slot);
        if (tier >= 0 && tier < _KV_TIER_MAX) {
                charge_layered(e, tier, (uint64_t)n * e->block_nominal_bytes, true);
                if (kv > 0)
                        charge_layered(e, tier, (uint64_t)(kv / bt) * e->block_nominal_bytes,
                                       false);
        }
        e->res.layered_prefills++;
        return PLAN_OK;
}

static int plan_one(struct engine *e, struct request *c, bool may_evict, uint32_t *budget,
                    uint32_t *decodes)
{
        bool decode = request_in_decode(c);
        uint32_t kv = request_kv_tokens(c);
        uint32_t want;
        int r;

        if (*budget == 0 || (decode && *decodes == 0))
                return PLAN_NO_ROOM;
        if (!decode && e->cfg.admission == ADMIT_LAYER && c->n_blocks == 0 &&
            (!c->swap_slot || c->layering))
                return plan_layered(e, c, may_evict, budget, decodes);
        want = decode ? 1 : MIN(MIN(c->prompt - c->prefilled, *budget), e->cfg.max_prefill_chunk);

        /* Whole-context admission: the first chunk of a prompt reserves KV for all of it. */
        bool reserve =
            !decode && e->cfg.admission == ADMIT_REQUEST && c->prefilled == 0 && !c->swap_slot;
        uint32_t alloc_tokens = reserve ? c->prompt : kv + want;

        /* Swapped-out blocks must all come back (a reservation may hold more than its tokens),
         * plus room for the new tokens. */
        uint32_t need = sat_sub(MAX(blocks_for(e, alloc_tokens), c->swapped_blocks), c->n_blocks);
        r = make_room(e, c, need, may_evict, *decodes);
        if (r < 0)
                return r;
        if (e->n_free < need) {
                /* A prefill chunk can shrink to what fits; a decode or a reservation cannot. */
                uint64_t fit = (uint64_t)(c->n_blocks + e->n_free) * e->cfg.block_tokens;
                if (decode || reserve || fit <= kv || c->swapped_blocks > e->n_free)
                        return PLAN_NO_MEMORY;
                want = (uint32_t)MIN((uint64_t)want, fit - kv);
                alloc_tokens = kv + want;
        }

        if (c->swap_slot) {
                r = restore(e, c);
                if (r < 0)
                        return r;
        }
        r = blocks_grow(e, c, sat_sub(blocks_for(e, alloc_tokens), c->n_blocks));
        /* (restore() brought back the swapped blocks, so n_blocks counts them now.) */
        if (r < 0)
                return r;

        batch_add(e, c, want, !decode, budget, decodes);
        return PLAN_OK;
}

static void admit(struct engine *e)
{
        while (e->next_arrival < e->n_all && e->all[e->next_arrival]->arrival_ns <= e->now)
                e->live[e->n_live++] = e->all[e->next_arrival++];
}

/* A decode whose KV is resident: it emits a token every iteration it runs. */
static bool streaming(const struct request *r)
{
        return request_in_decode(r) && r->generated > 0 && r->n_blocks > 0;
}

/*
 * The fair scheduler made SLA-aware (tbt_budget_ns > 0). The time-sliced scheduler's TBT tail
 * comes from preempting decodes: least-served-first ranks a decode lower with every token it
 * makes, so under memory pressure the longest-running decodes are swapped out again and again
 * for newer ones and wait whole slices (or bursts) for a place; every such stall is one gap
 * between tokens. Here a streaming decode (its KV resident) runs every iteration and is never
 * swapped out for anyone else, so its gaps are one iteration long. Prefills keep the fair order
 * (least progress first) and run in memory kept free for them (reserve: one iteration's
 * tokens), so a burst's prompts are prefilled at once instead of queueing behind the decodes;
 * when the streaming set would eat into that reserve (or exceeds the decode slots), the decode
 * with the fewest tokens so far is parked (swapped out: one long gap, its first); parked
 * decodes come back oldest first when memory beyond the reserve is free. The price of a park
 * is a swap-out and a swap-in of its whole context, over whichever link the KV goes: that is
 * where peer memory over NVLink beats DRAM over PCIe.
 */
static int plan_sla(struct engine *e)
{
        uint32_t budget = e->cfg.max_batch_tokens, decodes = e->cfg.decode_slots;
        uint32_t reserve = MIN(blocks_for(e, e->cfg.max_batch_tokens), e->n_blocks / 4);
        int r;

        /* Streaming decodes first, earliest last token first; then the fair order. */
        for (size_t i = 0; i < e->n_live; i++)
                e->live[i]->urgent = streaming(e->live[i]);
        sched_rank(SCHED_FAIR, e->live, e->n_live);

        /*
         * Park while the streaming set is over its share of memory (room for a block each and
         * the reserve) or of the decode slots: a decode that never was parked, fewest tokens
         * first, so each request waits in one gap at most. Only when streaming decodes could
         * not even grow does an already parked one go again.
         */
        for (;;) {
                uint64_t used = 0, n = 0;
                struct request *fresh = NULL, *any = NULL;
                for (size_t i = 0; i < e->n_live; i++) {
                        struct request *c = e->live[i];
                        if (!c->urgent)
                                continue;
                        used += c->n_blocks;
                        n++;
                        if (!any || c->generated < any->generated ||
                            (c->generated == any->generated && c->arrival_ns > any->arrival_ns))
                                any = c;
                        if (!c->parked && (!fresh || c->generated < fresh->generated ||
                                           (c->generated == fresh->generated &&
                                            c->arrival_ns > fresh->arrival_ns)))
                                fresh = c;
                }
                bool hard = n > e->cfg.decode_slots || used + n > e->n_blocks;
                bool over = hard || used + n + reserve > e->n_blocks;
                struct request *v = fresh ?: (hard ? any : NULL);
                if (!over || !v || n <= 1)
                        break;
                r = evict(e, v);
                if (r < 0)
                        return r;
                v->urgent = false;
                v->parked = true;
        }

        e->n_batch = 0;
        e->n_win = 0;
        e->iter_swap_ns = 0;
        e->iter_overlap_ns = 0;

        for (size_t i = 0; i < e->n_live; i++) {
                struct request *c = e->live[i];
                c->selected = false;
                if (!c->urgent)
                        continue;
                /* Out of blocks to grow: the lowest-ranked other streaming decode is parked. */
                r = plan_one(e, c, true, &budget, &decodes);
                if (r < 0)
                        return r;
        }
        /* Prefills, least progress first, in free memory only. */
        for (size_t i = 0; i < e->n_live && budget > 0; i++) {
                struct request *c = e->live[i];
                if (c->in_batch || request_in_decode(c))
                        continue;
                /* LayerKV's "offload another request's layers" may swap out a lower-ranked
                 * prefill that holds memory; streaming decodes are never taken. */
                r = plan_one(e, c,
                             e->cfg.admission == ADMIT_LAYER &&
                                 e->cfg.layer_full == LAYER_FULL_OFFLOAD,
                             &budget, &decodes);
                if (r < 0)
                        return r;
        }
        /* Parked decodes, oldest token first, while memory beyond the reserve is free. */
        struct request *parked[64];
        size_t n_parked = 0;
        for (size_t i = 0; i < e->n_live; i++) {
                struct request *c = e->live[i];
                if (c->in_batch || !request_in_decode(c) || c->n_blocks > 0 || c->layering)
                        continue;
                if (n_parked < ARRAY_SIZE(parked))
                        parked[n_parked++] = c;
                else {
                        /* Keep the 64 oldest. */
                        size_t m = 0;
                        for (size_t j = 1; j < n_parked; j++)
                                if (parked[j]->last_token_ns > parked[m]->last_token_ns)
                                        m = j;
                        if (c->last_token_ns < parked[m]->last_token_ns)
                                parked[m] = c;
                }
        }
        while (decodes > 0 && budget > 0 && n_parked > 0) {
                size_t m = 0;
                for (size_t j = 1; j < n_parked; j++)
                        if (parked[j]->last_token_ns < parked[m]->last_token_ns ||
                            (parked[j]->last_token_ns == parked[m]->last_token_ns &&
                             parked[j]->id < parked[m]->id))
                                m = j;
                struct request *c = parked[m];
                parked[m] = parked[--n_parked];
                uint32_t need =
                    MAX(blocks_for(e, (uint64_t)request_kv_tokens(c) + 1), c->swapped_blocks);
                /* Beyond the reserve, and a block of growth for every streaming decode. */
                uint32_t n_streaming = 0;
                for (size_t i = 0; i < e->n_live; i++)
                        n_streaming += e->live[i]->urgent;
                if (e->n_free < need + reserve + 2 * n_streaming)
                        break;
                r = plan_one(e, c, false, &budget, &decodes);
                if (r < 0)
                        return r;
        }

        e->any_selected = false;
        for (size_t i = 0; i < e->n_live; i++) {
                struct request *c = e->live[i];
                if (!c->in_batch)
                        c->selected = false;
                e->any_selected = e->any_selected || c->selected;
        }
        return 0;
}

static int plan(struct engine *e)
{
        if (e->cfg.sched == SCHED_FAIR && e->cfg.tbt_budget_ns > 0)
                return plan_sla(e);

        bool fair = e->cfg.sched == SCHED_FAIR;
        uint32_t budget = e->cfg.max_batch_tokens, decodes = e->cfg.decode_slots;
        int r;

        /* Arrival order is FCFS's order already; the fair order changes with progress. */
        if (fair)
                sched_rank(SCHED_FAIR, e->live, e->n_live);
        else
                for (size_t i = 0; i < e->n_live; i++)
                        e->live[i]->rank = i;

        /* The fair scheduler re-ranks everyone once per time slice, counted in iterations. */
        bool boundary =
            fair && (!e->any_selected || e->iter - e->last_reselect >= e->cfg.slice_iters);
        if (boundary) {
                for (size_t i = 0; i < e->n_live; i++)
                        e->live[i]->selected = false;
                e->last_reselect = e->iter;
        }

        e->n_batch = 0;
        e->n_win = 0;
        e->iter_swap_ns = 0;
        e->iter_overlap_ns = 0;

        /* The running set keeps running: its decodes first, then its prefill chunks. */
        for (int pass = 0; pass < 2; pass++)
                for (size_t i = 0; i < e->n_live; i++) {
                        struct request *c = e->live[i];
                        if (!c->selected || c->in_batch || request_in_decode(c) != (pass == 0))
                                continue;
                        r = plan_one(e, c, true, &budget, &decodes);
                        if (r < 0)
                                return r;
                        /* Out of memory with nobody below it to evict: it yields its own blocks. */
                        if (r == PLAN_NO_MEMORY && c->n_blocks > 0) {
                                r = evict(e, c);
                                if (r < 0)
                                        return r;
                        }
                        if (r == PLAN_NO_MEMORY)
                                c->selected = false;
                }

        /* Then newcomers in rank order. FCFS stops at the first that does not fit (no overtaking).
         */
        for (size_t i = 0; i < e->n_live && budget > 0; i++) {
                struct request *c = e->live[i];
                if (c->selected || c->in_batch)
                        continue;
                r = plan_one(e, c, boundary, &budget, &decodes);
                if (r < 0)
                        return r;
                /* A LayerKV prefill needs only a window for the iteration: it may pass a
                 * decode waiting for memory to prefetch its layers into. */
                if (r == PLAN_NO_MEMORY && !fair && !c->layered)
                        break;
        }

        /*
         * Fair: the slice belongs to those that got a place in this batch, so
         * a member that found no slot does not take one from them later in the
         * slice as its rank improves. FCFS keeps its running set as it is.
         */
        e->any_selected = false;
        for (size_t i = 0; i < e->n_live; i++) {
                struct request *c = e->live[i];
                if (fair && !c->in_batch)
                        c->selected = false;
                e->any_selected = e->any_selected || c->selected;
        }
        return 0;
}

static void emit(struct engine *e, struct request *c, uint64_t t)
{
        if (e->on_token)
                e->on_token(e->userdata, c->id, c->generated - 1, t);
}

/* Did c meet the SLA: TTFT, and the p99 of its own gaps between tokens? */
static void sla_check(struct engine *e, struct request *c)
{
        bool ttft = c->first_token_ns - c->arrival_ns <= e->cfg.sla_ttft_ns, tbt = true;
        uint64_t p99;

        if (stats_percentile(&c->gaps, 99, &p99) == 0)
                tbt = p99 <= e->cfg.sla_tbt_ns;
        stats_clear(&c->gaps);
        e->res.sla_ttft_met += ttft;
        e->res.sla_tbt_met += tbt;
        e->res.sla_met += ttft && tbt;
}

static int finish(struct engine *e, struct request *c, uint64_t t)
{
        if (c->swap_slot) {
                /* A one-token request done at the end of a layered prefill: its KV was never
                 * needed back. */
                e->swap->ops->discard(e->swap->ctx, c->swap_slot);
                c->swap_slot = NULL;
                c->layered = false;
        } else if (!kv_intact(e, c))
                e->res.integrity_errors++;
        sla_check(e, c);
        blocks_release(e, c);
        c->done = true;
        c->selected = false;
        c->finish_ns = t;
        e->res.requests_done++;
        e->res.prompt_tokens += c->prompt;
        e->res.output_tokens += c->output;
        e->res.last_finish_ns = MAX(e->res.last_finish_ns, t);
        return 0;
}

/*
 * LayerKV: compute a chunk's KV layer by layer into the window (admit_layers layers of its
 * blocks, used round-robin) and hand each layer to the swap backend as soon as it is written,
 * while the next one is computed into the next part of the window. The slot is sealed (every
 * copy done) before the window goes back.
 */
static int layered_chunk(struct engine *e, struct request *c, size_t item)
{
        uint32_t bt = e->cfg.block_tokens, k = e->cfg.admit_layers, L = e->cfg.n_layers;
        uint32_t from = c->prefilled, to = from + e->batch[item].tokens;
        uint32_t first = from / bt, n = blocks_for(e, to) - first;
        const uint32_t *win = e->win + e->win_first[item];
        size_t seg = (size_t)bt * e->layer_bytes;
        int r;

        for (uint32_t l = 0; l < L; l++) {
                /* Window segment q: full block q / L, its segment q % L. */
                for (uint32_t j = 0; j < n; j++) {
                        uint64_t q = (uint64_t)(l % k) * n + j;
                        e->segs[j] = (uint8_t *)block_mem(e, win[q / L]) + (q % L) * seg;
                }
                for (uint32_t p = from; p < to; p++)
                        kv_write_layer(e, c->id, p, l,
                                       (uint8_t *)e->segs[p / bt - first] +
                                           (size_t)(p % bt) * e->layer_bytes);
                r = e->swap->ops->write_layer(e->swap->ctx, c->swap_slot, l, first, e->segs, n);
                if (r < 0)
                        return r;
        }
        r = e->swap->ops->seal(e->swap->ctx, c->swap_slot);
        if (r < 0)
                return r;
        if (to == c->prompt) {
                /* Prefilled: its whole prompt's KV waits in the slot for the decode. */
                c->layering = false;
                c->layered = true;
                c->parked = true; /* its one wait: for the prefetch before its decode */
                c->swapped_blocks = c->layered_blocks;
        }
        return 0;
}

static int execute(struct engine *e)
{
        uint64_t prefill_tokens = 0, decodes = 0;
        int r;

        for (size_t i = 0; i < e->n_batch; i++) {
                if (e->batch[i].prefill)
                        prefill_tokens += e->batch[i].tokens;
                else
                        decodes++;
        }
        /*
         * Layer-wise transfers run on their own streams, layer i's beside layer i + 1's
         * compute: the iteration takes the longer of the two, plus one layer of the shorter
         * (the pipeline's fill). Whole-request swaps stall it.
         */
        uint64_t compute = e->cfg.iter_ns + prefill_tokens * e->cfg.prefill_token_ns +
                           decodes * e->cfg.decode_seq_ns;
        uint64_t x = e->iter_overlap_ns;
        uint64_t busy = MAX(compute, x) + MIN(compute, x) / e->cfg.n_layers;
        e->res.overlap_ns += x;
        e->res.hidden_ns += compute + x - busy;
        uint64_t end = e->now + busy + e->iter_swap_ns;

        for (size_t i = 0; i < e->n_batch; i++) {
                struct request *c = e->batch_req[i];
                uint32_t kv = request_kv_tokens(c);

                if (e->win_n[i] > 0) {
                        r = layered_chunk(e, c, i);
                        if (r < 0)
                                return r;
                } else
                        kv_write(e, c, kv, kv + e->batch[i].tokens);
                c->in_batch = false;
                if (e->batch[i].prefill) {
                        c->prefilled += e->batch[i].tokens;
                        if (c->prefilled < c->prompt)
                                continue;
                        /* The last prefill chunk yields the first output token. */
                        c->generated = 1;
                        c->first_token_ns = end;
                        r = stats_add(&e->res.ttft, end - c->arrival_ns);
                } else {
                        c->generated++;
                        r = stats_add(&e->res.tbt, end - c->last_token_ns);
                        if (r >= 0)
                                r = stats_add(&c->gaps, end - c->last_token_ns);
                }
                if (r < 0)
                        return r;
                c->last_token_ns = end;
                emit(e, c, end);
                if (c->generated == c->output) {
                        r = finish(e, c, end);
                        if (r < 0)
                                return r;
                }
        }
        /* The windows go back once every layer has left them. */
        for (size_t i = 0; i < e->n_win; i++)
                e->free_blocks[e->n_free++] = e->win[i];
        e->n_win = 0;
        e->last_iter_ns = end - e->now;
        e->now = end;

        size_t k = 0;
        for (size_t i = 0; i < e->n_live; i++)
                if (!e->live[i]->done)
                        e->live[k++] = e->live[i];
        e->n_live = k;
        return 0;
}

int engine_step(struct engine *e)
{
        int r;

        if (!e)
                return -EINVAL;
        admit(e);
        if (e->n_live == 0) {
                if (e->next_arrival == e->n_all)
                        return ENGINE_DONE;
                /* Idle: the virtual clock jumps to the next arrival. */
                e->now = MAX(e->now, e->all[e->next_arrival]->arrival_ns);
                admit(e);
        }
        if (e->swap->ops->poll) {
                r = e->swap->ops->poll(e->swap->ctx);
                if (r < 0)
                        return r;
        }
        r = plan(e);
        if (r < 0)
                return r;
        /* An empty plan only happens when a slice ends with nobody selected; two in a row is a bug.
         */
        if (e->n_batch == 0 && ++e->empty_iters > 2)
                return -EDEADLK;
        if (e->n_batch > 0)
                e->empty_iters = 0;
        r = execute(e);
        if (r < 0)
                return r;
        e->iter++;
        e->res.iterations++;
        return 0;
}

int engine_run(struct engine *e)
{
        int r;
        while ((r = engine_step(e)) == 0)
                ;
        return r == ENGINE_DONE ? 0 : r;
}

uint64_t engine_now(const struct engine *e)
{
        return e->now;
}

const struct engine_item *engine_last_batch(const struct engine *e, size_t *ret_n)
{
        *ret_n = e->n_batch;
        return e->batch;
}

const struct request *engine_request(const struct engine *e, uint32_t id)
{
        return id < e->n_all ? e->all[id] : NULL;
}

const struct engine_result *engine_result(const struct engine *e)
{
        return &e->res;
}

void engine_take_result(struct engine *e, struct engine_result *ret)
{
        *ret = e->res;
        e->res.ttft = (struct stats){};
        e->res.tbt = (struct stats){};
}
