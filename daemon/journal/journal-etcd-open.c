/* A domain's journal in etcd: a new leader's read of the state, by pages at one revision, and
 * the move of a domain's log of records to objects (journal-etcd.c says how the keys are laid
 * out). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "journal-etcd-private.h"

struct reader {
        struct etcd_journal *j;
        int64_t revision; /* every page at one revision */
        journal_replay_fn fn;
        void *userdata;
        struct journal_replay_stats *stats;
        /* the kind of object being read: its message, its operation */
        const ProtobufCMessageDescriptor *d;
        Aquaj__JOp__OpCase kind;
};

/* Every key starting with prefix, by pages, each through fn. */
static int read_all(struct reader *rd, const char *prefix, size_t limit,
                    int (*fn)(struct reader *rd, const struct etcd_kv *kv))
{
        _cleanup_free_ char *from = NULL;
        bool more = true;

        while (more) {
                struct etcd_kv *kvs = NULL;
                size_t n = 0;
                int64_t rev = 0;
                int r = etcd_range_page(rd->j->etcd, prefix, from, rd->revision, limit, &kvs, &n,
                                        &rev, &more);
                if (r < 0)
                        return fail(rd->j, r, "%s", etcd_error(rd->j->etcd));
                if (!rd->revision)
                        rd->revision = rev;
                for (size_t i = 0; i < n && r >= 0; i++)
                        r = fn(rd, &kvs[i]);
                if (r >= 0 && n) {
                        size_t kl = strlen(kvs[n - 1].key);
                        free(from);
                        /* the next key after the last: the same with a 0 byte appended */
                        from = malloc(kl + 2);
                        if (!from)
                                r = -ENOMEM;
                        else {
                                memcpy(from, kvs[n - 1].key, kl + 1);
                                /* etcd keys are bytes; ours are text: "\x01" is past "\0" */
                                from[kl] = 1;
                                from[kl + 1] = 0;
                        }
                }
                etcd_kvs_free(kvs, n);
                if (r < 0)
                        return r;
                if (n == 0)
                        break;
        }
        return 0;
}

static int mirror_kv(struct reader *rd, const struct etcd_kv *kv)
{
        struct entry *m = map_ensure(&rd->j->mirror, kv->key);

        if (!m || entry_set(m, kv->value, kv->len) < 0)
                return -ENOMEM;
        rd->j->bytes += kv->len;
        rd->stats->records++;
        rd->stats->bytes += kv->len;
        return 0;
}

/* Replay one decoded message as a record of one operation. */
static int replay_one(struct reader *rd, Aquaj__JOp *op)
{
        Aquaj__JOp *ops[] = {op};
        Aquaj__JournalRecord rec = AQUAJ__JOURNAL_RECORD__INIT;

        rec.ops = ops;
        rec.n_ops = 1;
        return rd->fn ? rd->fn(&rec, rd->userdata) : 0;
}

static int bad(struct reader *rd, const char *key)
{
        rd->stats->bad_offset = rd->stats->records + 1;
        return fail(rd->j, -EUCLEAN, "the key %s does not decode", key);
}

/* One object of a kind (its message's descriptor) replayed as a record of one operation. */
static int read_object(struct reader *rd, const struct etcd_kv *kv,
                       const ProtobufCMessageDescriptor *d, Aquaj__JOp__OpCase kind)
{
        ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, kv->len, kv->value);
        Aquaj__JOp op = AQUAJ__JOP__INIT;
        int r;

        if (!m)
                return bad(rd, kv->key);
        op.op_case = kind;
        switch (kind) {
        case AQUAJ__JOP__OP_SNAPSHOT:
                op.snapshot = (Aquaj__JSnapshot *)m;
                break;
        case AQUAJ__JOP__OP_LEASE_SET:
                op.lease_set = (Aquaj__JLease *)m;
                break;
        case AQUAJ__JOP__OP_GPU_SET:
                op.gpu_set = (Aquaj__JGpu *)m;
                break;
        default:
                op.pair_set = (Aquaj__JPair *)m;
                break;
        }
        r = replay_one(rd, &op);
        protobuf_c_message_free_unpacked(m, NULL);
        return r < 0 ? r : mirror_kv(rd, kv);
}

static int read_kind(struct reader *rd, const struct etcd_kv *kv)
{
        return read_object(rd, kv, rd->d, rd->kind);
}

/* A page of chunks replayed as one record of its chunks. */
static int read_page(struct reader *rd, const struct etcd_kv *kv)
{
        Aquaj__JournalRecord rec = AQUAJ__JOURNAL_RECORD__INIT;
        _cleanup_free_ Aquaj__JChunk *cs = NULL;
        _cleanup_free_ Aquaj__JOp *ops = NULL;
        _cleanup_free_ Aquaj__JOp **ptrs = NULL;
        struct page *p = NULL;
        int r = page_decode(kv->value, kv->len, &p);

        if (r == -EBADMSG)
                return bad(rd, kv->key);
        if (r < 0)
                return r;
        cs = calloc(p->n ? p->n : 1, sizeof(*cs));
        ops = calloc(p->n ? p->n : 1, sizeof(*ops));
        ptrs = calloc(p->n ? p->n : 1, sizeof(*ptrs));
        if (!cs || !ops || !ptrs) {
                page_free(p);
                return -ENOMEM;
        }
        for (size_t i = 0; i < p->n; i++) {
                page_chunk(p, i, &cs[i]);
                aquaj__jop__init(&ops[i]);
                ops[i].op_case = AQUAJ__JOP__OP_CHUNK_SET;
                ops[i].chunk_set = &cs[i];
                ptrs[i] = &ops[i];
        }
        rec.ops = ptrs;
        rec.n_ops = p->n;
        r = rd->fn ? rd->fn(&rec, rd->userdata) : 0;
        page_free(p);
        return r < 0 ? r : mirror_kv(rd, kv);
}

static int read_state(struct reader *rd)
{
        static const struct {
                const char *tail;
                size_t limit;
                const ProtobufCMessageDescriptor *d; /* NULL: chunk pages */
                Aquaj__JOp__OpCase kind;
        } kinds[] = {
            /* meta first (a snapshot of just the ids, on an empty core); leases before the
             * chunks that name them */
            {"meta", 1, &aquaj__jsnapshot__descriptor, AQUAJ__JOP__OP_SNAPSHOT},
            {"lease/", READ_PAGE_KEYS, &aquaj__jlease__descriptor, AQUAJ__JOP__OP_LEASE_SET},
            {"chunk/", READ_PAGE_CHUNK_KEYS, NULL, AQUAJ__JOP__OP_CHUNK_SET},
            {"gpu/", READ_PAGE_KEYS, &aquaj__jgpu__descriptor, AQUAJ__JOP__OP_GPU_SET},
            {"pin/", READ_PAGE_KEYS, &aquaj__jpair__descriptor, AQUAJ__JOP__OP_PAIR_SET},
        };
        int r = 0;

        for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]) && r >= 0; i++) {
                _cleanup_free_ char *prefix = key_of(rd->j, "%s", kinds[i].tail);
                if (!prefix)
                        return -ENOMEM;
                rd->d = kinds[i].d;
                rd->kind = kinds[i].kind;
                r = read_all(rd, prefix, kinds[i].limit, kinds[i].d ? read_kind : read_page);
        }
        return r;
}

/* The log of records a domain kept before objects: replayed through fn and into pending. */
static int read_log_record(struct reader *rd, const struct etcd_kv *kv)
{
        Aquaj__JournalRecord *rec = aquaj__journal_record__unpack(NULL, kv->len, kv->value);
        int r;

        if (!rec)
                return bad(rd, kv->key);
        r = rd->fn ? rd->fn(rec, rd->userdata) : 0;
        if (r >= 0)
                r = apply_record(rd->j, rec);
        aquaj__journal_record__free_unpacked(rec, NULL);
        rd->stats->records++;
        rd->stats->bytes += kv->len;
        return r;
}

/* Write the pending state in as many fenced transactions as it takes (nobody reads it before
 * seq exists), then seq and the log's removal in one. */
static int migrate(struct etcd_journal *j)
{
        struct write w = {0};
        char seq[64];
        int r;

        r = plan(j, &w);
        for (size_t done = 0; r >= 0 && done < w.n;) {
                size_t n = 0, bytes = 0;
                while (done + n < w.n && n < TXN_MAX_OPS - 1 &&
                       bytes + strlen(w.ops[done + n].key) + w.ops[done + n].len <= TXN_MAX_BYTES) {
                        bytes += strlen(w.ops[done + n].key) + w.ops[done + n].len;
                        n++;
                }
                if (n == 0)
                        n = 1; /* one object larger than the budget: alone */
                const struct etcd_cmp cmp[] = {
                    {.key = j->seq_key, .target = ETCD_CMP_VERSION, .value = 0},
                    {.key = j->fence_key, .target = ETCD_CMP_CREATE, .value = j->fence_revision},
                    {.key = j->fence_key, .target = ETCD_CMP_LEASE, .value = j->fence_lease},
                };
                r = etcd_txn(j->etcd, cmp, j->unfenced ? 1 : 3, w.ops + done, n, NULL);
                if (r == 0)
                        r = fail(j, -ESTALE, "lost the lead while moving the journal to objects");
                else if (r < 0)
                        r = fail(j, r, "%s", etcd_error(j->etcd));
                done += n;
        }
        if (r >= 0) {
                const struct etcd_op last[] = {
                    {.kind = ETCD_OP_PUT, .key = j->seq_key, .value = seq},
                    {.kind = ETCD_OP_DELETE_RANGE, .key = j->log},
                };
                struct etcd_op ops[2] = {last[0], last[1]};
                seq_put(j, seq, sizeof(seq), &ops[0]);
                r = txn(j, ops, 2);
                if (r == 0)
                        r = fail(j, -ESTALE, "lost the lead while moving the journal to objects");
                else if (r < 0)
                        r = fail(j, r, "%s", etcd_error(j->etcd));
        }
        if (r >= 0) {
                forget_written(j, &w, true);
                j->seq_version++;
                map_clear(&j->pending);
        }
        write_done(&w);
        return r;
}

struct etcd_journal *etcd_journal_free(struct etcd_journal *j)
{
        if (!j)
                return NULL;
        map_clear(&j->mirror);
        map_clear(&j->pending);
        free(j->state);
        free(j->log);
        free(j->fence_key);
        free(j->seq_key);
        free(j);
        return NULL;
}

int etcd_journal_open(struct etcd *e, const char *root, const struct journal_fence *fence,
                      journal_replay_fn fn, void *userdata, struct etcd_journal **ret,
                      struct journal_replay_stats *ret_stats)
{
        struct journal_replay_stats stats = {0};
        struct etcd_journal *j;
        struct etcd_kv *kv = NULL;
        size_t n = 0;
        int r;

        j = calloc(1, sizeof(*j));
        if (!j)
                return -ENOMEM;
        j->etcd = e;
        j->fence_key = strdup(fence->key);
        j->fence_revision = fence->revision;
        j->fence_lease = fence->lease;
        j->unfenced = fence->unfenced;
        if (asprintf(&j->state, "%sstate/", root) < 0)
                j->state = NULL;
        if (asprintf(&j->log, "%sjournal/", root) < 0)
                j->log = NULL;
        j->seq_key = j->state ? key_of(j, "seq") : NULL;
        if (!j->fence_key || !j->state || !j->log || !j->seq_key) {
                etcd_journal_free(j);
                return -ENOMEM;
        }
        struct reader rd = {.j = j, .fn = fn, .userdata = userdata, .stats = &stats};

        r = etcd_range(e, j->seq_key, false, &kv, &n, &rd.revision);
        if (r < 0)
                r = fail(j, r, "%s", etcd_error(e));
        else if (n == 1) {
                j->seq_version = kv[0].version;
                if (r >= 0)
                        r = read_state(&rd);
        } else {
                /* No state yet, or only a move to it that did not finish: from the log. */
                _cleanup_free_ char *state = strdup(j->state);
                const struct etcd_op clear = {.kind = ETCD_OP_DELETE_RANGE, .key = state};
                r = state ? 0 : -ENOMEM;
                if (r >= 0)
                        r = read_all(&rd, j->log, READ_PAGE_CHUNK_KEYS, read_log_record);
                if (r >= 0 && (stats.records > 0)) {
                        const struct etcd_cmp cmp[] = {
                            {.key = j->fence_key, .target = ETCD_CMP_CREATE,
                             .value = j->fence_revision},
                            {.key = j->fence_key, .target = ETCD_CMP_LEASE,
                             .value = j->fence_lease},
                        };
                        r = etcd_txn(e, cmp, j->unfenced ? 0 : 2, &clear, 1, NULL);
                        if (r == 0)
                                r = fail(j, -ESTALE, "lost the lead before moving the journal");
                        else if (r < 0)
                                r = fail(j, r, "%s", etcd_error(e));
                        if (r >= 0)
                                r = migrate(j);
                }
        }
        etcd_kvs_free(kv, n);
        if (ret_stats)
                *ret_stats = stats;
        if (r < 0) {
                if (ret_stats && r != -EUCLEAN)
                        ret_stats->bad_offset = 0;
                etcd_journal_free(j);
                return r;
        }
        *ret = j;
        return 0;
}

