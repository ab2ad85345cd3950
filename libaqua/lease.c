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
static void lease_chunk_drop(struct gpu_dev *g, struct aqua_lease *l, struct lease_chunk *c)
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

static void lease_free_parts(struct lease_table *t, struct gpu_dev *g, struct aqua_lease *l)
{
        for (size_t i = 0; i < l->n_chunks; i++) {
                struct lease_chunk *c = &l->chunks[i];

                lease_chunk_drop(g, l, c);
                /* A lease that failed half-way was never entered for all its chunks. */
                if (idmap_get(&t->chunk_by_id, c->id) == c)
                        idmap_remove(&t->chunk_by_id, c->id);
        }
        if (l->dptr)
                gpu_unreserve(g, l->dptr, l->size);
        free(l);
}

int lease_create(struct lease_table *t, struct gpu_dev *g, uint64_t lease_id,
                 struct lease_grant_chunk *chunks, size_t n, bool tensor_pool,
                 struct aqua_lease **ret)
{
        struct aqua_lease *l;
        uint64_t size = 0;
        bool unusable = false;
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
        /* Every chunk is tried, so that the daemon learns of all the bad ones at once. */
        for (size_t i = 0; i < n; i++) {
                r = chunks[i].fabric ? gpu_import_fabric(g, chunks[i].fabric, &l->chunks[i].handle)
                                     : gpu_import(g, chunks[i].fd, &l->chunks[i].handle);
                l->chunks[i].has_handle = r == 0;
                /* Out of memory, or no permission (no IMEX channel), is this process's trouble,
                 * not the chunk's. */
                chunks[i].unusable = r < 0 && r != -ENOMEM && r != -ENOKEY;
                unusable |= chunks[i].unusable;
                if (r == -ENOMEM || r == -ENOKEY)
                        goto fail;
        }
        if (unusable) {
                r = -EIO;
                goto fail;
        }
        for (size_t i = 0; i < n; i++) {
                struct lease_chunk *c = &l->chunks[i];

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
        l->tensor_pool = tensor_pool;
        if (tensor_pool) {
                l->n_free = n;
                t->pool_free_bytes += size;
        }
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

void lease_move_prepare(const struct aqua_lease *l, const struct lease_chunk *c, struct move *m)
{
        *m = (struct move){.at = l->dptr + c->offset, .size = c->size, .old = c->handle};
}

void lease_moved(struct lease_table *t, struct gpu_dev *g, struct aqua_lease *l,
                 struct lease_chunk *c, struct move *m)
{
        gpu_release(g, c->handle);
        c->has_handle = m->has_handle;
        c->handle = m->handle;
        c->mapped = m->has_handle;
        c->host = m->host;
        c->tier = AQUA_TIER_DRAM;
        l->peer_bytes -= c->size;
        l->dram_bytes += c->size;
        t->peer_bytes -= c->size;
        t->dram_bytes += c->size;
}

int lease_migrate(struct lease_table *t, struct gpu_dev *g, struct aqua_lease *l,
                  struct lease_chunk *c)
{
        struct move m;
        int r;

        if (c->tier != AQUA_TIER_PEER || l->tensor_pool)
                return -EINVAL;
        lease_move_prepare(l, c, &m);
        r = move_out(g, &m, 1, &t->no_host_map);
        if (r < 0)
                return r;
        if (m.error < 0)
                return m.error;
        lease_moved(t, g, l, c, &m);
        return 0;
}

void lease_chunk_give_back(struct lease_table *t, struct gpu_dev *g, struct aqua_lease *l,
                           struct lease_chunk *c)
{
        if (c->tier != AQUA_TIER_PEER)
                return;
        if (!c->user) {
                l->n_free--;
                t->pool_free_bytes -= c->size;
        }
        c->user = NULL;
        lease_chunk_drop(g, l, c);
        c->tier = AQUA_TIER_NONE;
        l->peer_bytes -= c->size;
        t->peer_bytes -= c->size;
}

struct lease_chunk *lease_tensor_pool_find(struct lease_table *t, uint64_t size,
                                           struct aqua_lease **ret_lease)
{
        for (struct aqua_lease *l = t->head; l; l = l->next) {
                if (!l->tensor_pool || l->n_free == 0)
                        continue;
                for (size_t i = 0; i < l->n_chunks; i++) {
                        struct lease_chunk *c = &l->chunks[i];

                        if (c->tier == AQUA_TIER_PEER && !c->user && c->size == size) {
                                *ret_lease = l;
                                return c;
                        }
                }
        }
        return NULL;
}

void lease_chunk_use(struct lease_table *t, struct aqua_lease *l, struct lease_chunk *c,
                     struct aqua_tensor *user, size_t index)
{
        c->user = user;
        c->user_index = index;
        l->n_free--;
        t->pool_free_bytes -= c->size;
}

void lease_chunk_unuse(struct lease_table *t, struct aqua_lease *l, struct lease_chunk *c)
{
        c->user = NULL;
        l->n_free++;
        t->pool_free_bytes += c->size;
}

bool lease_in_use(const struct aqua_lease *l)
{
        for (size_t i = 0; l->tensor_pool && i < l->n_chunks; i++)
                if (l->chunks[i].user)
                        return true;
        return false;
}

void lease_table_remove(struct lease_table *t, struct gpu_dev *g, struct aqua_lease *l)
{
        if (!l)
                return;
        idmap_remove(&t->by_id, l->id);
        lease_unlink(t, l);
        t->peer_bytes -= l->peer_bytes;
        t->dram_bytes -= l->dram_bytes;
        if (l->tensor_pool)
                for (size_t i = 0; i < l->n_chunks; i++)
                        if (l->chunks[i].tier == AQUA_TIER_PEER && !l->chunks[i].user)
                                t->pool_free_bytes -= l->chunks[i].size;
        lease_free_parts(t, g, l);
}

void lease_table_clear(struct lease_table *t, struct gpu_dev *g)
{
        while (t->head)
                lease_table_remove(t, g, t->head);
        idmap_clear(&t->by_id);
        idmap_clear(&t->chunk_by_id);
        t->peer_bytes = t->dram_bytes = t->pool_free_bytes = 0;
}
