/*
 * Acknowledged means durable: with a journal that cannot be written (a full disk, as the file
 * size limit makes it for aquad alone), offers and grants are refused and undone, aquad says it
 * is degraded, recovers by itself, and a restart finds exactly what was acknowledged.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "rawclient.h"
#include "testutil.h"

#define MiB        (UINT64_C(1) << 20)
#define E(name)    AQUA__ERROR_CODE__ERROR_CODE_##name
#define BODY(name) AQUA__ENVELOPE__BODY_##name

static struct aquad *daemon_;
static struct raw producer, consumer, admin;

static void teardown(void)
{
        raw_close(&producer);
        raw_close(&consumer);
        raw_close(&admin);
        aquad_stop_in_teardown(daemon_);
        daemon_ = NULL;
}

TestSuite(durability, .fini = teardown, .timeout = 60);

static void connect_all(void)
{
        test_connect_cast(daemon_, &producer, &consumer, &admin);
}

static void close_all(void)
{
        raw_close(&producer);
        raw_close(&consumer);
        raw_close(&admin);
}

/* aquad may write no file beyond bytes from now on (RLIM_INFINITY: as before). */
static void limit_files(rlim_t bytes)
{
        struct rlimit rl = {.rlim_cur = bytes, .rlim_max = RLIM_INFINITY};

        cr_assert_eq(prlimit(aquad_pid(daemon_), RLIMIT_FSIZE, &rl, NULL), 0, "prlimit: %m");
}

static off_t journal_size(void)
{
        char path[512];
        struct stat st;

        snprintf(path, sizeof(path), "%s/journal", aquad_dir(daemon_));
        cr_assert_eq(stat(path, &st), 0);
        return st.st_size;
}

static Aqua__StatusInfo *status(Aqua__Envelope **keep)
{
        *keep = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_STATUS);
        cr_assert_eq((*keep)->body_case, BODY(ADMIN_REPLY));
        return (*keep)->admin_reply->status;
}

static void expect_journal_error(Aqua__Envelope *e, const char *what)
{
        cr_assert_eq(raw_error_code(e), E(JOURNAL),
                     "%s: acknowledged (or %d) with the journal full", what, raw_error_code(e));
        cr_assert_not_null(strstr(e->error->message, "journal"), "%s", e->error->message);
        raw_free(e);
}

Test(durability, refuses_offers_and_grants_its_journal_cannot_hold_and_recovers)
{
        Aqua__Envelope *e, *q;
        int pfds[4], cfds[4];
        size_t n;

        cr_assert_eq(aquad_start("journal-compact-size: 64MiB\n", &daemon_), 0);
        connect_all();
        e = raw_offer(&producer, 2, 2 * MiB, pfds);
        cr_assert_eq(e->body_case, BODY(OFFER_REPLY));
        raw_free(e);

        /* The disk is full: nothing more fits in the journal. */
        limit_files((rlim_t)journal_size());
        expect_journal_error(raw_offer(&producer, 2, 2 * MiB, pfds + 2), "offer");
        expect_journal_error(raw_borrow(&consumer, 2 * MiB, 2 * MiB, false, cfds, 4, &n), "borrow");
        cr_assert_eq(n, 0, "no descriptors for a refused grant");
        cr_assert_not_null(strstr(status(&q)->degraded, "cannot be written"), "'%s'",
                           q->admin_reply->status->degraded);
        cr_assert_eq(q->admin_reply->status->leases, 0, "the refused grant was undone");
        cr_assert_eq(q->admin_reply->status->pool_bytes, 4 * MiB, "the refused offer was undone");
        raw_free(q);

        /* Space again: aquad recovers by itself, and the same borrow is granted. */
        limit_files(RLIM_INFINITY);
        for (int i = 0; i < 300; i++) {
                bool degraded = status(&q)->degraded[0];
                raw_free(q);
                if (!degraded)
                        break;
                usleep(10000);
        }
        cr_assert_str_empty(status(&q)->degraded);
        raw_free(q);
        e = raw_borrow(&consumer, 2 * MiB, 2 * MiB, false, cfds, 4, &n);
        cr_assert_eq(e->body_case, BODY(GRANT), "error %d", raw_error_code(e));
        raw_free(e);

        /* What a crash leaves is what was acknowledged: one offer of two chunks, one lease. */
        cr_assert_eq(aquad_kill(daemon_, SIGKILL), 128 + SIGKILL);
        close_all();
        cr_assert_eq(aquad_restart(daemon_), 0);
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        cr_assert_eq(status(&q)->leases, 1);
        cr_assert_eq(q->admin_reply->status->pool_bytes, 4 * MiB);
        raw_free(q);
        side_close_fds(pfds, 2);
        side_close_fds(cfds, n);
}

Test(durability, a_journal_that_cannot_be_compacted_is_retried_with_back_off)
{
        char path[512];
        Aqua__Envelope *e, *q;
        int fds[1];

        cr_assert_eq(aquad_start("journal-compact-size: 4KiB\n", &daemon_), 0);
        /* The snapshot's file cannot be created: compaction fails, the log stays intact. */
        snprintf(path, sizeof(path), "%s/journal.new", aquad_dir(daemon_));
        cr_assert_eq(mkdir(path, 0700), 0);
        connect_all();
        for (int i = 0; i < 400; i++) {
                e = raw_offer(&producer, 1, 2 * MiB, fds);
                cr_assert_eq(e->body_case, BODY(OFFER_REPLY), "acknowledged: the log is intact");
                raw_free(e);
                close(fds[0]);
        }
        cr_assert_not_null(strstr(status(&q)->degraded, "cannot be compacted"), "'%s'",
                           q->admin_reply->status->degraded);
        /* Many commits past the threshold, each would have built a snapshot: a few tries. */
        cr_assert_leq(q->admin_reply->status->compaction_failures, 3, "%llu compactions tried",
                      (unsigned long long)q->admin_reply->status->compaction_failures);
        cr_assert_geq(q->admin_reply->status->compaction_failures, 1);
        raw_free(q);
        cr_assert_eq(rmdir(path), 0);
}
