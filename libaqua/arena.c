/* Arenas: device allocations handed out first-fit from one aqua tensor, which grows and trims. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "aqua/aqua.h"
#include "util.h"

#define DEFAULT_ALIGN 512

struct piece {
        uint64_t offset, bytes;
};

struct aqua_arena {
        aqua_ctx *ctx;
        aqua_tensor *t;
        uint64_t align, max_bytes, chunk_bytes;
        struct piece *pieces; /* sorted by offset, never overlapping */
        size_t n, alloc;
        uint64_t bytes;
};

int aqua_arena_new(aqua_ctx *ctx, aqua_tensor *t, uint64_t align, aqua_arena **ret)
{
        struct aqua_tensor_info ti;
        aqua_arena *a;
        int r;

        if (!ctx || !t || !ret || (align & (align - 1)))
                return -EINVAL;
        r = aqua_tensor_get_info(ctx, t, &ti);
        if (r < 0)
                return r;
        a = calloc(1, sizeof(*a));
        if (!a)
                return -ENOMEM;
        *a = (struct aqua_arena){.ctx = ctx,
                                 .t = t,
                                 .align = align ? align : DEFAULT_ALIGN,
                                 .max_bytes = ti.max_bytes,
                                 .chunk_bytes = ti.chunk_bytes};
        *ret = a;
        return 0;
}

aqua_arena *aqua_arena_free(aqua_arena *a)
{
        if (a) {
                free(a->pieces);
                free(a);
        }
        return NULL;
}

static uint64_t top(const aqua_arena *a)
{
        return a->n ? a->pieces[a->n - 1].offset + a->pieces[a->n - 1].bytes : 0;
}

int aqua_arena_alloc(aqua_arena *a, uint64_t bytes, uint64_t *ret_dptr)
{
        uint64_t at = 0, want;
        size_t i;
        int r;

        if (!a || !ret_dptr || bytes == 0 || bytes > UINT64_MAX - a->align)
                return -EINVAL;
        want = (bytes + a->align - 1) & ~(a->align - 1);
        /* First fit: the first gap before a piece that is large enough, else after the last. */
        for (i = 0; i < a->n; i++) {
                if (a->pieces[i].offset - at >= want)
                        break;
                at = a->pieces[i].offset + a->pieces[i].bytes;
        }
        if (at > a->max_bytes || a->max_bytes - at < want)
                return -ERANGE;
        if (a->n == a->alloc) {
                size_t n = a->alloc ? a->alloc * 2 : 64;
                struct piece *p = reallocarray(a->pieces, n, sizeof(*p));
                if (!p)
                        return -ENOMEM;
                a->pieces = p;
                a->alloc = n;
        }
        /* Past the mapped window: map the chunks it needs (all or nothing). */
        if (i == a->n) {
                r = aqua_tensor_grow(a->ctx, a->t, at + want);
                if (r != 0)
                        return r;
        }
        memmove(a->pieces + i + 1, a->pieces + i, (a->n - i) * sizeof(*a->pieces));
        a->pieces[i] = (struct piece){.offset = at, .bytes = want};
        a->n++;
        a->bytes += want;
        *ret_dptr = aqua_tensor_dptr(a->t) + at;
        return 0;
}

static int cmp_piece(const void *key, const void *elem)
{
        uint64_t off = *(const uint64_t *)key;
        const struct piece *p = elem;

        return off < p->offset ? -1 : off > p->offset;
}

int aqua_arena_release(aqua_arena *a, uint64_t dptr)
{
        uint64_t base, off;
        struct piece *p;
        size_t i;

        if (!a)
                return -EINVAL;
        base = aqua_tensor_dptr(a->t);
        if (dptr < base)
                return -ENOENT;
        off = dptr - base;
        p = bsearch(&off, a->pieces, a->n, sizeof(*a->pieces), cmp_piece);
        if (!p)
                return -ENOENT;
        i = (size_t)(p - a->pieces);
        a->bytes -= p->bytes;
        memmove(p, p + 1, (a->n - i - 1) * sizeof(*p));
        a->n--;
        /* The highest piece went: release the chunks no piece reaches any more. */
        if (i == a->n)
                (void)aqua_tensor_trim(a->ctx, a->t, 0, top(a));
        return 0;
}

int aqua_arena_get_info(const aqua_arena *a, struct aqua_arena_info *ret)
{
        struct aqua_tensor_info ti;
        int r;

        if (!a || !ret)
                return -EINVAL;
        r = aqua_tensor_get_info(a->ctx, a->t, &ti);
        if (r < 0)
                return r;
        *ret = (struct aqua_arena_info){
            .pieces = a->n, .bytes = a->bytes, .mapped_bytes = ti.end - ti.begin};
        return 0;
}
