/* The producer's offers: its table of exportable chunks. */
#include "offers.h"

#include <errno.h>
#include <stdlib.h>

#include "util.h"

int offers_alloc(struct offers *p, struct gpu_dev *g, uint64_t size, bool fabric,
                 struct offered_chunk **ret)
{
        _cleanup_free_ struct offered_chunk *c = NULL;
        int r;

        if (p->n == p->cap) {
                size_t cap = p->cap ? p->cap * 2 : 64;
                struct offered_chunk **a = realloc(p->chunks, cap * sizeof(*a));
                if (!a)
                        return -ENOMEM;
                p->chunks = a;
                p->cap = cap;
        }
        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        r = gpu_alloc_exportable(g, size, fabric, &c->handle);
        if (r < 0)
                return r;
        c->ref = ++p->last_ref;
        c->size = size;
        c->state = OFFER_OFFERING;
        c->index = p->n;
        p->chunks[p->n++] = c;
        *ret = TAKE_PTR(c);
        return 0;
}

int offers_set_id(struct offers *p, struct offered_chunk *c, uint64_t id)
{
        int r = idmap_put(&p->by_id, id, c);

        if (r < 0)
                return r;
        c->id = id;
        c->state = OFFER_OFFERED;
        p->offered_bytes += c->size;
        return 0;
}

struct offered_chunk *offers_get(const struct offers *p, uint64_t id)
{
        return idmap_get(&p->by_id, id);
}

void offers_release(struct offers *p, struct gpu_dev *g, struct offered_chunk *c)
{
        if (c->id) {
                idmap_remove(&p->by_id, c->id);
                p->offered_bytes -= c->size;
        }
        gpu_release(g, c->handle);
        p->chunks[c->index] = p->chunks[--p->n];
        p->chunks[c->index]->index = c->index;
        free(c);
}

void offers_clear(struct offers *p, struct gpu_dev *g)
{
        while (p->n > 0)
                offers_release(p, g, p->chunks[p->n - 1]);
        free(p->chunks);
        idmap_clear(&p->by_id);
        *p = (struct offers){0};
}
