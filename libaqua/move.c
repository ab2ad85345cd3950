/* Batched moves of chunks into new host or local memory at the same device address. */
#include "move.h"

#include <errno.h>
#include <stdlib.h>

#include "util.h"

size_t copy_merge(struct aqua_copy_piece *p, size_t n)
{
        size_t k = 0;

        for (size_t i = 0; i < n; i++) {
                if (k > 0 && p[k - 1].dst + p[k - 1].bytes == p[i].dst &&
                    p[k - 1].src + p[k - 1].bytes == p[i].src) {
                        p[k - 1].bytes += p[i].bytes;
                        continue;
                }
                p[k++] = p[i];
        }
        return k;
}

void move_free(struct gpu_dev *g, struct move *m)
{
        if (m->has_handle)
                gpu_release(g, m->handle);
        if (m->host)
                gpu_host_free(g, m->host);
        m->has_handle = false;
        m->host = NULL;
}

static int move_alloc(struct gpu_dev *g, struct move *m, bool *no_host_map)
{
        int r;

        if (m->local_first && gpu_alloc_local(g, m->size, &m->handle) == 0) {
                m->has_handle = true;
                m->tier = AQUA_TIER_LOCAL;
                return 0;
        }
        m->tier = AQUA_TIER_DRAM;
        if (!*no_host_map) {
                r = gpu_alloc_host_mappable(g, m->size, &m->handle);
                if (r == 0) {
                        m->has_handle = true;
                        return 0;
                }
                if (r != -EOPNOTSUPP)
                        return r;
                *no_host_map = true;
        }
        return gpu_host_alloc(g, m->size, &m->host);
}

int move_out(struct gpu_dev *g, struct move *m, size_t n, bool *no_host_map)
{
        _cleanup_free_ struct aqua_copy_piece *pieces = calloc(n ? n : 1, sizeof(*pieces));
        uint64_t staging = 0, staging_size = 0, off = 0;
        size_t n_pieces = 0;
        int r = 0;

        if (!pieces)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                m[i].has_handle = false;
                m[i].host = NULL;
                m[i].staged = 0;
                m[i].error = move_alloc(g, &m[i], no_host_map);
                if (m[i].error == 0 && m[i].has_handle)
                        staging_size += m[i].size;
        }
        /* New allocations are reachable for the copy only once mapped: all in one range. */
        if (staging_size) {
                r = gpu_reserve(g, staging_size, &staging);
                if (r < 0)
                        goto fail;
        }
        for (size_t i = 0; i < n; i++) {
                uint64_t dst;

                if (m[i].error < 0)
                        continue;
                if (m[i].has_handle) {
                        r = gpu_map(g, staging + off, m[i].size, m[i].handle);
                        if (r < 0)
                                goto fail;
                        dst = m[i].staged = staging + off;
                        off += m[i].size;
                } else
                        dst = (uint64_t)(uintptr_t)m[i].host;
                pieces[n_pieces++] = (struct aqua_copy_piece){dst, m[i].at, m[i].size};
        }
        /* Chunks that were neighbours stay neighbours in staging: mostly one large copy. */
        n_pieces = copy_merge(pieces, n_pieces);
        if (n_pieces) {
                r = gpu_copy_batch(g, NULL, NULL, pieces, n_pieces, true, NULL, 0);
                if (r == 0)
                        r = gpu_stream_sync(g, NULL);
        }
fail:
        for (size_t i = 0; i < n; i++)
                if (m[i].staged) {
                        gpu_unmap(g, m[i].staged, m[i].size);
                        m[i].staged = 0;
                }
        if (staging)
                gpu_unreserve(g, staging, staging_size);
        if (r < 0) {
                for (size_t i = 0; i < n; i++)
                        move_free(g, &m[i]);
                return r;
        }
        /* The copies are done: swap the mappings. */
        for (size_t i = 0; i < n; i++) {
                if (m[i].error < 0)
                        continue;
                m[i].error = gpu_unmap(g, m[i].at, m[i].size);
                if (m[i].error == 0 && m[i].has_handle) {
                        m[i].error = gpu_map(g, m[i].at, m[i].size, m[i].handle);
                        /* Put the old memory back: it is still the caller's. */
                        if (m[i].error < 0 && gpu_map(g, m[i].at, m[i].size, m[i].old) < 0)
                                m[i].error = -EIO;
                }
                if (m[i].error < 0)
                        move_free(g, &m[i]);
        }
        return 0;
}
