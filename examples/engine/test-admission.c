/*
 * Admission and allocation: whole-prompt reservation, LayerKV's window of K layers and its two
 * choices when they do not fit, layer-wise slots, SLA attainment, and the SLA-aware fair
 * scheduler's promise (a streaming decode is never swapped out for another request).
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "example-util.h"

/* Blocks of 16 tokens at 1 KiB per token, 4 layers of 8 sample bytes each. */
struct fixture {
        struct kv_swap swap;
        struct engine_config c;
        struct engine *e;
};

static void config(struct fixture *f, enum sched_kind k, uint32_t blocks)
{
        engine_config_defaults(&f->c);
        f->c.sched = k;
        f->c.block_tokens = 16;
        f->c.bytes_per_token = 1024;
        f->c.hbm_bytes = (uint64_t)blocks * 16 * 1024;
        f->c.kv_sample_bytes = 32;
        f->c.n_layers = 4;
        f->c.decode_slots = 8;
        f->c.max_batch_tokens = 256;
        f->c.max_prefill_chunk = 256;
        f->c.slice_iters = 4;
}

static void start(struct fixture *f)
{
        cr_assert_eq(kv_swap_host_new(KV_TIER_PEER, 0, &f->swap), 0);
        cr_assert_eq(engine_new(&f->c, &f->swap, &f->e), 0);
}

static void teardown(struct fixture *f)
{
        engine_free(f->e);
        kv_swap_free(&f->swap);
}

static void add(struct fixture *f, uint64_t arrival, uint32_t prompt, uint32_t output)
{
        struct trace_request t = {arrival, prompt, output};
        cr_assert_eq(engine_add(f->e, &t, NULL), 0);
}

/* Step once; the batch's item for id (its tokens), or 0 when id is not in it. */
static uint32_t step_tokens(struct fixture *f, uint32_t id)
{
        size_t n;
        cr_assert_eq(engine_step(f->e), 0);
        const struct engine_item *b = engine_last_batch(f->e, &n);
        for (size_t i = 0; i < n; i++)
                if (b[i].id == id)
                        return b[i].tokens;
        return 0;
}

Test(admission, names_parse)
{
        enum engine_admission a;
        uint32_t k = 0;

        cr_assert_eq(engine_admission_from_string("request", &a, &k), 0);
        cr_assert_eq(a, ADMIT_REQUEST);
        cr_assert_eq(engine_admission_from_string("layer", &a, &k), 0);
        cr_assert_eq(a, ADMIT_LAYER);
        cr_assert_eq(k, 4);
        cr_assert_eq(engine_admission_from_string("layer:8", &a, &k), 0);
        cr_assert_eq(k, 8);
        cr_assert_eq(engine_admission_from_string("layer:1", &a, &k), -EINVAL);
        cr_assert_eq(engine_admission_from_string("layer:x", &a, &k), -EINVAL);
        cr_assert_eq(engine_admission_from_string("whole", &a, &k), -EINVAL);
        cr_assert_eq(engine_layer_full_from_string("wait"), LAYER_FULL_WAIT);
        cr_assert_eq(engine_layer_full_from_string("offload"), LAYER_FULL_OFFLOAD);
        cr_assert_eq(engine_layer_full_from_string("drop"), _LAYER_FULL_INVALID);
}

Test(admission, layer_needs_a_backend_with_layered_slots_and_k_of_at_least_two)
{
        struct fixture f;
        config(&f, SCHED_FCFS, 8);
        f.c.admission = ADMIT_LAYER;
        f.c.admit_layers = 1;
        cr_assert_eq(kv_swap_host_new(KV_TIER_PEER, 0, &f.swap), 0);
        cr_assert_eq(engine_new(&f.c, &f.swap, &f.e), -EINVAL);
        f.c.admit_layers = 5; /* more than the model's 4 */
        cr_assert_eq(engine_new(&f.c, &f.swap, &f.e), -EINVAL);
        kv_swap_free(&f.swap);
}

/*
 * 8 blocks; request 0 (48 tokens of prompt) prefills alone, then decodes into its 4th block;
 * request 1 has a 96-token prompt (6 blocks) and 47 tokens of budget left. Chunk admission starts
 * it with 47 tokens; request admission waits until its whole prompt fits; LayerKV starts it with
 * 32 tokens (whole blocks) when K layers of those 2 blocks fit.
 */
static uint32_t second_prompt_first_chunk(enum engine_admission a, uint32_t k)
{
        struct fixture f;
        config(&f, SCHED_FCFS, 8);
        f.c.admission = a;
        f.c.admit_layers = k;
        f.c.max_batch_tokens = 48; /* the first prompt alone in the first iteration */
        f.c.max_prefill_chunk = 48;
        start(&f);
        add(&f, 0, 48, 16);
        add(&f, 1, 96, 4);
        cr_assert_eq(step_tokens(&f, 1), 0);
        uint32_t got = step_tokens(&f, 1);
        teardown(&f);
        return got;
}

Test(admission, whole_prompt_reservation_waits_where_a_chunk_would_start)
{
        /* 4 blocks taken; 4 free: 64 tokens, 47 of budget. */
        cr_assert_eq(second_prompt_first_chunk(ADMIT_CHUNK, 4), 47);
        cr_assert_eq(second_prompt_first_chunk(ADMIT_REQUEST, 4), 0);
}

Test(admission, layerkv_starts_a_prompt_when_k_layers_of_its_chunk_fit)
{
        /* A 32-token chunk is 2 blocks: a window of 2 x 2 / 4 = 1 full block for K = 2. */
        cr_assert_eq(second_prompt_first_chunk(ADMIT_LAYER, 2), 32);
        /* K = 4 is every layer: 2 blocks, still fits. */
        cr_assert_eq(second_prompt_first_chunk(ADMIT_LAYER, 4), 32);
}

Test(admission, a_layered_prefill_holds_no_blocks_after_it_and_its_kv_comes_back_intact)
{
        struct fixture f;
        config(&f, SCHED_FCFS, 8);
        f.c.admission = ADMIT_LAYER;
        f.c.admit_layers = 2;
        start(&f);
        add(&f, 0, 64, 20);
        cr_assert_eq(step_tokens(&f, 0), 64); /* the whole prompt through the window */
        const struct request *r = engine_request(f.e, 0);
        cr_assert_eq(r->n_blocks, 0, "the window went back; the prompt is in the slot");
        cr_assert_not_null(r->swap_slot);
        cr_assert_eq(r->generated, 1);
        cr_assert_eq(engine_run(f.e), 0);
        const struct engine_result *res = engine_result(f.e);
        cr_assert_eq(res->requests_done, 1);
        cr_assert_eq(res->integrity_errors, 0);
        cr_assert_eq(res->layered_prefills, 1);
        cr_assert_eq(res->layer_out_bytes[KV_TIER_PEER], 4 * 16 * 1024, "4 blocks out");
        cr_assert_eq(res->layer_in_bytes[KV_TIER_PEER], 4 * 16 * 1024, "and back for decode");
        cr_assert_gt(res->hidden_ns, 0, "the layer transfers overlap the compute");
        teardown(&f);
}

Test(admission, layered_chunks_start_on_block_boundaries)
{
        struct fixture f;
        config(&f, SCHED_FCFS, 16);
        f.c.admission = ADMIT_LAYER;
        f.c.max_prefill_chunk = 40; /* rounded down to 32 unless it ends the prompt */
        start(&f);
        add(&f, 0, 72, 4);
        cr_assert_eq(step_tokens(&f, 0), 32);
        cr_assert_eq(step_tokens(&f, 0), 40); /* the last chunk ends the prompt */
        cr_assert_eq(engine_run(f.e), 0);
        cr_assert_eq(engine_result(f.e)->integrity_errors, 0);
        teardown(&f);
}

/*
 * Fair, time-sliced, one decode slot: requests 0 and 1 (40-token prompts, 3 blocks each, no
 * growth) decode in turn, so one of them always sits resident without a slot. Newcomer 2 needs
 * a window of 4 blocks (64 tokens, K = all 4 layers) with 2 free: offload swaps the idle decode
 * out to make room, wait lets 2 wait until memory frees (the decodes' own turns may still swap
 * each other, as without LayerKV).
 */
static uint64_t preemptions_when_layers_do_not_fit(enum engine_layer_full full)
{
        struct fixture f;
        config(&f, SCHED_FAIR, 8);
        f.c.admission = ADMIT_LAYER;
        f.c.admit_layers = 4;
        f.c.layer_full = full;
        f.c.decode_slots = 1;
        f.c.slice_iters = 1;
        start(&f);
        add(&f, 0, 40, 8);
        add(&f, 0, 40, 8);
        add(&f, 30 * 1000 * 1000, 64, 4);
        cr_assert_eq(engine_run(f.e), 0);
        const struct engine_result *r = engine_result(f.e);
        cr_assert_eq(r->requests_done, 3);
        cr_assert_eq(r->integrity_errors, 0);
        uint64_t p = r->preemptions;
        teardown(&f);
        return p;
}

Test(admission, when_layers_do_not_fit_offload_swaps_out_and_wait_waits)
{
        cr_assert_gt(preemptions_when_layers_do_not_fit(LAYER_FULL_OFFLOAD),
                     preemptions_when_layers_do_not_fit(LAYER_FULL_WAIT));
}

Test(admission, host_layered_slots_check_what_arrives)
{
        struct kv_swap s;
        uint8_t src[2][64], dst[2][64];
        void *blocks[2] = {dst[0], dst[1]};
        void *slot;
        enum kv_tier tier;

        for (int i = 0; i < 2; i++)
                for (int j = 0; j < 64; j++)
                        src[i][j] = (uint8_t)(i * 64 + j);
        cr_assert_eq(kv_swap_host_new(KV_TIER_DRAM, 0, &s), 0);
        for (int round = 0; round < 2; round++) {
                cr_assert_eq(s.ops->reserve(s.ctx, 2, 64, 4, &slot, &tier), 0);
                cr_assert_eq(tier, KV_TIER_DRAM);
                /* Layers in reverse order: the checksum does not depend on it. */
                for (int l = 3; l >= 0; l--) {
                        void *seg[2] = {src[0] + l * 16, src[1] + l * 16};
                        cr_assert_eq(s.ops->write_layer(s.ctx, slot, l, 0, seg, 2), 0);
                }
                cr_assert_eq(s.ops->seal(s.ctx, slot), 0);
                if (round == 1)
                        cr_assert_eq(kv_swap_host_corrupt(&s, slot, 70), 0);
                memset(dst, 0, sizeof(dst));
                int r = s.ops->swap_in(s.ctx, slot, blocks, 2, 64);
                if (round == 0) {
                        cr_assert_eq(r, 0);
                        cr_assert_arr_eq(dst, src, sizeof(src));
                } else
                        cr_assert_eq(r, -EIO);
        }
        cr_assert_eq(s.ops->write_layer(s.ctx, NULL, 0, 0, NULL, 0), -EINVAL);
        kv_swap_free(&s);
}

Test(sla, attainment_counts_ttft_and_each_requests_own_tbt_p99)
{
        struct fixture f;
        config(&f, SCHED_FCFS, 64);
        start(&f);
        add(&f, 0, 32, 50);
        add(&f, 0, 32, 50);
        cr_assert_eq(engine_run(f.e), 0);
        const struct engine_result *r = engine_result(f.e);
        cr_assert_eq(r->sla_met, 2, "an idle engine meets the SLA");
        teardown(&f);

        config(&f, SCHED_FCFS, 64);
        f.c.sla_tbt_ns = 1; /* no gap is that short */
        start(&f);
        add(&f, 0, 32, 50);
        add(&f, 0, 32, 1); /* one token: no gaps, nothing to miss */
        cr_assert_eq(engine_run(f.e), 0);
        r = engine_result(f.e);
        cr_assert_eq(r->sla_ttft_met, 2);
        cr_assert_eq(r->sla_tbt_met, 1);
        cr_assert_eq(r->sla_met, 1);
        cr_assert_leq(r->sla_met, r->requests);
        teardown(&f);
}

/* A hard burst on little memory, as test-sched's; the TBT p99 of the run (virtual time). */
static uint64_t burst_tbt_p99(enum engine_admission a, uint64_t budget_ns)
{
        struct trace_gen g;
        struct trace t;
        struct fixture f;

        trace_gen_defaults(&g);
        g.n = 300;
        g.seed = 7;
        g.rate_on = 200;
        g.prompt_max = 512;
        g.output_max = 256;
        cr_assert_eq(trace_generate(&g, &t), 0);
        config(&f, SCHED_FAIR, 128);
        f.c.decode_slots = 16;
        f.c.admission = a;
        f.c.tbt_budget_ns = budget_ns;
        start(&f);
        for (size_t i = 0; i < t.n; i++)
                add(&f, t.req[i].arrival_ns, t.req[i].prompt_tokens, t.req[i].output_tokens);
        cr_assert_eq(engine_run(f.e), 0);
        const struct engine_result *r = engine_result(f.e);
        cr_assert_eq(r->requests_done, t.n);
        cr_assert_eq(r->integrity_errors, 0);
        cr_assert_gt(r->preemptions, 0, "the case must preempt to test anything");
        for (size_t i = 0; i < t.n; i++)
                cr_assert(engine_request(f.e, (uint32_t)i)->done);
        struct kv_swap_host_stats hs;
        cr_assert_eq(kv_swap_host_stats(&f.swap, &hs), 0);
        cr_assert_eq(hs.slots, 0);
        struct engine_result res;
        uint64_t p99;
        engine_take_result(f.e, &res);
        cr_assert_eq(stats_percentile(&res.tbt, 99, &p99), 0);
        stats_clear(&res.ttft);
        stats_clear(&res.tbt);
        trace_clear(&t);
        teardown(&f);
        return p99;
}

Test(sla, aware_fair_keeps_the_tbt_tail_below_the_time_sliced_one)
{
        uint64_t sliced = burst_tbt_p99(ADMIT_REQUEST, 0);
        uint64_t aware = burst_tbt_p99(ADMIT_REQUEST, 100 * 1000 * 1000);
        cr_assert_lt(aware, sliced, "TBT p99 %" PRIu64 " ns against %" PRIu64, aware, sliced);
}

Test(sla, aware_fair_with_layerkv_serves_everything_intact)
{
        burst_tbt_p99(ADMIT_LAYER, 100 * 1000 * 1000);
}
