/*
 * libaqua end to end: a real aquad (tests/harness.h), producer and consumer engines as separate
 * processes (tests/aqua-agent.c) on a private simulated machine of three 16 GiB GPUs (simcuda).
 * Lend, borrow, reclaim with data intact, and the deaths of each of the three parties.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "rawclient.h"
#include "testutil.h"
#include "time-util.h"
#include "util.h"

#define GiB (UINT64_C(1) << 30)
/* The other scenarios need no gigabytes: a quarter keeps them quick. */
#define SMALL (GiB / 4)

struct agent {
        pid_t pid;
        FILE *in, *out;
        char line[512];
};

static struct aquad *daemon_;
static struct agent producer, consumer;

/* ---------------------------------------------------------------- agents */

static void agent_start(struct agent *a)
{
        test_agent_spawn(&a->pid, &a->in, &a->out);
        setvbuf(a->in, NULL, _IOLBF, 0);
}

static void agent_send(struct agent *a, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vfprintf(a->in, fmt, ap);
        va_end(ap);
        fputc('\n', a->in);
        fflush(a->in);
}

/* The agent's answer to the last command; it must start with "ok". */
static const char *agent_reply(struct agent *a)
{
        cr_assert_not_null(fgets(a->line, sizeof(a->line), a->out), "agent %d died", a->pid);
        a->line[strcspn(a->line, "\n")] = 0;
        cr_assert_eq(strncmp(a->line, "ok", 2), 0, "agent %d: %s", a->pid, a->line);
        return a->line[2] ? a->line + 3 : a->line + 2;
}

static const char *agent_do(struct agent *a, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vfprintf(a->in, fmt, ap);
        va_end(ap);
        fputc('\n', a->in);
        fflush(a->in);
        return agent_reply(a);
}

static uint64_t agent_num(struct agent *a, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vfprintf(a->in, fmt, ap);
        va_end(ap);
        fputc('\n', a->in);
        fflush(a->in);
        return strtoull(agent_reply(a), NULL, 0);
}

/* The value of key=... in an agent's reply. */
static uint64_t field(const char *reply, const char *key)
{
        char k[64];
        const char *p;

        snprintf(k, sizeof(k), "%s=", key);
        p = strstr(reply, k);
        cr_assert_not_null(p, "no %s in '%s'", key, reply);
        return strtoull(p + strlen(k), NULL, 0);
}

static void agent_kill(struct agent *a)
{
        test_agent_kill(&a->pid, a->in, a->out);
}

static void agent_stop(struct agent *a)
{
        int status;

        if (a->pid <= 0)
                return;
        fclose(a->in);
        waitpid(a->pid, &status, 0);
        fclose(a->out);
        a->pid = 0;
}

/*
 * Free memory on device as an agent's cuMemGetInfo sees it, once it equals want: aquad lets go
 * of a chunk's descriptor just after it answers, so the last release may trail the reply.
 */
static uint64_t wait_free(struct agent *a, int device, uint64_t want)
{
        uint64_t got = 0;

        for (int i = 0; i < 500; i++) {
                got = agent_num(a, "free %d", device);
                if (got == want)
                        break;
                usleep(20000);
        }
        return got;
}

/* ---------------------------------------------------------------- set-up */

static void sim_cleanup(void)
{
        test_sim_remove(getenv("AQUA_SIM_MACHINE"));
}

static void setup(void)
{
        char id[64];

        /* Every test its own machine: memory and cuMemGetInfo are not shared between tests. */
        snprintf(id, sizeof(id), "libaqua-it-%d", (int)getpid());
        setenv("AQUA_SIM_MACHINE", id, 1);
        setenv("AQUA_SIM_DEVICES", "3x16GiB", 1);
        unsetenv("AQUA_SIM_TOPOLOGY");
        unsetenv("AQUA_SIM_RUNTIME_DIR");
        cr_assert_eq(aquad_start("reclaim-deadline: 10s\nreconcile-timeout: 20s\n"
                                 "dram-budget: 1GiB\n",
                                 &daemon_),
                     0);
        setenv("AQUA_ENDPOINT", aquad_endpoint(daemon_), 1);
        setenv("AQUA_SIDE_PATH", aquad_side_path(daemon_), 1);
        agent_start(&producer);
        agent_start(&consumer);
        agent_do(&producer, "open producer 1");
        agent_do(&consumer, "open consumer 0");
}

static void teardown(void)
{
        agent_stop(&consumer);
        agent_stop(&producer);
        agent_kill(&consumer);
        agent_kill(&producer);
        aquad_stop(daemon_);
        daemon_ = NULL;
        sim_cleanup();
}

TestSuite(libaqua, .init = setup, .fini = teardown, .timeout = 120);

/* ---------------------------------------------------------------- tests */

Test(libaqua, reclaims_two_gib_from_a_consumer_with_its_data_intact)
{
        uint64_t free_before, free_after;
        const char *r;

        cr_assert_eq(agent_num(&producer, "offer %llu", 4 * GiB), 4 * GiB);
        r = agent_do(&consumer, "borrow %llu %llu", 3 * GiB, 1 * GiB);
        cr_assert_str_eq(r, "0 3221225472 0", "a 3 GiB lease: %s", r);
        cr_assert_str_eq(agent_do(&consumer, "fill 0 7"), "0");

        free_before = agent_num(&producer, "free 1");
        /* The producer blocks in aqua_reclaim while the consumer's poll moves 1 GiB off. */
        agent_send(&producer, "reclaim %llu 30000", 2 * GiB);
        r = agent_do(&consumer, "poll 30000 migrated");
        cr_assert_geq(field(r, "migrated"), 1);
        r = agent_reply(&producer);
        cr_assert_str_eq(r, "0 2147483648", "reclaim result and bytes freed: %s", r);
        free_after = wait_free(&producer, 1, free_before + 2 * GiB);
        cr_assert_eq(free_after - free_before, 2 * GiB);

        /* All 3 GiB are still readable where they were: 2 GiB peer, 1 GiB now in DRAM. */
        cr_assert_str_eq(agent_do(&consumer, "check 0 7"), "0");
        r = agent_do(&consumer, "info");
        cr_assert_eq(field(r, "borrowed"), 2 * GiB);
        cr_assert_eq(field(r, "dram"), 1 * GiB);
        r = agent_do(&producer, "info");
        cr_assert_eq(field(r, "offered"), 2 * GiB);
}

Test(libaqua, moves_a_tensor_off_a_reclaimed_lease_to_dram_at_the_same_address)
{
        uint64_t dptr;
        const char *r;
        unsigned long long idx;

        /* The producer's chunks are 32 MiB (the default), and so are the tensor's. */
        cr_assert_eq(agent_num(&producer, "offer %llu", SMALL), SMALL);
        r = agent_do(&consumer, "borrow %llu %llu tensors", SMALL, SMALL);
        cr_assert_str_eq(r, "0 268435456 0", "a pool lease of 256 MiB: %s", r);
        /* 192 MiB of tensor on the pool: two of its eight chunks stay free. */
        r = agent_do(&consumer, "tensor %llu", 3 * SMALL / 4);
        cr_assert_eq(sscanf(r, "%llu %" SCNu64, &idx, &dptr), 2, "%s", r);
        cr_assert_str_eq(agent_do(&consumer, "tfill 0 9"), "0");
        r = agent_do(&consumer, "tinfo 0");
        cr_assert_eq(field(r, "peer"), 3 * SMALL / 4);

        agent_send(&producer, "reclaim 0 30000");
        r = agent_do(&consumer, "poll 30000 tmoved");
        cr_assert_eq(field(r, "tmoved"), 3 * SMALL / 4, "exactly the tensor's chunks moved: %s", r);
        r = agent_reply(&producer);
        cr_assert_str_eq(r, "0 268435456", "all of it came back: %s", r);

        r = agent_do(&consumer, "tinfo 0");
        cr_assert_eq(field(r, "dptr"), dptr, "the device address did not change");
        cr_assert_eq(field(r, "dram"), 3 * SMALL / 4);
        cr_assert_eq(field(r, "peer"), 0);
        cr_assert_str_eq(agent_do(&consumer, "tcheck 0 9"), "0");
        r = agent_do(&consumer, "info");
        cr_assert_eq(field(r, "borrowed"), 0);
}

Test(libaqua, gives_a_dead_consumers_chunks_back_to_the_pool)
{
        uint64_t free0, freed, t0;
        const char *r;

        cr_assert_eq(agent_num(&producer, "offer %llu", SMALL), SMALL);
        free0 = agent_num(&producer, "free 1");
        agent_do(&consumer, "borrow %llu %llu", SMALL, SMALL);
        agent_do(&consumer, "fill 0 3");
        t0 = now_mono_ns();
        agent_kill(&consumer);

        /* Unleased again: a reclaim of everything frees it at once, nobody to wait for. */
        r = agent_do(&producer, "reclaim 0 30000");
        /* Logged, not asserted: how fast depends on the machine. */
        fprintf(stderr, "chunks of the killed consumer back and freed %.1f ms after the kill\n",
                (now_mono_ns() - t0) / 1e6);
        cr_assert_eq(sscanf(r, "0 %llu", (unsigned long long *)&freed), 1, "%s", r);
        cr_assert_eq(freed, SMALL);
        cr_assert_eq(wait_free(&producer, 1, free0 + SMALL), free0 + SMALL,
                     "the dead consumer's mappings died with it");
}

Test(libaqua, keeps_a_consumers_data_when_its_producer_dies)
{
        const char *r;

        agent_do(&producer, "offer %llu", SMALL);
        agent_do(&consumer, "borrow %llu %llu", SMALL, SMALL);
        agent_do(&consumer, "fill 0 5");
        agent_kill(&producer);

        /* Its mapping keeps the memory alive ... */
        cr_assert_str_eq(agent_do(&consumer, "check 0 5"), "0");
        /* ... and the daemon asks it to move off, which poll does. */
        r = agent_do(&consumer, "poll 30000 migrated");
        cr_assert_geq(field(r, "migrated"), 1);
        cr_assert_str_eq(agent_do(&consumer, "check 0 5"), "0");
        r = agent_do(&consumer, "info");
        cr_assert_eq(field(r, "borrowed"), 0);
        cr_assert_eq(field(r, "dram"), SMALL);
        cr_assert_eq(wait_free(&consumer, 1, 16 * GiB), 16 * GiB, "nothing left on the dead GPU");
}

Test(libaqua, grants_a_dram_budget_when_no_producer_lends)
{
        const char *r;

        /* The producer has offered nothing: peers cannot help, the DRAM budget can. */
        r = agent_do(&consumer, "borrow %llu %llu dram", 2 * SMALL, SMALL);
        cr_assert_str_eq(r, "0 0 536870912", "no lease, 512 MiB of DRAM budget: %s", r);
        agent_do(&consumer, "return_dram %llu", 2 * SMALL);
        /* Without DRAM allowed, nothing at all can be granted. */
        agent_send(&consumer, "borrow %llu %llu", 2 * SMALL, SMALL);
        cr_assert_not_null(fgets(consumer.line, sizeof(consumer.line), consumer.out));
        cr_assert_eq(strncmp(consumer.line, "err 3 ", 6), 0, "AQUA_NO_MEMORY: %s", consumer.line);
}

/* The leases and chunks aquad knows, through its admin interface. */
static void count_leases(size_t *ret_leases, uint64_t *ret_lease_bytes, size_t *ret_chunks)
{
        struct raw raw;
        Aqua__Envelope *e;

        cr_assert_eq(raw_connect(&raw, aquad_endpoint(daemon_), aquad_side_path(daemon_)), 0);
        e = raw_hello(&raw, AQUA__ROLE__ROLE_ADMIN, NULL, NULL, NULL, 0, NULL);
        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_WELCOME);
        raw_free(e);
        e = raw_admin_query(&raw, AQUA__ADMIN_QUERY__WHAT__WHAT_LEASES);
        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_ADMIN_REPLY);
        *ret_leases = e->admin_reply->n_leases;
        *ret_lease_bytes = 0;
        for (size_t i = 0; i < e->admin_reply->n_leases; i++)
                *ret_lease_bytes += e->admin_reply->leases[i]->bytes;
        raw_free(e);
        e = raw_admin_query(&raw, AQUA__ADMIN_QUERY__WHAT__WHAT_CHUNKS);
        *ret_chunks = e->admin_reply->n_chunks;
        raw_free(e);
        raw_close(&raw);
}

Test(libaqua, reconciles_leases_when_aquad_is_killed_and_restarted)
{
        size_t leases, chunks, leases0, chunks0;
        uint64_t bytes, bytes0;
        const char *r;

        agent_do(&producer, "offer %llu", 2 * SMALL);
        agent_do(&consumer, "borrow %llu %llu", SMALL, SMALL);
        agent_do(&consumer, "fill 0 9");
        count_leases(&leases0, &bytes0, &chunks0);
        cr_assert_eq(leases0, 1);
        cr_assert_eq(bytes0, SMALL);

        cr_assert_eq(aquad_kill(daemon_, SIGKILL), 128 + SIGKILL);
        r = agent_do(&consumer, "poll 10000 disconnected");
        cr_assert_eq(field(r, "disconnected"), 1);
        cr_assert_eq(aquad_restart(daemon_), 0);
        r = agent_do(&consumer, "poll 30000 reconnected");
        cr_assert_eq(field(r, "reconnected"), 1);
        cr_assert_eq(field(r, "lost"), 0);
        r = agent_do(&producer, "poll 30000 reconnected");
        cr_assert_eq(field(r, "reconnected"), 1);

        /* The same lease, the same chunks: nothing lost, nothing twice. */
        count_leases(&leases, &bytes, &chunks);
        cr_assert_eq(leases, leases0);
        cr_assert_eq(bytes, bytes0);
        cr_assert_eq(chunks, chunks0);
        cr_assert_str_eq(agent_do(&consumer, "check 0 9"), "0");
        r = agent_do(&consumer, "info");
        cr_assert_eq(field(r, "connected"), 1);
        cr_assert_eq(field(r, "borrowed"), SMALL);

        /* And the flows work on: the producer takes everything back. */
        agent_send(&producer, "reclaim 0 30000");
        agent_do(&consumer, "poll 30000 migrated");
        r = agent_reply(&producer);
        cr_assert(strncmp(r, "0 ", 2) == 0 && strtoull(r + 2, NULL, 0) == 2 * SMALL, "%s", r);
        cr_assert_str_eq(agent_do(&consumer, "check 0 9"), "0");
}

/* Whether aquad's event log has an event whose text holds needle. */
static bool has_event(const char *needle)
{
        struct raw raw;
        Aqua__Envelope *e;
        bool found = false;

        test_connect_as(daemon_, &raw, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        e = raw_admin_query(&raw, AQUA__ADMIN_QUERY__WHAT__WHAT_EVENTS);
        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_ADMIN_REPLY);
        for (size_t i = 0; i < e->admin_reply->n_events && !found; i++)
                found = strstr(e->admin_reply->events[i]->text, needle) != NULL;
        raw_free(e);
        raw_close(&raw);
        return found;
}

/* Replace the value of a top-level key in the test's aquad config (for the next start). */
static void set_config(const char *key, const char *value)
{
        cr_assert_eq(aquad_config_set(daemon_, key, value), 0, "%s", aquad_config_path(daemon_));
}

/* The reply line of a command that must fail ("err ..."). */
static const char *agent_err(struct agent *a, const char *cmd)
{
        agent_send(a, "%s", cmd);
        cr_assert_not_null(fgets(a->line, sizeof(a->line), a->out), "agent %d died", a->pid);
        a->line[strcspn(a->line, "\n")] = 0;
        cr_assert_eq(strncmp(a->line, "err", 3), 0, "agent %d: '%s' gave '%s'", a->pid, cmd,
                     a->line);
        return a->line;
}

/*
 * After a restart aquad cannot hear a consumer until it calls aqua_poll(), however long an idle
 * engine takes. Its chunks must not go to anyone else while its process lives and maps them;
 * once the process is gone they are scrubbed and lent again.
 */
Test(libaqua, keeps_a_silent_consumers_leases_after_a_restart_until_its_process_is_gone)
{
        struct agent other = {0};
        size_t leases, chunks;
        uint64_t bytes;
        const char *r;
        bool lent = false;

        agent_do(&producer, "offer %llu", SMALL);
        agent_do(&consumer, "borrow %llu %llu", SMALL, SMALL);
        agent_do(&consumer, "fill 0 7");

        cr_assert_eq(aquad_kill(daemon_, SIGTERM), 0);
        set_config("reconcile-timeout", "300ms");
        cr_assert_eq(aquad_restart(daemon_), 0);
        r = agent_do(&producer, "poll 30000 reconnected");
        cr_assert_eq(field(r, "reconnected"), 1);

        /* The window closes with the consumer silent: its process runs, its lease stays. */
        for (int i = 0; i < 500 && !has_event("silent after the restart"); i++)
                usleep(20000);
        cr_assert(has_event("silent after the restart"), "aquad never looked at the consumer");
        agent_do(&producer, "poll 300"); /* would scrub what aquad wrongly released */
        count_leases(&leases, &bytes, &chunks);
        cr_assert_eq(leases, 1, "the silent consumer's lease is kept");
        cr_assert_eq(bytes, SMALL);

        /* Another consumer gets none of that memory. */
        agent_start(&other);
        agent_do(&other, "open consumer 2");
        agent_err(&other, "borrow 2097152 2097152");
        cr_assert_str_eq(agent_do(&consumer, "check 0 7"), "0", "the consumer's data is intact");

        /* The consumer wakes: the same lease, nothing lost. */
        r = agent_do(&consumer, "poll 30000 reconnected");
        cr_assert_eq(field(r, "lost"), 0);
        cr_assert_str_eq(agent_do(&consumer, "check 0 7"), "0");

        /* Silent again across another restart, then gone: now its chunks are lent again,
         * scrubbed, to the other consumer. */
        cr_assert_eq(aquad_kill(daemon_, SIGTERM), 0);
        cr_assert_eq(aquad_restart(daemon_), 0);
        r = agent_do(&producer, "poll 30000 reconnected");
        for (int i = 0; i < 500 && !has_event("silent after the restart"); i++)
                usleep(20000);
        agent_kill(&consumer);
        for (int i = 0; i < 100 && !lent; i++) {
                agent_do(&producer, "poll 100");
                agent_send(&other, "borrow %llu %llu", SMALL, SMALL);
                cr_assert_not_null(fgets(other.line, sizeof(other.line), other.out));
                lent = strncmp(other.line, "ok", 2) == 0;
        }
        cr_assert(lent, "the dead consumer's chunks were never lent again: %s", other.line);
        cr_assert_str_eq(agent_do(&other, "zeroed 0"), "0", "scrubbed before it was lent");
        agent_kill(&other);
}

Test(libaqua, a_full_aquad_refuses_a_client_with_eusers_and_says_why)
{
        struct agent third = {0};
        FILE *f = fopen(aquad_config_path(daemon_), "ae");
        char line[512] = "";

        /* The producer and the consumer are two clients: a limit of two leaves no room. */
        cr_assert_not_null(f);
        fputs("limits:\n  clients: 2\n", f);
        fclose(f);
        cr_assert_eq(kill(aquad_pid(daemon_), SIGHUP), 0);
        agent_start(&third);
        /* Until aquad has reloaded, the open gets as far as its GPU, which the consumer has. */
        for (int i = 0; i < 200; i++) {
                agent_send(&third, "open neutral 0");
                cr_assert_not_null(fgets(line, sizeof(line), third.out));
                line[strcspn(line, "\n")] = 0;
                if (strncmp(line, "err -16 ", 8) != 0)
                        break;
                usleep(20000);
        }
        cr_assert(strncmp(line, "err -87 ", 8) == 0, "not -EUSERS: %s", line);
        cr_assert(strstr(line, "the limit of 2 clients is reached"), "%s", line);
        agent_stop(&third);
        agent_kill(&third);
}

/*
 * More chunks than one message may list (limits.repeated-items): after a restart both sides
 * re-register all of them, in parts, and nothing is lost.
 */
Test(libaqua, re_registers_more_chunks_than_one_message_may_list)
{
        const uint64_t chunk = 2 << 20, n = 300;
        size_t leases, chunks, leases0, chunks0;
        uint64_t bytes, bytes0;
        const char *r;

        cr_assert_eq(aquad_kill(daemon_, SIGTERM), 0);
        set_config("reclaim-deadline", "10s\nlimits:\n  repeated-items: 256");
        cr_assert_eq(aquad_restart(daemon_), 0);
        agent_do(&producer, "close");
        agent_do(&producer, "open producer 1 %llu", (unsigned long long)chunk);
        agent_do(&consumer, "poll 30000 reconnected");

        agent_do(&producer, "offer %llu", (unsigned long long)(n * chunk));
        /* A grant carries at most 256 chunks: borrow until all are leased. */
        agent_do(&consumer, "borrow %llu %llu", (unsigned long long)(256 * chunk),
                 (unsigned long long)(256 * chunk));
        agent_do(&consumer, "borrow %llu %llu", (unsigned long long)((n - 256) * chunk),
                 (unsigned long long)((n - 256) * chunk));
        agent_do(&consumer, "fill 1 5");
        count_leases(&leases0, &bytes0, &chunks0);
        cr_assert_eq(leases0, 2);
        cr_assert_eq(bytes0, n * chunk, "all %llu chunks leased: %llu MiB in %zu leases",
                     (unsigned long long)n, (unsigned long long)(bytes0 >> 20), leases0);

        cr_assert_eq(aquad_kill(daemon_, SIGTERM), 0);
        cr_assert_eq(aquad_restart(daemon_), 0);
        r = agent_do(&producer, "poll 20000 reconnected");
        cr_assert_eq(field(r, "reconnected"), 1, "the producer could not re-register");
        r = agent_do(&consumer, "poll 20000 reconnected");
        cr_assert_eq(field(r, "reconnected"), 1, "the consumer could not re-register");
        cr_assert_eq(field(r, "lost"), 0);
        count_leases(&leases, &bytes, &chunks);
        cr_assert_eq(leases, leases0);
        cr_assert_eq(bytes, bytes0);
        cr_assert_eq(chunks, chunks0);
        cr_assert_str_eq(agent_do(&consumer, "check 1 5"), "0");
}

/*
 * Co-located models on one GPU lend to each other (colocated-lending): a producer and a
 * consumer on device 0 are paired, the consumer's data survives a reclaim in DRAM, and the
 * producer gets its memory back.
 */
Test(libaqua, lends_between_processes_on_the_same_gpu_when_the_config_allows_it)
{
        uint64_t free0;
        const char *r;

        agent_do(&producer, "close");
        r = agent_err(&producer, "open producer 0");
        cr_assert(strstr(r, "already registered"), "off by default: %s", r);

        cr_assert_eq(aquad_kill(daemon_, SIGTERM), 0);
        set_config("reclaim-deadline", "10s\ncolocated-lending: true");
        cr_assert_eq(aquad_restart(daemon_), 0);
        agent_do(&consumer, "poll 30000 reconnected");
        agent_do(&producer, "open producer 0");
        agent_do(&consumer, "poll 200"); /* PairChanged */
        r = agent_do(&consumer, "info");
        /* The only producer is on the consumer's own GPU; clients hear of the device. */
        cr_assert(!strstr(r, "paired=-") && !strchr(r, '/'), "not paired with its GPU: %s", r);

        free0 = agent_num(&producer, "free 0");
        agent_do(&producer, "offer %llu", SMALL);
        r = agent_do(&consumer, "borrow %llu %llu", SMALL, SMALL);
        cr_assert_eq(strtoull(r, NULL, 0), 0, "a lease: %s", r);
        agent_do(&consumer, "fill 0 3");

        agent_send(&producer, "reclaim 0 30000");
        agent_do(&consumer, "poll 30000 migrated");
        r = agent_reply(&producer);
        cr_assert(strncmp(r, "0 ", 2) == 0, "%s", r);
        cr_assert_str_eq(agent_do(&consumer, "check 0 3"), "0", "the data moved to DRAM intact");
        cr_assert_eq(wait_free(&producer, 0, free0), free0, "the producer has its memory back");
}
