/*
 * lend-borrow-all: a consumer for aqua-lend's tests that borrows everything it is given. It asks
 * for more every BORROW_EVERY, stamps the first STAMP bytes of every chunk it gets with a pattern
 * of its own, lets reclaims move them to DRAM (inside aqua_poll), and checks every stamp before
 * it gives a lease back: when a lease has nothing left on a peer, and at the end (SIGTERM).
 * Usage: lend-borrow-all DEVICE. Prints "borrow-all: moved N bytes to DRAM" with its running total
 * each time reclaims moved chunks (so that a killed consumer's moves are counted too), and at
 * the end
 *   "borrow-all: N leases, SIZE borrowed, SIZE moved to DRAM, N chunks checked, N bad"
 * and exits 1 when a stamp was wrong or a driver call failed.
 */
#include <aqua/aqua.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STAMP        4096
#define ASK          (UINT64_C(1) << 30)
#define BORROW_EVERY 100 /* ms */
#define MAX_LEASES   4096

struct held {
        aqua_lease *lease;
        uint64_t id;
};

static struct held held[MAX_LEASES];
static size_t n_held;
static uint64_t borrowed, moved, checked, bad, leases;
static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
        stop = sig;
}

static void log_line(enum aqua_log_level level, const char *message, void *userdata)
{
        fprintf(stderr, "borrow-all: libaqua: %s\n", message);
}

static void pattern(uint8_t *buf, uint64_t lease_id, size_t chunk)
{
        for (size_t i = 0; i < STAMP; i++)
                buf[i] = (uint8_t)(lease_id * 131 + chunk * 31 + i);
}

/* Copy STAMP bytes of chunk `i` of the lease in (into) or out of (!into) buf, where it lives. */
static int stamp_io(aqua_ctx *ctx, aqua_lease *lease, size_t i, uint8_t *buf, bool into)
{
        struct aqua_lease_info li;
        struct aqua_chunk_info ci;
        aqua_ticket t;
        int r;

        if ((r = aqua_lease_get_info(ctx, lease, &li)) < 0 ||
            (r = aqua_lease_get_chunk(ctx, lease, i, &ci)) < 0)
                return r;
        uint64_t at = ci.host ? (uintptr_t)ci.host : li.dptr + ci.offset;
        struct aqua_copy_piece p = into ? (struct aqua_copy_piece){(uintptr_t)buf, at, STAMP}
                                        : (struct aqua_copy_piece){at, (uintptr_t)buf, STAMP};
        r = aqua_copy_batch(ctx, &p, 1, NULL, NULL, NULL, &t);
        return r < 0 ? r : aqua_copy_wait(ctx, t);
}

static int check_and_return(aqua_ctx *ctx, struct held *h)
{
        struct aqua_lease_info li;
        uint8_t want[STAMP], got[STAMP];
        int r = aqua_lease_get_info(ctx, h->lease, &li);

        for (size_t i = 0; r >= 0 && i < li.n_chunks; i++) {
                pattern(want, h->id, i);
                r = stamp_io(ctx, h->lease, i, got, true);
                if (r < 0)
                        break;
                checked++;
                if (memcmp(want, got, STAMP) != 0) {
                        size_t zeros = 0;
                        for (size_t k = 0; k < STAMP; k++)
                                zeros += got[k] == 0;
                        bad++;
                        /* Whose bytes are there instead: zeros (a scrub), or another stamp. */
                        fprintf(stderr,
                                "borrow-all: lease %" PRIu64 " chunk %zu: stamp wrong (%zu of %d "
                                "bytes zero; first bytes %02x %02x %02x %02x, wanted %02x %02x "
                                "%02x %02x)\n",
                                h->id, i, zeros, STAMP, got[0], got[1], got[2], got[3], want[0],
                                want[1], want[2], want[3]);
                }
        }
        if (r < 0)
                fprintf(stderr, "borrow-all: reading lease %" PRIu64 ": %s\n", h->id,
                        aqua_strerror(r));
        int rr = aqua_return(ctx, h->lease);
        if (rr < 0)
                fprintf(stderr, "borrow-all: returning lease %" PRIu64 ": %s\n", h->id,
                        aqua_strerror(rr));
        *h = held[--n_held];
        return r < 0 ? r : 0;
}

static int borrow(aqua_ctx *ctx)
{
        struct aqua_grant g;
        struct aqua_lease_info li;
        uint8_t buf[STAMP];
        int r;

        while (n_held < MAX_LEASES) {
                r = aqua_borrow(ctx, ASK, 0, 0, &g);
                if (r != 0 || !g.lease)
                        return r == AQUA_NO_MEMORY || r == AQUA_THROTTLED || r == -ENOTCONN ? 0 : r;
                aqua_lease_get_info(ctx, g.lease, &li);
                for (size_t i = 0; i < li.n_chunks; i++) {
                        pattern(buf, li.lease_id, i);
                        r = stamp_io(ctx, g.lease, i, buf, false);
                        if (r < 0)
                                return r;
                }
                held[n_held++] = (struct held){g.lease, li.lease_id};
                borrowed += g.bytes;
                leases++;
                if (g.bytes < ASK)
                        return 0;
        }
        return 0;
}

int main(int argc, char **argv)
{
        struct sigaction sa = {.sa_handler = on_signal};
        aqua_ctx *ctx;
        int fd, r, failed = 0;

        aqua_set_log(log_line, NULL, getenv("AQUA_TEST_VERBOSE") ? AQUA_LOG_DEBUG : AQUA_LOG_WARNING);
        /* As a supervised engine would be restarted: aquad may be restarting right now. */
        for (int tries = 0;; tries++) {
                r = aqua_open(argc > 1 ? atoi(argv[1]) : 1, AQUA_ROLE_CONSUMER, NULL, &ctx);
                if (r >= 0 || tries == 40 ||
                    (r != -ECONNREFUSED && r != -ENOENT && r != -ECONNRESET && r != -ESHUTDOWN &&
                     r != -ETIMEDOUT && r != -EPIPE))
                        break;
                nanosleep(&(struct timespec){0, 500 * 1000 * 1000}, NULL);
        }
        if (r < 0) {
                fprintf(stderr, "borrow-all: aqua_open: %s\n", aqua_strerror(r));
                return 1;
        }
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        aqua_fd(ctx, &fd);
        printf("borrow-all: borrowing\n");
        fflush(stdout);
        while (!stop && !failed) {
                struct aqua_event ev[16];
                size_t n = 0;

                poll(&(struct pollfd){.fd = fd, .events = POLLIN}, 1, BORROW_EVERY);
                do {
                        struct timespec t0, t1;
                        clock_gettime(CLOCK_MONOTONIC, &t0);
                        if (aqua_poll(ctx, ev, 16, &n) < 0)
                                failed = 1;
                        clock_gettime(CLOCK_MONOTONIC, &t1);
                        /* What a reclaim costs here, for whoever reads the log. */
                        double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 +
                                    (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
                        if (ms >= 100)
                                fprintf(stderr, "borrow-all: aqua_poll took %.0f ms\n", ms);
                        uint64_t moved_before = moved;
                        for (size_t i = 0; i < n; i++) {
                                if (ev[i].type == AQUA_EVENT_MIGRATED)
                                        moved += ev[i].bytes;
                                if (ev[i].type == AQUA_EVENT_RECLAIM_FAILED) {
                                        fprintf(stderr, "borrow-all: a reclaim failed: %s\n",
                                                aqua_strerror(ev[i].error));
                                        failed = 1;
                                }
                        }
                        if (moved != moved_before) {
                                printf("borrow-all: moved %" PRIu64 " bytes to DRAM\n", moved);
                                fflush(stdout);
                        }
                } while (n == 16);
                /* A lease with nothing left on a peer: check it and give it back. */
                for (size_t i = 0; i < n_held;) {
                        struct aqua_lease_info li;
                        if (aqua_lease_get_info(ctx, held[i].lease, &li) == 0 &&
                            li.peer_bytes == 0) {
                                if (check_and_return(ctx, &held[i]) < 0)
                                        failed = 1;
                        } else
                                i++;
                }
                r = borrow(ctx);
                if (r < 0) {
                        fprintf(stderr, "borrow-all: borrowing: %s\n", aqua_strerror(r));
                        failed = 1;
                }
        }
        while (n_held > 0)
                if (check_and_return(ctx, &held[0]) < 0)
                        failed = 1;
        aqua_close(ctx);
        printf("borrow-all: %" PRIu64 " leases, %" PRIu64 " MiB borrowed, %" PRIu64
               " MiB moved to DRAM, %" PRIu64 " chunks checked, %" PRIu64 " bad\n",
               leases, borrowed >> 20, moved >> 20, checked, bad);
        return failed || bad ? 1 : 0;
}
