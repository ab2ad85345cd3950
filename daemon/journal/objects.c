/* A domain's journal's keys and pages of chunks in memory (objects.h). */
#include "objects.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* ------------------------------------------------------------------------------ the maps */

static uint64_t hash(const char *s)
{
        uint64_t h = 1469598103934665603ull;

        while (*s)
                h = (h ^ (uint8_t)*s++) * 1099511628211ull;
        return h;
}

void page_free(struct page *p)
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

struct entry *map_get(const struct map *m, const char *key)
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

struct entry *map_ensure(struct map *m, const char *key)
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

void map_remove(struct map *m, const char *key)
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

void map_clear(struct map *m)
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

int entry_set(struct entry *e, const uint8_t *value, size_t len)
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

int page_decode(const uint8_t *value, size_t len, struct page **ret)
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

int page_encode(const struct page *p, uint8_t **ret, size_t *ret_len)
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

void page_chunk(const struct page *p, size_t i, Aquaj__JChunk *ret)
{
        jc_to(&p->v[i], ret);
}

int page_set(struct page *p, const Aquaj__JChunk *c)
{
        bool found;
        struct jc v;
        size_t i;
        int r = jc_from(&v, c, 0);

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

void page_del(struct page *p, uint64_t id)
{
        bool found;
        size_t i = page_find(p, id, &found);

        if (!found)
                return;
        free(p->v[i].producer);
        free(p->v[i].qboot);
        memmove(p->v + i, p->v + i + 1, (p->n - i - 1) * sizeof(*p->v));
        p->n--;
}
