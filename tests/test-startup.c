/*
 * Starts aquad must refuse, with a real aquad: a journal damaged before its tail (and its repair
 * on request), and sockets another aquad serves.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "rawclient.h"
#include "testutil.h"
#include "util.h"

#define MiB (UINT64_C(1) << 20)

static struct aquad *daemon_;
static struct raw producer, client;

static void teardown(void)
{
        raw_close(&producer);
        raw_close(&client);
        /* Some tests end with their aquad killed: only a running one must stop cleanly. */
        aquad_stop_in_teardown(daemon_);
        daemon_ = NULL;
}

TestSuite(startup, .fini = teardown);

static void journal_path(char *buf, size_t size)
{
        snprintf(buf, size, "%s/journal", aquad_dir(daemon_));
}

static void run(const char *fmt, ...) _printf_(1, 2);
static void run(const char *fmt, ...)
{
        char cmd[512];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(cmd, sizeof(cmd), fmt, ap);
        va_end(ap);
        cr_assert_eq(system(cmd), 0, "%s", cmd);
}

/* Keep the journal as it is now in journal.before, to compare with later. */
static void keep_journal(void)
{
        run("cp '%s/journal' '%s/journal.before'", aquad_dir(daemon_), aquad_dir(daemon_));
}

/*
 * A journal of several records (a registration and three offers), left as a SIGKILL leaves it;
 * then one bit flipped in the body of a record in its middle. Returns that record's offset.
 */
static uint64_t damage_a_middle_record(void)
{
        _cleanup_close_ int fd = -1;
        uint64_t offsets[64], off = 8;
        char path[160];
        struct stat st;
        uint8_t h[8];
        size_t n = 0;
        int fds[3];

        cr_assert_eq(aquad_start(NULL, &daemon_), 0, "aquad did not start");
        test_connect_as(daemon_, &producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C");
        for (int i = 0; i < 3; i++) {
                Aqua__Envelope *o = raw_offer(&producer, 1, 2 * MiB, fds);
                cr_assert_eq(o->body_case, AQUA__ENVELOPE__BODY_OFFER_REPLY);
                raw_free(o);
                close(fds[0]);
        }
        cr_assert_eq(aquad_kill(daemon_, SIGKILL), 128 + SIGKILL);
        raw_close(&producer);

        /* The records' framing: [u32 length][u32 crc32c][body] after an 8-byte magic. */
        journal_path(path, sizeof(path));
        fd = open(path, O_RDWR | O_CLOEXEC);
        cr_assert_geq(fd, 0);
        cr_assert_eq(fstat(fd, &st), 0);
        while (n < 64 && pread(fd, h, sizeof(h), (off_t)off) == (ssize_t)sizeof(h)) {
                offsets[n++] = off;
                off += 8 + (h[0] | h[1] << 8 | h[2] << 16 | (uint32_t)h[3] << 24);
        }
        cr_assert_eq(off, (uint64_t)st.st_size, "the journal is whole records");
        cr_assert_geq(n, 3, "the journal has a middle record");
        off = offsets[n / 2];
        cr_assert_eq(pread(fd, h, 1, (off_t)off + 9), 1);
        h[0] ^= 0x04;
        cr_assert_eq(pwrite(fd, h, 1, (off_t)off + 9), 1);
        return off;
}

Test(startup, refuses_a_journal_damaged_before_its_tail_and_leaves_it_as_it_was)
{
        _cleanup_free_ char *log = NULL;
        char path[160], where[64];
        uint64_t bad;
        int status;

        bad = damage_a_middle_record();
        journal_path(path, sizeof(path));
        keep_journal();

        status = aquad_run(aquad_config_path(daemon_), NULL, 10000, &log);
        /* 1: refused (not crashed, hung, or leaking under ASan). */
        cr_assert_eq(status, 1, "aquad did not refuse a damaged journal: exit %d", status);
        snprintf(where, sizeof(where), "byte %" PRIu64, bad);
        cr_assert_not_null(strstr(log, where), "the log names the offset %s: %s", where, log);
        cr_assert_not_null(strstr(log, path), "the log names the journal: %s", log);
        cr_assert_not_null(strstr(log, "--repair-journal"), "the log names the way out: %s", log);

        /* Byte for byte as it was. */
        run("cmp '%s.before' '%s'", path, path);
}

/* The one journal.corrupt-* file in aquad's folder, or NULL. */
static char *find_copy(void)
{
        DIR *d = opendir(aquad_dir(daemon_));
        struct dirent *e;
        char *found = NULL;

        cr_assert_not_null(d);
        while ((e = readdir(d)))
                if (strncmp(e->d_name, "journal.corrupt-", 16) == 0) {
                        cr_assert_null(found, "one copy only");
                        cr_assert_gt(asprintf(&found, "%s/%s", aquad_dir(daemon_), e->d_name), 0);
                }
        closedir(d);
        return found;
}

Test(startup, repairs_a_damaged_journal_on_request_keeping_a_copy_and_serves)
{
        static const char *const repair[] = {"--repair-journal", NULL};
        _cleanup_free_ char *copy_path = NULL;
        char path[160];
        uint64_t bad;

        bad = damage_a_middle_record();
        journal_path(path, sizeof(path));
        keep_journal();

        cr_assert_eq(aquad_restart_args(daemon_, repair), 0, "aquad did not start with the repair");
        test_connect_as(daemon_, &client, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);

        copy_path = find_copy();
        cr_assert_not_null(copy_path, "a copy of the damaged journal is kept beside it");
        /* The copy is the damaged journal as it was; the journal keeps what came before. */
        run("cmp '%s.before' '%s'", path, copy_path);
        run("cmp -n %" PRIu64 " '%s.before' '%s'", bad, path, path);
}

/*
 * Start a second aquad on the first one's endpoint, with side socket side and its own journal:
 * it must refuse, naming the first one's pid and named, and the first one must serve on.
 */
static void second_aquad_refuses(const char *side, const char *named)
{
        _cleanup_free_ char *log = NULL;
        char config[160], pid[32];
        struct stat st;
        FILE *f;
        int status;

        cr_assert_eq(aquad_start(NULL, &daemon_), 0, "aquad did not start");
        snprintf(config, sizeof(config), "%s/second.yaml", aquad_dir(daemon_));
        f = fopen(config, "we");
        cr_assert_not_null(f);
        fprintf(f, "endpoint: %s\nside-socket: %s\njournal: %s/second/journal\n",
                aquad_endpoint(daemon_), side ? side : aquad_side_path(daemon_),
                aquad_dir(daemon_));
        fclose(f);

        status = aquad_run(config, NULL, 5000, &log);
        cr_assert_eq(status, 1,
                     "a second aquad did not refuse the sockets of a running one: exit %d", status);
        snprintf(pid, sizeof(pid), "pid %d", (int)aquad_pid(daemon_));
        cr_assert_not_null(strstr(log, pid), "the refusal names the running aquad (%s): %s", pid,
                           log);
        cr_assert_not_null(strstr(log, named), "and the path %s: %s", named, log);

        /* The first one still has its sockets and serves on them. */
        cr_assert_eq(stat(aquad_side_path(daemon_), &st), 0, "the side socket is still there");
        cr_assert(S_ISSOCK(st.st_mode));
        cr_assert_eq(stat(aquad_endpoint(daemon_) + 6, &st), 0, "the endpoint is still there");
        test_connect_as(daemon_, &client, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", NULL);
}

Test(startup, a_second_aquad_on_the_same_sockets_refuses_and_the_first_serves_on)
{
        /* The same endpoint and side socket, another journal: the journal's lock cannot tell. */
        second_aquad_refuses(NULL, "aquad.side");
}

Test(startup, a_second_aquad_on_the_same_endpoint_refuses_and_the_first_serves_on)
{
        char dir[] = "/tmp/aquad-second-XXXXXX", side[160];

        /* A folder of its own: aquad serves from no folder others may write (/tmp). */
        cr_assert_not_null(mkdtemp(dir));
        snprintf(side, sizeof(side), "%s/aquad.side", dir);
        second_aquad_refuses(side, "aquad.sock");
        cr_assert_neq(access(side, F_OK), 0, "the refused aquad made no side socket");
        unlink(side);
        strcat(side, ".lock");
        unlink(side);
        rmdir(dir);
}

/*
 * Custody by identity, item 7: an ipc:// endpoint (or a side socket) that names a file which is
 * not a socket, such as the journal, is refused at start and by --check-config, naming the path;
 * the file is left as it was.
 */
Test(startup, refuses_an_endpoint_that_names_a_file_that_is_not_a_socket_and_leaves_it)
{
        static const char *const check[] = {"--check-config", NULL};
        char config[160], precious[160], journal[160];
        FILE *f;

        cr_assert_eq(aquad_start(NULL, &daemon_), 0, "aquad did not start");
        snprintf(config, sizeof(config), "%s/other.yaml", aquad_dir(daemon_));
        snprintf(precious, sizeof(precious), "%s/precious", aquad_dir(daemon_));
        snprintf(journal, sizeof(journal), "%s/other-journal", aquad_dir(daemon_));
        run("echo 'nobody else s data' > '%s'", precious);
        for (int side = 0; side < 2; side++) {
                for (int i = 0; i < 2; i++) {
                        _cleanup_free_ char *log = NULL;
                        int status;

                        f = fopen(config, "we");
                        cr_assert_not_null(f);
                        if (side)
                                fprintf(f, "endpoint: ipc://%s/other.sock\nside-socket: %s\n",
                                        aquad_dir(daemon_), precious);
                        else
                                fprintf(f, "endpoint: ipc://%s\nside-socket: %s/other.side\n",
                                        precious, aquad_dir(daemon_));
                        fprintf(f, "journal: %s\n", journal);
                        fclose(f);
                        status = aquad_run(config, i ? check : NULL, 5000, &log);
                        cr_assert_eq(status, 1, "%s%s was not refused: exit %d",
                                     side ? "side-socket" : "endpoint",
                                     i ? " (--check-config)" : "", status);
                        cr_assert(strstr(log, precious) &&
                                      strstr(log, "regular file, not a socket"),
                                  "the refusal names the path and what it is: %s", log);
                        run("grep -qx 'nobody else s data' '%s'", precious);
                }
        }
        /* The journal named as the endpoint: refused before anything is opened. */
        f = fopen(config, "we");
        cr_assert_not_null(f);
        fprintf(f, "endpoint: ipc://%s\nside-socket: %s/other.side\njournal: %s\n", journal,
                aquad_dir(daemon_), journal);
        fclose(f);
        {
                _cleanup_free_ char *log = NULL;
                cr_assert_eq(aquad_run(config, check, 5000, &log), 1);
                cr_assert(strstr(log, "is also the journal"), "%s", log);
        }
}
