/*
 * A domain's journal in etcd. Records are keys PREFIX/TERM-SEQ (16 hex digits each, so key order
 * is commit order), each value one packed JournalRecord. A compaction deletes every record before
 * its snapshot and writes the snapshot, in one transaction. Every transaction holds only if the
 * election key still has the create revision and the lease this leader won it with: a leader that
 * lost its lease, or whose key another has taken, writes nothing (-ESTALE).
 */
#include "journal-etcd.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct etcd_journal {
        struct etcd *etcd; /* the caller's */
        char *prefix;
        char *fence_key;
        int64_t fence_revision, fence_lease;
        bool unfenced;
        uint64_t seq; /* of the last record */
};

static void record_key(const struct etcd_journal *j, uint64_t seq, char *buf, size_t size)
{
        snprintf(buf, size, "%s%016" PRIx64 "-%016" PRIx64, j->prefix, (uint64_t)j->fence_revision,
                 seq);
}

struct etcd_journal *etcd_journal_free(struct etcd_journal *j)
{
        if (!j)
                return NULL;
        free(j->prefix);
        free(j->fence_key);
        free(j);
        return NULL;
}

int etcd_journal_open(struct etcd *e, const char *prefix, const struct journal_fence *fence,
                      journal_replay_fn fn, void *userdata, struct etcd_journal **ret,
                      struct journal_replay_stats *ret_stats)
{
        struct journal_replay_stats stats = {0};
        struct etcd_kv *kvs = NULL;
        struct etcd_journal *j;
        size_t n = 0;
        int r;

        j = calloc(1, sizeof(*j));
        if (!j)
                return -ENOMEM;
        j->etcd = e;
        j->prefix = strdup(prefix);
        j->fence_key = strdup(fence->key);
        j->fence_revision = fence->revision;
        j->fence_lease = fence->lease;
        j->unfenced = fence->unfenced;
        if (!j->prefix || !j->fence_key) {
                etcd_journal_free(j);
                return -ENOMEM;
        }
        r = etcd_range(e, prefix, true, &kvs, &n, NULL);
        for (size_t i = 0; r >= 0 && i < n; i++) {
                const char *dash = strrchr(kvs[i].key, '-');
                Aquaj__JournalRecord *rec;

                rec = aquaj__journal_record__unpack(NULL, kvs[i].len, kvs[i].value);
                if (!rec || !dash) {
                        if (rec)
                                aquaj__journal_record__free_unpacked(rec, NULL);
                        stats.bad_offset = i + 1;
                        stats.records_after = n - i - 1;
                        r = -EUCLEAN;
                        break;
                }
                r = fn ? fn(rec, userdata) : 0;
                aquaj__journal_record__free_unpacked(rec, NULL);
                j->seq = strtoull(dash + 1, NULL, 16);
                stats.records++;
                stats.bytes += kvs[i].len;
        }
        etcd_kvs_free(kvs, n);
        if (ret_stats)
                *ret_stats = stats;
        if (r < 0) {
                etcd_journal_free(j);
                return r;
        }
        *ret = j;
        return 0;
}

/* The transaction every write is: fenced, then ops. */
static int fenced(struct etcd_journal *j, const struct etcd_op *ops, size_t n_ops)
{
        const struct etcd_cmp cmp[] = {
            {.key = j->fence_key, .target = ETCD_CMP_CREATE, .value = j->fence_revision},
            {.key = j->fence_key, .target = ETCD_CMP_LEASE, .value = j->fence_lease},
        };
        int r = etcd_txn(j->etcd, cmp, j->unfenced ? 0 : 2, ops, n_ops, NULL);

        return r < 0 ? r : r == 0 ? -ESTALE : 0;
}

int etcd_journal_append(struct etcd_journal *j, const uint8_t *rec, size_t len)
{
        char key[512];
        int r;

        record_key(j, j->seq + 1, key, sizeof(key));
        r = fenced(j, &(struct etcd_op){.kind = ETCD_OP_PUT, .key = key, .value = rec, .len = len},
                   1);
        if (r >= 0)
                j->seq++;
        return r;
}

int etcd_journal_compact(struct etcd_journal *j, const uint8_t *snap, size_t len)
{
        char key[512];
        int r;

        /* Every record before the snapshot goes: the range ends at the snapshot's key. */
        record_key(j, j->seq + 1, key, sizeof(key));
        const struct etcd_op ops[] = {
            {.kind = ETCD_OP_DELETE_RANGE, .key = j->prefix, .end = key},
            {.kind = ETCD_OP_PUT, .key = key, .value = snap, .len = len},
        };
        r = fenced(j, ops, 2);
        if (r >= 0)
                j->seq++;
        return r;
}
