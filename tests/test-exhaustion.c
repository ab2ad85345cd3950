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
