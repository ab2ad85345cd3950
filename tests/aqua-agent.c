/*
 * A libaqua client process for the multi-process tests: it reads one command per line on stdin,
 * runs it through the public API (and the CUDA driver, for data and free memory) and answers one
 * line on stdout, "ok ..." or "err CODE TEXT". Tests start producers and consumers as agents so
 * that they can kill them like real engines.
 *
 *   open ROLE DEVICE [CHUNK_BYTES]   -> ok
 *   offer BYTES                      -> ok OFFERED
 *   reclaim BYTES TIMEOUT_MS         -> ok RESULT FREED
 *   borrow BYTES MIN [dram|tensors]  -> ok INDEX BYTES DRAM   (INDEX names the lease later)
 *   tensor BYTES                     -> ok INDEX DPTR         (a tensor grown to BYTES)
 *   tfill INDEX SEED / tcheck INDEX SEED -> ok / ok BAD_CHUNKS
 *   tinfo INDEX                      -> ok dptr=D peer=B local=B dram=B end=B
 *   return_dram BYTES                -> ok
 *   fill INDEX SEED / check INDEX SEED -> ok / ok BAD_CHUNKS
 *   zeroed INDEX                     -> ok CHUNKS_NOT_ALL_ZERO
 *   return INDEX                     -> ok
 *   poll MS [until-EVENT]            -> ok migrated=N reclaimed=BYTES disconnected=N
 *                                          reconnected=N lost=N failed=N tmoved=BYTES
 *   info                             -> ok connected=0|1 offered=B borrowed=B dram=B paired=UUID
 *   free DEVICE                      -> ok FREE_BYTES          (cuMemGetInfo)
 *   close                            -> ok
 *   quit                             -> ok, then exits (closing first)
 *
 * A failed open answers "err CODE TEXT; LOG" with libaqua's last error message.
 * $AQUA_AGENT_TIMEOUT_MS: the context's timeout (aqua_options.timeout_ms), libaqua's default else.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "aqua/aqua.h"
#include "cuda-driver.h"
#include "time-util.h"
#include "util.h"

#define MAX_LEASES 64

static aqua_ctx *ctx;
static const struct cuda_driver *cu;
static aqua_lease *leases[MAX_LEASES];
static size_t n_leases;
static aqua_tensor *tensors[MAX_LEASES];
static size_t n_tensors;
static int device;
static char last_error[512];

static void reply(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void reply(const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        putchar('\n');
        fflush(stdout);
}

static void fail(int r)
{
        reply("err %d %s", r, aqua_strerror(r));
}

static int cu_ok(CUresult r)
{
        return r == CUDA_SUCCESS ? 0 : -EIO;
}

/*
 * Make device's primary context current, for copies and cuMemGetInfo. The agent keeps its own
 * retain of each context it used until it exits: a retain released at once would destroy the
 * context whenever the library holds none (another device's, or after close), and every call
 * made in it afterwards fails with CUDA_ERROR_CONTEXT_IS_DESTROYED.
 */
static int use_device(int dev)
{
        static CUcontext retained[64];
        CUdevice d;
        char *err = NULL;

        if (!cu && cuda_driver_get(&cu, &err) < 0) {
                free(err);
                return -ELIBACC;
        }
        if (dev < 0 || dev >= (int)ARRAY_SIZE(retained))
                return -EINVAL;
        if (cu_ok(cu->cuInit(0)) < 0 || cu_ok(cu->cuDeviceGet(&d, dev)) < 0)
                return -EIO;
        if (!retained[dev] && cu_ok(cu->cuDevicePrimaryCtxRetain(&retained[dev], d)) < 0)
                return -EIO;
        return cu_ok(cu->cuCtxSetCurrent(retained[dev]));
}

/* Distinct for every seed, chunk and word, and cheap enough to write gigabytes of. */
static uint64_t pattern_base(unsigned seed, uint64_t chunk)
{
        return (uint64_t)seed * UINT64_C(0x9e3779b97f4a7c15) ^ (chunk << 40);
}

/* Fill or check every chunk of a lease, wherever the chunk lives now; zero: check for zeros. */
static int walk(size_t index, unsigned seed, bool fill, bool zero, size_t *ret_bad)
{
        struct aqua_lease_info li;
        uint64_t *buf;
        size_t bad = 0;
        int r;

        if (index >= n_leases || !leases[index])
                return -EINVAL;
        r = aqua_lease_get_info(ctx, leases[index], &li);
        if (r < 0)
                return r;
        r = use_device(device);
        if (r < 0)
                return r;
        buf = malloc(li.chunk_bytes);
        if (!buf)
                return -ENOMEM;
        for (size_t c = 0; c < li.n_chunks && r == 0; c++) {
                struct aqua_chunk_info ci;
                size_t words;

                r = aqua_lease_get_chunk(ctx, leases[index], c, &ci);
                if (r < 0)
                        break;
                uint64_t base = pattern_base(seed, c);

                words = ci.bytes / 8;
                if (fill) {
                        for (size_t i = 0; i < words; i++)
                                buf[i] = base ^ i;
                        if (ci.host)
                                memcpy(ci.host, buf, ci.bytes);
                        else
                                r = cu_ok(cu->cuMemcpyHtoD(li.dptr + ci.offset, buf, ci.bytes));
                        continue;
                }
                if (ci.host)
                        memcpy(buf, ci.host, ci.bytes);
                else
                        r = cu_ok(cu->cuMemcpyDtoH(buf, li.dptr + ci.offset, ci.bytes));
                for (size_t i = 0; i < words && r == 0; i++)
                        if (buf[i] != (zero ? 0 : base ^ i)) {
                                bad++;
                                break;
                        }
        }
        free(buf);
        if (r == 0 && ret_bad)
                *ret_bad = bad;
        return r;
}

/* Fill or check every mapped chunk of a tensor through its device address (or host copy). */
static int twalk(size_t index, unsigned seed, bool fill, size_t *ret_bad)
{
        struct aqua_tensor_info ti;
        uint64_t *buf;
        size_t bad = 0;
        int r;

        if (index >= n_tensors)
                return -EINVAL;
        r = aqua_tensor_get_info(ctx, tensors[index], &ti);
        if (r == 0)
                r = use_device(device);
        if (r < 0)
                return r;
        buf = malloc(ti.chunk_bytes);
        if (!buf)
                return -ENOMEM;
        for (uint64_t off = ti.begin; off < ti.end && r == 0; off += ti.chunk_bytes) {
                struct aqua_tensor_range rg;
                uint64_t base = pattern_base(seed, off / ti.chunk_bytes);
                size_t words = ti.chunk_bytes / 8;
                void *host;

                r = aqua_tensor_get_range(ctx, tensors[index], off, &rg);
                if (r < 0)
                        break;
                host = rg.host ? (char *)rg.host + (off - rg.offset) : NULL;
                if (fill) {
                        for (size_t i = 0; i < words; i++)
                                buf[i] = base ^ i;
                        if (host)
                                memcpy(host, buf, ti.chunk_bytes);
                        else
                                r = cu_ok(cu->cuMemcpyHtoD(ti.dptr + off, buf, ti.chunk_bytes));
                        continue;
                }
                if (host)
                        memcpy(buf, host, ti.chunk_bytes);
                else
                        r = cu_ok(cu->cuMemcpyDtoH(buf, ti.dptr + off, ti.chunk_bytes));
                for (size_t i = 0; i < words && r == 0; i++)
                        if (buf[i] != (base ^ i)) {
                                bad++;
                                break;
                        }
        }
        free(buf);
        if (r == 0 && ret_bad)
                *ret_bad = bad;
        return r;
}

static void cmd_poll(int ms, const char *until)
{
        uint64_t deadline = now_mono_ns() + (uint64_t)ms * NSEC_PER_MSEC;
        unsigned migrated = 0, disconnected = 0, reconnected = 0, lost = 0, failed = 0;
        uint64_t reclaimed = 0, tmoved = 0;
        int fd, r;

        aqua_fd(ctx, &fd);
        for (;;) {
                struct aqua_event ev[16];
                struct pollfd p = {.fd = fd, .events = POLLIN};
                bool done = false;
                size_t n = 0;

                r = aqua_poll(ctx, ev, 16, &n);
                if (r < 0) {
                        fail(r);
                        return;
                }
                for (size_t i = 0; i < n; i++) {
                        const char *name = "";

                        switch (ev[i].type) {
                        case AQUA_EVENT_MIGRATED:
                                migrated++;
                                name = "migrated";
                                break;
                        case AQUA_EVENT_RECLAIMED:
                                reclaimed += ev[i].bytes;
                                name = "reclaimed";
                                break;
                        case AQUA_EVENT_DISCONNECTED:
                                disconnected++;
                                name = "disconnected";
                                break;
                        case AQUA_EVENT_RECONNECTED:
                                reconnected++;
                                name = "reconnected";
                                break;
                        case AQUA_EVENT_LEASE_LOST:
                                lost++;
                                name = "lost";
                                break;
                        case AQUA_EVENT_RECLAIM_FAILED:
                                failed++;
                                name = "failed";
                                break;
                        case AQUA_EVENT_TENSOR_MIGRATED:
                                tmoved += ev[i].bytes;
                                name = "tmoved";
                                break;
                        default:
                                break;
                        }
                        if (until && strcmp(until, name) == 0)
                                done = true;
                }
                if (done || now_mono_ns() >= deadline)
                        break;
                /* The fd wakes us; the short timeout only bounds the wait for the deadline. */
                poll(&p, 1, MIN(ms_until(deadline), 50));
        }
        reply("ok migrated=%u reclaimed=%llu disconnected=%u reconnected=%u lost=%u failed=%u "
              "tmoved=%llu",
              migrated, (unsigned long long)reclaimed, disconnected, reconnected, lost, failed,
              (unsigned long long)tmoved);
}

static void dispatch(char *line)
{
        char cmd[32] = "", a[64] = "", b[64] = "", c[64] = "";
        unsigned long long x, y;
        int r;

        sscanf(line, "%31s %63s %63s %63s", cmd, a, b, c);
        if (strcmp(cmd, "open") == 0) {
                struct aqua_options o = AQUA_OPTIONS_INIT;
                enum aqua_role role = strcmp(a, "producer") == 0   ? AQUA_ROLE_PRODUCER
                                      : strcmp(a, "consumer") == 0 ? AQUA_ROLE_CONSUMER
                                                                   : AQUA_ROLE_NEUTRAL;
                device = atoi(b);
                o.chunk_bytes = strtoull(c, NULL, 0);
                o.client_name = a;
                if (getenv("AQUA_AGENT_TIMEOUT_MS"))
                        o.timeout_ms = atoi(getenv("AQUA_AGENT_TIMEOUT_MS"));
                last_error[0] = '\0';
                r = aqua_open(device, role, &o, &ctx);
                r < 0 ? reply("err %d %s; %s", r, aqua_strerror(r), last_error) : reply("ok");
        } else if (strcmp(cmd, "offer") == 0) {
                uint64_t offered = 0;
                r = aqua_offer(ctx, strtoull(a, NULL, 0), &offered);
                r != 0 ? fail(r) : reply("ok %llu", (unsigned long long)offered);
        } else if (strcmp(cmd, "reclaim") == 0) {
                uint64_t freed = 0;
                x = strtoull(a, NULL, 0);
                r = aqua_reclaim(ctx, x ? x : AQUA_ALL, atoi(b), &freed);
                r < 0 ? fail(r) : reply("ok %d %llu", r, (unsigned long long)freed);
        } else if (strcmp(cmd, "borrow") == 0) {
                struct aqua_grant g;
                x = strtoull(a, NULL, 0);
                y = strtoull(b, NULL, 0);
                r = aqua_borrow(ctx, x, y,
                                strcmp(c, "dram") == 0      ? AQUA_BORROW_ALLOW_DRAM
                                : strcmp(c, "tensors") == 0 ? AQUA_BORROW_TENSORS
                                                            : 0,
                                &g);
                if (r != 0 || n_leases == MAX_LEASES) {
                        fail(r ? r : -E2BIG);
                        return;
                }
                leases[n_leases++] = g.lease;
                reply("ok %zu %llu %llu", n_leases - 1, (unsigned long long)g.bytes,
                      (unsigned long long)g.dram_bytes);
        } else if (strcmp(cmd, "return_dram") == 0) {
                r = aqua_return_dram(ctx, strtoull(a, NULL, 0));
                r != 0 ? fail(r) : reply("ok");
        } else if (strcmp(cmd, "fill") == 0 || strcmp(cmd, "check") == 0 ||
                   strcmp(cmd, "zeroed") == 0) {
                size_t bad = 0;
                r = walk(strtoul(a, NULL, 0), (unsigned)atoi(b), cmd[0] == 'f', cmd[0] == 'z',
                         &bad);
                r < 0 ? fail(r) : reply("ok %zu", bad);
        } else if (strcmp(cmd, "tensor") == 0) {
                aqua_tensor *t = NULL;
                x = strtoull(a, NULL, 0);
                r = n_tensors < MAX_LEASES ? aqua_tensor_new(ctx, x, NULL, &t) : -E2BIG;
                if (r == 0) {
                        r = aqua_tensor_grow(ctx, t, x);
                        if (r != 0)
                                aqua_tensor_free(ctx, t);
                }
                if (r != 0) {
                        fail(r);
                        return;
                }
                tensors[n_tensors++] = t;
                reply("ok %zu %llu", n_tensors - 1, (unsigned long long)aqua_tensor_dptr(t));
        } else if (strcmp(cmd, "tfill") == 0 || strcmp(cmd, "tcheck") == 0) {
                size_t bad = 0;
                r = twalk(strtoul(a, NULL, 0), (unsigned)atoi(b), cmd[1] == 'f', &bad);
                r < 0 ? fail(r) : reply("ok %zu", bad);
        } else if (strcmp(cmd, "tinfo") == 0) {
                struct aqua_tensor_info ti;
                size_t i = strtoul(a, NULL, 0);
                r = i < n_tensors ? aqua_tensor_get_info(ctx, tensors[i], &ti) : -EINVAL;
                if (r < 0) {
                        fail(r);
                        return;
                }
                reply("ok dptr=%llu peer=%llu local=%llu dram=%llu end=%llu",
                      (unsigned long long)ti.dptr, (unsigned long long)ti.peer_bytes,
                      (unsigned long long)ti.local_bytes, (unsigned long long)ti.dram_bytes,
                      (unsigned long long)ti.end);
        } else if (strcmp(cmd, "return") == 0) {
                size_t i = strtoul(a, NULL, 0);
                r = i < n_leases ? aqua_return(ctx, leases[i]) : -EINVAL;
                if (i < n_leases)
                        leases[i] = NULL;
                r != 0 ? fail(r) : reply("ok");
        } else if (strcmp(cmd, "poll") == 0) {
                cmd_poll(atoi(a), b[0] ? b : NULL);
        } else if (strcmp(cmd, "info") == 0) {
                struct aqua_info in;
                r = aqua_get_info(ctx, &in);
                if (r < 0) {
                        fail(r);
                        return;
                }
                reply("ok connected=%d offered=%llu borrowed=%llu dram=%llu paired=%s",
                      in.connected, (unsigned long long)in.offered_bytes,
                      (unsigned long long)in.borrowed_bytes, (unsigned long long)in.dram_bytes,
                      in.paired_with[0] ? in.paired_with : "-");
        } else if (strcmp(cmd, "free") == 0) {
                size_t free_b = 0, total = 0;
                r = use_device(atoi(a));
                if (r == 0)
                        r = cu_ok(cu->cuMemGetInfo(&free_b, &total));
                r < 0 ? fail(r) : reply("ok %zu", free_b);
        } else if (strcmp(cmd, "close") == 0 || strcmp(cmd, "quit") == 0) {
                ctx = aqua_close(ctx);
                n_leases = n_tensors = 0;
                reply("ok");
                /* quit: whoever else holds our stdin open (a process the test started later
                 * inherited it) does not keep us waiting for its end. */
                if (strcmp(cmd, "quit") == 0)
                        exit(0);
        } else
                reply("err %d unknown command", -EINVAL);
}

/*
 * libaqua's last error message, which a failed open passes on; with AQUA_AGENT_LOG=1 every
 * message on stderr too, for finding out what a test saw.
 */
static void log_message(enum aqua_log_level level, const char *message, void *userdata)
{
        if (level <= AQUA_LOG_ERROR)
                snprintf(last_error, sizeof(last_error), "%s", message);
        if (userdata)
                fprintf(stderr, "agent %d: %s\n", (int)getpid(), message);
}

int main(void)
{
        char line[512];

        setvbuf(stdout, NULL, _IOLBF, 0);
        if (getenv("AQUA_AGENT_LOG"))
                aqua_set_log(log_message, stderr, AQUA_LOG_DEBUG);
        else
                aqua_set_log(log_message, NULL, AQUA_LOG_ERROR);
        while (fgets(line, sizeof(line), stdin))
                dispatch(line);
        aqua_close(ctx);
        return 0;
}
