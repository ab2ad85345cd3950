/*
 * Arenas over an aqua tensor of the GPU's own memory (fake daemon, simcuda): aligned first-fit
 * pieces, a window that grows to the highest piece and is trimmed back, data that stays put,
 * and the errors.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "aqua/aqua.h"
#include "fake-daemon.h"
#include "gpu.h"

#define MiB   (UINT64_C(1) << 20)
#define CHUNK (2 * MiB)

static struct fake fk;
static aqua_ctx *ctx;
static aqua_tensor *tensor;
static aqua_arena *arena;
static struct gpu_dev *local;

static void setup(void)
{
        struct aqua_tensor_options to = AQUA_TENSOR_OPTIONS_INIT;

        test_sim_machine("test-arena", "1x1GiB");
        fake_start(&fk);
        fake_open(&fk, 0, AQUA_ROLE_CONSUMER, "test-arena", "", &ctx);
        to.chunk_bytes = CHUNK;
        to.tier = AQUA_TIER_LOCAL;
        cr_assert_eq(aqua_tensor_new(ctx, 16 * CHUNK, &to, &tensor), 0);
        cr_assert_eq(aqua_arena_new(ctx, tensor, 0, &arena), 0);
        cr_assert_eq(gpu_open(0, &local), 0);
}

static void teardown(void)
{
        arena = aqua_arena_free(arena);
        tensor = aqua_tensor_free(ctx, tensor);
        ctx = aqua_close(ctx);
        local = gpu_free(local);
        fake_stop(&fk);
        test_sim_cleanup();
}

TestSuite(arena, .init = setup, .fini = teardown);

static struct aqua_arena_info info(void)
{
        struct aqua_arena_info i;

        cr_assert_eq(aqua_arena_get_info(arena, &i), 0);
        return i;
}

Test(arena, hands_out_aligned_pieces_first_fit_and_reuses_a_freed_gap)
{
        uint64_t a, b, c, d, base = aqua_tensor_dptr(tensor);

        cr_assert_eq(aqua_arena_alloc(arena, 1000, &a), 0);
        cr_assert_eq(aqua_arena_alloc(arena, 3 * MiB, &b), 0);
        cr_assert_eq(aqua_arena_alloc(arena, 1, &c), 0);
        cr_assert_eq(a, base);
        cr_assert_eq(b, base + 1024, "1000 bytes take two 512-byte units");
        cr_assert_eq(c % 512, 0);
        cr_assert_gt(c, b);
        cr_assert_eq(info().pieces, 3);
        cr_assert_eq(aqua_arena_release(arena, b), 0);
        /* The gap b left holds a smaller piece; a larger one goes after c. */
        cr_assert_eq(aqua_arena_alloc(arena, MiB, &d), 0);
        cr_assert_eq(d, b);
        cr_assert_eq(info().bytes, 1024 + MiB + 512);
}

Test(arena, maps_chunks_up_to_the_highest_piece_and_trims_them_back)
{
        uint64_t a, b;

        cr_assert_eq(info().mapped_bytes, 0);
        cr_assert_eq(aqua_arena_alloc(arena, MiB, &a), 0);
        cr_assert_eq(info().mapped_bytes, CHUNK);
        cr_assert_eq(aqua_arena_alloc(arena, 5 * CHUNK, &b), 0);
        cr_assert_eq(info().mapped_bytes, 6 * CHUNK);
        cr_assert_eq(aqua_arena_release(arena, b), 0);
        cr_assert_eq(info().mapped_bytes, CHUNK, "the chunks only b reached are released");
        cr_assert_eq(aqua_arena_release(arena, a), 0);
        cr_assert_eq(info().mapped_bytes, 0);
        /* And it grows again from the start. */
        cr_assert_eq(aqua_arena_alloc(arena, 2 * CHUNK, &a), 0);
        cr_assert_eq(a, aqua_tensor_dptr(tensor));
        cr_assert_eq(info().mapped_bytes, 2 * CHUNK);
}

Test(arena, keeps_what_a_piece_holds_while_others_come_and_go)
{
        static uint8_t in[3 * MiB], out[3 * MiB];
        uint64_t keep, x, y;

        for (size_t i = 0; i < sizeof(in); i++)
                in[i] = (uint8_t)(i * 7 + 3);
        cr_assert_eq(aqua_arena_alloc(arena, MiB, &x), 0);
        cr_assert_eq(aqua_arena_alloc(arena, sizeof(in), &keep), 0);
        cr_assert_eq(gpu_copy(local, keep, (uint64_t)(uintptr_t)in, sizeof(in)), 0);
        cr_assert_eq(aqua_arena_release(arena, x), 0);
        cr_assert_eq(aqua_arena_alloc(arena, 4 * CHUNK, &y), 0);
        cr_assert_eq(aqua_arena_release(arena, y), 0);
        cr_assert_eq(gpu_copy(local, (uint64_t)(uintptr_t)out, keep, sizeof(out)), 0);
        cr_assert_eq(memcmp(in, out, sizeof(in)), 0);
}

Test(arena, says_what_does_not_fit_and_what_it_never_handed_out)
{
        uint64_t a;

        cr_assert_eq(aqua_arena_alloc(arena, 0, &a), -EINVAL);
        cr_assert_eq(aqua_arena_alloc(arena, 17 * CHUNK, &a), -ERANGE);
        cr_assert_eq(aqua_arena_alloc(arena, 16 * CHUNK, &a), 0, "the whole range fits");
        cr_assert_eq(aqua_arena_alloc(arena, 1, &a), -ERANGE);
        cr_assert_eq(aqua_arena_release(arena, a + 512), -ENOENT);
        cr_assert_eq(aqua_arena_release(arena, 1), -ENOENT);
        cr_assert_eq(aqua_arena_new(ctx, tensor, 3, &arena), -EINVAL, "align not a power of two");
}
