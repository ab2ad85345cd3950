/*
 * lend-workload: a GPU workload that knows nothing of aqua, for aqua-lend's tests and bench. A
 * plain CUDA Driver API program (cuda.h, linked against libcuda.so.1 as any is): it holds device
 * memory following a trace, allocating and freeing it in blocks with cuMemAlloc and cuMemFree,
 * and counts the allocations the device refused.
 *
 * Usage: lend-workload TRACE DEVICE [RECORD]
 *        lend-workload --free DEVICE      prints "free BYTES total BYTES" (cuMemGetInfo)
 *   TRACE   CSV lines "seconds,size": from that time on, hold that much ("0,1GiB")
 *   RECORD  a CSV line per step: monotonic ms, the target, what it holds, refusals so far
 * It ends after the trace's last line has held one step, printing
 *   "workload: N allocation failures, held at most SIZE, trace done"
 */
#include <cuda.h>
#include <errno.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLOCK   (UINT64_C(32) << 20)
#define STEP_NS (UINT64_C(10) * 1000 * 1000)
#define MAX_BLOCKS 65536
#define MIN(a, b) ((a) < (b) ? (a) : (b))

struct point {
        double t;
        uint64_t bytes;
};

static uint64_t now_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* "1GiB", "512MiB", "0": bytes (binary units only, enough for a trace). */
static int parse_bytes(const char *s, uint64_t *ret)
{
        char *end;
        double v = strtod(s, &end);
        uint64_t unit = 1;

        if (end == s || v < 0)
                return -EINVAL;
        while (*end == ' ')
                end++;
        if (!strncmp(end, "GiB", 3))
                unit = UINT64_C(1) << 30;
        else if (!strncmp(end, "MiB", 3))
                unit = UINT64_C(1) << 20;
        else if (*end && *end != '\n' && *end != '\r')
                return -EINVAL;
        *ret = (uint64_t)(v * (double)unit);
        return 0;
}

static int load_trace(const char *path, struct point **ret, size_t *ret_n)
{
        FILE *f = fopen(path, "re");
        char line[256];
        struct point *p = NULL;
        size_t n = 0, lineno = 0;

        if (!f) {
                fprintf(stderr, "lend-workload: %s: %s\n", path, strerror(errno));
                return -errno;
        }
        while (fgets(line, sizeof(line), f)) {
                char *comma = strchr(line, ',');
                struct point *np;

                lineno++;
                if (line[0] == '#' || line[0] == '\n')
                        continue;
                np = realloc(p, (n + 1) * sizeof(*p));
                if (!comma || !np) {
                        fprintf(stderr, "lend-workload: %s:%zu: expected 'seconds,size'\n", path,
                                lineno);
                        free(np ? np : p);
                        fclose(f);
                        return -EINVAL;
                }
                p = np;
                p[n].t = strtod(line, NULL);
                if (parse_bytes(comma + 1, &p[n].bytes) < 0 || (n > 0 && p[n].t < p[n - 1].t)) {
                        fprintf(stderr, "lend-workload: %s:%zu: bad size or time out of order\n",
                                path, lineno);
                        free(p);
                        fclose(f);
                        return -EINVAL;
                }
                n++;
        }
        fclose(f);
        if (n == 0) {
                fprintf(stderr, "lend-workload: %s: no points\n", path);
                free(p);
                return -EINVAL;
        }
        *ret = p;
        *ret_n = n;
        return 0;
}

static int check(CUresult r, const char *what)
{
        const char *name = NULL;

        if (r == CUDA_SUCCESS)
                return 0;
        cuGetErrorName(r, &name);
        fprintf(stderr, "lend-workload: %s: %s\n", what, name ? name : "?");
        return -1;
}

int main(int argc, char **argv)
{
        static CUdeviceptr blocks[MAX_BLOCKS];
        struct point *trace = NULL;
        size_t n_points = 0, n_blocks = 0, at = 0;
        uint64_t failures = 0, peak = 0, start, next;
        FILE *record = NULL;
        CUcontext cctx;
        CUdevice dev;

        if (argc < 3) {
                fprintf(stderr, "usage: lend-workload TRACE DEVICE [RECORD]\n"
                                "       lend-workload --free DEVICE\n");
                return 2;
        }
        bool free_only = !strcmp(argv[1], "--free");
        if (!free_only && load_trace(argv[1], &trace, &n_points) < 0)
                return 2;
        if (check(cuInit(0), "cuInit") || check(cuDeviceGet(&dev, atoi(argv[2])), "cuDeviceGet") ||
            check(cuDevicePrimaryCtxRetain(&cctx, dev), "cuDevicePrimaryCtxRetain") ||
            check(cuCtxSetCurrent(cctx), "cuCtxSetCurrent"))
                return 1;
        if (free_only) {
                size_t free_b, total;
                if (check(cuMemGetInfo(&free_b, &total), "cuMemGetInfo"))
                        return 1;
                printf("free %zu total %zu\n", free_b, total);
                cuDevicePrimaryCtxRelease(dev);
                return 0;
        }
        if (argc > 3) {
                record = fopen(argv[3], "we");
                if (!record) {
                        fprintf(stderr, "lend-workload: %s: %s\n", argv[3], strerror(errno));
                        return 1;
                }
                fprintf(record, "t_ms,target,held,failures\n");
        }
        start = next = now_ns();
        for (;;) {
                double t = (double)(now_ns() - start) / 1e9;
                uint64_t target, want;
                bool refused = false;

                while (at + 1 < n_points && trace[at + 1].t <= t)
                        at++;
                target = trace[at].bytes;
                want = MIN((target + BLOCK - 1) / BLOCK, MAX_BLOCKS);
                while (n_blocks < want) {
                        CUresult r = cuMemAlloc(&blocks[n_blocks], BLOCK);
                        if (r == CUDA_ERROR_OUT_OF_MEMORY) {
                                refused = true;
                                break;
                        }
                        if (check(r, "cuMemAlloc"))
                                return 1;
                        n_blocks++;
                }
                /* One refusal a step: it asks again at the next one, as an allocator retries. */
                failures += refused;
                while (n_blocks > want)
                        if (check(cuMemFree(blocks[--n_blocks]), "cuMemFree"))
                                return 1;
                if ((uint64_t)n_blocks * BLOCK > peak)
                        peak = (uint64_t)n_blocks * BLOCK;
                if (record)
                        fprintf(record, "%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 "\n",
                                now_ns() / 1000000, target, (uint64_t)n_blocks * BLOCK, failures);
                if (at + 1 == n_points && t > trace[at].t)
                        break;
                next += STEP_NS;
                uint64_t now = now_ns();
                if (next > now) {
                        struct timespec ts = {0, (long)(next - now)};
                        nanosleep(&ts, NULL);
                } else
                        next = now;
        }
        while (n_blocks > 0)
                cuMemFree(blocks[--n_blocks]);
        cuDevicePrimaryCtxRelease(dev);
        if (record)
                fclose(record);
        printf("workload: %" PRIu64 " allocation failures, held at most %.2f GiB, trace done\n",
               failures, (double)peak / (1 << 30));
        free(trace);
        return 0;
}
