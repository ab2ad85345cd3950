/* The long-prompt, multi-turn and host-link models: invariants, never timings of this machine. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "cases.h"
#include "hostlink.h"

Test(hostlink, one_gpu_has_its_own_link_and_eight_share_the_uplinks)
{
        struct host_link h;
        enum host_link_limit lim;
        host_link_defaults(&h);
        cr_assert_float_eq(host_link_share(&h, 1, &lim), 50, 1e-9);
        cr_assert_eq(lim, HOST_LINK_GPU);
        cr_assert_float_eq(host_link_share(&h, 4, &lim), 50, 1e-9); /* one per switch */
        cr_assert_float_eq(host_link_share(&h, 8, &lim), 25, 1e-9);
        cr_assert_eq(lim, HOST_LINK_UPLINK);
        double last = 1e9;
        for (unsigned b = 1; b <= 8; b++) {
                double g = host_link_share(&h, b, NULL);
                cr_assert(g <= last, "more busy GPUs never get more each (%u: %g > %g)", b, g,
                          last);
                cr_assert(g * b <= h.host_mem_gbps + 1e-9, "the host's memory is not exceeded");
                last = g;
        }
        h.host_mem_gbps = 100;
        cr_assert_float_eq(host_link_share(&h, 8, &lim), 12.5, 1e-9);
        cr_assert_eq(lim, HOST_LINK_MEMORY);
        cr_assert_float_eq(host_link_share(&h, 0, NULL), host_link_share(&h, 1, NULL), 1e-9);
        cr_assert_float_eq(host_link_share(&h, 99, NULL), host_link_share(&h, 8, NULL), 1e-9);
}

Test(long_prompt, a_plan_keeps_what_fits_and_streams_the_rest_spread_out)
{
        struct lp_model m;
        struct lp_plan p;
        lp_model_defaults(&m);
        cr_assert_eq(lp_plan(&m, 256 << 10, &p), 0);
        cr_assert_eq(p.resident, m.layers);
        cr_assert_eq(p.offloaded, 0);
        for (uint64_t ctx = 420 << 10; ctx <= (2u << 20); ctx += 97 << 10) {
                cr_assert_eq(lp_plan(&m, ctx, &p), 0, "context %" PRIu64, ctx);
                cr_assert_eq(p.resident + p.offloaded, m.layers);
                cr_assert_gt(p.offloaded, 0, "context %" PRIu64 " does not fit whole", ctx);
                double used = (double)(p.resident + m.buffers) * p.kv_layer_bytes;
                cr_assert(used <= p.kv_budget_bytes, "the plan fits in HBM");
                cr_assert(used + p.kv_layer_bytes > p.kv_budget_bytes, "and keeps all it can");
                unsigned n = 0, longest = 0, run = 0;
                for (unsigned i = 0; i < m.layers; i++) {
                        n += p.offload[i];
                        run = p.offload[i] ? run + 1 : 0;
                        longest = run > longest ? run : longest;
                }
                cr_assert_eq(n, p.offloaded);
                if (p.offloaded <= m.layers / 2)
                        cr_assert_eq(longest, 1, "streamed layers are spread, not bunched");
        }
        cr_assert_eq(lp_plan(&m, 64u << 20, &p), -E2BIG, "not even the buffers fit");
        m.layers = 0;
        cr_assert_eq(lp_plan(&m, 1024, &p), -EINVAL);
}

Test(long_prompt, a_step_overlaps_transfers_with_compute_and_no_better)
{
        struct lp_model m;
        struct lp_plan p;
        struct lp_step all_hbm, fast, slow, none;
        struct kv_tier_cost cost[_KV_TIER_MAX];
        lp_model_defaults(&m);
        kv_tier_cost_defaults(cost);

        cr_assert_eq(lp_plan(&m, 256 << 10, &p), 0);
        lp_step(&m, &p, &cost[KV_TIER_DRAM], &none);
        cr_assert_float_eq(none.step_ns, none.compute_ns, 1e-3, "nothing streamed: compute only");
        cr_assert_eq(none.link_bytes, 0);

        for (uint64_t ctx = 448 << 10; ctx <= (1u << 20); ctx += 128 << 10) {
                cr_assert_eq(lp_plan(&m, ctx, &p), 0);
                lp_step(&m, &p, NULL, &all_hbm);
                lp_step(&m, &p, &cost[KV_TIER_PEER], &fast);
                lp_step(&m, &p, &cost[KV_TIER_DRAM], &slow);
                cr_assert_float_eq(all_hbm.step_ns, all_hbm.compute_ns, 1e-3);
                for (int k = 0; k < 2; k++) {
                        const struct lp_step *s = k ? &slow : &fast;
                        double lo = s->compute_ns > s->transfer_ns ? s->compute_ns : s->transfer_ns;
                        cr_assert(s->step_ns >= lo - 1e-3,
                                  "no faster than its compute or its link");
                        cr_assert(s->step_ns <= s->compute_ns + s->transfer_ns + 1e-3,
                                  "no slower than doing both in turn");
                        cr_assert_float_eq(s->link_bytes,
                                           (double)p.offloaded *
                                               (p.kv_layer_bytes + m.kv_bytes_per_token_layer),
                                           1, "every streamed layer in, its new token out");
                        cr_assert_float_eq(s->tokens_per_s * s->step_ns, 1e9, 1e-3);
                }
                cr_assert(fast.step_ns <= slow.step_ns, "a faster link is never slower");
                cr_assert(fast.step_ns >= all_hbm.step_ns - 1e-3, "streaming never beats HBM");
        }
}

/* A tier's bookkeeping seen from the hooks: what was stored must be what is loaded. */
struct book {
        uint64_t stored[4096];
        bool present[4096];
        uint64_t stores, loads, evictions, polls, bad;
};

static int book_store(void *u, uint32_t conv, uint64_t tokens)
{
        struct book *b = u;
        if (tokens < b->stored[conv] && b->present[conv])
                b->bad++; /* a context never shrinks */
        b->stored[conv] = tokens;
        b->present[conv] = true;
        b->stores++;
        return 0;
}

static int book_load(void *u, uint32_t conv, uint64_t tokens)
{
        struct book *b = u;
        if (!b->present[conv] || b->stored[conv] != tokens)
                b->bad++;
        b->loads++;
        return 0;
}

static void book_evict(void *u, uint32_t conv)
{
        struct book *b = u;
        if (!b->present[conv])
                b->bad++;
        b->present[conv] = false;
        b->evictions++;
}

static int book_poll(void *u, uint64_t now)
{
        (void)now;
        ((struct book *)u)->polls++;
        return 0;
}

static void small(struct mt_config *c)
{
        mt_config_defaults(c);
        c->gen.conversations = 60;
        c->gen.rate = 0.6;
        c->gen.think_mean_s = 10;
}

static void check_conserved(const struct mt_config *c, const struct mt_result *r)
{
        cr_assert_eq(r->done, r->turns, "every turn finishes");
        cr_assert_eq(r->follow_ups, r->hit_local + r->hit_peer + r->hit_dram + r->miss,
                     "every follow-up's prefix came from somewhere");
        cr_assert_eq(r->turns - r->follow_ups, r->conversations);
        cr_assert_eq(r->ttft_follow.n, r->follow_ups);
        cr_assert_eq(r->ttft_first.n, r->conversations);
        cr_assert_leq(r->sla_met_follow, r->follow_ups);
        cr_assert(r->peak_tier_bytes[KV_TIER_PEER] <= c->peer_capacity_bytes);
        cr_assert(r->peak_tier_bytes[KV_TIER_DRAM] <= c->dram_capacity_bytes);
        double loaded = r->load_bytes[KV_TIER_PEER] + r->load_bytes[KV_TIER_DRAM];
        cr_assert_float_eq(loaded, (double)r->loaded_tokens * c->bytes_per_token, 1,
                           "load bytes are the loaded tokens' KV");
}

Test(multi_turn, every_tier_conserves_turns_and_bytes)
{
        for (int t = 0; t < _MT_TIER_MAX; t++) {
                struct mt_config c;
                struct mt_result r;
                struct book b = {};
                struct mt_bytes hooks = {&b, book_store, book_load, book_evict, book_poll};
                small(&c);
                c.tier = t;
                c.hbm_kv_bytes = 12e9; /* a small GPU, so that prefixes leave HBM */
                c.peer_capacity_bytes = 8e9;
                c.dram_capacity_bytes = 24e9;
                c.bytes = &hooks;
                cr_assert_eq(mt_run(&c, &r), 0, "tier %s", mt_tier_to_string(t));
                check_conserved(&c, &r);
                cr_assert_eq(b.bad, 0, "tier %s: the hooks saw a load of what was not stored",
                             mt_tier_to_string(t));
                cr_assert_eq(b.loads, r.hit_peer + r.hit_dram, "a load per tier hit");
                cr_assert_eq(b.evictions, r.evictions);
                cr_assert_gt(b.polls, 0);
                if (t == MT_NONE) {
                        cr_assert_eq(b.stores, 0);
                        cr_assert_eq(r.hit_peer + r.hit_dram, 0);
                        cr_assert_eq(r.load_bytes[KV_TIER_PEER] + r.load_bytes[KV_TIER_DRAM] +
                                         r.store_bytes[KV_TIER_PEER] + r.store_bytes[KV_TIER_DRAM],
                                     0);
                } else {
                        cr_assert_gt(b.stores, 0);
                        cr_assert_gt(r.hit_peer + r.hit_dram, 0, "tier %s never hit",
                                     mt_tier_to_string(t));
                }
                if (t == MT_DRAM)
                        cr_assert_eq(r.hit_peer + r.load_bytes[KV_TIER_PEER], 0);
                if (t == MT_PEER)
                        cr_assert_eq(r.hit_dram + r.load_bytes[KV_TIER_DRAM], 0);
                mt_result_clear(&r);
        }
}

Test(multi_turn, the_same_trace_whatever_the_tier_and_runs_repeat)
{
        struct mt_config c;
        struct mt_result r[3];
        small(&c);
        for (int i = 0; i < 3; i++) {
                c.tier = i == 2 ? MT_PEER : MT_NONE;
                cr_assert_eq(mt_run(&c, &r[i]), 0);
        }
        cr_assert_eq(r[0].turns, r[2].turns, "the trace does not depend on the tier");
        cr_assert_eq(r[0].conversations, r[2].conversations);
        cr_assert_eq(r[0].iterations, r[1].iterations, "a run repeats exactly");
        cr_assert_eq(r[0].miss, r[1].miss);
        for (int i = 0; i < 3; i++)
                mt_result_clear(&r[i]);
}

Test(multi_turn, a_tier_without_room_never_hits_and_more_room_never_hits_less)
{
        struct mt_config c;
        struct mt_result none, some, more;
        small(&c);
        c.tier = MT_DRAM;
        c.hbm_kv_bytes = 12e9;
        c.dram_capacity_bytes = 0;
        cr_assert_eq(mt_run(&c, &none), 0);
        cr_assert_eq(none.hit_dram, 0);
        cr_assert_eq(none.peak_tier_bytes[KV_TIER_DRAM], 0);
        c.dram_capacity_bytes = 6e9;
        cr_assert_eq(mt_run(&c, &some), 0);
        c.dram_capacity_bytes = 200e9;
        cr_assert_eq(mt_run(&c, &more), 0);
        cr_assert_eq(more.evictions, 0, "room for everything: nothing evicted");
        cr_assert_geq(more.hit_dram + more.hit_local, some.hit_dram + some.hit_local);
        cr_assert_gt(some.hit_dram, 0);
        mt_result_clear(&none);
        mt_result_clear(&some);
        mt_result_clear(&more);
}

Test(multi_turn, refuses_what_cannot_run)
{
        struct mt_config c;
        struct mt_result r;
        small(&c);
        c.hbm_kv_bytes = 1e9; /* a 32K context does not fit */
        cr_assert_eq(mt_run(&c, &r), -EINVAL);
        small(&c);
        c.gen.turns_max = 0;
        cr_assert_eq(mt_run(&c, &r), -EINVAL);
        small(&c);
        c.dram.gbytes_per_s = 0;
        cr_assert_eq(mt_run(&c, &r), -EINVAL);
}
