/*
 * The smallest consumer: borrow peer GPU memory through aquad, write into it, keep the data
 * through a reclaim (inside aqua_poll(), libaqua moves it to DRAM), read it back and return the
 * lease. Only <aqua/aqua.h>: copy it out and build with  cc borrow.c -laqua
 * Usage: aqua-borrow [DEVICE [SECONDS]]: waits up to SECONDS (30) for a reclaim.
 */
#include <aqua/aqua.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLOCK    (64 << 10)
#define N_BLOCKS 16

static int fail(const char *what, int r)
{
        fprintf(stderr, "aqua-borrow: %s: %s\n", what, aqua_strerror(r));
        return EXIT_FAILURE;
}

/* Copy n blocks of BLOCK bytes with one batch and wait for it. */
static int copy(aqua_ctx *ctx, const struct aqua_copy_piece *p, size_t n)
{
        aqua_ticket t;
        int r = aqua_copy_batch(ctx, p, n, NULL, NULL, NULL, &t);
        return r < 0 ? r : aqua_copy_wait(ctx, t);
}

int main(int argc, char **argv)
{
        int device = argc > 1 ? atoi(argv[1]) : 0, seconds = argc > 2 ? atoi(argv[2]) : 30;
        static uint8_t src[N_BLOCKS][BLOCK], back[N_BLOCKS][BLOCK];
        struct aqua_copy_piece p[N_BLOCKS];
        struct aqua_grant g;
        aqua_ctx *ctx;
        uint64_t moved = 0;
        int r, fd;

        r = aqua_open(device, AQUA_ROLE_CONSUMER, NULL, &ctx);
        if (r < 0)
                return fail("aqua_open", r);
        r = aqua_borrow(ctx, 64 << 20, 0, 0, &g);
        if (r != 0 || !g.lease) {
                aqua_close(ctx);
                return fail("aqua_borrow (is a producer offering?)", r ? r : AQUA_NO_MEMORY);
        }
        printf("borrowed %llu MiB at 0x%llx\n", (unsigned long long)(g.bytes >> 20),
               (unsigned long long)g.dptr);

        /* Blocks spread over the lease, so that every chunk holds some. */
        uint64_t step = g.bytes / N_BLOCKS / BLOCK * BLOCK;
        for (int i = 0; i < N_BLOCKS; i++) {
                memset(src[i], 'a' + i, BLOCK);
                p[i] = (struct aqua_copy_piece){g.dptr + i * step, (uintptr_t)src[i], BLOCK};
        }
        r = copy(ctx, p, N_BLOCKS);
        if (r < 0)
                return fail("writing", r);
        printf("wrote %d blocks; waiting for a reclaim\n", N_BLOCKS);
        fflush(stdout);

        /* The engine's loop: poll at a safe point whenever the context's fd wakes us. */
        aqua_fd(ctx, &fd);
        for (time_t end = time(NULL) + seconds; moved < g.bytes && time(NULL) < end;) {
                struct aqua_event ev[8];
                size_t n = 0;
                poll(&(struct pollfd){.fd = fd, .events = POLLIN}, 1, 100);
                r = aqua_poll(ctx, ev, 8, &n);
                if (r < 0)
                        return fail("aqua_poll", r);
                for (size_t i = 0; i < n; i++)
                        moved += ev[i].type == AQUA_EVENT_MIGRATED ? ev[i].bytes : 0;
        }
        printf("%llu MiB moved to DRAM\n", (unsigned long long)(moved >> 20));

        /* Read back where each block lives now: the same device address, or a host copy. */
        for (int i = 0; i < N_BLOCKS; i++) {
                struct aqua_lease_info li;
                struct aqua_chunk_info ci;
                uint64_t off = i * step;
                aqua_lease_get_info(ctx, g.lease, &li);
                aqua_lease_get_chunk(ctx, g.lease, off / li.chunk_bytes, &ci);
                uint64_t at = ci.host ? (uintptr_t)ci.host + (off - ci.offset) : g.dptr + off;
                p[i] = (struct aqua_copy_piece){(uintptr_t)back[i], at, BLOCK};
        }
        r = copy(ctx, p, N_BLOCKS);
        if (r < 0)
                return fail("reading back", r);
        int bad = 0;
        for (int i = 0; i < N_BLOCKS; i++)
                bad += memcmp(src[i], back[i], BLOCK) != 0;
        printf("read back %d blocks: %d bad\n", N_BLOCKS, bad);

        r = aqua_return(ctx, g.lease);
        printf("returned the lease: %s\n", aqua_strerror(r));
        aqua_close(ctx);
        return bad || !moved ? EXIT_FAILURE : EXIT_SUCCESS;
}
