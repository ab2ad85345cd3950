/* The schedulers: ordering rules, batch formation, time slices, and preemption that loses nothing.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "example-util.h"

static struct request req(uint32_t id, uint64_t arrival, uint32_t prompt, uint32_t prefilled,
                          uint32_t generated)
{
        return (struct request){.id = id,
                                .arrival_ns = arrival,
                                .prompt = prompt,
                                .output = 100,
                                .prefilled = prefilled,
                                .generated = generated};
}

static void check_order(enum sched_kind k, struct request *r, size_t n, const uint32_t *want)
{
        struct request *v[16];
        for (size_t i = 0; i < n; i++)
                v[n - 1 - i] = &r[i]; /* start reversed so the sort has work to do */
        sched_rank(k, v, n);
        for (size_t i = 0; i < n; i++) {
                cr_assert_eq(v[i]->id, want[i], "position %zu: got %u, want %u", i, v[i]->id,
                             want[i]);
                cr_assert_eq(v[i]->rank, i);
        }
}

Test(sched, fcfs_orders_by_arrival_whatever_the_progress)
{
        struct request r[] = {
            req(0, 300, 50, 50, 40),
            req(1, 100, 50, 10, 0),
            req(2, 200, 50, 50, 1),
            req(3, 100, 50, 0, 0),
        };
        check_order(SCHED_FCFS, r, ARRAY_SIZE(r), (uint32_t[]){1, 3, 2, 0});
}

Test(sched, fair_puts_every_decode_before_any_prefill)
{
        struct request r[] = {
            req(0, 100, 50, 0, 0),   /* prefill, no progress, earliest */
            req(1, 900, 50, 50, 80), /* decode, much served, latest */
            req(2, 500, 50, 49, 0),  /* prefill, almost done */
        };
        check_order(SCHED_FAIR, r, ARRAY_SIZE(r), (uint32_t[]){1, 0, 2});
}

Test(sched, fair_serves_the_least_prefill_progress_first)
{
        struct request r[] = {
            req(0, 100, 500, 256, 0), req(1, 200, 500, 0, 0), req(2, 300, 500, 64, 0),
            req(3, 50, 500, 64, 0), /* same progress as 2, earlier: first of the two */
        };
        check_order(SCHED_FAIR, r, ARRAY_SIZE(r), (uint32_t[]){1, 3, 2, 0});
}

Test(sched, fair_serves_the_fewest_generated_tokens_first)
{
        struct request r[] = {
            req(0, 100, 50, 50, 30),
            req(1, 200, 50, 50, 2),
            req(2, 300, 50, 50, 17),
            req(3, 400, 50, 50, 2),
        };
        check_order(SCHED_FAIR, r, ARRAY_SIZE(r), (uint32_t[]){1, 3, 2, 0});
}

Test(sched, names_round_trip)
{
        cr_assert_eq(sched_from_string("fair"), SCHED_FAIR);
        cr_assert_eq(sched_from_string("fcfs"), SCHED_FCFS);
        cr_assert_eq(sched_from_string("lifo"), _SCHED_INVALID);
        cr_assert_str_eq(sched_to_string(SCHED_FAIR), "fair");
}

/* An engine with tiny, round numbers: blocks of 16 tokens, 1 KiB per token. */
struct fixture {
        struct kv_swap swap;
        struct engine *e;
};

static void setup(struct fixture *f, enum sched_kind k, uint32_t blocks, uint32_t decode_slots,
                  uint32_t budget, uint32_t slice)
{
        struct engine_config c;
        engine_config_defaults(&c);
        c.sched = k;
        c.block_tokens = 16;
        c.bytes_per_token = 1024;
        c.hbm_bytes = (uint64_t)blocks * 16 * 1024;
        c.kv_sample_bytes = 16;
        c.decode_slots = decode_slots;
        c.max_batch_tokens = budget;
        c.max_prefill_chunk = budget;
        c.slice_iters = slice;
        cr_assert_eq(kv_swap_host_new(KV_TIER_DRAM, 0, &f->swap), 0);
        cr_assert_eq(engine_new(&c, &f->swap, &f->e), 0);
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

/* Step once and compare the batch with "id:tokens" pairs in order (prefill or decode implied). */
static void step_expect(struct fixture *f, size_t n, const uint32_t (*want)[2])
{
        size_t got_n;
        cr_assert_eq(engine_step(f->e), 0);
        const struct engine_item *b = engine_last_batch(f->e, &got_n);
        cr_assert_eq(got_n, n, "batch has %zu items, want %zu", got_n, n);
        for (size_t i = 0; i < n; i++) {
                cr_assert_eq(b[i].id, want[i][0], "item %zu: id %u, want %u", i, b[i].id,
                             want[i][0]);
                cr_assert_eq(b[i].tokens, want[i][1], "item %zu: %u tokens, want %u", i,
                             b[i].tokens, want[i][1]);
        }
}

#define STEP(f, ...)                                                                               \
        do {                                                                                       \
                const uint32_t w_[][2] = {__VA_ARGS__};                                            \
                step_expect(f, ARRAY_SIZE(w_), w_);                                                \
        } while (0)

Test(sched, fair_chunks_go_to_the_prompt_with_least_progress)
{
        struct fixture f;
        setup(&f, SCHED_FAIR, 64, 8, 64, 1);
        add(&f, 0, 100, 5);
        add(&f, 0, 100, 5);
        STEP(&f, {0, 64});          /* a tie: the first arrival */
        STEP(&f, {1, 64});          /* 1 has no progress: it goes first and takes the budget */
        STEP(&f, {0, 36}, {1, 28}); /* tie again at 64 each */
        STEP(&f, {0, 1}, {1, 8});   /* 0 decodes now: decode slots are filled first */
        teardown(&f);
}

Test(sched, fcfs_chunks_go_to_the_earliest_prompt)
{
        struct fixture f;
        setup(&f, SCHED_FCFS, 64, 8, 64, 1);
        add(&f, 0, 100, 5);
        add(&f, 0, 100, 5);
        STEP(&f, {0, 64});
        STEP(&f, {0, 36}, {1, 28});
        STEP(&f, {0, 1}, {1, 63});
        teardown(&f);
}

Test(sched, fair_alternates_decodes_by_fewest_generated_each_slice)
{
        struct fixture f;
        setup(&f, SCHED_FAIR, 64, 1, 64, 1);
        add(&f, 0, 16, 10);
        add(&f, 0, 16, 10);
        STEP(&f, {0, 16}, {1, 16}); /* both prefills, both first tokens */
        STEP(&f, {0, 1});           /* one decode slot; tie at 1 generated */
        STEP(&f, {1, 1});           /* 1 has fewer now */
        STEP(&f, {0, 1});
        STEP(&f, {1, 1});
        teardown(&f);
}

Test(sched, fair_keeps_the_running_set_for_a_whole_slice)
{
        struct fixture f;
        setup(&f, SCHED_FAIR, 64, 1, 64, 4);
        add(&f, 0, 16, 20);
        add(&f, 0, 16, 20);
        STEP(&f, {0, 16}, {1, 16}); /* iteration 0 opens the first slice */
        for (int i = 1; i < 4; i++)
                STEP(&f, {0, 1}); /* the rest of the slice belongs to 0 */
        for (int i = 4; i < 8; i++)
                STEP(&f, {1, 1}); /* re-ranked at iteration 4: 1 has fewer tokens */
        STEP(&f, {0, 1});
        teardown(&f);
}

Test(sched, fcfs_runs_the_first_arrival_to_completion)
{
        struct fixture f;
        setup(&f, SCHED_FCFS, 64, 1, 64, 1);
        add(&f, 0, 16, 5);
        add(&f, 0, 16, 5);
        STEP(&f, {0, 16}, {1, 16});
        for (int i = 0; i < 4; i++)
                STEP(&f, {0, 1});
        cr_assert(engine_request(f.e, 0)->done);
        for (int i = 0; i < 4; i++)
                STEP(&f, {1, 1});
        cr_assert_eq(engine_step(f.e), ENGINE_DONE);
        teardown(&f);
}

Test(sched, fcfs_preempts_the_latest_arrival_when_memory_runs_short)
{
        struct fixture f;
        /* 4 blocks = 64 tokens; each request grows to 16 + 39 = 55 tokens (4 blocks). */
        setup(&f, SCHED_FCFS, 4, 8, 64, 1);
        add(&f, 0, 16, 40);
        add(&f, 1, 16, 40);
        cr_assert_eq(engine_run(f.e), 0);
        const struct engine_result *r = engine_result(f.e);
        cr_assert_eq(r->requests_done, 2);
        cr_assert_eq(engine_request(f.e, 0)->preemptions, 0);
        cr_assert_gt(engine_request(f.e, 1)->preemptions, 0);
        cr_assert_eq(r->integrity_errors, 0);
        teardown(&f);
}

Test(sched, refuses_a_request_that_could_never_fit)
{
        struct fixture f;
        setup(&f, SCHED_FAIR, 4, 8, 64, 1);
        struct trace_request t = {0, 60, 10}; /* 69 tokens: 5 blocks */
        cr_assert_eq(engine_add(f.e, &t, NULL), ENGINE_E_TOO_LARGE);
        cr_assert_eq(engine_result(f.e)->rejected, 1);
        cr_assert_eq(engine_step(f.e), ENGINE_DONE);
        teardown(&f);
}

Test(sched, refuses_arrivals_that_go_back_in_time)
{
        struct fixture f;
        setup(&f, SCHED_FAIR, 4, 8, 64, 1);
        add(&f, 100, 4, 4);
        struct trace_request t = {99, 4, 4};
        cr_assert_eq(engine_add(f.e, &t, NULL), -EINVAL);
        teardown(&f);
}

/* Every token of every request, counted as it is emitted. */
struct token_log {
        uint8_t *seen; /* [id * max_output + index] */
        uint32_t max_output;
        uint64_t emitted, duplicates, out_of_range;
};

static void on_token(void *userdata, uint32_t id, uint32_t index, uint64_t now)
{
        struct token_log *l = userdata;
        l->emitted++;
        if (index >= l->max_output) {
                l->out_of_range++;
                return;
        }
        if (l->seen[(size_t)id * l->max_output + index]++)
                l->duplicates++;
}

static void preemption_loses_nothing(enum sched_kind k)
{
        struct trace_gen g;
        struct trace t;
        struct fixture f;
        struct token_log log = {.max_output = 256};

        trace_gen_defaults(&g);
        g.n = 300;
        g.seed = 7;
        g.rate_on = 200; /* a hard burst, so memory runs out */
        g.prompt_max = 512;
        g.output_max = log.max_output;
        cr_assert_eq(trace_generate(&g, &t), 0);

        /* 128 blocks: ~2000 tokens for a burst that wants many times that. */
        setup(&f, k, 128, 16, 256, 4);
        log.seen = calloc(t.n * log.max_output, 1);
        cr_assert_not_null(log.seen);
        engine_set_token_callback(f.e, on_token, &log);
        uint64_t outputs = 0;
        for (size_t i = 0; i < t.n; i++) {
                add(&f, t.req[i].arrival_ns, t.req[i].prompt_tokens, t.req[i].output_tokens);
                outputs += t.req[i].output_tokens;
        }

        cr_assert_eq(engine_run(f.e), 0);
        const struct engine_result *r = engine_result(f.e);
        cr_assert_eq(r->requests_done, t.n, "%" PRIu64 " of %zu requests finished",
                     r->requests_done, t.n);
        cr_assert_gt(r->preemptions, 0, "the case must preempt to test anything");
        cr_assert_eq(r->integrity_errors, 0);
        cr_assert_eq(log.duplicates, 0);
        cr_assert_eq(log.out_of_range, 0);
        cr_assert_eq(log.emitted, outputs);
        for (size_t i = 0; i < t.n; i++) {
                const struct request *q = engine_request(f.e, (uint32_t)i);
                cr_assert(q->done);
                cr_assert_eq(q->generated, q->output);
                cr_assert_eq(q->prefilled, q->prompt);
                for (uint32_t j = 0; j < q->output; j++)
                        cr_assert_eq(log.seen[i * log.max_output + j], 1, "request %zu token %u", i,
                                     j);
        }
        struct kv_swap_host_stats hs;
        cr_assert_eq(kv_swap_host_stats(&f.swap, &hs), 0);
        cr_assert_eq(hs.slots, 0, "swap slots left behind: %zu", hs.slots);
        cr_assert_eq(hs.checksum_failures, 0);

        free(log.seen);
        trace_clear(&t);
        teardown(&f);
}

Test(sched, fair_preemption_generates_every_token_exactly_once)
{
        preemption_loses_nothing(SCHED_FAIR);
}

Test(sched, fcfs_preemption_generates_every_token_exactly_once)
{
        preemption_loses_nothing(SCHED_FCFS);
}

/*
 * A backend that damages what it hands back, to show the checks can fail:
 * either before the host backend's own checksum (swap_in then says -EIO) or
 * after it (only the engine's check of every token's KV at the end sees it).
 */
struct damaging {
        struct kv_swap inner;
        bool after_check;
};

static int dmg_swap_out(void *ctx, void *const *blocks, size_t n, size_t bb, void **ret_slot,
                        enum kv_tier *ret_tier)
{
        struct damaging *d = ctx;
        int r = d->inner.ops->swap_out(d->inner.ctx, blocks, n, bb, ret_slot, ret_tier);
        if (r == 0 && !d->after_check)
                cr_assert_eq(kv_swap_host_corrupt(&d->inner, *ret_slot, n * bb - 1), 0);
        return r;
}

static int dmg_swap_in(void *ctx, void *slot, void *const *blocks, size_t n, size_t bb)
{
        struct damaging *d = ctx;
        int r = d->inner.ops->swap_in(d->inner.ctx, slot, blocks, n, bb);
        if (r == 0 && d->after_check)
                ((uint8_t *)blocks[0])[0] ^= 0x80;
        return r;
}

static void dmg_discard(void *ctx, void *slot)
{
        struct damaging *d = ctx;
        d->inner.ops->discard(d->inner.ctx, slot);
}

static enum kv_tier dmg_tier_of(void *ctx, void *slot)
{
        return KV_TIER_DRAM;
}

static void dmg_free(void *ctx)
{
}

static const struct kv_swap_ops damaging_ops = {
    .name = "damaging",
    .swap_out = dmg_swap_out,
    .swap_in = dmg_swap_in,
    .discard = dmg_discard,
    .tier_of = dmg_tier_of,
    .free = dmg_free,
};

static void damaged_run(bool after_check)
{
        struct damaging d = {.after_check = after_check};
        struct kv_swap swap = {&damaging_ops, &d};
        struct engine_config c;
        struct engine *e;

        cr_assert_eq(kv_swap_host_new(KV_TIER_DRAM, 0, &d.inner), 0);
        engine_config_defaults(&c);
        c.sched = SCHED_FCFS;
        c.bytes_per_token = 1024;
        c.hbm_bytes = 4 * 16 * 1024;
        c.kv_sample_bytes = 16;
        cr_assert_eq(engine_new(&c, &swap, &e), 0);
        struct trace_request a = {0, 16, 40}, b = {1, 16, 40};
        cr_assert_eq(engine_add(e, &a, NULL), 0);
        cr_assert_eq(engine_add(e, &b, NULL), 0);
        cr_assert_eq(engine_run(e), 0);
        cr_assert_gt(engine_result(e)->preemptions, 0);
        cr_assert_gt(engine_result(e)->integrity_errors, 0);
        engine_free(e);
        kv_swap_free(&d.inner);
}

Test(sched, damaged_swapped_kv_is_caught_by_the_backend_checksum)
{
        damaged_run(false);
}

Test(sched, damaged_kv_that_passed_the_backend_is_caught_at_completion)
{
        damaged_run(true);
}
