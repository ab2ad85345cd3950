/*
 * aqua-gpu-check: the consumer half of tests/gpu/device-check, on a real GPU or on simcuda. With
 * aquad and a producer lending on the same GPU (colocated-lending), it reports what the driver
 * supports, borrows, writes every byte through copies (no kernels), measures, waits for the
 * reclaim the script starts, checks every byte in DRAM at the same addresses and measures the
 * DRAM tier. One line per result:
 *
 *   info KEY VALUE...            what the driver reports, which DRAM path libaqua took
 *   check NAME ok|FAIL TEXT      a property that must hold
 *   BENCH NAME VALUE OP TARGET   a figure (ratios against a baseline measured in this run)
 *   ready                        the lease is written: start the reclaim, then send a line
 *
 * Usage: aqua-gpu-check DEVICE BYTES   (aquad's endpoint and side socket from the environment)
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aqua/aqua.h"
#include "cuda-driver.h"
#include "time-util.h"
#include "util.h"

#define MiB        (UINT64_C(1) << 20)
#define BATCH_N    4096
#define BATCH_B    (16 * 1024)
#define BORROWS    20
#define COPY_TIMES 5

static const struct cuda_driver *cu;
static aqua_ctx *ctx;
static int failures;

static void check(bool ok, const char *name, const char *fmt, ...) _printf_(3, 4);
static void check(bool ok, const char *name, const char *fmt, ...)
{
        va_list ap;

        printf("check %s %s ", name, ok ? "ok" : "FAIL");
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        putchar('\n');
        fflush(stdout);
        failures += !ok;
}

static void bench(const char *name, double value, const char *op, double target)
{
        printf("BENCH %s %.3f %s %.2f\n", name, value, op, target);
        fflush(stdout);
}

static int cu_ok(CUresult r, const char *what)
{
        const char *name = NULL;

        if (r == CUDA_SUCCESS)
                return 0;
        cu->cuGetErrorName(r, &name);
        fprintf(stderr, "aqua-gpu-check: %s: %s\n", what, name ? name : "?");
        return -EIO;
}

static void log_to_stderr(enum aqua_log_level level, const char *message, void *userdata)
{
        fprintf(stderr, "libaqua: %s\n", message);
}

static void attribute(CUdevice d, const char *name, CUdevice_attribute a)
{
        int v = -1;

        if (cu->cuDeviceGetAttribute(&v, a, d) != CUDA_SUCCESS)
                v = -1;
        printf("info %s %d\n", name, v);
}

static void driver_info(int device)
{
        char name[128] = "";
        size_t total = 0;
        CUdevice d;

        cu->cuDeviceGet(&d, device);
        cu->cuDeviceGetName(name, sizeof(name), d);
        cu->cuDeviceTotalMem(&total, d);
        printf("info device %d %s, %zu MiB, driver %d\n", device, name, total / MiB, cu->version);
        attribute(d, "vmm", CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
        attribute(d, "posix_fd_handles",
                  CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
        attribute(d, "fabric_handles", CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED);
        attribute(d, "host_numa_id", CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID);
        attribute(d, "host_numa_vmm",
                  CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
        attribute(d, "host_numa_mempools", CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED);
        fflush(stdout);
}

/* Wall time of fn(arg) COPY_TIMES times, the context synchronized after each; the best run. */
static double best_seconds(int (*fn)(void *), void *arg)
{
        double best = 0;

        for (int i = 0; i < COPY_TIMES; i++) {
                uint64_t t0 = now_mono_ns();
                if (fn(arg) < 0 || cu_ok(cu->cuCtxSynchronize(), "cuCtxSynchronize") < 0)
                        return 0;
                double s = (double)(now_mono_ns() - t0) / 1e9;
                if (best == 0 || s < best)
                        best = s;
        }
        return best;
}

struct dtod {
        CUdeviceptr dst, src;
        size_t bytes;
};

static int run_dtod(void *arg)
{
        struct dtod *c = arg;

        return cu_ok(cu->cuMemcpyDtoD(c->dst, c->src, c->bytes), "cuMemcpyDtoD");
}

struct htod {
        CUdeviceptr dst;
        const void *src;
        size_t bytes;
};

static int run_htod(void *arg)
{
        struct htod *c = arg;

        return cu_ok(cu->cuMemcpyHtoD(c->dst, c->src, c->bytes), "cuMemcpyHtoD");
}

struct batch {
        struct aqua_copy_piece *pieces;
};

static int run_batch(void *arg)
{
        struct batch *b = arg;
        aqua_ticket t;
        int r = aqua_copy_batch(ctx, b->pieces, BATCH_N, NULL, NULL, NULL, &t);

        return r < 0 ? r : aqua_copy_wait(ctx, t);
}

static void fill(uint64_t *buf, uint64_t bytes, uint64_t seed)
{
        for (uint64_t i = 0; i < bytes / 8; i++)
                buf[i] = (seed * UINT64_C(0x9e3779b97f4a7c15)) ^ i;
}

/* Bytes of the tensor that differ from what fill(seed) wrote, read back in 64 MiB pieces. */
static uint64_t differing(uint64_t dptr, uint64_t bytes, uint64_t *host, uint64_t seed)
{
        uint64_t *want = malloc(64 * MiB), bad = 0;

        if (!want)
                return bytes;
        fill(host, bytes, seed);
        for (uint64_t off = 0; off < bytes; off += 64 * MiB) {
                uint64_t n = MIN(64 * MiB, bytes - off);
                if (cu_ok(cu->cuMemcpyDtoH(want, dptr + off, n), "cuMemcpyDtoH") < 0)
                        return bytes;
                if (memcmp(want, (uint8_t *)host + off, n) != 0)
                        for (uint64_t i = 0; i < n / 8; i++)
                                bad += 8 * (want[i] != host[off / 8 + i]);
        }
        free(want);
        return bad;
}

int main(int argc, char **argv)
{
        struct aqua_options o = AQUA_OPTIONS_INIT;
        struct aqua_tensor_options to = AQUA_TENSOR_OPTIONS_INIT;
        struct aqua_tensor_info ti;
        struct aqua_tensor_range range;
        struct aqua_copy_piece *pieces = NULL;
        struct aqua_grant g;
        aqua_tensor *t = NULL;
        CUdeviceptr local = 0, local2 = 0;
        uint64_t *host = NULL, bytes, lat[BORROWS];
        char *err = NULL, line[64];
        int device, r;

        if (argc != 3) {
                fprintf(stderr, "usage: aqua-gpu-check DEVICE BYTES\n");
                return 2;
        }
        device = atoi(argv[1]);
        bytes = strtoull(argv[2], NULL, 0) & ~(2 * MiB - 1);
        /* The batch scatters its blocks over 128 MiB. */
        if (bytes < 128 * MiB) {
                fprintf(stderr, "aqua-gpu-check: BYTES must be at least 128 MiB\n");
                return 2;
        }
        if (cuda_driver_get(&cu, &err) < 0) {
                fprintf(stderr, "aqua-gpu-check: %s\n", err ? err : "no CUDA driver");
                return 1;
        }
        /* The device's primary context, current here for this program's own copies (held to
         * the end: its last release would destroy what was made in it). */
        CUdevice dev;
        CUcontext cctx;
        if (cu_ok(cu->cuInit(0), "cuInit") < 0 ||
            cu_ok(cu->cuDeviceGet(&dev, device), "cuDeviceGet") < 0 ||
            cu_ok(cu->cuDevicePrimaryCtxRetain(&cctx, dev), "cuDevicePrimaryCtxRetain") < 0 ||
            cu_ok(cu->cuCtxSetCurrent(cctx), "cuCtxSetCurrent") < 0)
                return 1;
        aqua_set_log(log_to_stderr, NULL, AQUA_LOG_WARNING);
        o.client_name = "aqua-gpu-check";
        r = aqua_open(device, AQUA_ROLE_CONSUMER, &o, &ctx);
        if (r < 0) {
                fprintf(stderr, "aqua-gpu-check: aqua_open: %s\n", aqua_strerror(r));
                return 1;
        }
        driver_info(device);

        /* Borrow and return one chunk at a time: the control path's latency. */
        for (int i = 0; i < BORROWS; i++) {
                uint64_t t0 = now_mono_ns();
                r = aqua_borrow(ctx, 2 * MiB, 2 * MiB, 0, &g);
                if (r != 0 || !g.lease)
                        break;
                r = aqua_return(ctx, g.lease);
                lat[i] = now_mono_ns() - t0;
        }
        check(r == 0, "borrow-return", "%d borrow/return cycles of one chunk: %s", BORROWS,
              r == 0 ? "all granted" : aqua_strerror(r));
        if (r == 0) {
                uint64_t best = lat[0];
                for (int i = 1; i < BORROWS; i++)
                        best = MIN(best, lat[i]);
                bench("gpu.borrow_return_ms", (double)best / 1e6, "<=", 5.0);
        }

        /* The lease as capacity for a tensor: every byte is the producer's memory. */
        r = aqua_borrow(ctx, bytes, bytes, AQUA_BORROW_TENSORS, &g);
        check(r == 0 && g.bytes == bytes, "borrow", "%" PRIu64 " MiB of peer memory: %s",
              bytes / MiB, r == 0 ? "granted" : aqua_strerror(r));
        if (r != 0)
                goto out;
        r = aqua_tensor_new(ctx, bytes, &to, &t);
        if (r == 0)
                r = aqua_tensor_grow(ctx, t, bytes);
        if (r == 0)
                r = aqua_tensor_get_info(ctx, t, &ti);
        check(r == 0 && ti.peer_bytes == bytes, "tensor", "a tensor of %" PRIu64 " MiB in it: %s",
              bytes / MiB, r == 0 ? "mapped" : aqua_strerror(r));
        if (r != 0)
                goto out;

        host = malloc(bytes);
        pieces = calloc(BATCH_N, sizeof(*pieces));
        if (!host || !pieces || cu_ok(cu->cuMemAlloc(&local, bytes), "cuMemAlloc") < 0 ||
            cu_ok(cu->cuMemAlloc(&local2, bytes), "cuMemAlloc") < 0)
                goto out;

        /* Leased memory against the GPU's own, copy for copy. */
        struct dtod to_lease = {ti.dptr, local, bytes}, to_local = {local2, local, bytes};
        double s_lease = best_seconds(run_dtod, &to_lease);
        double s_local = best_seconds(run_dtod, &to_local);
        if (s_lease > 0 && s_local > 0) {
                printf("info leased_copy %.1f GB/s, local_copy %.1f GB/s\n", bytes / s_lease / 1e9,
                       bytes / s_local / 1e9);
                bench("gpu.leased_vs_local_dtod", s_local / s_lease, ">=", 0.9);
        }

        /* 4096 scattered 16 KiB blocks in one batch against one contiguous copy of them. */
        for (size_t i = 0; i < BATCH_N; i++)
                pieces[i] =
                    (struct aqua_copy_piece){.dst = ti.dptr + ((i * 7919) % BATCH_N) * BATCH_B * 2,
                                             .src = local + i * BATCH_B * 2,
                                             .bytes = BATCH_B};
        struct batch b = {pieces};
        struct dtod contiguous = {ti.dptr, local, (size_t)BATCH_N * BATCH_B};
        double s_batch = best_seconds(run_batch, &b), s_one = best_seconds(run_dtod, &contiguous);
        if (s_batch > 0 && s_one > 0)
                bench("gpu.batch16k_vs_contiguous", s_one / s_batch, ">=", 0.7);

        /* Every byte, written by copies, to be found again after the reclaim. */
        fill(host, bytes, 7);
        r = cu_ok(cu->cuMemcpyHtoD(ti.dptr, host, bytes), "cuMemcpyHtoD");
        check(r == 0 && differing(ti.dptr, bytes, host, 7) == 0, "write",
              "%" PRIu64 " MiB written and read back", bytes / MiB);

        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof(line), stdin))
                goto out;
        /* The producer reclaims: the chunks move to DRAM inside aqua_poll(). */
        uint64_t t0 = now_mono_ns(), deadline = t0 + 120 * NSEC_PER_SEC;
        int fd;
        aqua_fd(ctx, &fd);
        do {
                struct aqua_event ev[16];
                struct pollfd p = {.fd = fd, .events = POLLIN};
                size_t n;

                if (aqua_poll(ctx, ev, 16, &n) < 0 || aqua_tensor_get_info(ctx, t, &ti) < 0)
                        break;
                if (ti.peer_bytes == 0)
                        break;
                poll(&p, 1, 10);
        } while (now_mono_ns() < deadline);
        check(ti.peer_bytes == 0 && ti.dram_bytes == bytes, "reclaim",
              "%" PRIu64 " MiB moved to DRAM at the same address in %.1f ms", ti.dram_bytes / MiB,
              (double)(now_mono_ns() - t0) / 1e6);
        bench("gpu.reclaim_ms_per_gib",
              (double)(now_mono_ns() - t0) / 1e6 / ((double)bytes / (1 << 30)), "<=", 1000.0);
        check(ti.dptr == aqua_tensor_dptr(t) && differing(ti.dptr, bytes, host, 7) == 0,
              "data-after-reclaim", "every byte read back from DRAM at the same address");

        r = aqua_tensor_get_range(ctx, t, 0, &range);
        printf("info dram_path %s\n", r < 0        ? "unknown"
                                      : range.host ? "pinned host memory (the address changed)"
                                                   : "host-location VMM at the same address");

        /* The DRAM tier against pinned host-to-device copies of the same bytes. */
        void *pinned = NULL;
        if (!range.host && cu_ok(cu->cuMemAllocHost(&pinned, bytes), "cuMemAllocHost") == 0) {
                struct dtod from_dram = {local, ti.dptr, bytes};
                struct htod from_pinned = {local, pinned, bytes};
                double s_dram = best_seconds(run_dtod, &from_dram);
                double s_pinned = best_seconds(run_htod, &from_pinned);
                if (s_dram > 0 && s_pinned > 0) {
                        printf("info dram_tier %.1f GB/s, pinned_htod %.1f GB/s\n",
                               bytes / s_dram / 1e9, bytes / s_pinned / 1e9);
                        bench("gpu.dram_tier_vs_pinned_htod", s_pinned / s_dram, ">=", 0.9);
                }
                cu->cuMemFreeHost(pinned);
        }
out:
        if (local)
                cu->cuMemFree(local);
        if (local2)
                cu->cuMemFree(local2);
        free(host);
        free(pieces);
        t = aqua_tensor_free(ctx, t);
        ctx = aqua_close(ctx);
        cu->cuDevicePrimaryCtxRelease(dev);
        printf("done %d failures\n", failures);
        return failures ? 1 : 0;
}
