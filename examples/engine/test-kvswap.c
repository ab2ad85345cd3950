/* The host swap backend: bytes come back intact, checksums catch damage, and the cost model. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kvswap.h"
#include "example-util.h"

#define N  32
#define BB 512

static struct kv_swap swap;
static uint8_t mem[2][N][BB];
static void *src[N], *dst[N];

static void init(void)
{
        cr_assert_eq(kv_swap_host_new(KV_TIER_PEER, 0, &swap), 0);
        for (size_t i = 0; i < N; i++) {
                for (size_t j = 0; j < BB; j++)
                        mem[0][i][j] = (uint8_t)(i * 131 + j * 7 + 1);
                memset(mem[1][i], 0, BB);
                src[i] = mem[0][i];
                /* Different blocks, in a different order in memory: like a fresh allocation. */
                dst[i] = mem[1][N - 1 - i];
        }
}

static void fini(void)
{
        kv_swap_free(&swap);
}

TestSuite(kvswap, .init = init, .fini = fini);

Test(kvswap, swapped_blocks_come_back_byte_for_byte_in_order)
{
        void *slot;
        enum kv_tier tier;
        uint64_t before = kv_checksum(src, N, BB);

        cr_assert_eq(swap.ops->swap_out(swap.ctx, src, N, BB, &slot, &tier), 0);
        cr_assert_eq(tier, KV_TIER_PEER);
        memset(mem[0], 0xee, sizeof(mem[0])); /* the local blocks get reused */

        cr_assert_eq(swap.ops->swap_in(swap.ctx, slot, dst, N, BB), 0);
        cr_assert_eq(kv_checksum(dst, N, BB), before);
        for (size_t i = 0; i < N; i++)
                for (size_t j = 0; j < BB; j++)
                        cr_assert_eq(((uint8_t *)dst[i])[j], (uint8_t)(i * 131 + j * 7 + 1));
}

Test(kvswap, checksum_notices_a_flipped_bit_and_reordered_blocks)
{
        uint64_t h = kv_checksum(src, N, BB);
        mem[0][3][100] ^= 0x10;
        cr_assert_neq(kv_checksum(src, N, BB), h);
        mem[0][3][100] ^= 0x10;
        cr_assert_eq(kv_checksum(src, N, BB), h);

        void *swapped[N];
        memcpy(swapped, src, sizeof(swapped));
        swapped[0] = src[1];
        swapped[1] = src[0];
        cr_assert_neq(kv_checksum(swapped, N, BB), h);
}

Test(kvswap, a_damaged_copy_fails_swap_in_with_eio_and_is_counted)
{
        struct kv_swap_host_stats st;
        void *slot;
        enum kv_tier tier;

        cr_assert_eq(swap.ops->swap_out(swap.ctx, src, N, BB, &slot, &tier), 0);
        cr_assert_eq(kv_swap_host_corrupt(&swap, slot, 5 * BB + 17), 0);
        cr_assert_eq(swap.ops->swap_in(swap.ctx, slot, dst, N, BB), -EIO);
        cr_assert_eq(kv_swap_host_stats(&swap, &st), 0);
        cr_assert_eq(st.checksum_failures, 1);
        cr_assert_eq(st.slots, 0, "the slot is released even when the check fails");
}

Test(kvswap, counts_what_it_holds_and_releases_on_discard)
{
        struct kv_swap_host_stats st;
        void *a, *b;
        enum kv_tier tier;

        cr_assert_eq(swap.ops->swap_out(swap.ctx, src, 4, BB, &a, &tier), 0);
        cr_assert_eq(swap.ops->swap_out(swap.ctx, src + 4, 8, BB, &b, &tier), 0);
        cr_assert_eq(kv_swap_host_stats(&swap, &st), 0);
        cr_assert_eq(st.slots, 2);
        cr_assert_eq(st.bytes, 12 * BB);

        swap.ops->discard(swap.ctx, a);
        cr_assert_eq(swap.ops->swap_in(swap.ctx, b, dst, 8, BB), 0);
        cr_assert_eq(kv_swap_host_stats(&swap, &st), 0);
        cr_assert_eq(st.slots, 0);
        cr_assert_eq(st.bytes, 0);
        swap.ops->discard(swap.ctx, NULL);
}

Test(kvswap, refuses_a_swap_in_of_another_shape)
{
        void *slot;
        enum kv_tier tier;
        cr_assert_eq(swap.ops->swap_out(swap.ctx, src, 4, BB, &slot, &tier), 0);
        cr_assert_eq(swap.ops->swap_in(swap.ctx, slot, dst, 5, BB), -EINVAL);
        cr_assert_eq(swap.ops->swap_in(swap.ctx, slot, dst, 4, BB), 0);
}

Test(kvswap, a_full_backend_says_enospc)
{
        struct kv_swap small;
        void *a, *b = NULL;
        enum kv_tier tier = _KV_TIER_INVALID;

        cr_assert_eq(kv_swap_host_new(KV_TIER_DRAM, 3 * BB, &small), 0);
        cr_assert_eq(small.ops->swap_out(small.ctx, src, 2, BB, &a, &tier), 0);
        cr_assert_eq(tier, KV_TIER_DRAM);
        cr_assert_eq(small.ops->swap_out(small.ctx, src, 2, BB, &b, &tier), -ENOSPC);
        cr_assert_null(b);
        small.ops->discard(small.ctx, a);
        kv_swap_free(&small);
}

Test(kvswap, peer_transfers_cost_less_than_dram_ones)
{
        struct kv_tier_cost c[_KV_TIER_MAX];
        kv_tier_cost_defaults(c);
        uint64_t bytes = UINT64_C(64) << 20;
        uint64_t peer = kv_tier_cost_ns(&c[KV_TIER_PEER], bytes);
        uint64_t dram = kv_tier_cost_ns(&c[KV_TIER_DRAM], bytes);
        /* 64 MiB: 3 us + 181 us over 370 GB/s, 3 us + 1342 us over 50 GB/s. */
        cr_assert_eq(peer, 3000 + 181375);
        cr_assert_eq(dram, 3000 + 1342177);
        cr_assert_eq(kv_tier_cost_ns(&c[KV_TIER_DRAM], 0), 0);
}

Test(kvswap, tier_names_round_trip)
{
        cr_assert_eq(kv_tier_from_string("peer"), KV_TIER_PEER);
        cr_assert_eq(kv_tier_from_string("dram"), KV_TIER_DRAM);
        cr_assert_eq(kv_tier_from_string("nvme"), _KV_TIER_INVALID);
        cr_assert_str_eq(kv_tier_to_string(KV_TIER_DRAM), "dram");
}
