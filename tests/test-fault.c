/*
 * Fault injection: many randomized cycles of offer, borrow, write, reclaim and return by real
 * libaqua clients (tests/aqua-agent.c processes) on a simulated machine, with the producer, the
 * consumer or aquad SIGKILLed at a random point of a random step, or aquad restarted while the
 * consumer stays silent past the reconcile window, or aquad's disk full during the step (then
 * aquad SIGKILLed with it full). After every cycle:
 *   - no chunk is both free and leased, and every lease holds exactly the chunks that name it
 *     (aquad's admin queries);
 *   - no lease is lost or duplicated: what aquad has leased is what the live consumer maps, also
 *     while it is silent after a restart, and no lease it was granted is unknown after one;
 *   - every byte the consumer wrote reads back, from peer memory or from DRAM;
 *   - pins hold: the two GPUs are paired only by the config's pin (`pairing: static`), and
 *     whenever both are registered they are paired, in aquad's books and the consumer's view;
 *   - once everything is returned and reclaimed, the producer's GPU has all its memory back
 *     (cuMemGetInfo), and aquad holds no chunk and no lease.
 * Prints the cycles run and the violations, which must be 0. AQUA_FAULT_SEED replays a run;
 * AQUA_FAULT_SECONDS sets its length.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "rawclient.h"
#include "testutil.h"
#include "time-util.h"
#include "util.h"

#define MiB   (UINT64_C(1) << 20)
#define CHUNK (8 * MiB) /* the producer's chunk_bytes */

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

/* ---------------------------------------------------------------- agents that may die */

struct agent {
        const char *role; /* "producer", "consumer", or NULL for the observer */
        int device;
        pid_t pid;
        FILE *in, *out;
        char line[512];
        bool died;     /* by itself: line says how */
        uint64_t lost; /* leases aquad did not know after a restart (LEASE_LOST events) */
};

static struct aquad *daemon_;
static struct agent producer = {.role = "producer", .device = 1};
static struct agent consumer = {.role = "consumer", .device = 0};
static struct agent observer = {.role = NULL, .device = 1}; /* reads cuMemGetInfo */

static bool is_ok(const char *reply)
{
        return reply && strncmp(reply, "ok", 2) == 0;
}

static void agent_send(struct agent *a, const char *fmt, ...) _printf_(2, 3);
static void agent_send(struct agent *a, const char *fmt, ...)
{
        va_list ap;

        if (a->pid <= 0)
                return;
        va_start(ap, fmt);
        vfprintf(a->in, fmt, ap);
        va_end(ap);
        fputc('\n', a->in);
        fflush(a->in);
}

/* The agent's answer ("ok ..." or "err ..."), or NULL when it is dead or silent too long. */
static const char *agent_read(struct agent *a, int timeout_ms)
{
        struct pollfd p;

        if (a->pid <= 0)
                return NULL;
        p = (struct pollfd){.fd = fileno(a->out), .events = POLLIN};
        if (poll(&p, 1, timeout_ms) != 1)
                return NULL;
        if (!fgets(a->line, sizeof(a->line), a->out)) {
                /* It closed its end: it died by itself. Say how, once. */
                int status = 0;
                waitpid(a->pid, &status, 0);
                snprintf(a->line, sizeof(a->line), "died (%s %d)",
                         WIFSIGNALED(status) ? "signal" : "exit status",
                         WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
                a->pid = 0;
                fclose(a->in);
                fclose(a->out);
                a->died = true;
                return NULL;
        }
        a->line[strcspn(a->line, "\n")] = 0;
        return a->line;
}

static const char *agent_ask(struct agent *a, const char *fmt, ...) _printf_(2, 3);
static const char *agent_ask(struct agent *a, const char *fmt, ...)
{
        va_list ap;

        if (a->pid <= 0)
                return NULL;
        va_start(ap, fmt);
        vfprintf(a->in, fmt, ap);
        va_end(ap);
        fputc('\n', a->in);
        fflush(a->in);
        return agent_read(a, 60000);
}

static void agent_kill(struct agent *a)
{
        a->died = false;
        test_agent_kill(&a->pid, a->in, a->out);
}

/* Start the agent and open its context (not for the observer); false if that failed. */
static bool agent_start(struct agent *a)
{
        test_agent_spawn(&a->pid, &a->in, &a->out);
        /* Unbuffered: poll() on the descriptor must see everything not yet read. */
        setvbuf(a->out, NULL, _IONBF, 0);
        if (!a->role)
                return true;
        if (is_ok(agent_ask(a, "open %s %d %" PRIu64, a->role, a->device, CHUNK)))
                return true;
        agent_kill(a);
        return false;
}

/* ---------------------------------------------------------------- the run */

struct run {
        unsigned seed;
        uint64_t cycles, violations;
        uint64_t killed[5]; /* producer, consumer, aquad, silent restarts, full disks */
        uint64_t baseline;  /* free bytes of the producer's GPU with nothing lent */
        bool kill_pending;  /* this cycle's victim is still alive */
        unsigned seed_state;
        char last[256];
};

static void violation(struct run *r, const char *fmt, ...) _printf_(2, 3);
static void violation(struct run *r, const char *fmt, ...)
{
        char what[512];
        va_list ap;

        r->violations++;
        va_start(ap, fmt);
        vsnprintf(what, sizeof(what), fmt, ap);
        va_end(ap);
        test_note("fault: cycle %" PRIu64 " (seed %u): VIOLATION: %s [%s]", r->cycles, r->seed,
                  what, r->last);
}

static unsigned next(unsigned *state)
{
        *state = *state * 1103515245u + 12345u;
        return *state >> 16;
}

/* Connect an admin client; false when aquad does not answer. */
static bool admin_connect(struct raw *a)
{
        Aqua__Envelope *w;
        bool ok;

        if (raw_connect(a, aquad_endpoint(daemon_), aquad_side_path(daemon_)) != 0)
                return false;
        w = raw_hello(a, AQUA__ROLE__ROLE_ADMIN, NULL, NULL, NULL, 0, NULL);
        ok = w && w->body_case == AQUA__ENVELOPE__BODY_WELCOME;
        raw_free(w);
        return ok;
}

struct books {
        size_t leases, chunks;
        uint64_t leased_bytes;
};

/* aquad's books must add up: every chunk in one state, every lease holding what names it. */
static bool check_books(struct run *r, struct books *ret)
{
        Aqua__Envelope *l = NULL, *c = NULL;
        struct books b = {0};
        struct raw a;
        bool ok = false;

        if (!admin_connect(&a)) {
                violation(r, "aquad does not answer an admin");
                raw_close(&a);
                return false;
        }
        l = raw_admin_query(&a, AQUA__ADMIN_QUERY__WHAT__WHAT_LEASES);
        c = raw_admin_query(&a, AQUA__ADMIN_QUERY__WHAT__WHAT_CHUNKS);
        if (!l || !c || l->body_case != AQUA__ENVELOPE__BODY_ADMIN_REPLY ||
            c->body_case != AQUA__ENVELOPE__BODY_ADMIN_REPLY) {
                violation(r, "admin queries failed");
                goto out;
        }
        b.leases = l->admin_reply->n_leases;
        b.chunks = c->admin_reply->n_chunks;
        for (size_t i = 0; i < c->admin_reply->n_chunks; i++) {
                const Aqua__ChunkInfo *ci = c->admin_reply->chunks[i];
                bool free_state = strcmp(ci->state, "free") == 0 ||
                                  strcmp(ci->state, "dirty") == 0 ||
                                  strcmp(ci->state, "scrubbing") == 0;
                bool found = false;

                for (size_t k = 0; k < i; k++)
                        if (c->admin_reply->chunks[k]->chunk_id == ci->chunk_id)
                                violation(r, "chunk %" PRIu64 " is listed twice", ci->chunk_id);
                if (free_state && ci->lease_id)
                        violation(r, "chunk %" PRIu64 " is %s and in lease %" PRIu64, ci->chunk_id,
                                  ci->state, ci->lease_id);
                if (!free_state && !ci->lease_id)
                        violation(r, "chunk %" PRIu64 " is %s without a lease", ci->chunk_id,
                                  ci->state);
                for (size_t k = 0; ci->lease_id && k < l->admin_reply->n_leases; k++)
                        found |= l->admin_reply->leases[k]->lease_id == ci->lease_id;
                if (ci->lease_id && !found)
                        violation(r, "chunk %" PRIu64 " names lease %" PRIu64 " that aquad lacks",
                                  ci->chunk_id, ci->lease_id);
        }
        for (size_t k = 0; k < l->admin_reply->n_leases; k++) {
                const Aqua__LeaseInfo *li = l->admin_reply->leases[k];
                uint64_t bytes = 0;
                uint32_t n = 0;

                for (size_t i = 0; i < c->admin_reply->n_chunks; i++)
                        if (c->admin_reply->chunks[i]->lease_id == li->lease_id) {
                                n++;
                                bytes += c->admin_reply->chunks[i]->size;
                        }
                if (n != li->chunks || bytes != li->bytes)
                        violation(r,
                                  "lease %" PRIu64 " counts %u chunks of %" PRIu64
                                  " bytes; %u chunks of %" PRIu64 " name it",
                                  li->lease_id, li->chunks, li->bytes, n, bytes);
                b.leased_bytes += li->bytes;
        }
        *ret = b;
        ok = true;
out:
        raw_free(l);
        raw_free(c);
        raw_close(&a);
        return ok;
}

/* Pins hold: with both GPUs registered, aquad pairs them and the consumer knows it. */
static void check_pin(struct run *r)
{
        Aqua__Envelope *q = NULL;
        const char *producer_uuid = NULL, *paired = NULL;
        bool both = consumer.pid > 0 && producer.pid > 0;
        struct raw a;

        if (!admin_connect(&a)) {
                violation(r, "aquad does not answer an admin");
                raw_close(&a);
                return;
        }
        q = raw_admin_query(&a, AQUA__ADMIN_QUERY__WHAT__WHAT_GPUS);
        for (size_t i = 0;
             q && q->body_case == AQUA__ENVELOPE__BODY_ADMIN_REPLY && i < q->admin_reply->n_gpus;
             i++) {
                const Aqua__GpuInfo *g = q->admin_reply->gpus[i];
                both &= g->client_id != 0;
                if (g->ordinal == (uint32_t)producer.device)
                        producer_uuid = g->uuid;
                else if (g->ordinal == (uint32_t)consumer.device)
                        paired = g->paired_with;
        }
        if (both && (!producer_uuid || !paired || strcmp(paired, producer_uuid) != 0))
                violation(r, "the pinned consumer is paired with '%s', not with producer %s",
                          paired ? paired : "?", producer_uuid ? producer_uuid : "?");
        for (int i = 0; both && producer_uuid && i < 100; i++) {
                const char *info = agent_ask(&consumer, "info");
                if (info && strstr(info, producer_uuid))
                        break;
                if (i == 99 || !info)
                        violation(r, "the pinned consumer says '%s'; aquad pairs it with %s",
                                  info ? info : "nothing", producer_uuid);
                agent_ask(&consumer, "poll 20");
        }
        raw_free(q);
        raw_close(&a);
}

/* Poll an agent until it is connected to aquad (after a restart it reconnects on its own). */
static bool settle(struct agent *a, int timeout_ms)
{
        uint64_t deadline = now_mono_ns() + (uint64_t)timeout_ms * NSEC_PER_MSEC;

        while (a->pid > 0) {
                const char *info;

                const char *polled = agent_ask(a, "poll 100");
                if (!is_ok(polled))
                        return false;
                a->lost += test_field(polled, "lost");
                info = agent_ask(a, "info");
                if (test_field(info, "connected") == 1)
                        return true;
                if (now_mono_ns() > deadline)
                        return false;
        }
        return false;
}

enum step { STEP_OFFER, STEP_BORROW, STEP_FILL, STEP_RECLAIM, STEP_RETURN, _STEP_MAX };
enum victim {
        VICTIM_NONE,
        VICTIM_PRODUCER,
        VICTIM_CONSUMER,
        VICTIM_AQUAD,
        VICTIM_AQUAD_SILENT, /* aquad restarted; the consumer stays silent past reconcile-timeout */
        VICTIM_DISK,         /* aquad's journal can grow no more; then aquad is SIGKILLed */
        _VICTIM_MAX,
};

static const char *const step_names[] = {"offer", "borrow", "fill", "reclaim", "return"};
static const char *const victim_names[] = {
    "nobody", "the producer", "the consumer", "aquad", "aquad (consumer silent)", "aquad's disk"};

/* The reconcile window of the run's aquad (setup's config). */
#define RECONCILE_MS 500

/* aquad may write nothing more to its journal: the disk is full for it. */
static void fill_disk(void)
{
        char path[512];
        struct stat st;
        struct rlimit rl = {.rlim_max = RLIM_INFINITY};

        snprintf(path, sizeof(path), "%s/journal", aquad_dir(daemon_));
        rl.rlim_cur = stat(path, &st) == 0 ? (rlim_t)st.st_size : 0;
        (void)prlimit(aquad_pid(daemon_), RLIMIT_FSIZE, &rl, NULL);
}

static void kill_victim(struct run *r, enum victim v)
{
        if (!r->kill_pending)
                return;
        r->kill_pending = false;
        switch (v) {
        case VICTIM_PRODUCER:
                agent_kill(&producer);
                r->killed[0]++;
                break;
        case VICTIM_CONSUMER:
                agent_kill(&consumer);
                r->killed[1]++;
                break;
        case VICTIM_AQUAD:
                aquad_kill(daemon_, SIGKILL);
                r->killed[2]++;
                break;
        case VICTIM_AQUAD_SILENT:
                aquad_kill(daemon_, next(&r->seed_state) % 2 ? SIGKILL : SIGTERM);
                r->killed[3]++;
                break;
        case VICTIM_DISK:
                fill_disk();
                r->killed[4]++;
                break;
        default:
                break;
        }
}

/* Send cmd to a, and at the chosen step kill the victim at a random moment while it runs. */
static const char *act(struct run *r, unsigned *rnd, struct agent *a, enum step s,
                       enum step kill_at, enum victim v, const char *cmd)
{
        const char *reply;

        if (a->pid <= 0)
                return NULL;
        agent_send(a, "%s", cmd);
        if (s == kill_at && v != VICTIM_NONE) {
                sleep_ns((next(rnd) % 20) * NSEC_PER_MSEC);
                kill_victim(r, v);
        }
        reply = agent_read(a, 60000);
        if (!reply && (a->pid > 0 || a->died))
                violation(r, "the %s %s '%s'", a->role, a->died ? a->line : "did not answer", cmd);
        a->died = false;
        return reply;
}

static void cycle(struct run *r, unsigned *rnd)
{
        enum victim v = next(rnd) % _VICTIM_MAX;
        enum step kill_at = next(rnd) % _STEP_MAX;
        unsigned seed = next(rnd) % 100000 + 1;
        uint64_t chunks = 1 + next(rnd) % 6, want = (1 + next(rnd) % chunks) * CHUNK;
        bool leased = false, filled = false, returned = false;
        struct books b;
        const char *reply;
        char cmd[96];
        uint64_t free_now = 0;

        snprintf(r->last, sizeof(r->last),
                 "%" PRIu64 " chunks offered, %" PRIu64 " MiB borrowed, %s killed during %s",
                 chunks, want / MiB, victim_names[v], step_names[kill_at]);

        r->kill_pending = v != VICTIM_NONE;
        snprintf(cmd, sizeof(cmd), "offer %" PRIu64, chunks * CHUNK);
        reply = act(r, rnd, &producer, STEP_OFFER, kill_at, v, cmd);

        snprintf(cmd, sizeof(cmd), "borrow %" PRIu64 " %" PRIu64, want, CHUNK);
        reply = act(r, rnd, &consumer, STEP_BORROW, kill_at, v, cmd);
        leased = is_ok(reply) && strtoull(reply + 3, NULL, 0) == 0 && consumer.pid > 0;
        snprintf(r->last + strlen(r->last), sizeof(r->last) - strlen(r->last), "; borrow: %s",
                 reply ? reply : "-");
        if (leased) {
                /* The lease is always index 0: every cycle starts with a fresh consumer list. */
                snprintf(cmd, sizeof(cmd), "fill 0 %u", seed);
                filled = is_ok(act(r, rnd, &consumer, STEP_FILL, kill_at, v, cmd));
        } else if (kill_at == STEP_FILL)
                kill_at = STEP_RECLAIM;

        switch (next(rnd) % 3) {
        case 0: /* the producer wants memory back while the consumer moves off it */
                snprintf(cmd, sizeof(cmd), "reclaim %" PRIu64 " 20000",
                         next(rnd) % 2 ? (uint64_t)0 : (1 + next(rnd) % chunks) * CHUNK);
                agent_send(&consumer, "poll 3000");
                act(r, rnd, &producer, STEP_RECLAIM, kill_at, v, cmd);
                agent_read(&consumer, 60000);
                break;
        case 1:
                if (leased && consumer.pid > 0) {
                        /* Gone locally whatever the answer: aqua_return() always unmaps, and
                         * aquad reconciles what it did not hear. */
                        returned =
                            act(r, rnd, &consumer, STEP_RETURN, kill_at, v, "return 0") || true;
                        break;
                }
                /* fall through */
        default:
                break;
        }
        /* The chosen step did not happen this time: the victim dies at rest instead. */
        kill_victim(r, v);

        /* A full disk ends in a crash: what the next aquad finds is what was acknowledged. */
        if (v == VICTIM_DISK && aquad_pid(daemon_))
                aquad_kill(daemon_, SIGKILL);

        /* Recovery: aquad back, everyone reconnected, notices handled. */
        if (!aquad_pid(daemon_))
                cr_assert_eq(aquad_restart(daemon_), 0, "aquad did not restart");
        if (producer.pid > 0 && !settle(&producer, 20000))
                violation(r, "the producer did not reconnect");
        if (v == VICTIM_AQUAD_SILENT && consumer.pid > 0) {
                /* Past the window with the consumer silent: what it maps stays leased to it
                 * (aquad may hold more: a return it could not hear while it was down). */
                sleep_ns((RECONCILE_MS + 300) * NSEC_PER_MSEC);
                agent_ask(&producer, "poll 100");
                reply = agent_ask(&consumer, "info");
                if (check_books(r, &b) && reply && b.leased_bytes < test_field(reply, "borrowed"))
                        violation(r,
                                  "with the consumer silent, aquad has %" PRIu64
                                  " bytes leased, the consumer maps %" PRIu64,
                                  b.leased_bytes, test_field(reply, "borrowed"));
        }
        if (consumer.pid > 0 && !settle(&consumer, 20000))
                violation(r, "the consumer did not reconnect");
        /* A dead producer's chunks are moved off; scrub requests get done. */
        agent_ask(&consumer, "poll 300");
        agent_ask(&producer, "poll 300");
        check_pin(r);

        /* Every byte written is still readable, wherever it lives now. */
        if (filled && !returned && consumer.pid > 0) {
                snprintf(cmd, sizeof(cmd), "check 0 %u", seed);
                reply = agent_ask(&consumer, "%s", cmd);
                if (!is_ok(reply) || strtoull(reply + 3, NULL, 0) != 0)
                        violation(r, "the consumer's data did not read back: %s",
                                  reply ? reply : "(no answer)");
        }
        /* The books add up, and what aquad has leased is what the consumer maps (a return
         * the consumer sent may still be on its way: ask again for a while). */
        for (int i = 0;; i++) {
                uint64_t mapped = 0;

                if (!check_books(r, &b))
                        break;
                reply = consumer.pid > 0 ? agent_ask(&consumer, "info") : NULL;
                mapped = reply ? test_field(reply, "borrowed") : 0;
                if (b.leased_bytes == mapped)
                        break;
                if (i == 100) {
                        violation(r,
                                  "aquad has %" PRIu64 " bytes in %zu leases, the live consumer "
                                  "maps %" PRIu64,
                                  b.leased_bytes, b.leases, mapped);
                        break;
                }
                if (consumer.pid > 0)
                        agent_ask(&consumer, "poll 20");
                else
                        sleep_ns(20 * NSEC_PER_MSEC);
        }

        if (consumer.lost)
                violation(r, "%" PRIu64 " leases the consumer was granted were unknown to aquad",
                          consumer.lost);
        consumer.lost = 0;
        if (producer.died || consumer.died)
                violation(r, "the %s %s", producer.died ? "producer" : "consumer",
                          producer.died ? producer.line : consumer.line);

        /* Everything back: the consumer returns, the producer reclaims all. */
        if (leased && !returned)
                agent_ask(&consumer, "return 0");
        if (consumer.pid > 0)
                agent_ask(&consumer, "close");
        agent_kill(&consumer);
        if (producer.pid > 0 && !is_ok(agent_ask(&producer, "reclaim 0 20000")))
                violation(r, "the producer could not reclaim everything: %s", producer.line);
        if (producer.pid > 0)
                agent_ask(&producer, "close");
        agent_kill(&producer);
        for (int i = 0; i < 500; i++) {
                reply = agent_ask(&observer, "free 1");
                free_now = reply ? strtoull(reply + 3, NULL, 0) : 0;
                if (free_now == r->baseline)
                        break;
                sleep_ns(10 * NSEC_PER_MSEC);
        }
        if (free_now != r->baseline)
                violation(r, "the producer's GPU has %" PRIu64 " MiB free, %" PRIu64 " before",
                          free_now / MiB, r->baseline / MiB);
        for (int i = 0; i < 500; i++) {
                if (!check_books(r, &b) || (b.chunks == 0 && b.leases == 0))
                        break;
                sleep_ns(10 * NSEC_PER_MSEC);
        }
        if (b.chunks || b.leases)
                violation(r, "aquad still holds %zu chunks and %zu leases with every client gone",
                          b.chunks, b.leases);
        r->cycles++;
}

static char machine[64];

static void sim_cleanup(void)
{
        test_sim_remove(machine);
}

static void setup(void)
{
        signal(SIGPIPE, SIG_IGN); /* writing to an agent just killed */
        snprintf(machine, sizeof(machine), "fault-%d", (int)getpid());
        setenv("AQUA_SIM_MACHINE", machine, 1);
        setenv("AQUA_SIM_DEVICES", "2x2GiB", 1);
        unsetenv("AQUA_SIM_TOPOLOGY");
        unsetenv("AQUA_SIM_RUNTIME_DIR");
        cr_assert_eq(aquad_start("reclaim-deadline: 10s\nreconcile-timeout: 500ms\n"
                                 "pairing: static\npairs: [{producer: 1, consumer: 0}]\n",
                                 &daemon_),
                     0);
        setenv("AQUA_ENDPOINT", aquad_endpoint(daemon_), 1);
        setenv("AQUA_SIDE_PATH", aquad_side_path(daemon_), 1);
        cr_assert(agent_start(&observer));
}

static void teardown(void)
{
        agent_kill(&consumer);
        agent_kill(&producer);
        agent_kill(&observer);
        aquad_stop_in_teardown(daemon_);
        daemon_ = NULL;
        sim_cleanup();
}

TestSuite(fault, .init = setup, .fini = teardown, .timeout = 600);

Test(fault, random_kills_break_no_invariant)
{
        const char *s = getenv("AQUA_FAULT_SECONDS");
        double secs = s && atof(s) > 0 ? atof(s) : UNDER_ASAN ? 20 : 60;
        struct run r = {0};
        unsigned rnd;
        uint64_t stop;
        const char *reply;

        s = getenv("AQUA_FAULT_SEED");
        r.seed = s ? (unsigned)strtoul(s, NULL, 0) : (unsigned)(now_real_ns() % 1000000);
        rnd = r.seed;
        r.seed_state = r.seed;
        reply = agent_ask(&observer, "free 1");
        cr_assert(is_ok(reply));
        r.baseline = strtoull(reply + 3, NULL, 0);
        stop = now_mono_ns() + (uint64_t)(secs * 1e9);
        while (now_mono_ns() < stop) {
                if (!agent_start(&producer) || !agent_start(&consumer)) {
                        violation(&r, "an agent could not open its context");
                        break;
                }
                cycle(&r, &rnd);
        }
        test_note("fault: seed %u: %" PRIu64 " cycles in %.0f s; killed the producer %" PRIu64
                  ", the consumer %" PRIu64 ", aquad %" PRIu64 " times; restarted aquad with the "
                  "consumer silent %" PRIu64 " times; filled aquad's disk %" PRIu64
                  " times; %" PRIu64 " violations",
                  r.seed, r.cycles, secs, r.killed[0], r.killed[1], r.killed[2], r.killed[3],
                  r.killed[4], r.violations);
        cr_assert_gt(r.cycles, 0);
        cr_assert_eq(r.violations, 0, "%" PRIu64 " violations (seed %u)", r.violations, r.seed);
}

/* What a killed consumer wrote never reaches the next consumer of those chunks. */
Test(fault, a_killed_consumers_data_is_scrubbed_before_the_next_consumer_sees_it)
{
        const char *reply;
        char expect[32];

        cr_assert(agent_start(&producer));
        cr_assert(agent_start(&consumer));
        cr_assert(is_ok(agent_ask(&producer, "offer %" PRIu64, 4 * CHUNK)));
        reply = agent_ask(&consumer, "borrow %" PRIu64 " %" PRIu64, 4 * CHUNK, 4 * CHUNK);
        cr_assert(is_ok(reply), "%s", reply);
        cr_assert(is_ok(agent_ask(&consumer, "fill 0 77")));
        agent_kill(&consumer);

        /* The producer zeroes and verifies the four chunks from its poll. */
        cr_assert(is_ok(agent_ask(&producer, "poll 500")));
        cr_assert(agent_start(&consumer));
        for (int i = 0; i < 200; i++) {
                reply = agent_ask(&consumer, "borrow %" PRIu64 " %" PRIu64, 4 * CHUNK, 4 * CHUNK);
                if (is_ok(reply))
                        break;
                agent_ask(&producer, "poll 20");
        }
        cr_assert(is_ok(reply), "the next consumer got the chunks: %s", reply);
        snprintf(expect, sizeof(expect), "ok %d", 4);
        cr_assert_str_eq(agent_ask(&consumer, "check 0 77"), expect, "none holds the old data");
        cr_assert_str_eq(agent_ask(&consumer, "zeroed 0"), "ok 0", "all read as zero");
}
