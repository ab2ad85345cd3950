/*
 * The placer's plan holds across restarts. An 8-GPU simulated server with `pairs:` pinning
 * producers 4..7 to consumers 0..3 (ordinals); the eight clients (aqua-agent processes: producers
 * offer, consumers borrow) start in a random order, then each round kills and restarts three
 * random clients one at a time, and between rounds aquad itself restarts (SIGTERM and SIGKILL in
 * turn). After every step, once every live client is connected again:
 *   - a consumer whose pinned producer is registered is paired with it (aquad's books, and the
 *     consumer's own view once it has polled), and a consumer is never paired with a producer
 *     other than its pin's;
 *   - each GPU is listed once (a GPU restored from the journal and the same GPU registered by a
 *     new process are one GPU).
 * Several seeds; AQUA_PINS_SEED replays one.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "rawclient.h"
#include "testutil.h"
#include "time-util.h"
#include "util.h"

#define MiB       (UINT64_C(1) << 20)
#define CHUNK     (8 * MiB)
#define N_GPUS    8
#define N_PAIRS   4
#define PRODUCERS 4 /* GPUs 4..7 lend, 0..3 borrow; pin k: producer k + 4, consumer k */

struct client {
        int device;
        pid_t pid;
        FILE *in, *out;
        char line[512];
};

static struct aquad *daemon_;
static struct client clients[N_GPUS];
static char machine[64];

struct run {
        unsigned seed, state;
        unsigned steps, violations;
        char step[160];
};

static unsigned next(struct run *r)
{
        r->state = r->state * 1103515245u + 12345u;
        return r->state >> 16;
}

static bool is_producer(int device)
{
        return device >= PRODUCERS;
}

static void violation(struct run *r, const char *fmt, ...) _printf_(2, 3);
static void violation(struct run *r, const char *fmt, ...)
{
        char what[512];
        va_list ap;

        r->violations++;
        va_start(ap, fmt);
        vsnprintf(what, sizeof(what), fmt, ap);
        va_end(ap);
        test_note("pins: seed %u, step %u (%s): VIOLATION: %s", r->seed, r->steps, r->step, what);
}

/* The client's answer, or NULL when it is dead or silent for 60 s. */
static const char *ask(struct client *c, const char *fmt, ...) _printf_(2, 3);
static const char *ask(struct client *c, const char *fmt, ...)
{
        struct pollfd p = {.fd = c->pid > 0 ? fileno(c->out) : -1, .events = POLLIN};
        va_list ap;

        if (c->pid <= 0)
                return NULL;
        va_start(ap, fmt);
        vfprintf(c->in, fmt, ap);
        va_end(ap);
        fputc('\n', c->in);
        fflush(c->in);
        if (poll(&p, 1, 60000) != 1 || !fgets(c->line, sizeof(c->line), c->out))
                return NULL;
        c->line[strcspn(c->line, "\n")] = 0;
        return c->line;
}

static bool is_ok(const char *reply)
{
        return reply && strncmp(reply, "ok", 2) == 0;
}

static void stop_client(struct client *c)
{
        test_agent_kill(&c->pid, c->in, c->out);
}

/* Start the client of GPU c->device: a producer offers 4 chunks, a consumer borrows 2. */
static void start_client(struct run *r, struct client *c)
{
        const char *reply;

        test_agent_spawn(&c->pid, &c->in, &c->out);
        setvbuf(c->out, NULL, _IONBF, 0);
        reply = ask(c, "open %s %d %" PRIu64, is_producer(c->device) ? "producer" : "consumer",
                    c->device, CHUNK);
        if (!is_ok(reply)) {
                violation(r, "GPU %d's client did not open: %s", c->device, reply ? reply : "-");
                stop_client(c);
                return;
        }
        if (is_producer(c->device))
                reply = ask(c, "offer %" PRIu64, 4 * CHUNK);
        else
                reply = ask(c, "borrow %" PRIu64 " %" PRIu64, 2 * CHUNK, CHUNK);
        /* A consumer whose producer is not up yet gets nothing: that is fine here. */
        (void)reply;
}

/* Every live client polls until it is connected (after an aquad restart it reconnects). */
static void settle(struct run *r)
{
        for (int i = 0; i < N_GPUS; i++) {
                struct client *c = &clients[i];
                uint64_t deadline = now_mono_ns() + 20 * NSEC_PER_SEC;

                while (c->pid > 0) {
                        if (!is_ok(ask(c, "poll 20"))) {
                                violation(r, "GPU %d's client did not answer a poll", i);
                                break;
                        }
                        if (test_field(ask(c, "info"), "connected") == 1)
                                break;
                        if (now_mono_ns() > deadline) {
                                violation(r, "GPU %d's client did not reconnect", i);
                                break;
                        }
                }
        }
}

struct view {
        bool listed, registered;
        char uuid[64], paired[64];
};

/* aquad's GPUs by ordinal; false when it does not answer. */
static bool aquad_view(struct run *r, struct view v[N_GPUS])
{
        Aqua__Envelope *w = NULL, *q = NULL;
        struct raw a;
        bool ok = false;

        memset(v, 0, N_GPUS * sizeof(*v));
        if (raw_connect(&a, aquad_endpoint(daemon_), aquad_side_path(daemon_)) != 0)
                goto out;
        w = raw_hello(&a, AQUA__ROLE__ROLE_ADMIN, NULL, NULL, NULL, 0, NULL);
        if (!w || w->body_case != AQUA__ENVELOPE__BODY_WELCOME)
                goto out;
        q = raw_admin_query(&a, AQUA__ADMIN_QUERY__WHAT__WHAT_GPUS);
        if (!q || q->body_case != AQUA__ENVELOPE__BODY_ADMIN_REPLY)
                goto out;
        for (size_t i = 0; i < q->admin_reply->n_gpus; i++) {
                const Aqua__GpuInfo *g = q->admin_reply->gpus[i];

                if (g->ordinal_unknown || g->ordinal >= N_GPUS) {
                        violation(r, "aquad lists GPU %s without its ordinal", g->uuid);
                        continue;
                }
                if (v[g->ordinal].listed)
                        violation(r, "aquad lists GPU %u twice: %s and %s", g->ordinal,
                                  v[g->ordinal].uuid, g->uuid);
                v[g->ordinal].listed = true;
                v[g->ordinal].registered = g->client_id != 0;
                snprintf(v[g->ordinal].uuid, sizeof(v->uuid), "%s", g->uuid);
                snprintf(v[g->ordinal].paired, sizeof(v->paired), "%s", g->paired_with);
        }
        ok = true;
out:
        if (!ok)
                violation(r, "aquad did not answer an admin's query of its GPUs");
        raw_free(w);
        raw_free(q);
        raw_close(&a);
        return ok;
}

/* The pins hold, in aquad's books and in each consumer's own view. */
static void check(struct run *r)
{
        struct view v[N_GPUS];

        settle(r);
        if (!aquad_view(r, v))
                return;
        for (int k = 0; k < N_PAIRS; k++) {
                struct view *c = &v[k], *p = &v[k + PRODUCERS];
                const char *info;

                if (!c->listed)
                        continue;
                for (int o = PRODUCERS; o < N_GPUS; o++)
                        if (o != k + PRODUCERS && v[o].listed && strcmp(c->paired, v[o].uuid) == 0)
                                violation(r,
                                          "consumer %d is paired with producer %d; its pin is %d",
                                          k, o, k + PRODUCERS);
                if (!c->registered || !p->registered)
                        continue;
                if (strcmp(c->paired, p->uuid) != 0) {
                        violation(r,
                                  "consumer %d is paired with %s while its pinned producer %d "
                                  "is registered",
                                  k, c->paired[0] ? c->paired : "nobody", k + PRODUCERS);
                        continue;
                }
                /* The consumer hears of a change with its next poll. */
                for (int i = 0; i < 100; i++) {
                        info = ask(&clients[k], "info");
                        if (!info || strstr(info, p->uuid) || !is_ok(ask(&clients[k], "poll 20")))
                                break;
                }
                if (!info || !strstr(info, p->uuid))
                        violation(r, "consumer %d's client says %s; aquad pairs it with %s", k,
                                  info ? info : "nothing", p->uuid);
        }
        r->steps++;
}

static void restart_aquad(struct run *r, int sig)
{
        snprintf(r->step, sizeof(r->step), "aquad restarted after %s",
                 sig == SIGKILL ? "SIGKILL" : "SIGTERM");
        aquad_kill(daemon_, sig);
        cr_assert_eq(aquad_restart(daemon_), 0, "aquad did not restart");
        check(r);
}

static void run_seed(struct run *r)
{
        int order[N_GPUS];

        r->state = r->seed;
        for (int i = 0; i < N_GPUS; i++)
                order[i] = i;
        for (int i = N_GPUS - 1; i > 0; i--) {
                int j = (int)(next(r) % (unsigned)(i + 1)), t = order[i];
                order[i] = order[j];
                order[j] = t;
        }
        for (int i = 0; i < N_GPUS; i++) {
                snprintf(r->step, sizeof(r->step), "GPU %d started", order[i]);
                start_client(r, &clients[order[i]]);
                check(r);
        }
        for (int round = 0; round < 6; round++) {
                for (int k = 0; k < 3; k++) {
                        struct client *c = &clients[next(r) % N_GPUS];

                        snprintf(r->step, sizeof(r->step), "round %d: GPU %d's client killed",
                                 round, c->device);
                        stop_client(c);
                        check(r);
                        snprintf(r->step, sizeof(r->step), "round %d: GPU %d's client restarted",
                                 round, c->device);
                        start_client(r, c);
                        check(r);
                }
                restart_aquad(r, round % 2 ? SIGKILL : SIGTERM);
        }
        for (int i = 0; i < N_GPUS; i++)
                stop_client(&clients[i]);
}

static void setup(void)
{
        signal(SIGPIPE, SIG_IGN); /* writing to a client just killed */
        snprintf(machine, sizeof(machine), "pins-%d", (int)getpid());
        setenv("AQUA_SIM_MACHINE", machine, 1);
        setenv("AQUA_SIM_DEVICES", "8x512MiB", 1);
        unsetenv("AQUA_SIM_TOPOLOGY");
        unsetenv("AQUA_SIM_RUNTIME_DIR");
        for (int i = 0; i < N_GPUS; i++)
                clients[i] = (struct client){.device = i};
        cr_assert_eq(aquad_start("reconcile-timeout: 500ms\n"
                                 "pairing: auto\n"
                                 "pairs:\n"
                                 "  - {producer: 4, consumer: 0}\n"
                                 "  - {producer: 5, consumer: 1}\n"
                                 "  - {producer: 6, consumer: 2}\n"
                                 "  - {producer: 7, consumer: 3}\n",
                                 &daemon_),
                     0);
        setenv("AQUA_ENDPOINT", aquad_endpoint(daemon_), 1);
        setenv("AQUA_SIDE_PATH", aquad_side_path(daemon_), 1);
}

static void teardown(void)
{
        for (int i = 0; i < N_GPUS; i++)
                stop_client(&clients[i]);
        aquad_stop_in_teardown(daemon_);
        daemon_ = NULL;
        test_sim_remove(machine);
}

TestSuite(pins, .init = setup, .fini = teardown, .timeout = 300);

Test(pins, pinned_pairs_hold_across_client_and_aquad_restarts)
{
        const char *s = getenv("AQUA_PINS_SEED");
        unsigned seeds[] = {1, 7, 42};
        unsigned total = 0, steps = 0;

        for (size_t i = 0; i < (s ? 1 : ARRAY_SIZE(seeds)); i++) {
                struct run r = {.seed = s ? (unsigned)strtoul(s, NULL, 0) : seeds[i]};

                run_seed(&r);
                test_note("pins: seed %u: %u checked steps, %u violations", r.seed, r.steps,
                          r.violations);
                total += r.violations;
                steps += r.steps;
        }
        cr_assert_gt(steps, 0);
        cr_assert_eq(total, 0, "%u violations of a pin (tests' notes log has each)", total);
}
