/*
 * The journal: records replay in order, a torn tail is cut off, damage before the tail is refused
 * (or repaired on request, keeping a copy), compaction keeps the state.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* Append id to j (closed then), reopen: n records replay, id the last, nothing cut or damaged. */
static void appends_follow(struct journal *j, uint64_t id, size_t n)
{
        struct journal_replay_stats stats;
        struct seen s;

        append_del(j, id);
        journal_free(j);
        s = reopen(&stats);
        cr_assert_eq(s.n, n);
        cr_assert_eq(s.ids[n - 1], id);
        cr_assert_eq(stats.dropped_bytes, 0);
        cr_assert_eq(stats.bad_offset, 0);
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
        appends_follow(TAKE_PTR(j), 3, 2);
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
        return -ECANCELED;
}

Test(journal, stops_replay_at_the_first_error_of_the_callback)
{
        _cleanup_(journal_freep) struct journal *j = NULL;

        cr_assert_eq(journal_open(path, NULL, NULL, &j, NULL), 0);
        append_del(j, 1);
        j = journal_free(j);
        cr_assert_eq(journal_open(path, refuse, NULL, &j, NULL), -ECANCELED);
}

/* ------------------------------------------------ damage before the tail, and its repair */

/* The whole file at p, malloc'd; *ret_len its size. */
static uint8_t *slurp(const char *p, size_t *ret_len)
{
        _cleanup_close_ int fd = open(p, O_RDONLY | O_CLOEXEC);
        struct stat st;
        uint8_t *buf;

        cr_assert_geq(fd, 0, "open %s", p);
        cr_assert_eq(fstat(fd, &st), 0);
        buf = malloc((size_t)st.st_size + 1);
        cr_assert_not_null(buf);
        cr_assert_eq(pread(fd, buf, (size_t)st.st_size, 0), st.st_size);
        *ret_len = (size_t)st.st_size;
        return buf;
}

/* A journal of records deleting chunks 1..n; offsets[i] is where record i + 1 starts. */
static void write_records(size_t n, uint64_t *offsets)
{
        _cleanup_(journal_freep) struct journal *j = NULL;

        cr_assert_eq(journal_open(path, NULL, NULL, &j, NULL), 0);
        for (uint64_t id = 1; id <= n; id++) {
                offsets[id - 1] = journal_size(j);
                append_del(j, id);
        }
}

static void flip_bit(uint64_t off, int bit)
{
        _cleanup_close_ int fd = open(path, O_RDWR | O_CLOEXEC);
        uint8_t b;

        cr_assert_eq(pread(fd, &b, 1, (off_t)off), 1);
        b ^= (uint8_t)(1u << bit);
        cr_assert_eq(pwrite(fd, &b, 1, (off_t)off), 1);
}

/* Opening must fail with -EUCLEAN naming bad_offset, and leave every byte of the file as it was. */
static void assert_refused_untouched(uint64_t bad_offset)
{
        _cleanup_(journal_freep) struct journal *j = NULL;
        _cleanup_free_ uint8_t *before = NULL, *after = NULL;
        struct journal_replay_stats stats = {0};
        size_t n_before, n_after;

        before = slurp(path, &n_before);
        cr_assert_eq(journal_open(path, NULL, NULL, &j, &stats), -EUCLEAN);
        cr_assert_null(j);
        cr_assert_eq(stats.bad_offset, bad_offset);
        cr_assert_eq(stats.records_after, 1);
        after = slurp(path, &n_after);
        cr_assert_eq(n_after, n_before, "the file keeps its length");
        cr_assert_eq(memcmp(before, after, n_before), 0, "the file keeps its bytes");
}

Test(journal, refuses_a_record_with_a_bad_checksum_before_intact_ones_and_names_its_offset)
{
        uint64_t off[4];

        write_records(4, off);
        /* One flipped bit in the body of record 3 of 4. */
        flip_bit(off[2] + 8 + 1, 3);
        assert_refused_untouched(off[2]);
}

Test(journal, refuses_a_record_whose_length_was_corrupted_before_intact_ones)
{
        uint64_t off[4];

        write_records(4, off);
        /* Record 3 now claims to run far past the end of the file, as a torn append would. */
        flip_bit(off[2] + 2, 4);
        assert_refused_untouched(off[2]);
}

Test(journal, cuts_a_tail_of_zeros_a_power_loss_left_after_the_last_record)
{
        _cleanup_close_ int fd = -1;
        struct journal_replay_stats stats;
        uint8_t zeros[64] = {0};
        uint64_t off[2];
        struct stat st;
        struct seen s;

        write_records(2, off);
        fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
        cr_assert_eq(write(fd, zeros, sizeof(zeros)), (ssize_t)sizeof(zeros));

        s = reopen(&stats);
        cr_assert_eq(stats.records, 2, "zeros are not records");
        cr_assert_eq(s.n, 2);
        cr_assert_eq(stats.dropped_bytes, sizeof(zeros));
        cr_assert_eq(stats.bad_offset, 0, "a torn tail, not damage");
        cr_assert_eq(stat(path, &st), 0);
        cr_assert_eq((uint64_t)st.st_size, 8 + stats.bytes, "cut after the last record");
}

Test(journal, repair_keeps_a_copy_of_the_file_and_cuts_it_at_the_bad_record)
{
        _cleanup_(journal_freep) struct journal *j = NULL;
        _cleanup_free_ uint8_t *damaged = NULL, *copy = NULL;
        struct journal_replay_stats stats = {0};
        char copy_path[160];
        size_t n_damaged, n_copy;
        uint64_t off[4];
        struct stat st;
        struct seen s = {0};

        write_records(4, off);
        flip_bit(off[2] + 8 + 1, 3);
        damaged = slurp(path, &n_damaged);
        snprintf(copy_path, sizeof(copy_path), "%s.corrupt-test", path);

        cr_assert_eq(journal_open_repair(path, copy_path, collect, &s, &j, &stats), 0);
        cr_assert_eq(s.n, 2, "the records before the bad one replay");
        cr_assert_eq(s.ids[1], 2);
        cr_assert_eq(stats.bad_offset, off[2]);
        cr_assert_eq(stats.records_after, 1, "one intact record after it is dropped");
        cr_assert_eq(stats.dropped_bytes, n_damaged - off[2]);
        cr_assert_eq(stat(path, &st), 0);
        cr_assert_eq((uint64_t)st.st_size, off[2], "cut at the bad record");
        copy = slurp(copy_path, &n_copy);
        cr_assert_eq(n_copy, n_damaged);
        cr_assert_eq(memcmp(copy, damaged, n_copy), 0, "the copy is the damaged file as it was");

        /* Appends follow the last record kept, and the repaired journal opens plainly. */
        appends_follow(TAKE_PTR(j), 9, 3);
}

Test(journal, repair_leaves_a_sound_journal_alone_and_makes_no_copy)
{
        _cleanup_(journal_freep) struct journal *j = NULL;
        struct journal_replay_stats stats = {0};
        char copy_path[160];
        uint64_t off[3];
        struct seen s = {0};

        write_records(3, off);
        snprintf(copy_path, sizeof(copy_path), "%s.corrupt-test", path);
        cr_assert_eq(journal_open_repair(path, copy_path, collect, &s, &j, &stats), 0);
        cr_assert_eq(s.n, 3);
        cr_assert_eq(stats.bad_offset, 0);
        cr_assert_eq(stats.dropped_bytes, 0);
        cr_assert_neq(access(copy_path, F_OK), 0, "no copy of a sound journal");
}
