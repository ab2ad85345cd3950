/*
 * The cost of aqua_poll() with nothing pending, for callgrind: open a neutral context, drain what
 * registration left, then call poll_idle() (which only calls aqua_poll) --calls times.
 *
 *   valgrind --tool=callgrind --toggle-collect=poll_idle bench-poll --calls 10000
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "aqua/aqua.h"

/* The function callgrind collects in: kept out of line so its calls can be counted. */
__attribute__((noinline)) int poll_idle(aqua_ctx *ctx, struct aqua_event *ev, size_t *n)
{
        return aqua_poll(ctx, ev, 8, n);
}

int main(int argc, char **argv)
{
        static const struct option opts[] = {{"calls", required_argument, NULL, 'c'}, {}};
        struct aqua_event ev[8];
        aqua_ctx *ctx = NULL;
        long calls = 10000;
        size_t n, pending = 0;
        int o, r;

        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1)
                if (o == 'c')
                        calls = atol(optarg);
                else
                        return 2;
        r = aqua_open(0, AQUA_ROLE_NEUTRAL, NULL, &ctx);
        if (r < 0) {
                fprintf(stderr, "bench-poll: %s\n", aqua_strerror(r));
                return 1;
        }
        for (int i = 0; i < 100; i++)
                aqua_poll(ctx, ev, 8, &n);
        for (long i = 0; i < calls; i++) {
                if (poll_idle(ctx, ev, &n) < 0)
                        return 1;
                pending += n;
        }
        printf("poll_calls %ld\npoll_events %zu\n", calls, pending);
        aqua_close(ctx);
        return 0;
}
