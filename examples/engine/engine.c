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
#include "time-util.h"
#include "util.h"

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

        engine_token_fn on_token;
        void *userdata;
        struct engine_result res;
};

void engine_config_defaults(struct engine_config *c)
{
        /*
         * Roughly an 8B model with grouped-query attention on one H100-class
         * GPU: 128 KiB of KV per token, a few GiB of HBM left for KV after the
         * weights and the activations, iteration costs of that size of model.
         */
        *c = (struct engine_config){
            .sched = SCHED_FAIR,
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
            c->kv_sample_bytes < 8 || c->kv_sample_bytes % 8 != 0)
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
        e->token_bytes = MIN((uint64_t)c->kv_sample_bytes, c->bytes_per_token / 8 * 8);
        if (e->token_bytes < 8)
                e->token_bytes = 8;
        e->block_bytes = e->token_bytes * c->block_tokens;
        e->block_nominal_bytes = block_nominal;
        e->pool = calloc(n_blocks, e->block_bytes);
        e->free_blocks = calloc(n_blocks, sizeof(*e->free_blocks));
        e->scratch = calloc(n_blocks, sizeof(*e->scratch));
        e->batch = calloc(n_blocks + c->decode_slots + c->max_batch_tokens, sizeof(*e->batch));
        e->batch_req =
            calloc(n_blocks + c->decode_slots + c->max_batch_tokens, sizeof(*e->batch_req));
        if (!e->pool || !e->free_blocks || !e->scratch || !e->batch || !e->batch_req) {
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
                free(r);
        }
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

/* What token pos of request id holds in its KV sample: distinct per (id, pos, word). */
static uint64_t kv_word(uint32_t id, uint32_t pos, size_t word)
{
        uint64_t z = ((uint64_t)id << 32 | pos) * UINT64_C(0x9e3779b97f4a7c15) + word;
        z = (z ^ (z >> 29)) * UINT64_C(0xbf58476d1ce4e5b9);
        return z ^ (z >> 32);
}

static void kv_write(struct engine *e, const struct request *r, uint32_t from, uint32_t to)
{
        for (uint32_t p = from; p < to; p++) {
                uint8_t *m = (uint8_t *)block_mem(e, r->blocks[p / e->cfg.block_tokens]) +
                             (size_t)(p % e->cfg.block_tokens) * e->token_bytes;
                for (size_t w = 0; w < e->token_bytes / 8; w++) {
                        uint64_t v = kv_word(r->id, p, w);
                        memcpy(m + w * 8, &v, 8);
                }
        }
}

static bool kv_intact(struct engine *e, const struct request *r)
{
        uint32_t n = request_kv_tokens(r);
        for (uint32_t p = 0; p < n; p++) {
                const uint8_t *m =
                    (const uint8_t *)block_mem(e, r->blocks[p / e->cfg.block_tokens]) +
                    (size_t)(p % e->cfg.block_tokens) * e->token_bytes;
                for (size_t w = 0; w < e->token_bytes / 8; w++) {
                        uint64_t v = kv_word(r->id, p, w), got;
                        memcpy(&got, m + w * 8, 8);
                        if (got != v)
                                return false;
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
        if (tier >= 0 && tier < _KV_TIER_MAX)
                charge(e, tier, (uint64_t)n * e->block_nominal_bytes, false);
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
                if (v == c || v->in_batch || v->n_blocks == 0)
                        continue;
                if (v->rank > c->rank)
                        return v;
                if (e->cfg.sched == SCHED_FAIR && !v->selected && decodes_left == 0 &&
                    request_in_decode(v))
                        return v;
        }
        return NULL;
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
        want = decode ? 1 : MIN(MIN(c->prompt - c->prefilled, *budget), e->cfg.max_prefill_chunk);

        /* Swapped-out blocks must all come back, plus room for the new tokens. */
        uint32_t need = blocks_for(e, (uint64_t)kv + want) - c->n_blocks;
        while (e->n_free < need && may_evict) {
                struct request *v = pick_victim(e, c, *decodes);
                if (!v)
                        break;
                r = evict(e, v);
                if (r < 0)
                        return r;
        }
        if (e->n_free < need) {
                /* A prefill chunk can shrink to what fits; a decode cannot. */
                uint64_t fit = (uint64_t)(c->n_blocks + e->n_free) * e->cfg.block_tokens;
                if (decode || fit <= kv)
                        return PLAN_NO_MEMORY;
                want = (uint32_t)MIN((uint64_t)want, fit - kv);
                need = blocks_for(e, (uint64_t)kv + want) - c->n_blocks;
        }

        if (c->swap_slot) {
                r = restore(e, c);
                if (r < 0)
                        return r;
        }
        r = blocks_grow(e, c, blocks_for(e, (uint64_t)kv + want) - c->n_blocks);
        if (r < 0)
                return r;

        e->batch_req[e->n_batch] = c;
        e->batch[e->n_batch++] = (struct engine_item){c->id, want, !decode};
        c->in_batch = true;
        c->selected = true;
        *budget -= want;
        if (decode)
                (*decodes)--;
        return PLAN_OK;
}

static void admit(struct engine *e)
{
        while (e->next_arrival < e->n_all && e->all[e->next_arrival]->arrival_ns <= e->now)
                e->live[e->n_live++] = e->all[e->next_arrival++];
}

static int plan(struct engine *e)
{
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
        e->iter_swap_ns = 0;

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
                if (r == PLAN_NO_MEMORY && !fair)
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

static int finish(struct engine *e, struct request *c, uint64_t t)
{
        if (!kv_intact(e, c))
                e->res.integrity_errors++;
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
        uint64_t end = e->now + e->cfg.iter_ns + prefill_tokens * e->cfg.prefill_token_ns +
                       decodes * e->cfg.decode_seq_ns + e->iter_swap_ns;

        for (size_t i = 0; i < e->n_batch; i++) {
                struct request *c = e->batch_req[i];
                uint32_t kv = request_kv_tokens(c);

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
