/* The producer's chunk table. */
#include "pool.h"

#include <errno.h>
#include <stdlib.h>

#include "util.h"

int pool_alloc(struct pool *p, struct gpu *g, uint64_t size, struct pool_chunk **ret)
{
        _cleanup_free_ struct pool_chunk *c = NULL;
        int r;

        if (p->n == p->cap) {
                size_t cap = p->cap ? p->cap * 2 : 64;
                struct pool_chunk **a = realloc(p->chunks, cap * sizeof(*a));
                if (!a)
                        return -ENOMEM;
                p->chunks = a;
                p->cap = cap;
        }
        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        r = gpu_alloc_exportable(g, size, &c->handle);
        if (r < 0)
                return r;
        c->ref = ++p->last_ref;
        c->size = size;
        c->state = POOL_OFFERING;
        c->index = p->n;
        p->chunks[p->n++] = c;
        *ret = TAKE_PTR(c);
        return 0;
}

int pool_set_id(struct pool *p, struct pool_chunk *c, uint64_t id)
{
        int r = idmap_put(&p->by_id, id, c);

        if (r < 0)
                return r;
        c->id = id;
        c->state = POOL_OFFERED;
        p->offered_bytes += c->size;
        return 0;
}

struct pool_chunk *pool_get(const struct pool *p, uint64_t id)
{
        return idmap_get(&p->by_id, id);
}

void pool_release(struct pool *p, struct gpu *g, struct pool_chunk *c)
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

void pool_clear(struct pool *p, struct gpu *g)
{
        while (p->n > 0)
                pool_release(p, g, p->chunks[p->n - 1]);
        free(p->chunks);
        idmap_clear(&p->by_id);
        *p = (struct pool){0};
}
