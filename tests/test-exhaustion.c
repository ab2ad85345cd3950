/*
 * aquad out of resources a client can make it spend: side channels that never say Hello, and
 * descriptors beyond what it may hold. It refuses what does not fit, keeps serving everyone
 * else, and never aborts.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "rawclient.h"
#include "testutil.h"

#define MiB        (UINT64_C(1) << 20)
#define BODY(name) AQUA__ENVELOPE__BODY_##name
#define IDLE       40

static struct aquad *daemon_;
static struct raw producer, attacker, admin;

static void teardown(void)
{
        raw_close(&producer);
        raw_close(&attacker);
        raw_close(&admin);
        if (daemon_)
                cr_assert_eq(aquad_stop(daemon_), 0, "aquad did not stop cleanly");
        daemon_ = NULL;
}

TestSuite(exhaustion, .fini = teardown, .timeout = 60);

/* A side channel that connects and then says nothing. */
static int idle_side(void)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

        cr_assert_geq(fd, 0);
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", aquad_side_path(daemon_));
        cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0, "connect: %m");
        return fd;
}

/* How many descriptors aquad has open. */
static int aquad_fds(void)
{
        char path[64];
        struct dirent *d;
        DIR *dir;
        int n = 0;

        snprintf(path, sizeof(path), "/proc/%d/fd", (int)aquad_pid(daemon_));
        dir = opendir(path);
        cr_assert_not_null(dir, "%s: %m", path);
        while ((d = readdir(dir)))
                n += d->d_name[0] != '.';
        closedir(dir);
        return n;
}

static void offer_works(void)
{
        Aqua__Envelope *e;
        int fds[4];

        e = raw_offer(&producer, 4, 2 * MiB, fds);
        cr_assert_not_null(e);
        cr_assert_eq(e->body_case, BODY(OFFER_REPLY), "offer: error %d", raw_error_code(e));
        raw_free(e);
        side_close_fds(fds, 4);
}

Test(exhaustion, idle_side_channels_lock_out_no_client)
{
        int idle[IDLE];

        cr_assert_eq(aquad_start("limits:\n  clients: 8\n  unregistered: 4\n", &daemon_), 0);
        for (int i = 0; i < IDLE; i++)
                idle[i] = idle_side();
        /* Far more idle connections than either limit, each past the second it has to say
         * Hello: clients that register still get in. */
        usleep(1200 * 1000);
        test_connect_as(daemon_, &producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C");
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        offer_works();
        for (int i = 0; i < IDLE; i++)
                close(idle[i]);
}

Test(exhaustion, descriptors_beyond_what_aquad_may_hold_are_refused_and_it_serves_on)
{
        Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
        struct rlimit low = {.rlim_cur = 256, .rlim_max = 256};
        int fds[60], memfd;

        /* aquad inherits at most 256 descriptors (so a valgrind around it knows the limit too);
         * this test's own process, which ends with the test, has as many. */
        if (setrlimit(RLIMIT_NOFILE, &low) < 0 && errno == EPERM)
                /* Lowering a limit is always allowed, except under valgrind, which keeps
                 * descriptors of its own above the limit and refuses. */
                cr_skip_test("RLIMIT_NOFILE cannot be lowered here (valgrind?): %m");
        cr_assert_eq(aquad_start(NULL, &daemon_), 0);

        /* Without a Hello, descriptors for a "re-registration" aquad never hears of: near all
         * it may have open. */
        cr_assert_eq(raw_connect(&attacker, aquad_endpoint(daemon_), aquad_side_path(daemon_)), 0);
        memfd = raw_memfd(2 * MiB, "x");
        for (size_t i = 0; i < 60; i++)
                fds[i] = memfd;
        f.kind = AQUA__SIDE_FRAME__KIND__KIND_REREGISTER_FDS;
        f.request_id = 5;
        for (int k = 0; k < 4; k++)
                cr_assert_geq(side_send(attacker.side, &f, fds, 60), 0);
        close(memfd);
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        /* aquad kept its headroom for ZeroMQ, the journal and the clients that register. */
        cr_assert_leq(aquad_fds(), 256 - 64, "aquad holds %d of its 256 descriptors", aquad_fds());

        /* And side channels beyond the descriptors left. */
        int idle[IDLE];
        for (int i = 0; i < IDLE; i++)
                idle[i] = idle_side();

        test_connect_as(daemon_, &producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C");
        offer_works();
        cr_assert_eq(kill(aquad_pid(daemon_), 0), 0, "aquad is gone");
        for (int i = 0; i < IDLE; i++)
                close(idle[i]);
}

/* aquad's resident memory in KiB (VmRSS). */
static long aquad_rss_kib(void)
{
        char path[64], line[256];
        long kib = -1;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/status", (int)aquad_pid(daemon_));
        f = fopen(path, "re");
        cr_assert_not_null(f, "%s: %m", path);
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
                        break;
        fclose(f);
        return kib;
}

#define PARTS_CLIENTS 32
#define PART_ITEMS    256

/*
 * Custody by identity, item 6: unregistered clients sending HelloHeld parts and never a Hello.
 * What aquad keeps for them is bounded per client (the pool's chunks) and over all of them
 * (twice that), each refusal says which; its memory stays bounded and clients that register are
 * served.
 */
Test(exhaustion, hello_held_parts_before_a_hello_are_bounded_per_client_and_overall)
{
        static struct raw parts[PARTS_CLIENTS];
        static Aqua__HeldChunk held[PART_ITEMS], *heldp[PART_ITEMS];
        size_t per_client = 0, overall = 0;
        long rss0, rss1;

        cr_assert_eq(aquad_start("limits:\n  chunks: 4096\n  clients: 64\n  unregistered: 64\n"
                                 "  request-rate: 0\n",
                                 &daemon_),
                     0);
        for (size_t i = 0; i < PART_ITEMS; i++) {
                aqua__held_chunk__init(&held[i]);
                held[i].chunk_id = i + 1;
                held[i].size = 2 * MiB;
                held[i].lease_id = 7;
                heldp[i] = &held[i];
        }
        rss0 = aquad_rss_kib();
        for (int c = 0; c < PARTS_CLIENTS; c++) {
                Aqua__Envelope e = AQUA__ENVELOPE__INIT;
                Aqua__HelloHeld hh = AQUA__HELLO_HELD__INIT;

                cr_assert_eq(raw_connect(&parts[c], aquad_endpoint(daemon_), aquad_side_path(daemon_)),
                             0);
                hh.token = (ProtobufCBinaryData){.len = SIDE_TOKEN_LEN, .data = parts[c].token};
                hh.held = heldp;
                hh.n_held = PART_ITEMS;
                e.body_case = BODY(HELLO_HELD);
                e.hello_held = &hh;
                /* 20 parts of 256: 5120 entries, past the pool's 4096. */
                for (int k = 0; k < 20; k++) {
                        e.request_id = parts[c].next_id++;
                        cr_assert_eq(raw_send(&parts[c], &e), 0);
                }
                for (Aqua__Envelope *r; (r = raw_recv(&parts[c], 300));) {
                        if (raw_error_code(r) == AQUA__ERROR_CODE__ERROR_CODE_LIMIT) {
                                per_client += strstr(r->error->message, "more than the pool's") != NULL;
                                overall += strstr(r->error->message, "twice the pool's") != NULL;
                        }
                        raw_free(r);
                }
        }
        rss1 = aquad_rss_kib();
        cr_log_info("HelloHeld parts: %zu refusals per client, %zu overall; aquad RSS %ld -> %ld "
                    "KiB",
                    per_client, overall, rss0, rss1);
        cr_assert_gt(per_client, 0, "no client was refused past the pool's chunks");
        cr_assert_gt(overall, 0, "no client was refused past the overall budget");
        /* 8192 entries at most are kept, some hundreds of bytes each with what decodes them. */
        cr_assert_lt(rss1 - rss0, 32 * 1024, "aquad grew by %ld KiB", rss1 - rss0);
        test_connect_as(daemon_, &producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C");
        offer_works();
        for (int c = 0; c < PARTS_CLIENTS; c++)
                raw_close(&parts[c]);
}
