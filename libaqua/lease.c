/* The consumer's leases: import, map, migrate to host memory, unmap. */
#include "lease.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static void lease_link(struct lease_table *t, struct aqua_lease *l)
{
        l->prev = NULL;
        l->next = t->head;
        if (t->head)
                t->head->prev = l;
        t->head = l;
}

static void lease_unlink(struct lease_table *t, struct aqua_lease *l)
{
        if (l->prev)
                l->prev->next = l->next;
        else
                t->head = l->next;
        if (l->next)
                l->next->prev = l->prev;
        l->next = l->prev = NULL;
}

/* Undo whatever of chunk c exists; the lease's counters are the caller's. */
static void chunk_drop(struct gpu *g, struct aqua_lease *l, struct lease_chunk *c)
{
        if (c->mapped)
                gpu_unmap(g, l->dptr + c->offset, c->size);
        if (c->has_handle)
                gpu_release(g, c->handle);
        if (c->host)
                gpu_host_free(g, c->host);
        c->mapped = c->has_handle = false;
        c->host = NULL;
}

static void lease_free_parts(struct lease_table *t, struct gpu *g, struct aqua_lease *l)
{
        for (size_t i = 0; i < l->n_chunks; i++) {
                struct lease_chunk *c = &l->chunks[i];

                chunk_drop(g, l, c);
                /* A lease that failed half-way was never entered for all its chunks. */
                if (idmap_get(&t->chunk_by_id, c->id) == c)
                        idmap_remove(&t->chunk_by_id, c->id);
        }
        if (l->dptr)
                gpu_unreserve(g, l->dptr, l->size);
        free(l);
}

int lease_create(struct lease_table *t, struct gpu *g, uint64_t lease_id,
                 const struct lease_grant_chunk *chunks, size_t n, struct aqua_lease **ret)
{
        struct aqua_lease *l;
        uint64_t size = 0;
        int r;

        if (n == 0 || lease_id == 0 || idmap_get(&t->by_id, lease_id))
                return -EINVAL;
        l = calloc(1, sizeof(*l) + n * sizeof(l->chunks[0]));
        if (!l)
                return -ENOMEM;
        l->id = lease_id;
        l->n_chunks = n;
        for (size_t i = 0; i < n; i++) {
                l->chunks[i] = (struct lease_chunk){
                    .id = chunks[i].id,
                    .offset = size,
                    .size = chunks[i].size,
                    .tier = AQUA_TIER_PEER,
                };
                if (chunks[i].size == 0 || chunks[i].size % gpu_info(g)->granularity != 0 ||
                    size_add_overflows(size, chunks[i].size, &size)) {
                        r = -EPROTO;
                        goto fail;
                }
        }
        l->size = size;
        r = gpu_reserve(g, size, &l->dptr);
        if (r < 0)
                goto fail;
        for (size_t i = 0; i < n; i++) {
                struct lease_chunk *c = &l->chunks[i];

                r = gpu_import(g, chunks[i].fd, &c->handle);
                if (r < 0)
                        goto fail;
                c->has_handle = true;
                r = gpu_map(g, l->dptr + c->offset, c->size, c->handle);
                if (r < 0)
                        goto fail;
                c->mapped = true;
                r = idmap_put(&t->chunk_by_id, c->id, c);
                if (r < 0)
                        goto fail;
        }
        r = idmap_put(&t->by_id, lease_id, l);
        if (r < 0)
                goto fail;
        l->peer_bytes = size;
        t->peer_bytes += size;
        lease_link(t, l);
        *ret = l;
        return 0;
fail:
        lease_free_parts(t, g, l);
        return r;
}

struct aqua_lease *lease_get(const struct lease_table *t, uint64_t id)
{
        return idmap_get(&t->by_id, id);
}

bool lease_valid(const struct lease_table *t, const struct aqua_lease *l)
{
        /* Compare pointers only: a returned lease's memory must not be read. */
        for (const struct aqua_lease *i = t->head; i; i = i->next)
                if (i == l)
                        return true;
        return false;
}

struct lease_chunk *lease_chunk_by_id(const struct lease_table *t, uint64_t chunk_id)
{
        return idmap_get(&t->chunk_by_id, chunk_id);
}

/* Copy the chunk into a host allocation mapped at its own address; -EOPNOTSUPP if impossible. */
static int migrate_mapped(struct gpu *g, struct aqua_lease *l, struct lease_chunk *c,
                          gpu_handle *ret)
{
        uint64_t tmp = 0, at = l->dptr + c->offset;
        gpu_handle h;
        int r;

        r = gpu_alloc_host_mappable(g, c->size, &h);
        if (r < 0)
                return r;
        /* The host allocation must be reachable somewhere to receive the copy. */
        r = gpu_reserve(g, c->size, &tmp);
        if (r < 0)
                goto fail;
        r = gpu_map(g, tmp, c->size, h);
        if (r < 0)
                goto fail;
        r = gpu_copy(g, tmp, at, c->size);
        gpu_unmap(g, tmp, c->size);
        if (r < 0)
                goto fail;
        gpu_unreserve(g, tmp, c->size);
        tmp = 0;
        r = gpu_unmap(g, at, c->size);
        if (r < 0)
                goto fail;
        r = gpu_map(g, at, c->size, h);
        if (r < 0) {
                /* The peer memory is still ours: put it back where it was. */
                if (gpu_map(g, at, c->size, c->handle) < 0)
                        c->mapped = false;
                goto fail;
        }
        *ret = h;
        return 0;
fail:
        if (tmp)
                gpu_unreserve(g, tmp, c->size);
        gpu_release(g, h);
        return r;
}

int lease_migrate(struct lease_table *t, struct gpu *g, struct aqua_lease *l, struct lease_chunk *c)
{
        gpu_handle h;
        void *host = NULL;
        int r;

        if (c->tier != AQUA_TIER_PEER)
                return -EINVAL;
        if (!t->no_host_map) {
                r = migrate_mapped(g, l, c, &h);
                if (r == 0) {
                        gpu_release(g, c->handle);
                        c->handle = h;
                        goto done;
                }
                if (r != -EOPNOTSUPP)
                        return r;
                t->no_host_map = true;
        }
        r = gpu_host_alloc(g, c->size, &host);
        if (r < 0)
                return r;
        r = gpu_copy(g, (uint64_t)(uintptr_t)host, l->dptr + c->offset, c->size);
        if (r < 0) {
                gpu_host_free(g, host);
                return r;
        }
        gpu_unmap(g, l->dptr + c->offset, c->size);
        gpu_release(g, c->handle);
        c->mapped = c->has_handle = false;
        c->host = host;
done:
        c->tier = AQUA_TIER_DRAM;
        l->peer_bytes -= c->size;
        l->dram_bytes += c->size;
        t->peer_bytes -= c->size;
        t->dram_bytes += c->size;
        return 0;
}

void lease_destroy(struct lease_table *t, struct gpu *g, struct aqua_lease *l)
{
        if (!l)
                return;
        idmap_remove(&t->by_id, l->id);
        lease_unlink(t, l);
        t->peer_bytes -= l->peer_bytes;
        t->dram_bytes -= l->dram_bytes;
        lease_free_parts(t, g, l);
}

void lease_table_clear(struct lease_table *t, struct gpu *g)
{
        while (t->head)
                lease_destroy(t, g, t->head);
        idmap_clear(&t->by_id);
        idmap_clear(&t->chunk_by_id);
        t->peer_bytes = t->dram_bytes = 0;
}
