/*
 * Trust nothing a client names (daemon/README.md, "Who may hold what"), tried as a second user
 * of the server would: uid nobody, allowed to connect, no admin.
 *
 * - A lender maps what it lends: a consumer borrows only from lenders of its own tenant. nobody's
 *   honest producer never gets root's consumer paired with it, automatically or by a pin, until
 *   the operator declares one tenant for both.
 * - aquad's folders are aquad's: a socket or journal folder another user owns or may write, or a
 *   lock file of another owner, keeps aquad from starting, naming the folder, owner and mode; a
 *   link planted where compaction writes is never followed.
 * - Clients check whom they reach: aquactl and libaqua refuse a side channel another user serves.
 *
 * Needs root (to act as nobody); each test says so and skips where it cannot.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "harness.h"
#include "rawclient.h"
#include "testutil.h"
#include "util.h"

#define MiB    (UINT64_C(1) << 20)
#define NOBODY 65534

static struct aquad *daemon_;
static struct raw consumer, admin;
static pid_t lender = -1;
static int lender_pipe = -1;

static void teardown(void)
{
        if (lender > 0) {
                kill(lender, SIGKILL);
                waitpid(lender, NULL, 0);
        }
        lender = -1;
        if (lender_pipe >= 0)
                close(lender_pipe);
        lender_pipe = -1;
        raw_close(&consumer);
        raw_close(&admin);
        aquad_stop_in_teardown(daemon_);
        daemon_ = NULL;
}

TestSuite(trust, .fini = teardown, .timeout = 60);

static void need_nobody(void)
{
        if (geteuid() != 0)
                cr_skip_test("needs root to act as the second user, nobody");
        if (!getpwuid(NOBODY))
                cr_skip_test("this machine has no user nobody (uid 65534)");
}

/* In a forked child: become nobody, and die with the test (after the change of credentials,
 * which clears a parent-death signal set before it). */
static void become_nobody(void)
{
        pid_t parent = getppid();

        if (setgroups(0, NULL) < 0 || setgid(NOBODY) < 0 || setuid(NOBODY) < 0)
                _exit(99);
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
                _exit(98);
}

/* In a forked child: become nobody and register uuid (linked to peer) with the test's aquad;
 * exits 2 (no connection) or 3 (no Welcome) where it cannot. */
static void nobody_registers(struct raw *r, Aqua__Role role, const char *uuid, const char *peer)
{
        Aqua__Envelope *w;

        become_nobody();
        raw_forget_secrets();
        if (raw_connect(r, aquad_endpoint(daemon_), aquad_side_path(daemon_)) != 0)
                _exit(2);
        w = raw_hello(r, role, uuid, peer, NULL, 0, NULL);
        if (!w || w->body_case != AQUA__ENVELOPE__BODY_WELCOME)
                _exit(3);
        raw_free(w);
}

/* Start aquad with extra config; its folder opened so that nobody may reach the sockets. */
static void start(const char *extra)
{
        char yaml[1024];

        snprintf(yaml, sizeof(yaml),
                 "socket-mode: 0666\nallow: {users: [root, nobody]}\ndram-budget: 64MiB\n%s",
                 extra ? extra : "");
        cr_assert_eq(aquad_start(yaml, &daemon_), 0, "aquad did not start");
        cr_assert_eq(chmod(aquad_dir(daemon_), 0755), 0);
}

/*
 * nobody's honest producer: registers GPU-N (linked to GPU-C), offers 4 chunks of 2 MiB that
 * it keeps mapping (memfds it holds), then stays until the test ends. Returns once it offered.
 */
static void nobody_lends(void)
{
        int p[2], ready[2];

        cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
        cr_assert_eq(pipe2(ready, O_CLOEXEC), 0);
        lender = fork();
        cr_assert_geq(lender, 0);
        if (lender == 0) {
                struct raw r = {0};
                Aqua__Envelope *w;
                int fds[4];
                char c;

                close(p[1]);
                close(ready[0]);
                nobody_registers(&r, AQUA__ROLE__ROLE_PRODUCER, "GPU-N", "GPU-C");
                w = raw_offer(&r, 4, 2 * MiB, fds);
                if (!w || w->body_case != AQUA__ENVELOPE__BODY_OFFER_REPLY)
                        _exit(4);
                raw_free(w);
                (void)!write(ready[1], "x", 1);
                (void)!read(p[0], &c, 1); /* until the test closes its end */
                _exit(0);
        }
        close(p[0]);
        close(ready[1]);
        lender_pipe = p[1];
        char c;
        cr_assert_eq(read(ready[0], &c, 1), 1, "nobody's producer did not get to offer");
        close(ready[0]);
}

/* root's consumer on GPU-C (linked to GPU-N) borrows 8 MiB, DRAM allowed: chunks granted. */
static size_t root_borrows(uint64_t *ret_dram)
{
        Aqua__Envelope *g;
        int fds[8];
        size_t n = 0;

        test_connect_as(daemon_, &consumer, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", "GPU-N");
        g = raw_borrow(&consumer, 8 * MiB, 0, true, fds, 8, &n);
        cr_assert_not_null(g);
        cr_assert_eq(g->body_case, AQUA__ENVELOPE__BODY_GRANT, "borrow answered %d",
                     raw_error_code(g));
        if (ret_dram)
                *ret_dram = g->grant->dram_bytes;
        cr_assert_eq(g->grant->n_chunks, n);
        for (size_t i = 0; i < n; i++)
                close(fds[i]);
        raw_free(g);
        return n;
}

static const Aqua__GpuInfo *gpu_named(const Aqua__AdminReply *a, const char *uuid)
{
        for (size_t i = 0; i < a->n_gpus; i++)
                if (strcmp(a->gpus[i]->uuid, uuid) == 0)
                        return a->gpus[i];
        return NULL;
}

Test(trust, a_consumer_never_borrows_what_another_users_producer_lends)
{
        uint64_t dram = 0;
        Aqua__Envelope *q;
        const Aqua__GpuInfo *n, *c;

        need_nobody();
        start(NULL);
        nobody_lends();
        cr_assert_eq(root_borrows(&dram), 0, "root's KV went into memory nobody maps");
        cr_assert_eq(dram, 8 * MiB, "DRAM instead");

        /* aquactl gpus: each side's user and tenant. */
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_GPUS);
        cr_assert_not_null(q);
        n = gpu_named(q->admin_reply, "GPU-N");
        c = gpu_named(q->admin_reply, "GPU-C");
        cr_assert(n && c);
        cr_assert_str_eq(n->user, "nobody");
        cr_assert_str_eq(n->tenant, "user:65534");
        cr_assert_not(n->lends_to_all);
        cr_assert_str_eq(c->user, "root");
        cr_assert_str_eq(c->paired_with, "", "paired across users");
        raw_free(q);
}

Test(trust, a_pin_across_users_is_refused_and_says_why)
{
        Aqua__Envelope *q;
        bool seen = false;

        need_nobody();
        start("pairs:\n  - {producer: GPU-N, consumer: GPU-C}\n");
        nobody_lends();
        cr_assert_eq(root_borrows(NULL), 0, "a pin put root's KV into nobody's memory");
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_PAIRS);
        cr_assert_not_null(q);
        for (size_t i = 0; i < q->admin_reply->n_pairs; i++) {
                const Aqua__PairInfo *p = q->admin_reply->pairs[i];
                cr_assert(*p->refused, "a pair across users stands: %s -> %s", p->producer_uuid,
                          p->consumer_uuid);
                cr_assert(strstr(p->refused, "user:65534") && strstr(p->refused, "user:0"), "%s",
                          p->refused);
                seen = true;
        }
        cr_assert(seen, "the refused pin is not listed");
        raw_free(q);
}

Test(trust, users_the_operator_declares_one_tenant_share)
{
        uint64_t dram = 0;

        need_nobody();
        start("tenants:\n  - {name: team, users: [root, nobody]}\n");
        nobody_lends();
        cr_assert_eq(root_borrows(&dram), 4, "one tenant: nobody's memory is lent");
        cr_assert_eq(dram, 0);
}

Test(trust, roots_producer_lends_to_another_user)
{
        struct raw producer = {0};
        Aqua__Envelope *o, *g;
        int fds[8];
        size_t n = 0;
        pid_t pid;
        int status;

        need_nobody();
        start(NULL);
        test_connect_as(daemon_, &producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-R", "GPU-N");
        o = raw_offer(&producer, 2, 2 * MiB, fds);
        cr_assert_not_null(o);
        raw_free(o);
        for (int i = 0; i < 2; i++)
                close(fds[i]);
        /* nobody's consumer borrows root's memory: root reads any memory already. */
        pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
                struct raw r = {0};

                nobody_registers(&r, AQUA__ROLE__ROLE_CONSUMER, "GPU-N", "GPU-R");
                g = raw_borrow(&r, 4 * MiB, 0, false, fds, 8, &n);
                _exit(g && g->body_case == AQUA__ENVELOPE__BODY_GRANT && n == 2 ? 0 : 4);
        }
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
        raw_close(&producer);
}

/* ---------------------------------------------------------------- folders */

/* A config in dir naming sockets and journal in sock_dir; aquad's exit status and its log. */
static int run_in(const char *dir, const char *sock_dir, const char *journal_dir, char **ret_log)
{
        char path[512];
        FILE *f;

        snprintf(path, sizeof(path), "%s/aquad.yaml", dir);
        f = fopen(path, "w");
        cr_assert_not_null(f);
        fprintf(f,
                "endpoint: ipc://%s/aquad.sock\nside-socket: %s/aquad.side\n"
                "journal: %s/journal\n",
                sock_dir, sock_dir, journal_dir);
        fclose(f);
        return aquad_run(path, NULL, 5000, ret_log);
}

static void rm_rf(const char *dir)
{
        char cmd[600];

        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        cr_assert_eq(system(cmd), 0);
}

Test(trust, aquad_refuses_folders_another_user_owns_or_others_may_write)
{
        char dir[] = "/tmp/test-trust-XXXXXX", sub[600], log_dir[600];
        _cleanup_free_ char *log = NULL;
        static const struct {
                uid_t owner;
                mode_t mode;
                const char *expect;
        } cases[] = {
            {NOBODY, 0755, "owned by nobody with mode 0755"},
            {0, 0777, "owned by root with mode 0777: others may write in it"},
            {0, 01777, "owned by root with mode 1777: others may write in it"},
            {0, 0775, "owned by root with mode 0775: others may write in it"},
        };

        need_nobody();
        cr_assert_not_null(mkdtemp(dir));
        snprintf(log_dir, sizeof(log_dir), "%s/own", dir);
        cr_assert_eq(mkdir(log_dir, 0700), 0);
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                snprintf(sub, sizeof(sub), "%s/case%zu", dir, i);
                cr_assert_eq(mkdir(sub, 0700), 0);
                cr_assert_eq(chown(sub, cases[i].owner, cases[i].owner ? NOBODY : 0), 0);
                cr_assert_eq(chmod(sub, cases[i].mode), 0);
                /* As the sockets' folder, then as the journal's. */
                for (int as_journal = 0; as_journal < 2; as_journal++) {
                        free(log);
                        log = NULL;
                        int rc = run_in(log_dir, as_journal ? log_dir : sub,
                                        as_journal ? sub : log_dir, &log);
                        cr_assert_neq(rc, 0, "case %zu: aquad started in %s", i, sub);
                        cr_assert(strstr(log, sub) && strstr(log, cases[i].expect),
                                  "case %zu%s: %s", i, as_journal ? " (journal)" : "", log);
                        /* --check-config says the same. */
                }
        }
        /* Nothing was made there. */
        snprintf(sub, sizeof(sub), "%s/case0/aquad.side.lock", dir);
        cr_assert_neq(access(sub, F_OK), 0);
        rm_rf(dir);
}

Test(trust, check_config_refuses_a_folder_another_user_owns)
{
        char dir[] = "/tmp/test-trust-XXXXXX", sub[600], path[600];
        static const char *const check[] = {"--check-config", NULL};
        _cleanup_free_ char *log = NULL;
        FILE *f;

        need_nobody();
        cr_assert_not_null(mkdtemp(dir));
        snprintf(sub, sizeof(sub), "%s/theirs", dir);
        cr_assert_eq(mkdir(sub, 0755), 0);
        cr_assert_eq(chown(sub, NOBODY, NOBODY), 0);
        snprintf(path, sizeof(path), "%s/aquad.yaml", dir);
        f = fopen(path, "w");
        cr_assert_not_null(f);
        fprintf(f, "endpoint: ipc://%s/aquad.sock\nside-socket: %s/aquad.side\njournal: %s/j\n",
                sub, sub, dir);
        fclose(f);
        cr_assert_eq(aquad_run(path, check, 5000, &log), 1);
        cr_assert(strstr(log, "owned by nobody"), "%s", log);
        rm_rf(dir);
}

Test(trust, aquad_refuses_a_lock_file_of_another_owner)
{
        char dir[] = "/tmp/test-trust-XXXXXX", sock[600], lock[700];
        _cleanup_free_ char *log = NULL;
        int fd;

        need_nobody();
        cr_assert_not_null(mkdtemp(dir));
        snprintf(sock, sizeof(sock), "%s/s", dir);
        cr_assert_eq(mkdir(sock, 0755), 0);
        snprintf(lock, sizeof(lock), "%s/aquad.side.lock", sock);
        fd = open(lock, O_WRONLY | O_CREAT | O_EXCL, 0644);
        cr_assert_geq(fd, 0);
        close(fd);
        cr_assert_eq(chown(lock, NOBODY, NOBODY), 0);
        cr_assert_neq(run_in(dir, sock, dir, &log), 0);
        cr_assert(strstr(log, lock) && strstr(log, "belongs to nobody"), "%s", log);
        rm_rf(dir);
}

Test(trust, compaction_never_follows_a_link_planted_where_it_writes)
{
        char victim[] = "/tmp/test-trust-victim-XXXXXX", link_path[600], buf[32] = {0};
        struct stat st;
        int fd;

        need_nobody();
        fd = mkstemp(victim);
        cr_assert_geq(fd, 0);
        cr_assert_eq(write(fd, "precious", 8), 8);
        close(fd);
        start(NULL);
        snprintf(link_path, sizeof(link_path), "%s/journal.new", aquad_dir(daemon_));
        cr_assert_eq(symlink(victim, link_path), 0);
        /* aquad compacts its journal as it stops. */
        cr_assert_eq(aquad_kill(daemon_, SIGTERM), 0);
        fd = open(victim, O_RDONLY);
        cr_assert_geq(fd, 0);
        cr_assert_eq(read(fd, buf, sizeof(buf) - 1), 8);
        close(fd);
        cr_assert_str_eq(buf, "precious", "the link was followed");
        snprintf(link_path, sizeof(link_path), "%s/journal", aquad_dir(daemon_));
        cr_assert_eq(lstat(link_path, &st), 0);
        cr_assert(S_ISREG(st.st_mode), "the journal became a link");
        unlink(victim);
}

/* ---------------------------------------------------------------- clients */

/*
 * nobody serves a side channel in a folder of its own (an impostor's aquad); returns its path
 * in path. The child accepts and greets nobody: a client must refuse before it sends anything.
 */
static pid_t impostor(char *dir, size_t size)
{
        int ready[2];
        pid_t pid;

        cr_assert_eq(pipe2(ready, O_CLOEXEC), 0);
        pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
                struct sockaddr_un sa = {.sun_family = AF_UNIX};
                char d[] = "/tmp/test-trust-impostor-XXXXXX";
                int fd, c;

                close(ready[0]);
                become_nobody();
                if (!mkdtemp(d) || chmod(d, 0755) < 0)
                        _exit(2);
                snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/aquad.side", d);
                fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
                if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
                    chmod(sa.sun_path, 0666) < 0 || listen(fd, 8) < 0)
                        _exit(3);
                (void)!write(ready[1], d, strlen(d) + 1);
                for (;;) {
                        c = accept(fd, NULL, NULL);
                        if (c >= 0) {
                                char buf[4096];
                                ssize_t n = read(c, buf, sizeof(buf));
                                /* Anything the client sent: it spoke to the impostor. */
                                if (n > 0) {
                                        char seen[600];
                                        snprintf(seen, sizeof(seen), "%s/spoken", d);
                                        close(open(seen, O_CREAT | O_WRONLY, 0644));
                                }
                                close(c);
                        }
                }
        }
        close(ready[1]);
        cr_assert_gt(read(ready[0], dir, size), 0);
        close(ready[0]);
        return pid;
}

Test(trust, aquactl_and_libaqua_refuse_an_aquad_another_user_serves)
{
        const char *ctl = getenv("AQUACTL");
        char dir[64] = {0}, cmd[1024], out[2048] = {0}, line[1024] = {0}, spoken[128];
        pid_t pid, agent;
        FILE *p, *in, *o;

        need_nobody();
        if (!ctl)
                cr_skip_test("AQUACTL is not set");
        pid = impostor(dir, sizeof(dir));
        snprintf(cmd, sizeof(cmd), "%s -t 1s -e ipc://%s/aquad.sock --side %s/aquad.side status 2>&1",
                 ctl, dir, dir);
        p = popen(cmd, "r");
        cr_assert_not_null(p);
        size_t n = fread(out, 1, sizeof(out) - 1, p);
        out[n] = 0;
        int rc = pclose(p);
        cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 4, "aquactl exit %d: %s", rc, out);
        cr_assert(strstr(out, "nobody") && strstr(out, "uid 65534"), "%s", out);

        /* libaqua: the engine's open fails, naming the user, and says nothing to it. */
        setenv("AQUA_ENDPOINT", "ipc:///nonexistent/aquad.sock", 1);
        snprintf(cmd, sizeof(cmd), "%s/aquad.side", dir);
        setenv("AQUA_SIDE_PATH", cmd, 1);
        setenv("AQUA_SIM_DEVICES", "1x1GiB", 1);
        setenv("AQUA_SIM_MACHINE", "test-trust", 1);
        test_agent_spawn(&agent, &in, &o);
        fprintf(in, "open consumer 0\n");
        fflush(in);
        cr_assert_not_null(fgets(line, sizeof(line), o));
        cr_assert_eq(strncmp(line, "err", 3), 0, "%s", line);
        cr_assert(strstr(line, "uid 65534"), "%s", line);
        test_agent_kill(&agent, in, o);
        test_sim_remove("test-trust");
        snprintf(spoken, sizeof(spoken), "%s/spoken", dir);
        cr_assert_neq(access(spoken, F_OK), 0, "a client spoke to the impostor");
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        rm_rf(dir);
}

/* A reload that splits a tenant takes back what now crosses it: root's consumer is asked to
 * return what nobody's producer lent it, and pairs follow. */
Test(trust, a_reload_that_splits_a_tenant_reclaims_what_now_crosses_it)
{
        Aqua__Envelope *n, *q;

        need_nobody();
        start("tenants: [{name: team, users: [root, nobody]}]\n"); /* one line: replaced below */
        nobody_lends();
        cr_assert_eq(root_borrows(NULL), 4);
        cr_assert_eq(aquad_config_set(daemon_, "tenants", "[]"), 0);
        cr_assert_eq(kill(aquad_pid(daemon_), SIGHUP), 0);
        n = raw_wait(&consumer, 0, AQUA__ENVELOPE__BODY_RECLAIM_NOTICE, 5000);
        cr_assert_not_null(n, "no reclaim after the tenant was split");
        cr_assert_eq(n->reclaim_notice->n_chunk_ids, 4);
        raw_free(n);
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_GPUS);
        cr_assert_not_null(q);
        cr_assert_str_eq(gpu_named(q->admin_reply, "GPU-C")->paired_with, "");
        cr_assert_str_eq(gpu_named(q->admin_reply, "GPU-N")->tenant, "user:65534");
        raw_free(q);
}

/* ---------------------------------------------------------------- shares */

/* Descriptors aquad holds now. */
static long aquad_fds(void)
{
        char path[64];
        long n = 0;
        DIR *d;

        snprintf(path, sizeof(path), "/proc/%d/fd", (int)aquad_pid(daemon_));
        d = opendir(path);
        cr_assert_not_null(d);
        while (readdir(d))
                n++;
        closedir(d);
        return n - 2;
}

/*
 * In a child as nobody: n side channels registered as admin tools (aquactl's role), or n idle
 * ZeroMQ connections (zmq); it writes how many aquad took, then holds them until the test ends.
 */
static int nobody_floods(int n, bool zmq)
{
        int p[2], ready[2], got = 0;

        cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
        cr_assert_eq(pipe2(ready, O_CLOEXEC), 0);
        lender = fork();
        cr_assert_geq(lender, 0);
        if (lender == 0) {
                static struct raw r[300];
                void *ctx;
                char c;

                close(p[1]);
                close(ready[0]);
                become_nobody();
                raw_forget_secrets();
                ctx = zmq_ctx_new();
                for (int i = 0; i < n; i++) {
                        if (zmq) {
                                void *d = zmq_socket(ctx, ZMQ_DEALER);
                                got += d && zmq_connect(d, aquad_endpoint(daemon_)) == 0;
                                continue;
                        }
                        if (i >= 300 || raw_connect_ctx(&r[i], ctx, aquad_endpoint(daemon_),
                                                        aquad_side_path(daemon_)))
                                break;
                        Aqua__Envelope *w =
                            raw_hello(&r[i], AQUA__ROLE__ROLE_ADMIN, NULL, NULL, NULL, 0, NULL);
                        if (!w || w->body_case != AQUA__ENVELOPE__BODY_WELCOME)
                                break;
                        raw_free(w);
                        got++;
                }
                if (zmq)
                        sleep(1); /* ZeroMQ connects in the background */
                (void)!write(ready[1], &got, sizeof(got));
                (void)!read(p[0], &c, 1);
                _exit(0);
        }
        close(p[0]);
        close(ready[1]);
        lender_pipe = p[1];
        cr_assert_eq(read(ready[0], &got, sizeof(got)), (ssize_t)sizeof(got));
        close(ready[0]);
        return got;
}

/* root's aquactl status: its exit status, and what it printed in out. */
static int ctl_status(char *out, size_t size)
{
        char cmd[1024];
        FILE *p;
        size_t n;

        snprintf(cmd, sizeof(cmd), "%s -t 3s -e %s --side %s status 2>&1", getenv("AQUACTL"),
                 aquad_endpoint(daemon_), aquad_side_path(daemon_));
        p = popen(cmd, "r");
        cr_assert_not_null(p);
        n = fread(out, 1, size - 1, p);
        out[n] = 0;
        return WEXITSTATUS(pclose(p));
}

Test(trust, one_user_takes_no_more_than_its_share_of_clients)
{
        char out[4096];

        need_nobody();
        if (!getenv("AQUACTL"))
                cr_skip_test("AQUACTL is not set");
        /* The defaults: 256 clients, 64 a user. */
        start(NULL);
        cr_assert_eq(nobody_floods(255, false), 64, "nobody took more than its share");
        cr_assert_eq(ctl_status(out, sizeof(out)), 0, "root's aquactl: %s", out);
}

Test(trust, the_last_client_slots_are_kept_for_admins)
{
        char out[4096];

        need_nobody();
        if (!getenv("AQUACTL"))
                cr_skip_test("AQUACTL is not set");
        start("limits: {clients: 10, clients-per-user: 64, admin-reserve: 3}\n");
        cr_assert_eq(nobody_floods(30, false), 7, "nobody took the admins' reserve");
        cr_assert_eq(ctl_status(out, sizeof(out)), 0, "root's aquactl: %s", out);
}

Test(trust, one_users_idle_zeromq_connections_hold_no_more_than_its_share)
{
        char out[4096];
        long before, after;

        need_nobody();
        if (!getenv("AQUACTL"))
                cr_skip_test("AQUACTL is not set");
        start(NULL); /* 64 clients a user: 128 ipc:// connections */
        before = aquad_fds();
        cr_assert_eq(nobody_floods(300, true), 300);
        after = aquad_fds();
        cr_assert_leq(after - before, 2 * 64 + 4, "aquad holds %ld more descriptors",
                      after - before);
        cr_assert_eq(ctl_status(out, sizeof(out)), 0, "root's aquactl: %s", out);
}

/* ---------------------------------------------------------------- a GPU is its holder's */

/* The uuid simcuda gave device i, from the driver's files under root. */
static void uuid_of(const char *root, int i, char *uuid, size_t size)
{
        char path[512], line[256];
        FILE *f;

        snprintf(path, sizeof(path), "%s/proc/driver/nvidia/gpus/0000:%02x:00.0/information", root,
                 0x10 + i);
        f = fopen(path, "r");
        cr_assert_not_null(f, "simcuda wrote no %s", path);
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "GPU UUID: %63s", uuid) == 1)
                        break;
        fclose(f);
        cr_assert(strncmp(uuid, "GPU-", 4) == 0 && strlen(uuid) < size);
}

/* In a child as nobody: claim uuid as a producer, passing node (NULL: none); the Hello's error
 * code (0: welcomed), and its message in msg. */
static int nobody_claims(const char *uuid, const char *node, char *msg, size_t size)
{
        int p[2], code = -1;
        pid_t pid;

        cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
        pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
                struct raw r = {0};
                Aqua__Envelope *w;
                char out[600] = {0};

                close(p[0]);
                become_nobody();
                raw_forget_secrets();
                if (raw_connect(&r, aquad_endpoint(daemon_), aquad_side_path(daemon_)) != 0)
                        _exit(2);
                if (node) {
                        r.device_fd = open(node, O_RDONLY | O_CLOEXEC);
                        r.device_node = r.device_fd >= 0;
                }
                w = raw_hello(&r, AQUA__ROLE__ROLE_PRODUCER, uuid, NULL, NULL, 0, NULL);
                code = !w ? -2 : w->body_case == AQUA__ENVELOPE__BODY_WELCOME ? 0 : raw_error_code(w);
                snprintf(out, sizeof(out), "%d %s", code,
                         w && w->body_case == AQUA__ENVELOPE__BODY_ERROR ? w->error->message : "");
                (void)!write(p[1], out, strlen(out) + 1);
                _exit(0);
        }
        close(p[1]);
        char buf[600] = {0};
        cr_assert_gt(read(p[0], buf, sizeof(buf) - 1), 0);
        close(p[0]);
        waitpid(pid, NULL, 0);
        cr_assert_eq(sscanf(buf, "%d", &code), 1);
        snprintf(msg, size, "%s", strchr(buf, ' ') ? strchr(buf, ' ') + 1 : "");
        return code;
}

Test(trust, a_gpu_of_this_host_is_registered_only_by_a_process_the_host_lets_use_it)
{
        char root[] = "/tmp/test-trust-driver-XXXXXX", yaml[600], uuid0[64], uuid1[64],
            node[700], msg[600];
        pid_t agent;
        FILE *in, *o;
        char line[512];

        need_nobody();
        cr_assert_not_null(mkdtemp(root));
        cr_assert_eq(chmod(root, 0755), 0);
        snprintf(yaml, sizeof(yaml), "driver-root: %s\n", root);
        start(yaml);
        /* root's engine on the simulated machine: simcuda writes the driver's files. */
        setenv("AQUA_DRIVER_ROOT", root, 1);
        setenv("AQUA_SIM_DEVICES", "2x1GiB", 1);
        setenv("AQUA_SIM_MACHINE", "test-trust-nodes", 1);
        setenv("AQUA_ENDPOINT", aquad_endpoint(daemon_), 1);
        setenv("AQUA_SIDE_PATH", aquad_side_path(daemon_), 1);
        test_agent_spawn(&agent, &in, &o);
        fprintf(in, "free 1\n");
        fflush(in);
        cr_assert_not_null(fgets(line, sizeof(line), o));
        cr_assert_eq(strncmp(line, "ok", 2), 0, "%s", line);
        uuid_of(root, 0, uuid0, sizeof(uuid0));
        uuid_of(root, 1, uuid1, sizeof(uuid1));

        /* nobody names GPU 1 first with no node, with GPU 0's node, and with GPU 1's once its node is
         * root's alone (as a host that gives GPU 1 to root only). */
        cr_assert_eq(nobody_claims(uuid1, NULL, msg, sizeof(msg)), 5, "%s", msg);
        cr_assert(strstr(msg, uuid1) && strstr(msg, "uid 65534") && strstr(msg, "no device node"),
                  "%s", msg);
        snprintf(node, sizeof(node), "%s/dev/nvidia0", root);
        cr_assert_eq(nobody_claims(uuid1, node, msg, sizeof(msg)), 5, "%s", msg);
        cr_assert(strstr(msg, uuid0), "the refusal names the node's GPU: %s", msg);
        snprintf(node, sizeof(node), "%s/dev/nvidia1", root);
        cr_assert_eq(chmod(node, 0600), 0);
        cr_assert_eq(nobody_claims(uuid1, node, msg, sizeof(msg)), 5, "%s", msg);
        /* root's producer on GPU 1 registers: libaqua passes the node, aquad finds it GPU 1's;
         * nobody's claims held nothing up. */
        fprintf(in, "open producer 1\n");
        fflush(in);
        cr_assert_not_null(fgets(line, sizeof(line), o));
        cr_assert_eq(strncmp(line, "ok", 2), 0, "root's producer on its GPU: %s", line);
        /* With GPU 0's own node, nobody registers GPU 0. */
        snprintf(node, sizeof(node), "%s/dev/nvidia0", root);
        cr_assert_eq(nobody_claims(uuid0, node, msg, sizeof(msg)), 0, "%s", msg);
        /* A uuid the host has no GPU of is taken on its word, as before. */
        cr_assert_eq(nobody_claims("GPU-not-of-this-host", NULL, msg, sizeof(msg)), 0, "%s", msg);

        test_agent_kill(&agent, in, o);
        test_sim_remove("test-trust-nodes");
        unsetenv("AQUA_DRIVER_ROOT");
        rm_rf(root);
}
