/*
 * ctl.borrow_return_us: one 2 MiB chunk borrowed and returned through libaqua and aquad, with
 * its fd passed, imported, mapped and unmapped each time. A producer process on GPU 1 offers the
 * chunks; this process borrows them on GPU 0.
 *
 *   bench-borrow [--rounds N]     (endpoint and side channel from AQUA_ENDPOINT/AQUA_SIDE_PATH)
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "aqua/aqua.h"
#include "time-util.h"

#define CHUNK (UINT64_C(2) << 20)

static int cmp_u64(const void *a, const void *b)
{
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return x < y ? -1 : x > y;
}

static _Noreturn void fail(const char *what, int r)
{
        fprintf(stderr, "bench-borrow: %s: %s\n", what, aqua_strerror(r));
        exit(1);
}

static _Noreturn void producer(int ready_fd, int done_fd)
{
        struct aqua_options o = AQUA_OPTIONS_INIT;
        aqua_ctx *ctx = NULL;
        char c = 1;
        int r;

        o.chunk_bytes = CHUNK;
        o.client_name = "bench-producer";
        r = aqua_open(1, AQUA_ROLE_PRODUCER, &o, &ctx);
        if (r < 0)
                fail("producer open", r);
        r = aqua_offer(ctx, 4 * CHUNK, NULL);
        if (r != 0)
                fail("offer", r);
        if (write(ready_fd, &c, 1) != 1)
                _exit(1);
        /* Serve until the consumer is done: aqua_poll keeps reclaims and notices moving. */
        while (read(done_fd, &c, 1) != 0) {
        }
        aqua_close(ctx);
        _exit(0);
}

int main(int argc, char **argv)
{
        static const struct option opts[] = {{"rounds", required_argument, NULL, 'r'}, {}};
        int rounds = 300, ready[2], done[2], o, r;
        struct aqua_options opt = AQUA_OPTIONS_INIT;
        aqua_ctx *ctx = NULL;
        uint64_t *t, *tb;
        pid_t pid;
        char c;

        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1)
                if (o == 'r')
                        rounds = atoi(optarg);
                else
                        return 2;
        if (rounds < 10 || pipe(ready) < 0 || pipe(done) < 0)
                return 2;
        pid = fork();
        if (pid == 0) {
                close(ready[0]);
                close(done[1]);
                producer(ready[1], done[0]);
        }
        close(ready[1]);
        close(done[0]);
        if (read(ready[0], &c, 1) != 1) {
                fprintf(stderr, "bench-borrow: the producer did not start\n");
                return 1;
        }
        opt.client_name = "bench-consumer";
        r = aqua_open(0, AQUA_ROLE_CONSUMER, &opt, &ctx);
        if (r < 0)
                fail("consumer open", r);
        t = calloc(rounds, sizeof(*t));
        tb = calloc(rounds, sizeof(*tb));
        for (int i = -20; i < rounds; i++) {
                struct aqua_grant g;
                uint64_t t0 = now_mono_ns(), t1;

                r = aqua_borrow(ctx, CHUNK, CHUNK, 0, &g);
                if (r != 0)
                        fail("borrow", r);
                if (!g.lease || g.bytes != CHUNK) {
                        fprintf(stderr, "bench-borrow: granted %llu bytes, wanted one chunk\n",
                                (unsigned long long)g.bytes);
                        return 1;
                }
                t1 = now_mono_ns();
                r = aqua_return(ctx, g.lease);
                if (r != 0)
                        fail("return", r);
                if (i >= 0) {
                        t[i] = now_mono_ns() - t0;
                        tb[i] = t1 - t0;
                }
        }
        qsort(t, rounds, sizeof(*t), cmp_u64);
        qsort(tb, rounds, sizeof(*tb), cmp_u64);
        printf("borrow_return_us %.1f\n", t[rounds / 2] / 1e3);
        printf("borrow_return_p99_us %.1f\n", t[rounds * 99 / 100] / 1e3);
        printf("borrow_us %.1f\n", tb[rounds / 2] / 1e3);
        aqua_close(ctx);
        close(done[1]);
        waitpid(pid, NULL, 0);
        free(t);
        free(tb);
        return 0;
}
