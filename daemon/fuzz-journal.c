/*
 * Fuzz harness for journal replay: the input is a journal file's body (after its magic). It is
 * framed, checked, decoded and applied to a pool, which is then snapshotted, re-applied, and
 * run past its reconcile deadline, as a restart would.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pool.h"
#include "time-util.h"

static const struct pool_settings settings = {
    .dram_budget = UINT64_C(1) << 40,
    .reclaim_deadline_ns = NSEC_PER_SEC,
    .reconcile_timeout_ns = NSEC_PER_SEC,
    .max_chunks = 1 << 16,
    .max_leases = 1 << 14,
    .max_grant_chunks = 4096,
    .auto_pairing = true,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct pool *p = NULL, *copy = NULL;
        Aquaj__JournalRecord *snap = NULL;
        struct journal *j = NULL;
        char path[64];
        int fd;

        fd = memfd_create("journal", MFD_CLOEXEC);
        if (fd < 0)
                return 0;
        if (write(fd, "AQUAJNL1", 8) != 8 || (size && write(fd, data, size) != (ssize_t)size))
                goto out;
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        if (pool_new(&settings, &p) < 0)
                goto out;
        if (journal_open(path, pool_apply, p, &j, NULL) < 0)
                goto out;
        pool_attach_journal(p, j, 1 << 20);
        if (pool_snapshot(p, &snap) == 0 && pool_new(&settings, &copy) == 0)
                (void)pool_apply(snap, copy);
        pool_tick(p, now_mono_ns() + 10 * NSEC_PER_SEC);
        (void)pool_commit(p);
out:
        if (snap)
                aquaj__journal_record__free_unpacked(snap, NULL);
        pool_free(copy);
        pool_free(p);
        close(fd);
        return 0;
}
