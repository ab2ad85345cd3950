/*
 * Fuzz harness for journal replay: the input is a journal file's body (after its magic). It is
 * framed, checked, decoded and applied to a pool, which is then snapshotted, re-applied, and
 * run past its reconcile deadline, as a restart would. A body damaged before its tail is
 * repaired (the copy goes to /dev/shm), and the repaired journal must then open as it is.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "broker.h"
#include "time-util.h"

static const struct broker_settings settings = {
    .dram_budget = UINT64_C(1) << 40,
    .reclaim_deadline_ns = NSEC_PER_SEC,
    .reconcile_timeout_ns = NSEC_PER_SEC,
    .max_chunks = 1 << 16,
    .max_leases = 1 << 14,
    .max_grant_chunks = 4096,
    .auto_pairing = true,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Repair the journal at path into a fresh *p; what is left must replay with no damage. */
static int repair(const char *path, struct broker **p, struct journal **ret)
{
        struct journal_replay_stats stats;
        struct journal *j = NULL;
        char copy[64];
        int r;

        snprintf(copy, sizeof(copy), "/dev/shm/fuzz-journal-%d.corrupt", (int)getpid());
        unlink(copy);
        broker_free(*p);
        *p = NULL;
        if (broker_new(&settings, p) < 0)
                return -ENOMEM;
        r = journal_open_repair(path, copy, broker_apply, *p, &j, &stats);
        unlink(copy);
        if (r < 0)
                return r;
        if (stats.bad_offset == 0)
                abort(); /* journal_open() called it damaged */
        journal_free(j);
        broker_free(*p);
        *p = NULL;
        if (broker_new(&settings, p) < 0)
                return -ENOMEM;
        r = journal_open(path, broker_apply, *p, ret, &stats);
        if (r == -EUCLEAN || (r == 0 && (stats.bad_offset || stats.dropped_bytes)))
                abort(); /* the repair left damage behind */
        return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct broker *p = NULL, *copy = NULL;
        Aquaj__JournalRecord *snap = NULL;
        struct journal *j = NULL;
        char path[64];
        int fd, r;

        fd = memfd_create("journal", MFD_CLOEXEC);
        if (fd < 0)
                return 0;
        if (write(fd, "AQUAJNL1", 8) != 8 || (size && write(fd, data, size) != (ssize_t)size))
                goto out;
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        if (broker_new(&settings, &p) < 0)
                goto out;
        r = journal_open(path, broker_apply, p, &j, NULL);
        if (r == -EUCLEAN)
                r = repair(path, &p, &j);
        if (r < 0)
                goto out;
        broker_attach_journal(p, j, 1 << 20);
        if (broker_snapshot(p, &snap) == 0 && broker_new(&settings, &copy) == 0)
                (void)broker_apply(snap, copy);
        broker_tick(p, now_mono_ns() + 10 * NSEC_PER_SEC);
        (void)broker_commit(p);
out:
        if (snap)
                aquaj__journal_record__free_unpacked(snap, NULL);
        broker_free(copy);
        broker_free(p);
        close(fd);
        return 0;
}
