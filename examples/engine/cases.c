/* The long-prompt and multi-turn models (cases.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cases.h"
#include "rng.h"

/* ---------------------------------------------------------------------- one long prompt */

void lp_model_defaults(struct lp_model *m)
{
        *m = (struct lp_model){
            .layers = 32,
            .kv_bytes_per_token_layer = 2 * 8 * 128 * 2,
            .hidden_bytes_per_token = 4096 * 2,
            .weight_bytes = 8.03e9 * 2,
            .hbm_bytes = 80e9,
            .mem_util = 0.9,
            .activation_bytes = 2e9,
            .hbm_gbps = 3000,
            .buffers = 2,
        };
}

int lp_plan(const struct lp_model *m, uint64_t context, struct lp_plan *ret)
{
        if (m->layers == 0 || m->layers > LP_MAX_LAYERS || m->kv_bytes_per_token_layer == 0 ||
            context == 0 || m->buffers == 0 || !(m->hbm_gbps > 0))
                return -EINVAL;
        *ret = (struct lp_plan){
            .context = context,
            .kv_layer_bytes = context * m->kv_bytes_per_token_layer,
            .kv_budget_bytes = m->hbm_bytes * m->mem_util - m->weight_bytes - m->activation_bytes,
        };
        double fit =
            ret->kv_budget_bytes > 0 ? floor(ret->kv_budget_bytes / ret->kv_layer_bytes) : 0;
        if (fit >= m->layers) {
                ret->resident = m->layers;
                return 0;
        }
        if (fit < m->buffers)
                return -E2BIG;
        ret->resident = (unsigned)fit - m->buffers;
        ret->offloaded = m->layers - ret->resident;
        /* Spread the offloaded layers evenly so that each transfer has resident compute to hide
         * behind (all of them at the end would leave the last ones exposed). */
        for (unsigned i = 0; i < m->layers; i++)
                ret->offload[i] = ((uint64_t)(i + 1) * ret->offloaded) / m->layers !=
                                  ((uint64_t)i * ret->offloaded) / m->layers;
        return 0;
}

#define LP_STEPS 4

void lp_step(const struct lp_model *m, const struct lp_plan *p, const struct kv_tier_cost *link,
             struct lp_step *ret)
{
        /* Bytes over GB/s is nanoseconds. */
        double compute = (m->weight_bytes / m->layers + (double)p->kv_layer_bytes) / m->hbm_gbps;
        unsigned o = link ? p->offloaded : 0;
        double transfer =
            o ? (double)link->call_ns + (double)p->kv_layer_bytes / link->gbytes_per_s : 0;
        size_t n = (size_t)o * LP_STEPS;
        double *xfer_end = n ? calloc(n, sizeof(double)) : NULL,
               *done = n ? calloc(n, sizeof(double)) : NULL;
        double t = 0, prev_step_end = 0, step_end = 0, prefetch_free = 0;
        size_t k = 0, issued = 0;

        *ret = (struct lp_step){.compute_ns = compute * m->layers, .transfer_ns = transfer * o};
        if (n && (!xfer_end || !done)) {
                /* No memory for the pipeline: the serial bound, transfers not hidden. */
                free(xfer_end);
                free(done);
                ret->step_ns = ret->compute_ns + ret->transfer_ns;
                goto out;
        }
        for (unsigned s = 0; s < LP_STEPS; s++) {
                prev_step_end = step_end;
                for (unsigned i = 0; i < m->layers; i++) {
                        if (o && p->offload[i]) {
                                /* Issue prefetches up to this one: each waits for the stream and
                                 * for its buffer, freed when the layer `buffers` back computed. */
                                for (; issued <= k; issued++) {
                                        double start = prefetch_free;
                                        if (issued >= m->buffers &&
                                            done[issued - m->buffers] > start)
                                                start = done[issued - m->buffers];
                                        xfer_end[issued] = start + transfer;
                                        prefetch_free = xfer_end[issued];
                                }
                                if (xfer_end[k] > t)
                                        t = xfer_end[k];
                                t += compute;
                                done[k++] = t;
                        } else
                                t += compute;
                }
                step_end = t;
        }
        ret->step_ns = step_end - prev_step_end;
        free(xfer_end);
        free(done);
out:
        ret->tokens_per_s = ret->step_ns > 0 ? 1e9 / ret->step_ns : 0;
        /* In: every offloaded layer's KV; out: the new token's KV of each. */
        ret->link_bytes = (double)o * (double)(p->kv_layer_bytes + m->kv_bytes_per_token_layer);
}

/* ---------------------------------------------------------------------- multi-turn */

const char *mt_tier_to_string(enum mt_tier t)
{
        static const char *const names[_MT_TIER_MAX] = {"none", "dram", "peer", "aqua"};
        return (unsigned)t < _MT_TIER_MAX ? names[t] : "?";
}

void mt_trace_gen_defaults(struct mt_trace_gen *g)
{
        *g = (struct mt_trace_gen){
            .conversations = 200,
            .seed = 1,
            .rate = 0.5,
            .turns_min = 2,
            .turns_max = 8,
            .first_median = 8000,
            .first_sigma = 0.6,
            .user_median = 150,
            .user_sigma = 1.0,
            .output_median = 300,
            .output_sigma = 0.7,
            .first_min = 1500,
            .first_max = 24000,
            .user_min = 10,
            .user_max = 2000,
            .output_min = 20,
            .output_max = 1500,
            .context_max = 32768,
            .think_mean_s = 30,
        };
}

void mt_config_defaults(struct mt_config *c)
{
        struct lp_model m;
        lp_model_defaults(&m);
        *c = (struct mt_config){
            .tier = MT_AQUA,
            .bytes_per_token = m.kv_bytes_per_token_layer * m.layers,
            .hbm_kv_bytes = m.hbm_bytes * m.mem_util - m.weight_bytes - m.activation_bytes,
            .iter_ns = 8000000,
            .prefill_token_ns = 40000,
            .decode_seq_ns = 300000,
            .decode_slots = 64,
            .batch_tokens = 1024,
            .prefill_chunk = 512,
            .block_tokens = 16,
            .peer_capacity_bytes = 40e9,
            .dram_capacity_bytes = 128e9,
            .sla_ttft_ns = 1000000000,
        };
        mt_trace_gen_defaults(&c->gen);
        struct kv_tier_cost cost[_KV_TIER_MAX];
        kv_tier_cost_defaults(cost);
        c->peer = cost[KV_TIER_PEER];
        c->dram = cost[KV_TIER_DRAM];
}

void mt_result_clear(struct mt_result *r)
{
        stats_clear(&r->ttft_first);
        stats_clear(&r->ttft_follow);
        *r = (struct mt_result){};
}

#define MT_MAX_TURNS 64

struct mt_turn {
        uint32_t user, output;
        double think_s; /* after this turn's reply */
};

/* A tier's copy of a conversation's context. */
struct mt_entry {
        bool present;
        enum kv_tier where;
        uint64_t tokens;
        uint64_t ready_ns; /* its store has completed */
        uint64_t used;     /* LRU clock */
};

struct mt_conv {
        unsigned n_turns, turn;
        struct mt_turn turns[MT_MAX_TURNS];
        uint64_t first_arrival_ns, next_arrival_ns;
        bool waiting_arrival;
        uint64_t context; /* tokens so far, prompts and replies */
        bool cached;      /* its context's KV is still in HBM, idle */
        uint64_t cached_used;
        struct mt_entry tier;
};

enum { REQ_WAITING, REQ_LOADING, REQ_PREFILL, REQ_DECODE };

struct mt_req {
        uint32_t conv;
        unsigned turn;
        uint64_t arrival_ns, ready_ns;
        uint64_t prefix, user, output;
        uint64_t prefill_left, generated;
        int state;
};

struct mt_sim {
        const struct mt_config *c;
        struct mt_result *r;
        struct mt_conv *conv;
        size_t n_conv;
        struct mt_req *waiting, *running; /* FIFO of waiting, array of running */
        size_t n_waiting, waiting_head, n_running, cap_running;
        double hbm_reserved, hbm_cached;
        double tier_bytes[_KV_TIER_MAX];
        double link_free[2][_KV_TIER_MAX]; /* [0]: loads (tier to GPU), [1]: stores */
        uint64_t clock, now;
        uint64_t next_arrival_ns; /* the earliest pending arrival; UINT64_MAX: none */
};

static uint32_t lognormal(struct rng *g, double median, double sigma, uint32_t lo, uint32_t hi)
{
        double v = exp(log(median) + sigma * rng_normal(g));
        if (v < lo)
                v = lo;
        if (v > hi)
                v = hi;
        return (uint32_t)v;
}

static int mt_generate(const struct mt_trace_gen *g, struct mt_conv **ret)
{
        if (g->conversations == 0 || !(g->rate > 0) || g->turns_min < 1 ||
            g->turns_max < g->turns_min || g->turns_max > MT_MAX_TURNS || g->context_max == 0)
                return -EINVAL;
        struct mt_conv *v = calloc(g->conversations, sizeof(*v));
        if (!v)
                return -ENOMEM;
        struct rng arrivals = {g->seed * 2654435761u + 17};
        double t = 0;
        for (size_t i = 0; i < g->conversations; i++) {
                /* Each conversation's own lengths, the same whatever the tier. */
                struct rng r = {g->seed * 0x9e3779b97f4a7c15u + i * 7919 + 1};
                struct mt_conv *c = &v[i];
                t += rng_exponential(&arrivals, 1.0 / g->rate);
                c->first_arrival_ns = c->next_arrival_ns = (uint64_t)(t * 1e9);
                c->waiting_arrival = true;
                unsigned want =
                    g->turns_min + (unsigned)(rng_next(&r) % (g->turns_max - g->turns_min + 1));
                uint64_t context = 0;
                for (unsigned k = 0; k < want; k++) {
                        struct mt_turn *tu = &c->turns[k];
                        tu->user = k == 0 ? lognormal(&r, g->first_median, g->first_sigma,
                                                      g->first_min, g->first_max)
                                          : lognormal(&r, g->user_median, g->user_sigma,
                                                      g->user_min, g->user_max);
                        tu->output = lognormal(&r, g->output_median, g->output_sigma, g->output_min,
                                               g->output_max);
                        tu->think_s = rng_exponential(&r, g->think_mean_s);
                        if (context + tu->user + tu->output > g->context_max)
                                break;
                        context += tu->user + tu->output;
                        c->n_turns = k + 1;
                }
                if (c->n_turns == 0) { /* a first prompt longer than the window: cut to fit */
                        c->turns[0].output = g->output_min;
                        c->turns[0].user = g->context_max - g->output_min;
                        c->n_turns = 1;
                }
        }
        *ret = v;
        return 0;
}

static double tier_capacity(const struct mt_config *c, enum kv_tier w)
{
        return w == KV_TIER_PEER ? c->peer_capacity_bytes : c->dram_capacity_bytes;
}

static const struct kv_tier_cost *tier_cost(const struct mt_config *c, enum kv_tier w)
{
        return w == KV_TIER_PEER ? &c->peer : &c->dram;
}

static void tier_drop(struct mt_sim *s, uint32_t i, bool evicted)
{
        struct mt_entry *e = &s->conv[i].tier;
        if (!e->present)
                return;
        s->tier_bytes[e->where] -= (double)e->tokens * s->c->bytes_per_token;
        e->present = false;
        if (evicted) {
                s->r->evictions++;
                if (s->c->bytes && s->c->bytes->evict)
                        s->c->bytes->evict(s->c->bytes->userdata, i);
        }
}

/*
 * Where a context of `bytes` goes: the first of the tier's places (aqua: the lender's memory, then
 * DRAM) with room, after dropping the least recently used entries of those places as needed.
 * false: larger than every place.
 */
static bool tier_place(struct mt_sim *s, double bytes, enum kv_tier *ret)
{
        const struct mt_config *c = s->c;
        enum kv_tier order[2];
        size_t n = 0;
        if (c->tier == MT_PEER || c->tier == MT_AQUA)
                order[n++] = KV_TIER_PEER;
        if (c->tier == MT_DRAM || c->tier == MT_AQUA)
                order[n++] = KV_TIER_DRAM;
        bool possible = false;
        for (size_t k = 0; k < n; k++)
                possible = possible || bytes <= tier_capacity(c, order[k]);
        if (!possible)
                return false;
        for (;;) {
                for (size_t k = 0; k < n; k++)
                        if (s->tier_bytes[order[k]] + bytes <= tier_capacity(c, order[k])) {
                                *ret = order[k];
                                return true;
                        }
                size_t victim = SIZE_MAX;
                for (size_t i = 0; i < s->n_conv; i++) {
                        const struct mt_entry *e = &s->conv[i].tier;
                        if (e->present &&
                            (victim == SIZE_MAX || e->used < s->conv[victim].tier.used))
                                victim = i;
                }
                if (victim == SIZE_MAX)
                        return false;
                tier_drop(s, (uint32_t)victim, true);
        }
}

static double link_time(const struct kv_tier_cost *l, double bytes)
{
        return (double)l->call_ns + bytes / l->gbytes_per_s;
}

/* A finished turn's context goes to the tier: only the blocks the tier lacks cross the link. */
static int tier_store(struct mt_sim *s, uint32_t i)
{
        const struct mt_config *c = s->c;
        struct mt_conv *cv = &s->conv[i];
        uint64_t tokens = cv->context / c->block_tokens * c->block_tokens;
        if (c->tier == MT_NONE || tokens == 0)
                return 0;
        double bytes = (double)tokens * c->bytes_per_token;
        bool had = cv->tier.present;
        enum kv_tier old = cv->tier.where;
        uint64_t old_tokens = had ? cv->tier.tokens : 0;
        tier_drop(s, i, false);

        enum kv_tier w;
        if (!tier_place(s, bytes, &w)) {
                if (had && c->bytes && c->bytes->evict)
                        c->bytes->evict(c->bytes->userdata, i);
                return 0; /* larger than the tier: not kept */
        }
        double moved =
            (had && old == w ? (double)(tokens - old_tokens) : (double)tokens) * c->bytes_per_token;
        double *free_at = &s->link_free[1][w];
        double start = *free_at > (double)s->now ? *free_at : (double)s->now;
        *free_at = start + link_time(tier_cost(c, w), moved);
        cv->tier = (struct mt_entry){true, w, tokens, (uint64_t)*free_at, ++s->clock};
        s->tier_bytes[w] += bytes;
        if (s->tier_bytes[w] > s->r->peak_tier_bytes[w])
                s->r->peak_tier_bytes[w] = s->tier_bytes[w];
        s->r->store_bytes[w] += moved;
        if (c->bytes && c->bytes->store) {
                int r = c->bytes->store(c->bytes->userdata, i, tokens);
                if (r < 0) {
                        s->r->bytes_errors++;
                        return r;
                }
        }
        return 0;
}

/* Free HBM by dropping idle cached prefixes, least recently used first (not `keep`). */
static bool hbm_make_room(struct mt_sim *s, double need, size_t keep)
{
        while (s->hbm_reserved + s->hbm_cached + need > s->c->hbm_kv_bytes) {
                size_t victim = SIZE_MAX;
                for (size_t i = 0; i < s->n_conv; i++)
                        if (i != keep && s->conv[i].cached &&
                            (victim == SIZE_MAX ||
                             s->conv[i].cached_used < s->conv[victim].cached_used))
                                victim = i;
                if (victim == SIZE_MAX)
                        return false;
                s->conv[victim].cached = false;
                s->hbm_cached -= (double)s->conv[victim].context * s->c->bytes_per_token;
        }
        return true;
}

/* Admit waiting requests in order while their whole context fits in HBM (vLLM's rule). */
static int admit(struct mt_sim *s)
{
        const struct mt_config *c = s->c;
        while (s->waiting_head < s->n_waiting) {
                struct mt_req q = s->waiting[s->waiting_head];
                struct mt_conv *cv = &s->conv[q.conv];
                double need = (double)(q.prefix + q.user + q.output) * c->bytes_per_token;
                double own = cv->cached ? (double)cv->context * c->bytes_per_token : 0;
                /* Its own cached prefix becomes part of its reservation. */
                if (!hbm_make_room(s, need - own, q.conv))
                        return 0;
                s->waiting_head++;
                q.prefill_left = q.prefix + q.user;
                q.ready_ns = s->now;
                q.state = REQ_PREFILL;
                if (q.turn > 0) {
                        if (cv->cached) {
                                s->r->hit_local++;
                                q.prefill_left = q.user;
                        } else if (cv->tier.present && cv->tier.ready_ns <= s->now &&
                                   cv->tier.tokens <= q.prefix) {
                                enum kv_tier w = cv->tier.where;
                                double bytes = (double)cv->tier.tokens * c->bytes_per_token;
                                double *free_at = &s->link_free[0][w];
                                double start =
                                    *free_at > (double)s->now ? *free_at : (double)s->now;
                                *free_at = start + link_time(tier_cost(c, w), bytes);
                                q.ready_ns = (uint64_t)ceil(*free_at);
                                q.state = REQ_LOADING;
                                q.prefill_left = q.prefix - cv->tier.tokens + q.user;
                                s->r->load_bytes[w] += bytes;
                                s->r->loaded_tokens += cv->tier.tokens;
                                cv->tier.used = ++s->clock;
                                if (w == KV_TIER_PEER)
                                        s->r->hit_peer++;
                                else
                                        s->r->hit_dram++;
                                if (c->bytes && c->bytes->load) {
                                        int r = c->bytes->load(c->bytes->userdata, q.conv,
                                                               cv->tier.tokens);
                                        if (r < 0) {
                                                s->r->bytes_errors++;
                                                return r;
                                        }
                                }
                        } else {
                                s->r->miss++;
                                s->r->recomputed_tokens += q.prefix;
                        }
                }
                if (cv->cached) {
                        cv->cached = false;
                        s->hbm_cached -= own;
                }
                s->hbm_reserved += need;
                s->r->prefill_tokens += q.prefill_left;
                if (s->n_running == s->cap_running) {
                        size_t cap = s->cap_running ? 2 * s->cap_running : 64;
                        struct mt_req *v = reallocarray(s->running, cap, sizeof(*v));
                        if (!v)
                                return -ENOMEM;
                        s->running = v;
                        s->cap_running = cap;
                }
                s->running[s->n_running++] = q;
        }
        return 0;
}

/* The reply is done: HBM keeps the context as a cached prefix, the tier gets its copy. */
static int finish(struct mt_sim *s, size_t k)
{
        const struct mt_config *c = s->c;
        struct mt_req q = s->running[k];
        struct mt_conv *cv = &s->conv[q.conv];

        s->running[k] = s->running[--s->n_running];
        s->hbm_reserved -= (double)(q.prefix + q.user + q.output) * c->bytes_per_token;
        cv->context = q.prefix + q.user + q.output;
        cv->cached = true;
        cv->cached_used = ++s->clock;
        s->hbm_cached += (double)cv->context * c->bytes_per_token;
        s->r->done++;
        if (s->now > s->r->last_finish_ns)
                s->r->last_finish_ns = s->now;
        int r = tier_store(s, q.conv);
        if (r < 0)
                return r;
        cv->turn++;
        if (cv->turn < cv->n_turns) {
                cv->next_arrival_ns = s->now + (uint64_t)(cv->turns[q.turn].think_s * 1e9);
                cv->waiting_arrival = true;
                if (cv->next_arrival_ns < s->next_arrival_ns)
                        s->next_arrival_ns = cv->next_arrival_ns;
        }
        return 0;
}

static void first_token(struct mt_sim *s, const struct mt_req *q)
{
        uint64_t ttft = s->now - q->arrival_ns;
        bool met = ttft <= s->c->sla_ttft_ns;
        if (q->turn > 0) {
                (void)stats_add(&s->r->ttft_follow, ttft);
                s->r->sla_met_follow += met;
        } else
                (void)stats_add(&s->r->ttft_first, ttft);
        s->r->sla_met += met;
}

static void next_arrival_update(struct mt_sim *s)
{
        s->next_arrival_ns = UINT64_MAX;
        for (size_t i = 0; i < s->n_conv; i++)
                if (s->conv[i].waiting_arrival && s->conv[i].next_arrival_ns < s->next_arrival_ns)
                        s->next_arrival_ns = s->conv[i].next_arrival_ns;
}

/* Arrivals due by now join the waiting queue, in arrival order. */
static void arrivals(struct mt_sim *s)
{
        if (s->now < s->next_arrival_ns)
                return;
        for (;; next_arrival_update(s)) {
                size_t first = SIZE_MAX;
                for (size_t i = 0; i < s->n_conv; i++)
                        if (s->conv[i].waiting_arrival && s->conv[i].next_arrival_ns <= s->now &&
                            (first == SIZE_MAX ||
                             s->conv[i].next_arrival_ns < s->conv[first].next_arrival_ns))
                                first = i;
                if (first == SIZE_MAX)
                        return;
                struct mt_conv *cv = &s->conv[first];
                cv->waiting_arrival = false;
                s->waiting[s->n_waiting++] = (struct mt_req){
                    .conv = (uint32_t)first,
                    .turn = cv->turn,
                    .arrival_ns = cv->next_arrival_ns,
                    .prefix = cv->context,
                    .user = cv->turns[cv->turn].user,
                    .output = cv->turns[cv->turn].output,
                    .state = REQ_WAITING,
                };
                s->r->turns++;
                s->r->follow_ups += cv->turn > 0;
        }
}

/* The next time something happens when the GPU has nothing to run. */
static uint64_t next_event(const struct mt_sim *s)
{
        uint64_t t = s->next_arrival_ns;
        for (size_t i = 0; i < s->n_running; i++)
                if (s->running[i].state == REQ_LOADING && s->running[i].ready_ns < t)
                        t = s->running[i].ready_ns;
        return t;
}

/* One iteration: every ready decode (up to the slots), then prefill chunks in admission order. */
static int iterate(struct mt_sim *s)
{
        const struct mt_config *c = s->c;
        uint32_t budget = c->batch_tokens, decodes = 0, prefill = 0;
        uint32_t take[s->n_running ? s->n_running : 1];

        for (size_t i = 0; i < s->n_running; i++) {
                struct mt_req *q = &s->running[i];
                if (q->state == REQ_LOADING && q->ready_ns <= s->now)
                        q->state = REQ_PREFILL;
                take[i] = 0;
                if (q->state == REQ_DECODE && decodes < c->decode_slots && budget > 0) {
                        take[i] = 1;
                        decodes++;
                        budget--;
                }
        }
        for (size_t i = 0; i < s->n_running && budget > 0; i++) {
                struct mt_req *q = &s->running[i];
                if (q->state != REQ_PREFILL)
                        continue;
                uint64_t n =
                    q->prefill_left < c->prefill_chunk ? q->prefill_left : c->prefill_chunk;
                if (n > budget)
                        n = budget;
                take[i] = (uint32_t)n;
                prefill += (uint32_t)n;
                budget -= (uint32_t)n;
        }
        if (decodes == 0 && prefill == 0) {
                uint64_t t = next_event(s);
                if (t == UINT64_MAX)
                        return -EDEADLK; /* nothing runs, nothing arrives: a bug */
                s->now = t;
                return 0;
        }
        s->now += c->iter_ns + prefill * c->prefill_token_ns + decodes * c->decode_seq_ns;
        s->r->iterations++;
        for (size_t i = s->n_running; i-- > 0;) {
                struct mt_req *q = &s->running[i];
                if (take[i] == 0)
                        continue;
                if (q->state == REQ_PREFILL) {
                        q->prefill_left -= take[i];
                        if (q->prefill_left > 0)
                                continue;
                        q->state = REQ_DECODE;
                        first_token(s, q);
                        q->generated = 1;
                } else
                        q->generated++;
                if (q->generated >= q->output) {
                        /* finish() moves the last running request into slot i: already seen. */
                        int r = finish(s, i);
                        if (r < 0)
                                return r;
                }
        }
        return 0;
}

int mt_run(const struct mt_config *c, struct mt_result *ret)
{
        struct mt_sim s = {.c = c, .r = ret};
        size_t turns = 0;
        int r;

        *ret = (struct mt_result){};
        if (c->bytes_per_token == 0 || c->block_tokens == 0 || c->decode_slots == 0 ||
            c->batch_tokens == 0 || c->prefill_chunk == 0 || (unsigned)c->tier >= _MT_TIER_MAX ||
            !(c->peer.gbytes_per_s > 0) || !(c->dram.gbytes_per_s > 0) ||
            (double)c->gen.context_max * c->bytes_per_token > c->hbm_kv_bytes)
                return -EINVAL;
        r = mt_generate(&c->gen, &s.conv);
        if (r < 0)
                return r;
        s.n_conv = c->gen.conversations;
        for (size_t i = 0; i < s.n_conv; i++)
                turns += s.conv[i].n_turns;
        s.waiting = calloc(turns, sizeof(*s.waiting));
        if (!s.waiting) {
                r = -ENOMEM;
                goto out;
        }
        ret->conversations = s.n_conv;
        ret->first_arrival_ns = s.conv[0].first_arrival_ns;
        s.now = ret->first_arrival_ns;
        next_arrival_update(&s);
        while (ret->done < turns) {
                arrivals(&s);
                r = admit(&s);
                if (r < 0)
                        goto out;
                if (c->bytes && c->bytes->poll) {
                        r = c->bytes->poll(c->bytes->userdata, s.now);
                        if (r < 0)
                                goto out;
                }
                r = iterate(&s);
                if (r < 0)
                        goto out;
        }
        r = 0;
out:
        free(s.conv);
        free(s.waiting);
        free(s.running);
        return r;
}
