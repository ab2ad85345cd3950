/*
 * The data-plane figures of bench/run: batched copies of scattered 16 KiB blocks against one
 * contiguous copy of the same bytes, the driver calls a batch makes (counted by simcuda), and
 * the reclaim of a 1 GiB lease that backs a tensor against one 1 GiB copy.
 *
 *   bench-data batch [--rounds N]    (one consumer context)
 *   bench-data reclaim               (a producer and a consumer process)
 *
 * Endpoint and side channel from AQUA_ENDPOINT/AQUA_SIDE_PATH; simcuda from AQUA_CUDA_LIBRARY.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "aqua/aqua.h"
#include "time-util.h"

#define KiB    (UINT64_C(1) << 10)
#define MiB    (UINT64_C(1) << 20)
#define GiB    (UINT64_C(1) << 30)
#define BLOCKS 4096
#define BLOCK  (16 * KiB)

static _Noreturn void fail(const char *what, int r)
{
        fprintf(stderr, "bench-data: %s: %s\n", what, aqua_strerror(r));
        exit(1);
}

static int cmp_u64(const void *a, const void *b)
{
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return x < y ? -1 : x > y;
}

static uint64_t median(uint64_t *v, size_t n)
{
        qsort(v, n, sizeof(*v), cmp_u64);
        return v[n / 2];
}

/* simcuda's call counter; NULL on another driver. */
static unsigned long long (*call_count)(const char *name);

/*
 * An engine's thread has its GPU's context current (it launches kernels there); do the same
 * through the driver libaqua loaded, so libaqua's calls need no context switch, as in an engine.
 */
static void find_call_counter(void)
{
        const char *path = getenv("AQUA_CUDA_LIBRARY");
        void *dl = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
        int (*get)(int *, int), (*retain)(void **, int), (*set)(void *);
        void *pctx;
        int dev;

        if (!dl)
                return;
        call_count = (unsigned long long (*)(const char *))dlsym(dl, "simcudaGetCallCount");
        get = (int (*)(int *, int))dlsym(dl, "cuDeviceGet");
        retain = (int (*)(void **, int))dlsym(dl, "cuDevicePrimaryCtxRetain");
        set = (int (*)(void *))dlsym(dl, "cuCtxSetCurrent");
        if (get && retain && set && get(&dev, 0) == 0 && retain(&pctx, dev) == 0)
                set(pctx);
}

static aqua_tensor *local_tensor(aqua_ctx *ctx, uint64_t bytes)
{
        struct aqua_tensor_options o = AQUA_TENSOR_OPTIONS_INIT;
        aqua_tensor *t;
        int r;

        o.tier = AQUA_TIER_LOCAL;
        o.chunk_bytes = 2 * MiB;
        r = aqua_tensor_new(ctx, bytes, &o, &t);
        if (r == 0)
                r = aqua_tensor_grow(ctx, t, bytes);
        if (r != 0)
                fail("tensor", r);
        return t;
}

static uint64_t timed_batch(aqua_ctx *ctx, const struct aqua_copy_piece *p, size_t n)
{
        uint64_t t0 = now_mono_ns();
        aqua_ticket tk;
        int r;

        r = aqua_copy_batch(ctx, p, n, NULL, NULL, NULL, &tk);
        if (r == 0)
                r = aqua_copy_wait(ctx, tk);
        if (r != 0)
                fail("copy", r);
        return now_mono_ns() - t0;
}

/*
 * The hardware's own figure for the same pattern: the blocks copied one by one with memcpy, in
 * this process, between buffers of shared memory (what simcuda's device memory is), against one
 * contiguous memcpy; alternating rounds, like the batch. Its ratio is what a batch can reach.
 */
static void physical_baseline(const struct aqua_copy_piece *scattered, uint64_t src0, uint64_t dst0,
                              int rounds, uint64_t *ret_scattered_ns, uint64_t *ret_contiguous_ns)
{
        uint64_t *ts = calloc(rounds, sizeof(*ts)), *tc = calloc(rounds, sizeof(*tc));
        size_t bytes = 3 * BLOCKS * BLOCK;
        uint8_t *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        uint8_t *src = m, *dst = m + 2 * BLOCKS * BLOCK;

        if (m == MAP_FAILED || !ts || !tc)
                fail("baseline", -ENOMEM);
        memset(m, 1, bytes);
        for (int i = -3; i < rounds; i++) {
                uint64_t t0 = now_mono_ns(), t1, t2;

                for (size_t k = 0; k < BLOCKS; k++)
                        memcpy(dst + (scattered[k].dst - dst0), src + (scattered[k].src - src0),
                               BLOCK);
                t1 = now_mono_ns();
                memcpy(dst, src, BLOCKS * BLOCK);
                t2 = now_mono_ns();
                if (i >= 0) {
                        ts[i] = t1 - t0;
                        tc[i] = t2 - t1;
                }
        }
        *ret_scattered_ns = median(ts, rounds);
        *ret_contiguous_ns = median(tc, rounds);
        munmap(m, bytes);
        free(ts);
        free(tc);
}

static int run_batch(int rounds)
{
        struct aqua_copy_piece *scattered = calloc(BLOCKS, sizeof(*scattered)), one;
        uint64_t *tb = calloc(rounds, sizeof(*tb)), *tc = calloc(rounds, sizeof(*tc));
        uint64_t *tp = calloc(rounds, sizeof(*tp));
        struct aqua_options opt = AQUA_OPTIONS_INIT;
        unsigned long long calls0 = 0, calls1, batch0, batch1, perblock_calls = 0;
        aqua_tensor *src, *dst;
        aqua_ctx *ctx;
        unsigned seed = 1;
        int r;

        opt.client_name = "bench-data";
        r = aqua_open(0, AQUA_ROLE_CONSUMER, &opt, &ctx);
        if (r < 0)
                fail("open", r);
        find_call_counter();
        /* Blocks at every other 16 KiB of the source, to a shuffled order in the destination. */
        src = local_tensor(ctx, 2 * BLOCKS * BLOCK);
        dst = local_tensor(ctx, BLOCKS * BLOCK);
        for (size_t i = 0; i < BLOCKS; i++)
                scattered[i] =
                    (struct aqua_copy_piece){aqua_tensor_dptr(dst) + i * BLOCK,
                                             aqua_tensor_dptr(src) + 2 * i * BLOCK, BLOCK};
        for (size_t i = BLOCKS - 1; i > 0; i--) {
                size_t j = (size_t)rand_r(&seed) % (i + 1);
                uint64_t d = scattered[i].dst;

                scattered[i].dst = scattered[j].dst;
                scattered[j].dst = d;
        }
        one =
            (struct aqua_copy_piece){aqua_tensor_dptr(dst), aqua_tensor_dptr(src), BLOCKS * BLOCK};
        /* Warm up both (pages touched, events made), then alternate so drift hits both alike. */
        for (int i = 0; i < 3; i++) {
                timed_batch(ctx, scattered, BLOCKS);
                timed_batch(ctx, &one, 1);
        }
        for (int i = 0; i < rounds; i++) {
                tb[i] = timed_batch(ctx, scattered, BLOCKS);
                tc[i] = timed_batch(ctx, &one, 1);
        }
        /* For contrast: one batch call per block, as an engine without batching would copy. */
        for (int i = 0; i < rounds; i++) {
                uint64_t t0 = now_mono_ns();
                aqua_ticket tk = 0;

                if (call_count)
                        calls0 = call_count(NULL);
                for (size_t k = 0; k < BLOCKS; k++) {
                        r = aqua_copy_batch(ctx, &scattered[k], 1, NULL, NULL, NULL, &tk);
                        if (r != 0)
                                fail("copy", r);
                }
                if (call_count)
                        perblock_calls = call_count(NULL) - calls0;
                r = aqua_copy_wait(ctx, tk);
                if (r != 0)
                        fail("copy", r);
                /* The other tickets completed before the last one, on the same stream. */
                tp[i] = now_mono_ns() - t0;
        }
        uint64_t phys_scattered, phys_contiguous;
        physical_baseline(scattered, aqua_tensor_dptr(src), aqua_tensor_dptr(dst), rounds,
                          &phys_scattered, &phys_contiguous);
        printf("memcpy_scattered_ms %.3f\n", phys_scattered / 1e6);
        printf("memcpy_contiguous_ms %.3f\n", phys_contiguous / 1e6);
        printf("memcpy_scattered_vs_contiguous %.3f\n", (double)phys_contiguous / phys_scattered);
        printf("batch_vs_scattered_memcpy %.3f\n", (double)phys_scattered / median(tb, rounds));
        printf("batch_ms %.3f\n", median(tb, rounds) / 1e6);
        printf("contiguous_ms %.3f\n", median(tc, rounds) / 1e6);
        printf("per_block_ms %.3f\n", median(tp, rounds) / 1e6);
        printf("batch_vs_contiguous %.3f\n", (double)median(tc, rounds) / median(tb, rounds));
        printf("per_block_vs_contiguous %.3f\n", (double)median(tc, rounds) / median(tp, rounds));
        if (call_count) {
                aqua_ticket tk;

                calls0 = call_count(NULL);
                batch0 = call_count("cuMemcpyBatchAsync");
                r = aqua_copy_batch(ctx, scattered, BLOCKS, NULL, NULL, NULL, &tk);
                calls1 = call_count(NULL);
                batch1 = call_count("cuMemcpyBatchAsync");
                if (r != 0)
                        fail("copy", r);
                aqua_copy_wait(ctx, tk);
                printf("batch_driver_calls %llu\n", calls1 - calls0);
                printf("batch_batch_calls %llu\n", batch1 - batch0);
                printf("per_block_driver_calls %llu\n", perblock_calls);
        }
        aqua_tensor_free(ctx, src);
        aqua_tensor_free(ctx, dst);
        aqua_close(ctx);
        free(scattered);
        free(tb);
        free(tc);
        free(tp);
        return 0;
}

/* ---------------------------------------------------------------- reclaim */

#define RECLAIM_BYTES  GiB
#define RECLAIM_CHUNK  (32 * MiB)
#define RECLAIM_ROUNDS 3

/*
 * The consumer, once per round: a tensor of 1 GiB on a leased pool, written; polls every 1 ms
 * until the reclaim has moved it all, then times the baselines: one 1 GiB copy into fresh memory
 * (first touch, as the reclaim's destination is fresh) and into the same memory again (warm).
 * Each round ends with one line on out_fd and everything of the round freed.
 */
static _Noreturn void consumer(int go_fd, int ready_fd, int out_fd)
{
        struct aqua_options opt = AQUA_OPTIONS_INIT;
        aqua_ctx *ctx;
        char *buf;
        char c = 1;
        int r;

        /* The producer's memory is offered first. */
        if (read(go_fd, &c, 1) != 1)
                _exit(1);
        opt.client_name = "bench-data-consumer";
        r = aqua_open(0, AQUA_ROLE_CONSUMER, &opt, &ctx);
        if (r < 0)
                fail("consumer open", r);
        buf = malloc(RECLAIM_BYTES);
        memset(buf, 0x5a, RECLAIM_BYTES);
        for (int round = 0; round < RECLAIM_ROUNDS; round++) {
                struct aqua_grant g;
                struct aqua_tensor_info ti;
                struct aqua_copy_piece p;
                aqua_tensor *t, *fresh;
                uint64_t moved = 0, t_fresh, t_warm, in_poll = 0;
                char line[256];

                if (round > 0 && read(go_fd, &c, 1) != 1)
                        _exit(1);
                r = aqua_borrow(ctx, RECLAIM_BYTES, RECLAIM_BYTES, AQUA_BORROW_TENSORS, &g);
                if (r != 0)
                        fail("borrow", r);
                r = aqua_tensor_new(ctx, RECLAIM_BYTES, NULL, &t);
                if (r == 0)
                        r = aqua_tensor_grow(ctx, t, RECLAIM_BYTES);
                if (r != 0)
                        fail("tensor", r);
                p = (struct aqua_copy_piece){aqua_tensor_dptr(t), (uint64_t)(uintptr_t)buf,
                                             RECLAIM_BYTES};
                timed_batch(ctx, &p, 1);
                if (write(ready_fd, &c, 1) != 1)
                        _exit(1);
                while (moved < RECLAIM_BYTES) {
                        struct aqua_event ev[64];
                        struct timespec ms = {0, 1000000};
                        size_t n = 0;
                        uint64_t p0 = now_mono_ns();

                        r = aqua_poll(ctx, ev, 64, &n);
                        in_poll += now_mono_ns() - p0;
                        if (r < 0)
                                fail("poll", r);
                        for (size_t i = 0; i < n; i++)
                                if (ev[i].type == AQUA_EVENT_TENSOR_MIGRATED)
                                        moved += ev[i].bytes;
                                else if (ev[i].type == AQUA_EVENT_RECLAIM_FAILED)
                                        fail("reclaim", ev[i].error);
                        if (n == 0)
                                nanosleep(&ms, NULL);
                }
                aqua_tensor_get_info(ctx, t, &ti);
                if (ti.dram_bytes != RECLAIM_BYTES || ti.dptr != aqua_tensor_dptr(t)) {
                        fprintf(stderr, "bench-data: the tensor did not move to DRAM in place\n");
                        _exit(1);
                }
                fresh = local_tensor(ctx, RECLAIM_BYTES);
                p = (struct aqua_copy_piece){aqua_tensor_dptr(fresh), aqua_tensor_dptr(t),
                                             RECLAIM_BYTES};
                t_fresh = timed_batch(ctx, &p, 1);
                t_warm = timed_batch(ctx, &p, 1);
                snprintf(line, sizeof(line), "%llu %llu %llu\n", (unsigned long long)t_fresh,
                         (unsigned long long)t_warm, (unsigned long long)in_poll);
                if (write(out_fd, line, strlen(line)) < 0)
                        _exit(1);
                aqua_tensor_free(ctx, fresh);
                aqua_tensor_free(ctx, t);
                r = aqua_return(ctx, g.lease);
                if (r != 0)
                        fail("return", r);
        }
        free(buf);
        aqua_close(ctx);
        _exit(0);
}

/*
 * RECLAIM_ROUNDS rounds of: offer 1 GiB, let the consumer fill a tensor on it, time the reclaim,
 * take the consumer's baselines of that round. Each figure is the median over the rounds of the
 * per-round ratio, so that a burst of load on the machine in one round does not decide it.
 */
static int run_reclaim(void)
{
        uint64_t reclaim[RECLAIM_ROUNDS], fresh[RECLAIM_ROUNDS], warm[RECLAIM_ROUNDS];
        uint64_t in_poll[RECLAIM_ROUNDS], vs_fresh[RECLAIM_ROUNDS], vs_warm[RECLAIM_ROUNDS];
        struct aqua_options opt = AQUA_OPTIONS_INIT;
        int go[2], ready[2], out[2], r;
        aqua_ctx *ctx;
        FILE *f;
        pid_t pid;

        /* Fork before any context exists: ZeroMQ does not survive a fork. */
        if (pipe(go) < 0 || pipe(ready) < 0 || pipe(out) < 0)
                return 1;
        pid = fork();
        if (pid == 0) {
                close(go[1]);
                close(ready[0]);
                close(out[0]);
                consumer(go[0], ready[1], out[1]);
        }
        close(go[0]);
        close(ready[1]);
        close(out[1]);
        f = fdopen(out[0], "r");
        opt.client_name = "bench-data-producer";
        opt.chunk_bytes = RECLAIM_CHUNK;
        r = aqua_open(1, AQUA_ROLE_PRODUCER, &opt, &ctx);
        if (r < 0)
                fail("producer open", r);
        for (int round = 0; round < RECLAIM_ROUNDS; round++) {
                unsigned long long tf, tw, tp;
                uint64_t t0, t1, freed = 0;
                char c = 1, line[256];

                r = aqua_offer(ctx, RECLAIM_BYTES, NULL);
                if (r != 0)
                        fail("offer", r);
                if (write(go[1], &c, 1) != 1)
                        return 1;
                if (read(ready[0], &c, 1) != 1) {
                        fprintf(stderr, "bench-data: the consumer did not start\n");
                        return 1;
                }
                /* From the request until the producer is told its memory is free. */
                t0 = now_mono_ns();
                r = aqua_reclaim(ctx, AQUA_ALL, AQUA_FOREVER, &freed);
                t1 = now_mono_ns();
                if (r != 0)
                        fail("reclaim", r);
                if (freed != RECLAIM_BYTES) {
                        fprintf(stderr, "bench-data: the reclaim freed %llu bytes\n",
                                (unsigned long long)freed);
                        return 1;
                }
                if (!fgets(line, sizeof(line), f) ||
                    sscanf(line, "%llu %llu %llu", &tf, &tw, &tp) != 3 || !tf || !tw) {
                        fprintf(stderr, "bench-data: no baseline from the consumer\n");
                        return 1;
                }
                reclaim[round] = t1 - t0;
                fresh[round] = tf;
                warm[round] = tw;
                in_poll[round] = tp;
                /* Ratios kept as thousandths, to take their median like the times'. */
                vs_fresh[round] = reclaim[round] * 1000 / tf;
                vs_warm[round] = reclaim[round] * 1000 / tw;
                printf("round %d reclaim_ms %.3f copy_fresh_ms %.3f copy_warm_ms %.3f\n", round,
                       reclaim[round] / 1e6, tf / 1e6, tw / 1e6);
        }
        waitpid(pid, NULL, 0);
        printf("reclaim_rounds %d\n", RECLAIM_ROUNDS);
        printf("reclaim_ms %.3f\n", median(reclaim, RECLAIM_ROUNDS) / 1e6);
        printf("consumer_poll_ms %.3f\n", median(in_poll, RECLAIM_ROUNDS) / 1e6);
        printf("copy_fresh_ms %.3f\n", median(fresh, RECLAIM_ROUNDS) / 1e6);
        printf("copy_warm_ms %.3f\n", median(warm, RECLAIM_ROUNDS) / 1e6);
        printf("reclaim_vs_fresh_copy %.3f\n", median(vs_fresh, RECLAIM_ROUNDS) / 1e3);
        printf("reclaim_vs_warm_copy %.3f\n", median(vs_warm, RECLAIM_ROUNDS) / 1e3);
        fclose(f);
        aqua_close(ctx);
        return 0;
}

int main(int argc, char **argv)
{
        int rounds = 15;

        if (argc >= 3 && strcmp(argv[2], "--rounds") == 0 && argc == 4)
                rounds = atoi(argv[3]);
        if (rounds < 3)
                return 2;
        if (argc >= 2 && strcmp(argv[1], "batch") == 0)
                return run_batch(rounds);
        if (argc >= 2 && strcmp(argv[1], "reclaim") == 0)
                return run_reclaim();
        fprintf(stderr, "usage: bench-data batch [--rounds N] | reclaim\n");
        return 2;
}
