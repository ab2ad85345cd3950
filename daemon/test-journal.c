/* The journal: records replay in order, a torn tail is cut off, compaction keeps the state. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "journal.h"

static char dir[64];
static char path[128];

static void setup(void)
{
        snprintf(dir, sizeof(dir), "/tmp/test-journal-XXXXXX");
        cr_assert_not_null(mkdtemp(dir));
        snprintf(path, sizeof(path), "%s/state/journal", dir);
}

static void teardown(void)
{
        char cmd[160];

        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        cr_assert_eq(system(cmd), 0);
}

TestSuite(journal, .init = setup, .fini = teardown);

/* Replay collects the chunk ids of chunk_del ops and counts snapshots. */
struct seen {
        uint64_t ids[64];
        size_t n;
        size_t snapshots;
};

static int collect(const Aquaj__JournalRecord *rec, void *userdata)
{
        struct seen *s = userdata;

        for (size_t i = 0; i < rec->n_ops; i++) {
                if (rec->ops[i]->op_case == AQUAJ__JOP__OP_SNAPSHOT) {
                        s->snapshots++;
                        s->n = 0;
                        for (size_t k = 0; k < rec->ops[i]->snapshot->n_chunks; k++)
                                s->ids[s->n++] = rec->ops[i]->snapshot->chunks[k]->id;
                } else if (rec->ops[i]->op_case == AQUAJ__JOP__OP_CHUNK_DEL && s->n < 64)
                        s->ids[s->n++] = rec->ops[i]->chunk_del;
        }
        return 0;
}

static void append_del(struct journal *j, uint64_t id)
{
        Aquaj__JOp op = AQUAJ__JOP__INIT, *ops[] = {&op};
        Aquaj__JournalRecord rec = AQUAJ__JOURNAL_RECORD__INIT;

        op.op_case = AQUAJ__JOP__OP_CHUNK_DEL;
        op.chunk_del = id;
        rec.n_ops = 1;
        rec.ops = ops;
        cr_assert_eq(journal_append(j, &rec), 0);
}

static struct seen reopen(struct journal_replay_stats *stats)
{
        _cleanup_(journal_freep) struct journal *j = NULL;
        struct seen s = {0};

        cr_assert_eq(journal_open(path, collect, &s, &j, stats), 0);
        return s;
}

Test(journal, replays_records_in_the_order_they_were_appended)
{
        _cleanup_(journal_freep) struct journal *j = NULL;
        struct journal_replay_stats stats;
        struct seen s;

        cr_assert_eq(journal_open(path, NULL, NULL, &j, NULL), 0);
        for (uint64_t id = 1; id <= 5; id++)
                append_del(j, id);
        j = journal_free(j);

        s = reopen(&stats);
        cr_assert_eq(stats.records, 5);
        cr_assert_eq(stats.dropped_bytes, 0);
        cr_assert_eq(s.n, 5);
        for (size_t i = 0; i < 5; i++)
                cr_assert_eq(s.ids[i], i + 1);
}

Test(journal, ignores_a_torn_tail_record_and_appends_after_the_last_intact_one)
{
        _cleanup_(journal_freep) struct journal *j = NULL;
        struct journal_replay_stats stats;
        struct stat st;
        struct seen s;

        cr_assert_eq(journal_open(path, NULL, NULL, &j, NULL), 0);
        append_del(j, 1);
        append_del(j, 2);
        j = journal_free(j);
        /* A crash in the middle of writing record 2. */
        cr_assert_eq(stat(path, &st), 0);
        cr_assert_eq(truncate(path, st.st_size - 2), 0);

        s = reopen(&stats);
        cr_assert_eq(s.n, 1);
        cr_assert_eq(s.ids[0], 1);
        cr_assert_gt(stats.dropped_bytes, 0);

        cr_assert_eq(journal_open(path, NULL, NULL, &j, NULL), 0);
        append_del(j, 3);
        j = journal_free(j);
        s = reopen(&stats);
        cr_assert_eq(s.n, 2);
        cr_assert_eq(s.ids[1], 3);
        cr_assert_eq(stats.dropped_bytes, 0);
}

Test(journal, ignores_a_tail_record_with_a_bad_checksum)
{
        _cleanup_(journal_freep) struct journal *j = NULL;
        _cleanup_close_ int fd = -1;
        struct journal_replay_stats stats;
        struct stat st;
        uint8_t b;
        struct seen s;

        cr_assert_eq(journal_open(path, NULL, NULL, &j, NULL), 0);
        append_del(j, 1);
        append_del(j, 2);
        j = journal_free(j);
        fd = open(path, O_RDWR | O_CLOEXEC);
        cr_assert_eq(fstat(fd, &st), 0);
        cr_assert_eq(pread(fd, &b, 1, st.st_size - 1), 1);
        b ^= 0x5a;
        cr_assert_eq(pwrite(fd, &b, 1, st.st_size - 1), 1);

        s = reopen(&stats);
        cr_assert_eq(s.n, 1);
        cr_assert_eq(stats.records, 1);
}

Test(journal, compaction_replaces_the_log_by_one_snapshot_and_appends_follow_it)
{
        _cleanup_(journal_freep) struct journal *j = NULL;
        Aquaj__JChunk c = AQUAJ__JCHUNK__INIT, *chunks[] = {&c};
        Aquaj__JSnapshot snap = AQUAJ__JSNAPSHOT__INIT;
        Aquaj__JOp op = AQUAJ__JOP__INIT, *ops[] = {&op};
        Aquaj__JournalRecord rec = AQUAJ__JOURNAL_RECORD__INIT;
        struct journal_replay_stats stats;
        uint64_t before;
        struct seen s;

        cr_assert_eq(journal_open(path, NULL, NULL, &j, NULL), 0);
        for (uint64_t id = 1; id <= 200; id++)
                append_del(j, id);
        cr_assert(journal_wants_compaction(j, 1024));
        before = journal_size(j);

        c.id = 42;
        snap.n_chunks = 1;
        snap.chunks = chunks;
        op.op_case = AQUAJ__JOP__OP_SNAPSHOT;
        op.snapshot = &snap;
        rec.n_ops = 1;
        rec.ops = ops;
        cr_assert_eq(journal_compact(j, &rec), 0);
        cr_assert_lt(journal_size(j), before);
        cr_assert_not(journal_wants_compaction(j, 1024));
        append_del(j, 7);
        j = journal_free(j);

        s = reopen(&stats);
        cr_assert_eq(stats.records, 2);
        cr_assert_eq(s.snapshots, 1);
        cr_assert_eq(s.n, 2);
        cr_assert_eq(s.ids[0], 42);
        cr_assert_eq(s.ids[1], 7);
}

Test(journal, refuses_a_file_that_is_not_a_journal)
{
        _cleanup_(journal_freep) struct journal *j = NULL;
        FILE *f;

        cr_assert_eq(journal_open(path, NULL, NULL, &j, NULL), 0);
        j = journal_free(j);
        f = fopen(path, "w");
        fputs("endpoint: ipc:///x\n", f);
        fclose(f);
        cr_assert_eq(journal_open(path, NULL, NULL, &j, NULL), -EBADMSG);
}

Test(journal, is_held_by_one_daemon_at_a_time)
{
        _cleanup_(journal_freep) struct journal *a = NULL, *b = NULL;

        cr_assert_eq(journal_open(path, NULL, NULL, &a, NULL), 0);
        cr_assert_eq(journal_open(path, NULL, NULL, &b, NULL), -EBUSY);
}

static int refuse(const Aquaj__JournalRecord *rec, void *userdata)
{
        return -EUCLEAN;
}

Test(journal, stops_replay_at_the_first_error_of_the_callback)
{
        _cleanup_(journal_freep) struct journal *j = NULL;

        cr_assert_eq(journal_open(path, NULL, NULL, &j, NULL), 0);
        append_del(j, 1);
        j = journal_free(j);
        cr_assert_eq(journal_open(path, refuse, NULL, &j, NULL), -EUCLEAN);
}
