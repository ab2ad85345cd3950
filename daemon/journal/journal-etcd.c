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

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGE_SHIFT 9
/* One transaction: etcd refuses more than 128 operations (--max-txn-ops) and requests over
 * 1.5 MiB (--max-request-bytes) by default; well inside both. */
#define TXN_MAX_OPS   120
#define TXN_MAX_BYTES (192u << 10)
/* Keys per page of a read: chunk pages are larger than the other objects. */
#define READ_PAGE_KEYS       1000
#define READ_PAGE_CHUNK_KEYS 64

/* A chunk as a page holds it. */
struct jc {
        uint64_t id, size, client_ref, lease_id, deadline_ms, qstart;
        uint32_t qpid;
        bool reclaiming, orphan, dirty, quarantined, qback;
        char *producer, *qboot;
};

struct page {
        struct jc *v; /* sorted by id */
        size_t n, alloc;
};

/* A key: in the mirror, what etcd holds; pending, what the next commit writes. */
struct entry {
        struct entry *next;
        char *key;
        uint8_t *value; /* NULL with present false: absent (pending: to delete) */
        size_t len;
        bool present;
        bool unknown;      /* mirror: an attempt that may have landed wrote it */
        struct page *page; /* pending chunk page, decoded */
};

struct map {
        struct entry **b;
        size_t n_b, n;
};

struct etcd_journal {
        struct etcd *etcd; /* the caller's */
        char *state, *log; /* ROOT/state/, ROOT/journal/ */
        char *fence_key, *seq_key;
        int64_t fence_revision, fence_lease;
        bool unfenced;
        int64_t seq_version; /* seq's version as this leader last wrote it */
        struct map mirror, pending;
        uint64_t bytes; /* of the mirror's values */
        char error[320];
};

/* ------------------------------------------------------------------------------ the maps */

static uint64_t hash(const char *s)
{
        uint64_t h = 1469598103934665603ull;

        while (*s)
                h = (h ^ (uint8_t)*s++) * 1099511628211ull;
        return h;
}

static void page_free(struct page *p)
{
        if (!p)
                return;
        for (size_t i = 0; i < p->n; i++) {
                free(p->v[i].producer);
                free(p->v[i].qboot);
        }
        free(p->v);
        free(p);
}

static void entry_free(struct entry *e)
{
        free(e->key);
        free(e->value);
        page_free(e->page);
        free(e);
}

static struct entry *map_get(const struct map *m, const char *key)
{
        if (!m->n_b)
                return NULL;
        for (struct entry *e = m->b[hash(key) % m->n_b]; e; e = e->next)
                if (strcmp(e->key, key) == 0)
                        return e;
        return NULL;
}

static int map_grow(struct map *m)
{
        size_t n_b = m->n_b ? m->n_b * 2 : 256;
        struct entry **b = calloc(n_b, sizeof(*b));

        if (!b)
                return -ENOMEM;
        for (size_t i = 0; i < m->n_b; i++)
                while (m->b[i]) {
                        struct entry *e = m->b[i];
                        m->b[i] = e->next;
                        e->next = b[hash(e->key) % n_b];
                        b[hash(e->key) % n_b] = e;
                }
        free(m->b);
        m->b = b;
        m->n_b = n_b;
        return 0;
}

/* The entry of key, made (absent) when there is none; NULL: out of memory. */
static struct entry *map_ensure(struct map *m, const char *key)
{
        struct entry *e = map_get(m, key);

        if (e)
                return e;
        if (m->n >= m->n_b && map_grow(m) < 0)
                return NULL;
        e = calloc(1, sizeof(*e));
        if (!e || !(e->key = strdup(key))) {
                free(e);
                return NULL;
        }
        e->next = m->b[hash(key) % m->n_b];
        m->b[hash(key) % m->n_b] = e;
        m->n++;
        return e;
}

static void map_remove(struct map *m, const char *key)
{
        if (!m->n_b)
                return;
        for (struct entry **p = &m->b[hash(key) % m->n_b]; *p; p = &(*p)->next)
                if (strcmp((*p)->key, key) == 0) {
                        struct entry *e = *p;
                        *p = e->next;
                        entry_free(e);
                        m->n--;
                        return;
                }
}

static void map_clear(struct map *m)
{
        for (size_t i = 0; i < m->n_b; i++)
                while (m->b[i]) {
                        struct entry *e = m->b[i];
                        m->b[i] = e->next;
                        entry_free(e);
                }
        free(m->b);
        *m = (struct map){0};
}

/* Every entry, in no order; fn may not change the map. */
#define MAP_FOREACH(m, e)                                                                          \
        for (size_t _i = 0; _i < (m)->n_b; _i++)                                                   \
                for (struct entry *e = (m)->b[_i]; e; e = e->next)

static int set_value(struct entry *e, const uint8_t *value, size_t len)
{
        uint8_t *copy = NULL;

        if (value) {
                copy = malloc(len ? len : 1);
                if (!copy)
                        return -ENOMEM;
                memcpy(copy, value, len);
        }
        free(e->value);
        e->value = copy;
        e->len = value ? len : 0;
        e->present = value != NULL;
        return 0;
}

/* ------------------------------------------------------------------------------ keys */

static char *key_of(const struct etcd_journal *j, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));
static char *key_of(const struct etcd_journal *j, const char *fmt, ...)
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

/* ------------------------------------------------------------------------------ pages */

static int jc_from(struct jc *c, const Aquaj__JChunk *j, uint64_t k)
{
        *c = (struct jc){
            .id = j->id + k,
            .size = j->size,
            .client_ref = j->client_ref + k,
            .lease_id = j->lease_id,
            .deadline_ms = j->deadline_ms,
            .qstart = j->quarantine_start_time,
            .qpid = j->quarantine_pid,
            .reclaiming = j->reclaiming,
            .orphan = j->orphan,
            .dirty = j->dirty,
            .quarantined = j->quarantined,
            .qback = j->quarantine_back,
        };
        c->producer = strdup(j->producer ? j->producer : "");
        if (j->quarantine_boot_id && j->quarantine_boot_id[0])
                c->qboot = strdup(j->quarantine_boot_id);
        if (!c->producer || (j->quarantine_boot_id && j->quarantine_boot_id[0] && !c->qboot)) {
                free(c->producer);
                free(c->qboot);
                return -ENOMEM;
        }
        return 0;
}

static void jc_to(const struct jc *c, Aquaj__JChunk *j)
{
        aquaj__jchunk__init(j);
        j->id = c->id;
        j->producer = c->producer;
        j->size = c->size;
        j->client_ref = c->client_ref;
        j->lease_id = c->lease_id;
        j->reclaiming = c->reclaiming;
        j->orphan = c->orphan;
        j->deadline_ms = c->deadline_ms;
        j->dirty = c->dirty;
        j->quarantined = c->quarantined;
        j->quarantine_pid = c->qpid;
        j->quarantine_start_time = c->qstart;
        j->quarantine_boot_id = c->qboot ? c->qboot : (char *)"";
        j->quarantine_back = c->qback;
}

/* Whether b continues a's run: the next id and client ref, alike in all else. */
static bool continues(const struct jc *a, const struct jc *b)
{
        return b->id == a->id + 1 && b->client_ref == a->client_ref + 1 && b->size == a->size &&
               b->lease_id == a->lease_id && b->deadline_ms == a->deadline_ms &&
               b->qstart == a->qstart && b->qpid == a->qpid && b->reclaiming == a->reclaiming &&
               b->orphan == a->orphan && b->dirty == a->dirty &&
               b->quarantined == a->quarantined && b->qback == a->qback &&
               strcmp(a->producer, b->producer) == 0 &&
               strcmp(a->qboot ? a->qboot : "", b->qboot ? b->qboot : "") == 0;
}

static int page_decode(const uint8_t *value, size_t len, struct page **ret)
{
        struct page *p = calloc(1, sizeof(*p));
        Aquaj__JChunkPage *jp = NULL;
        int r = 0;

        if (!p)
                return -ENOMEM;
        if (value) {
                jp = aquaj__jchunk_page__unpack(NULL, len, value);
                if (!jp) {
                        free(p);
                        return -EBADMSG;
                }
        }
        for (size_t i = 0; jp && i < jp->n_chunks && r >= 0; i++) {
                uint64_t run = jp->chunks[i]->run ? jp->chunks[i]->run : 1;
                if (run > (1u << PAGE_SHIFT) || p->n + run > (2u << PAGE_SHIFT)) {
                        r = -EBADMSG;
                        break;
                }
                if (p->n + run > p->alloc) {
                        size_t a = p->n + run + 16;
                        struct jc *v = reallocarray(p->v, a, sizeof(*v));
                        if (!v) {
                                r = -ENOMEM;
                                break;
                        }
                        p->v = v;
                        p->alloc = a;
                }
                for (uint64_t k = 0; k < run && r >= 0; k++) {
                        r = jc_from(&p->v[p->n], jp->chunks[i], k);
                        if (r >= 0)
                                p->n++;
                }
        }
        if (jp)
                aquaj__jchunk_page__free_unpacked(jp, NULL);
        if (r < 0) {
                page_free(p);
                return r;
        }
        *ret = p;
        return 0;
}

/* The page packed: *ret NULL (and *ret_len 0) when it holds no chunk. */
static int page_encode(const struct page *p, uint8_t **ret, size_t *ret_len)
{
        Aquaj__JChunkPage jp = AQUAJ__JCHUNK_PAGE__INIT;
        _cleanup_free_ Aquaj__JChunk *runs = NULL;
        _cleanup_free_ Aquaj__JChunk **ptrs = NULL;
        size_t n = 0;

        *ret = NULL;
        *ret_len = 0;
        if (p->n == 0)
                return 0;
        runs = calloc(p->n, sizeof(*runs));
        ptrs = calloc(p->n, sizeof(*ptrs));
        if (!runs || !ptrs)
                return -ENOMEM;
        for (size_t i = 0; i < p->n; i++) {
                if (n && continues(&p->v[i - 1], &p->v[i])) {
                        runs[n - 1].run = runs[n - 1].run ? runs[n - 1].run + 1 : 2;
                        continue;
                }
                jc_to(&p->v[i], &runs[n]);
                ptrs[n] = &runs[n];
                n++;
        }
        jp.chunks = ptrs;
        jp.n_chunks = n;
        *ret_len = aquaj__jchunk_page__get_packed_size(&jp);
        *ret = malloc(*ret_len ? *ret_len : 1);
        if (!*ret)
                return -ENOMEM;
        aquaj__jchunk_page__pack(&jp, *ret);
        return 0;
}

static size_t page_find(const struct page *p, uint64_t id, bool *found)
{
        size_t lo = 0, hi = p->n;

        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (p->v[mid].id < id)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        *found = lo < p->n && p->v[lo].id == id;
        return lo;
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
        if (m && m->present && set_value(e, m->value, m->len) < 0) {
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
        bool found;
        struct jc v;
        size_t i;
        int r;

        r = pending_chunk_page(j, c->id, &p);
        if (r < 0)
                return r;
        r = jc_from(&v, c, 0);
        if (r < 0)
                return r;
        i = page_find(p, c->id, &found);
        if (found) {
                free(p->v[i].producer);
                free(p->v[i].qboot);
                p->v[i] = v;
                return 0;
        }
        if (p->n == p->alloc) {
                size_t a = p->alloc ? p->alloc * 2 : 16;
                struct jc *nv = reallocarray(p->v, a, sizeof(*nv));
                if (!nv) {
                        free(v.producer);
                        free(v.qboot);
                        return -ENOMEM;
                }
                p->v = nv;
                p->alloc = a;
        }
        memmove(p->v + i + 1, p->v + i, (p->n - i) * sizeof(*p->v));
        p->v[i] = v;
        p->n++;
        return 0;
}

static int del_chunk(struct etcd_journal *j, uint64_t id)
{
        struct page *p;
        bool found;
        size_t i;
        int r = pending_chunk_page(j, id, &p);

        if (r < 0)
                return r;
        i = page_find(p, id, &found);
        if (found) {
                free(p->v[i].producer);
                free(p->v[i].qboot);
                memmove(p->v + i, p->v + i + 1, (p->n - i - 1) * sizeof(*p->v));
                p->n--;
        }
        return 0;
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
        return set_value(e, buf, len);
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
                                set_value(e, NULL, 0);
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
                                set_value(e, NULL, 0);
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

static int apply_record(struct etcd_journal *j, const Aquaj__JournalRecord *rec)
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

static int fail(struct etcd_journal *j, int r, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
static int fail(struct etcd_journal *j, int r, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(j->error, sizeof(j->error), fmt, ap);
        va_end(ap);
        return r;
}

struct write {
        struct etcd_op *ops;
        struct entry **entries;
        size_t n, bytes;
};

static void write_done(struct write *w)
{
        free(w->ops);
        free(w->entries);
        *w = (struct write){0};
}

/* What the pending changes write: each key whose value differs from etcd's, or may. Pages are
 * encoded into e->value here. */
static int plan(struct etcd_journal *j, struct write *w)
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

static int seq_put(struct etcd_journal *j, char *buf, size_t size, struct etcd_op *op)
{
        snprintf(buf, size, "%" PRId64 " %" PRId64, j->fence_revision, j->seq_version + 1);
        *op = (struct etcd_op){.kind = ETCD_OP_PUT, .key = j->seq_key, .value = buf,
                               .len = strlen(buf)};
        return 0;
}

/* One fenced, ordered transaction of n ops (the first being seq's). 1 done, 0 a condition
 * failed, or a negative errno. */
static int txn(struct etcd_journal *j, const struct etcd_op *ops, size_t n)
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

static void forget_written(struct etcd_journal *j, const struct write *w, bool landed)
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
                if (set_value(m, e->present ? e->value : NULL, e->len) < 0)
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

/* ------------------------------------------------------------------------------ open */

struct reader {
        struct etcd_journal *j;
        int64_t revision; /* every page at one revision */
        journal_replay_fn fn;
        void *userdata;
        struct journal_replay_stats *stats;
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

        if (!m || set_value(m, kv->value, kv->len) < 0)
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

static int read_meta(struct reader *rd, const struct etcd_kv *kv)
{
        Aquaj__JSnapshot *s = aquaj__jsnapshot__unpack(NULL, kv->len, kv->value);
        Aquaj__JOp op = AQUAJ__JOP__INIT;
        int r;

        if (!s)
                return bad(rd, kv->key);
        op.op_case = AQUAJ__JOP__OP_SNAPSHOT;
        op.snapshot = s;
        r = replay_one(rd, &op);
        aquaj__jsnapshot__free_unpacked(s, NULL);
        return r < 0 ? r : mirror_kv(rd, kv);
}

static int read_lease(struct reader *rd, const struct etcd_kv *kv)
{
        Aquaj__JLease *l = aquaj__jlease__unpack(NULL, kv->len, kv->value);
        Aquaj__JOp op = AQUAJ__JOP__INIT;
        int r;

        if (!l)
                return bad(rd, kv->key);
        op.op_case = AQUAJ__JOP__OP_LEASE_SET;
        op.lease_set = l;
        r = replay_one(rd, &op);
        aquaj__jlease__free_unpacked(l, NULL);
        return r < 0 ? r : mirror_kv(rd, kv);
}

static int read_gpu(struct reader *rd, const struct etcd_kv *kv)
{
        Aquaj__JGpu *g = aquaj__jgpu__unpack(NULL, kv->len, kv->value);
        Aquaj__JOp op = AQUAJ__JOP__INIT;
        int r;

        if (!g)
                return bad(rd, kv->key);
        op.op_case = AQUAJ__JOP__OP_GPU_SET;
        op.gpu_set = g;
        r = replay_one(rd, &op);
        aquaj__jgpu__free_unpacked(g, NULL);
        return r < 0 ? r : mirror_kv(rd, kv);
}

static int read_pin(struct reader *rd, const struct etcd_kv *kv)
{
        Aquaj__JPair *p = aquaj__jpair__unpack(NULL, kv->len, kv->value);
        Aquaj__JOp op = AQUAJ__JOP__INIT;
        int r;

        if (!p)
                return bad(rd, kv->key);
        op.op_case = AQUAJ__JOP__OP_PAIR_SET;
        op.pair_set = p;
        r = replay_one(rd, &op);
        aquaj__jpair__free_unpacked(p, NULL);
        return r < 0 ? r : mirror_kv(rd, kv);
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
                jc_to(&p->v[i], &cs[i]);
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
                int (*fn)(struct reader *rd, const struct etcd_kv *kv);
        } kinds[] = {
            /* meta first (a snapshot of just the ids, on an empty core); leases before the
             * chunks that name them */
            {"meta", 1, read_meta},
            {"lease/", READ_PAGE_KEYS, read_lease},
            {"chunk/", READ_PAGE_CHUNK_KEYS, read_page},
            {"gpu/", READ_PAGE_KEYS, read_gpu},
            {"pin/", READ_PAGE_KEYS, read_pin},
        };
        int r = 0;

        for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]) && r >= 0; i++) {
                _cleanup_free_ char *prefix = key_of(rd->j, "%s", kinds[i].tail);
                if (!prefix)
                        return -ENOMEM;
                r = read_all(rd, prefix, kinds[i].limit, kinds[i].fn);
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

uint64_t etcd_journal_size(const struct etcd_journal *j)
{
        return j->bytes;
}

const char *etcd_journal_error(const struct etcd_journal *j)
{
        return j->error;
}
