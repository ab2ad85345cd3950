/*
 * A domain's state in etcd, as objects (daemon/README.md, "A domain on etcd"). Each thing the
 * core journals is a key under ROOT/state/, written only when a commit changes it:
 *   seq               the commits so far; every commit compares its version and writes it
 *   meta              the next chunk and lease ids (a JSnapshot of just those)
 *   gpu/UUID          a JGpu
 *   lease/ID          a JLease (16 hex digits)
 *   pin/P/C           a JPair (each uuid in hex)
 *   chunk/PAGE        a JChunkPage: the chunks whose ids are PAGE * 512 ... + 511, a run of
 *                     consecutive ones alike but for id and client_ref as one entry
 * So the state's size follows what the domain holds, not how long it has run; a commit writes
 * the keys its operations change, in one transaction, fenced (the election key still has this
 * leader's create revision and lease, else -ESTALE) and ordered (seq's version is the one this
 * leader last wrote, so an attempt that failed here but that etcd applied later can never land
 * after a newer one). A key an uncertain attempt wrote is written again by the next commit,
 * whatever it holds. A commit too large for one transaction is refused (-E2BIG) on its own:
 * its operations stay here, and the undo that follows returns those keys to what etcd has.
 *
 * Here a mirror of what etcd holds (each key's value) lets a commit write only what differs, and
 * the pending changes of a commit not yet written are kept until one is.
 *
 * A domain whose journal is still the log of records under ROOT/journal/ (TERM-SEQ keys) is
 * moved to objects when a leader first opens it: the state is written in batches, then seq and
 * the log's removal in one last transaction; until then nobody reads the batches.
 */
#include "journal-etcd.h"
#include "journal-etcd-private.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------ keys */

char *key_of(const struct etcd_journal *j, const char *fmt, ...)
{
        char *tail = NULL, *key = NULL;
        va_list ap;
        int r;

        va_start(ap, fmt);
        r = vasprintf(&tail, fmt, ap);
        va_end(ap);
        if (r < 0)
                return NULL;
        if (asprintf(&key, "%s%s", j->state, tail) < 0)
                key = NULL;
        free(tail);
        return key;
}

static char *hex(const char *s)
{
        size_t n = strlen(s);
        char *h = malloc(2 * n + 1);

        if (!h)
                return NULL;
        for (size_t i = 0; i < n; i++)
                snprintf(h + 2 * i, 3, "%02x", (uint8_t)s[i]);
        h[2 * n] = 0;
        return h;
}

static char *pin_key(const struct etcd_journal *j, const char *producer, const char *consumer)
{
        _cleanup_free_ char *p = hex(producer), *c = hex(consumer);

        return p && c ? key_of(j, "pin/%s/%s", p, c) : NULL;
}

/* ------------------------------------------------------------------------------ pending */

/* The pending entry of key, starting from what the mirror holds. */
static struct entry *pending(struct etcd_journal *j, const char *key)
{
        struct entry *e = map_get(&j->pending, key), *m;

        if (e)
                return e;
        e = map_ensure(&j->pending, key);
        if (!e)
                return NULL;
        m = map_get(&j->mirror, key);
        if (m && m->present && entry_set(e, m->value, m->len) < 0) {
                map_remove(&j->pending, key);
                return NULL;
        }
        return e;
}

static int pending_chunk_page(struct etcd_journal *j, uint64_t id, struct page **ret)
{
        _cleanup_free_ char *key = key_of(j, "chunk/%016" PRIx64, id >> PAGE_SHIFT);
        struct entry *e;
        int r;

        if (!key)
                return -ENOMEM;
        e = pending(j, key);
        if (!e)
                return -ENOMEM;
        if (!e->page) {
                r = page_decode(e->present ? e->value : NULL, e->len, &e->page);
                if (r < 0)
                        return r;
        }
        *ret = e->page;
        return 0;
}

static int set_chunk(struct etcd_journal *j, const Aquaj__JChunk *c)
{
        struct page *p;
        int r = pending_chunk_page(j, c->id, &p);

        return r < 0 ? r : page_set(p, c);
}

static int del_chunk(struct etcd_journal *j, uint64_t id)
{
        struct page *p;
        int r = pending_chunk_page(j, id, &p);

        if (r >= 0)
                page_del(p, id);
        return r;
}

/* key's next value: packed from msg by pack (NULL: delete it). */
static int put_packed(struct etcd_journal *j, char *key, const ProtobufCMessage *msg)
{
        _cleanup_free_ char *k = key;
        _cleanup_free_ uint8_t *buf = NULL;
        struct entry *e;
        size_t len = 0;

        if (!k)
                return -ENOMEM;
        if (msg) {
                len = protobuf_c_message_get_packed_size(msg);
                buf = malloc(len ? len : 1);
                if (!buf)
                        return -ENOMEM;
                protobuf_c_message_pack(msg, buf);
        }
        e = pending(j, k);
        if (!e)
                return -ENOMEM;
        return entry_set(e, buf, len);
}

/* Delete every pin with uuid on either side: those in etcd and those pending. */
static int del_pins(struct etcd_journal *j, const char *uuid)
{
        _cleanup_free_ char *h = hex(uuid), *prefix = key_of(j, "pin/");
        size_t plen;
        int r = 0;

        if (!h || !prefix)
                return -ENOMEM;
        plen = strlen(prefix);
        /* Collect first: pending() adds to the map being walked. */
        for (int pass = 0; pass < 2 && r >= 0; pass++) {
                struct map *m = pass ? &j->pending : &j->mirror;
                char **keys = NULL;
                size_t n = 0;

                MAP_FOREACH(m, e)
                {
                        const char *rest = e->key + plen;
                        const char *slash;
                        if (strncmp(e->key, prefix, plen) != 0 || !(slash = strchr(rest, '/')))
                                continue;
                        size_t hl = strlen(h);
                        if (!((size_t)(slash - rest) == hl && strncmp(rest, h, hl) == 0) &&
                            strcmp(slash + 1, h) != 0)
                                continue;
                        char **k2 = reallocarray(keys, n + 1, sizeof(*keys));
                        if (!k2 || !(k2[n] = strdup(e->key))) {
                                keys = k2 ? k2 : keys;
                                r = -ENOMEM;
                                break;
                        }
                        keys = k2;
                        n++;
                }
                for (size_t i = 0; i < n; i++) {
                        struct entry *e = r >= 0 ? pending(j, keys[i]) : NULL;
                        if (r >= 0 && !e)
                                r = -ENOMEM;
                        if (e)
                                entry_set(e, NULL, 0);
                        free(keys[i]);
                }
                free(keys);
        }
        return r;
}

static int put_meta(struct etcd_journal *j, uint64_t next_chunk, uint64_t next_lease)
{
        Aquaj__JSnapshot meta = AQUAJ__JSNAPSHOT__INIT;

        meta.next_chunk_id = next_chunk;
        meta.next_lease_id = next_lease;
        return put_packed(j, key_of(j, "meta"), &meta.base);
}

/* A snapshot replaces the whole state: every key not in it goes. */
static int apply_snapshot(struct etcd_journal *j, const Aquaj__JSnapshot *s)
{
        _cleanup_free_ char *seq = strdup(j->seq_key);
        int r = 0;

        if (!seq)
                return -ENOMEM;
        for (int pass = 0; pass < 2; pass++) {
                struct map *m = pass ? &j->pending : &j->mirror;
                char **keys = calloc(m->n ? m->n : 1, sizeof(*keys));
                size_t n = 0;

                if (!keys)
                        return -ENOMEM;
                MAP_FOREACH(m, e)
                if (strcmp(e->key, seq) != 0 && (e->present || e->page || e->unknown) &&
                    !(keys[n++] = strdup(e->key)))
                        r = -ENOMEM;
                for (size_t i = 0; i < n; i++) {
                        struct entry *e = r >= 0 && keys[i] ? pending(j, keys[i]) : NULL;
                        if (e) {
                                entry_set(e, NULL, 0);
                                if (e->page) {
                                        page_free(e->page);
                                        e->page = calloc(1, sizeof(*e->page));
                                        if (!e->page)
                                                r = -ENOMEM;
                                }
                        } else if (r >= 0)
                                r = -ENOMEM;
                        free(keys[i]);
                }
                free(keys);
                if (r < 0)
                        return r;
        }
        for (size_t i = 0; i < s->n_leases && r >= 0; i++)
                r = put_packed(j, key_of(j, "lease/%016" PRIx64, s->leases[i]->id),
                               &s->leases[i]->base);
        for (size_t i = 0; i < s->n_chunks && r >= 0; i++)
                r = set_chunk(j, s->chunks[i]);
        for (size_t i = 0; i < s->n_gpus && r >= 0; i++)
                r = put_packed(j, key_of(j, "gpu/%s", s->gpus[i]->uuid), &s->gpus[i]->base);
        for (size_t i = 0; i < s->n_pairs && r >= 0; i++)
                r = put_packed(j, pin_key(j, s->pairs[i]->producer, s->pairs[i]->consumer),
                               &s->pairs[i]->base);
        if (r >= 0)
                r = put_meta(j, s->next_chunk_id, s->next_lease_id);
        return r;
}

/* The highest ids a record names, so that meta says what the next ones are. */
struct ids {
        uint64_t chunk, lease;
        bool changed;
};

static int apply_op(struct etcd_journal *j, const Aquaj__JOp *op, struct ids *ids)
{
        switch (op->op_case) {
        case AQUAJ__JOP__OP_SNAPSHOT:
                ids->changed = false;
                ids->chunk = MAX(ids->chunk, op->snapshot->next_chunk_id);
                ids->lease = MAX(ids->lease, op->snapshot->next_lease_id);
                return apply_snapshot(j, op->snapshot);
        case AQUAJ__JOP__OP_CHUNK_SET:
                if (op->chunk_set->id >= ids->chunk) {
                        ids->chunk = op->chunk_set->id + 1;
                        ids->changed = true;
                }
                return set_chunk(j, op->chunk_set);
        case AQUAJ__JOP__OP_CHUNK_DEL:
                return del_chunk(j, op->chunk_del);
        case AQUAJ__JOP__OP_LEASE_SET:
                if (op->lease_set->id >= ids->lease) {
                        ids->lease = op->lease_set->id + 1;
                        ids->changed = true;
                }
                return put_packed(j, key_of(j, "lease/%016" PRIx64, op->lease_set->id),
                                  &op->lease_set->base);
        case AQUAJ__JOP__OP_LEASE_DEL:
                return put_packed(j, key_of(j, "lease/%016" PRIx64, op->lease_del), NULL);
        case AQUAJ__JOP__OP_GPU_SET:
                return put_packed(j, key_of(j, "gpu/%s", op->gpu_set->uuid), &op->gpu_set->base);
        case AQUAJ__JOP__OP_PAIR_SET:
                return put_packed(j, pin_key(j, op->pair_set->producer, op->pair_set->consumer),
                                  &op->pair_set->base);
        case AQUAJ__JOP__OP_PAIR_DEL:
                return del_pins(j, op->pair_del);
        default:
                return 0;
        }
}

/* The meta key as the mirror and pending changes have it. */
static void current_meta(struct etcd_journal *j, struct ids *ids)
{
        _cleanup_free_ char *key = key_of(j, "meta");
        struct entry *e = key ? map_get(&j->pending, key) : NULL;
        Aquaj__JSnapshot *m;

        if (!e && key)
                e = map_get(&j->mirror, key);
        if (!e || !e->present)
                return;
        m = aquaj__jsnapshot__unpack(NULL, e->len, e->value);
        if (!m)
                return;
        ids->chunk = MAX(ids->chunk, m->next_chunk_id);
        ids->lease = MAX(ids->lease, m->next_lease_id);
        aquaj__jsnapshot__free_unpacked(m, NULL);
}

int apply_record(struct etcd_journal *j, const Aquaj__JournalRecord *rec)
{
        struct ids ids = {0}, before = {0};
        int r = 0;

        current_meta(j, &before);
        ids = before;
        for (size_t i = 0; i < rec->n_ops && r >= 0; i++)
                r = apply_op(j, rec->ops[i], &ids);
        if (r >= 0 && ids.changed && (ids.chunk != before.chunk || ids.lease != before.lease))
                r = put_meta(j, ids.chunk, ids.lease);
        return r;
}

/* ------------------------------------------------------------------------------ commit */

int fail(struct etcd_journal *j, int r, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(j->error, sizeof(j->error), fmt, ap);
        va_end(ap);
        return r;
}

void write_done(struct write *w)
{
        free(w->ops);
        free(w->entries);
        *w = (struct write){0};
}

/* What the pending changes write: each key whose value differs from etcd's, or may. Pages are
 * encoded into e->value here. */
int plan(struct etcd_journal *j, struct write *w)
{
        size_t n = j->pending.n;

        *w = (struct write){0};
        w->ops = calloc(n + 1, sizeof(*w->ops));
        w->entries = calloc(n + 1, sizeof(*w->entries));
        if (!w->ops || !w->entries)
                return -ENOMEM;
        MAP_FOREACH(&j->pending, e)
        {
                struct entry *m = map_get(&j->mirror, e->key);
                if (e->page) {
                        uint8_t *buf;
                        size_t len;
                        int r = page_encode(e->page, &buf, &len);
                        if (r < 0)
                                return r;
                        free(e->value);
                        e->value = buf;
                        e->len = len;
                        e->present = buf != NULL;
                }
                bool same = m && !m->unknown && m->present == e->present &&
                            (!e->present || (m->len == e->len && memcmp(m->value, e->value, e->len) == 0));
                if (same || (!m && !e->present))
                        continue;
                w->ops[w->n] = (struct etcd_op){
                    .kind = e->present ? ETCD_OP_PUT : ETCD_OP_DELETE,
                    .key = e->key,
                    .value = e->value,
                    .len = e->len,
                };
                w->entries[w->n] = e;
                w->bytes += strlen(e->key) + e->len;
                w->n++;
        }
        return 0;
}

int seq_put(struct etcd_journal *j, char *buf, size_t size, struct etcd_op *op)
{
        snprintf(buf, size, "%" PRId64 " %" PRId64, j->fence_revision, j->seq_version + 1);
        *op = (struct etcd_op){.kind = ETCD_OP_PUT, .key = j->seq_key, .value = buf,
                               .len = strlen(buf)};
        return 0;
}

/* One fenced, ordered transaction of n ops (the first being seq's). 1 done, 0 a condition
 * failed, or a negative errno. */
int txn(struct etcd_journal *j, const struct etcd_op *ops, size_t n)
{
        const struct etcd_cmp cmp[] = {
            {.key = j->seq_key, .target = ETCD_CMP_VERSION, .value = j->seq_version},
            {.key = j->fence_key, .target = ETCD_CMP_CREATE, .value = j->fence_revision},
            {.key = j->fence_key, .target = ETCD_CMP_LEASE, .value = j->fence_lease},
        };

        return etcd_txn(j->etcd, cmp, j->unfenced ? 1 : 3, ops, n, NULL);
}

/* After a failed condition: whose? -ESTALE when the fence's, else seq's version adopted (an
 * attempt of ours etcd applied after we gave up on it) and 0. */
static int why_refused(struct etcd_journal *j)
{
        struct etcd_kv *kv = NULL;
        size_t n = 0;
        int r;

        r = etcd_range(j->etcd, j->fence_key, false, &kv, &n, NULL);
        if (r < 0)
                return fail(j, r, "%s", etcd_error(j->etcd));
        if (!j->unfenced &&
            (n != 1 || kv[0].create_revision != j->fence_revision || kv[0].lease != j->fence_lease)) {
                etcd_kvs_free(kv, n);
                return fail(j, -ESTALE,
                            "etcd refused the commit: the election key %s is no longer this "
                            "leader's (term %" PRId64 ")",
                            j->fence_key, j->fence_revision);
        }
        etcd_kvs_free(kv, n);
        r = etcd_range(j->etcd, j->seq_key, false, &kv, &n, NULL);
        if (r < 0)
                return fail(j, r, "%s", etcd_error(j->etcd));
        /* What etcd has is the truth: a late attempt of ours landed. */
        j->seq_version = n == 1 ? kv[0].version : 0;
        etcd_kvs_free(kv, n);
        return 0;
}

void forget_written(struct etcd_journal *j, const struct write *w, bool landed)
{
        for (size_t i = 0; i < w->n; i++) {
                struct entry *e = w->entries[i], *m = map_ensure(&j->mirror, e->key);
                if (!m)
                        continue; /* out of memory: the pending change stays and is written */
                if (!landed) {
                        m->unknown = true;
                        continue;
                }
                j->bytes -= m->present ? m->len : 0;
                if (entry_set(m, e->present ? e->value : NULL, e->len) < 0)
                        m->unknown = true;
                else {
                        m->unknown = false;
                        j->bytes += m->len;
                }
                if (!m->present && !m->unknown)
                        map_remove(&j->mirror, e->key);
        }
}

int etcd_journal_append(struct etcd_journal *j, const Aquaj__JournalRecord *rec)
{
        struct write w = {0};
        char seq[64];
        int r;

        r = apply_record(j, rec);
        if (r < 0)
                return fail(j, r, "out of memory applying a commit");
        for (int attempt = 0;; attempt++) {
                r = plan(j, &w);
                if (r < 0) {
                        write_done(&w);
                        return fail(j, r, "out of memory planning a commit");
                }
                if (w.n == 0) {
                        write_done(&w);
                        map_clear(&j->pending);
                        return 0;
                }
                if (w.n + 1 > TXN_MAX_OPS || w.bytes > TXN_MAX_BYTES) {
                        r = fail(j, -E2BIG,
                                 "the turn changes %zu keys, %zu bytes: more than one etcd "
                                 "transaction carries (%d keys, %u bytes)",
                                 w.n, w.bytes, TXN_MAX_OPS - 1, TXN_MAX_BYTES);
                        write_done(&w);
                        return r;
                }
                /* seq first: ops[0] is free for it. */
                memmove(w.ops + 1, w.ops, w.n * sizeof(*w.ops));
                seq_put(j, seq, sizeof(seq), &w.ops[0]);
                r = txn(j, w.ops, w.n + 1);
                memmove(w.ops, w.ops + 1, w.n * sizeof(*w.ops));
                if (r == 1) {
                        forget_written(j, &w, true);
                        j->seq_version++;
                        write_done(&w);
                        map_clear(&j->pending);
                        return 0;
                }
                forget_written(j, &w, false);
                write_done(&w);
                if (r < 0)
                        return fail(j, r, "%s", etcd_error(j->etcd));
                r = why_refused(j);
                if (r < 0)
                        return r;
                if (attempt > 0)
                        return fail(j, -EAGAIN, "etcd refused the commit twice: another writer "
                                                "changes %s",
                                    j->seq_key);
        }
}

uint64_t etcd_journal_size(const struct etcd_journal *j)
{
        return j->bytes;
}

const char *etcd_journal_error(const struct etcd_journal *j)
{
        return j->error;
}
