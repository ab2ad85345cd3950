/*
 * aquad under load: 256 consumers, each paired with its own producer, borrow and return in a
 * loop for a bounded time, all at once from one process (a thread per pair, one ZeroMQ context).
 * Every request must be answered without an error, the daemon's memory must not grow with the
 * iterations, and it must exit cleanly (under ASan: without a leak).
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zmq.h>

#include "harness.h"
#include "rawclient.h"
#include "time-util.h"
#include "util.h"

#define MiB        (UINT64_C(1) << 20)
#define BODY(name) AQUA__ENVELOPE__BODY_##name
#define PAIRS      256
#define CHUNKS     4 /* each producer offers this many chunks of 2 MiB */

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static struct aquad *daemon_;
static void *zctx;
static pthread_barrier_t ready, go;
static atomic_bool half_time;
static uint64_t start_ns, stop_ns, half_ns;

struct worker {
        pthread_t thread;
        size_t index;
        struct raw producer, consumer;
        uint64_t cycles, cycles_first_half;
        uint64_t errors;
        char first_error[256];
};

static struct worker workers[PAIRS];

static void fail(struct worker *w, const char *what, const Aqua__Envelope *reply)
{
        if (w->errors++ == 0)
                snprintf(w->first_error, sizeof(w->first_error), "pair %zu: %s: %s", w->index, what,
                         !reply                            ? "no reply"
                         : reply->body_case == BODY(ERROR) ? reply->error->message
                                                           : "unexpected reply");
}

static bool join(struct worker *w, struct raw *r, Aqua__Role role, const char *uuid,
                 const char *peer)
{
        Aqua__Envelope *e;
        bool ok;

        if (raw_connect_ctx(r, zctx, aquad_endpoint(daemon_), aquad_side_path(daemon_)) != 0) {
                fail(w, "connect", NULL);
                return false;
        }
        e = raw_hello(r, role, uuid, peer, NULL, 0, NULL);
        ok = e && e->body_case == BODY(WELCOME);
        if (!ok)
                fail(w, "hello", e);
        raw_free(e);
        return ok;
}

/* One borrow of up to two chunks, checked and given back. */
static void cycle(struct worker *w)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *g, *r;
        Aqua__Return rt = AQUA__RETURN__INIT;
        bool dram = w->cycles % 4 == 3;
        int fds[CHUNKS];
        size_t n = 0;

        g = raw_borrow(&w->consumer, 4 * MiB + (dram ? 2 * MiB : 0), 2 * MiB, dram, fds, CHUNKS,
                       &n);
        if (!g || g->body_case != BODY(GRANT) || !g->grant->lease_id || n == 0) {
                fail(w, "borrow", g);
                raw_free(g);
                return;
        }
        for (size_t i = 0; i < n; i++)
                if (!raw_memfd_has(fds[i], "chunk 0") && !raw_memfd_has(fds[i], "chunk 1") &&
                    !raw_memfd_has(fds[i], "chunk 2") && !raw_memfd_has(fds[i], "chunk 3"))
                        fail(w, "a granted descriptor holds another's data", NULL);
        side_close_fds(fds, n);
        rt.lease_id = g->grant->lease_id;
        rt.dram_bytes = g->grant->dram_bytes;
        e.body_case = BODY(RETURN);
        e.return_ = &rt;
        r = raw_call(&w->consumer, &e);
        if (!r || r->body_case != BODY(RETURN_REPLY) || r->return_reply->returned != n)
                fail(w, "return", r);
        else
                w->cycles++;
        raw_free(r);
        raw_free(g);
}

static void *run(void *arg)
{
        struct worker *w = arg;
        char p[32], c[32];
        Aqua__Envelope *o;
        bool ok;

        snprintf(p, sizeof(p), "GPU-P%03zu", w->index);
        snprintf(c, sizeof(c), "GPU-C%03zu", w->index);
        ok = join(w, &w->producer, AQUA__ROLE__ROLE_PRODUCER, p, c) &&
             join(w, &w->consumer, AQUA__ROLE__ROLE_CONSUMER, c, p);
        if (ok) {
                o = raw_offer(&w->producer, CHUNKS, 2 * MiB, NULL);
                if (!o || o->body_case != BODY(OFFER_REPLY))
                        fail(w, "offer", o);
                raw_free(o);
        }
        pthread_barrier_wait(&ready);
        pthread_barrier_wait(&go);
        while (w->errors == 0 && now_mono_ns() < stop_ns) {
                cycle(w);
                if (!w->cycles_first_half && atomic_load(&half_time))
                        w->cycles_first_half = w->cycles ? w->cycles : 1;
        }
        return NULL;
}

/* VmRSS and VmHWM of a process, in KiB. */
static void memory_of(pid_t pid, uint64_t *rss, uint64_t *hwm)
{
        char path[64], line[256];
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
        f = fopen(path, "re");
        cr_assert_not_null(f);
        while (fgets(line, sizeof(line), f)) {
                if (strncmp(line, "VmRSS:", 6) == 0)
                        *rss = strtoull(line + 6, NULL, 10);
                else if (strncmp(line, "VmHWM:", 6) == 0)
                        *hwm = strtoull(line + 6, NULL, 10);
        }
        fclose(f);
}

static double seconds(void)
{
        const char *s = getenv("AQUA_LOAD_SECONDS");

        if (s && atof(s) > 0)
                return atof(s);
        /* Under valgrind everything is ~50x slower: the loop gets what the setup allows. */
        return getenv("AQUA_UNDER_VALGRIND") ? 10.0 : 4.0;
}

struct load {
        size_t pairs;
        double secs;
        uint64_t cycles, first_half, least, errors;
        uint64_t rss0, rss1, rss2, hwm0, hwm2; /* KiB: before, at half time, at the end */
};

/* Run pairs producer/consumer pairs for secs seconds against a fresh aquad, and stop it. */
static void run_load(struct load *ld)
{
        struct rlimit rl;
        pid_t pid;
        uint64_t hwm1 = 0;

        /* Each pair costs this process about six descriptors, and aquad more than ten. */
        cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
        if (rl.rlim_cur < 16 * ld->pairs)
                cr_skip_test("the descriptor limit (%ju) is too low for %zu clients",
                             (uintmax_t)rl.rlim_cur, 2 * ld->pairs);

        /* Closed loops: with one journal commit per turn a few clients run past a client's
         * default request rate; this measures the protocol, not the throttle. */
        cr_assert_eq(
            aquad_start("limits: {clients: 1024, request-rate: 0}\ndram-budget: 4GiB\n", &daemon_),
            0);
        pid = aquad_pid(daemon_);
        zctx = zmq_ctx_new();
        zmq_ctx_set(zctx, ZMQ_MAX_SOCKETS, 4096);
        pthread_barrier_init(&ready, NULL, (unsigned)ld->pairs + 1);
        pthread_barrier_init(&go, NULL, (unsigned)ld->pairs + 1);
        atomic_store(&half_time, false);
        memset(workers, 0, sizeof(workers));
        for (size_t i = 0; i < ld->pairs; i++) {
                workers[i].index = i;
                cr_assert_eq(pthread_create(&workers[i].thread, NULL, run, &workers[i]), 0);
        }
        /* Everyone connected and offered: the daemon's memory before the loop. */
        pthread_barrier_wait(&ready);
        memory_of(pid, &ld->rss0, &ld->hwm0);
        start_ns = now_mono_ns();
        half_ns = start_ns + (uint64_t)(ld->secs / 2 * 1e9);
        stop_ns = start_ns + (uint64_t)(ld->secs * 1e9);
        pthread_barrier_wait(&go);
        sleep_ns(half_ns - now_mono_ns());
        memory_of(pid, &ld->rss1, &hwm1);
        atomic_store(&half_time, true);
        ld->least = UINT64_MAX;
        for (size_t i = 0; i < ld->pairs; i++) {
                pthread_join(workers[i].thread, NULL);
                ld->cycles += workers[i].cycles;
                ld->first_half += workers[i].cycles_first_half;
                ld->errors += workers[i].errors;
                ld->least = MIN(ld->least, workers[i].cycles);
        }
        memory_of(pid, &ld->rss2, &ld->hwm2);
        pthread_barrier_destroy(&ready);
        pthread_barrier_destroy(&go);

        test_note("load: %zu consumers + %zu producers, %.1f s: %" PRIu64
                  " borrow/return cycles (%.0f/s; %" PRIu64 " in the first half; fewest for one "
                  "consumer %" PRIu64 "), %" PRIu64 " errors\n"
                  "load: aquad VmRSS %" PRIu64 " KiB before, %" PRIu64 " at half time, %" PRIu64
                  " at the end; VmHWM %" PRIu64 " -> %" PRIu64 " KiB",
                  ld->pairs, ld->pairs, ld->secs, ld->cycles, ld->cycles / ld->secs, ld->first_half,
                  ld->least, ld->errors, ld->rss0, ld->rss1, ld->rss2, ld->hwm0, ld->hwm2);
        for (size_t i = 0; i < ld->pairs; i++)
                cr_expect_eq(workers[i].errors, 0, "%s", workers[i].first_error);
        cr_assert_eq(ld->errors, 0);
        cr_assert_gt(ld->least, 0, "every consumer was served");

        for (size_t i = 0; i < ld->pairs; i++) {
                raw_close(&workers[i].consumer);
                raw_close(&workers[i].producer);
        }
        zmq_ctx_term(zctx);
        cr_assert_eq(aquad_stop(daemon_), 0, "aquad exited cleanly (no leak under ASan)");
        daemon_ = NULL;
}

/* ASan's quarantine holds freed memory by design, valgrind has its own heap: only the normal
 * build can tell growth from noise. */
static bool memory_is_telling(void)
{
        return !UNDER_ASAN && !getenv("AQUA_UNDER_VALGRIND");
}

Test(load, many_consumers_borrow_and_return_at_once_without_errors, .timeout = 600)
{
        struct load ld = {.pairs = getenv("AQUA_UNDER_VALGRIND") ? 16 : PAIRS, .secs = seconds()};

        run_load(&ld);
        /* Bounded: ZeroMQ keeps up to two 16 KiB message chunks per pipe and direction, the
         * daemon a few KiB per client; 128 KiB per client is the generous whole. */
        if (memory_is_telling())
                cr_assert_leq(ld.hwm2, ld.rss0 + 128 * 2 * ld.pairs,
                              "aquad peaked at %" PRIu64 " KiB, from %" PRIu64, ld.hwm2, ld.rss0);
}

/*
 * Few clients, many cycles each: ZeroMQ's per-pipe buffers settle early, so what the second
 * half adds over the first is what the daemon would leak or accumulate per request.
 */
Test(load, the_daemon_does_not_grow_with_the_iterations, .timeout = 600)
{
        struct load ld = {.pairs = 8, .secs = seconds()};

        run_load(&ld);
        if (memory_is_telling())
                cr_assert_leq(ld.rss2, ld.rss1 + 1024,
                              "aquad grew from %" PRIu64 " to %" PRIu64 " KiB in %" PRIu64
                              " cycles of the second half",
                              ld.rss1, ld.rss2, ld.cycles - ld.first_half);
}
