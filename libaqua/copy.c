/*
 * Batched copies between any tiers (merged neighbours, one cuMemcpyBatchAsync where the driver
 * has it), the batches libaqua still has in flight, and layer-wise offload and prefetch.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alog.h"
#include "ctx.h"
#include "move.h"
#include "util.h"

/* Where addr lies, in the caller's terms: the role says (a consumer: a tensor's offset and
 * tier, or a lease), else the address. */
static void describe(aqua_ctx *ctx, uint64_t addr, char *buf, size_t len)
{
        if (!(ctx->ops && ctx->ops->describe && ctx->ops->describe(ctx, addr, buf, len)))
                snprintf(buf, len, "0x%" PRIx64 " (not aqua's memory)", addr);
}

/*
 * A batch whose completion the driver reported as failed: on a GPU that is a fault (an address
 * its device may not touch), asynchronous and sticky. Its bytes did not arrive; say which memory
 * is affected, once, where the caller learns of it. Returns -EIO.
 */
static int copy_failed(aqua_ctx *ctx, const struct copy_inflight *c)
{
        char dst[160], src[160];
        uint64_t *v = realloc(ctx->failed_tickets, (ctx->n_failed + 1) * sizeof(*v));

        /* Remembered, so that asking after the batch again never reads as done. */
        if (v) {
                v[ctx->n_failed++] = c->ticket;
                ctx->failed_tickets = v;
        }

        describe(ctx, c->dst, dst, sizeof(dst));
        describe(ctx, c->src, src, sizeof(src));
        alog_error("Copy batch %" PRIu64 " (%zu piece%s, %" PRIu64 " bytes; the first into %s, "
                   "from %s) failed on device %d: %s. Its data is lost, and the device's context "
                   "stays unusable: copies, tensors and leases of this context fail from now on",
                   c->ticket, c->n, c->n == 1 ? "" : "s", c->bytes, dst, src,
                   gpu_info(ctx->gpu)->ordinal, gpu_last_error(ctx->gpu));
        return -EIO;
}

static bool ticket_failed(const aqua_ctx *ctx, aqua_ticket ticket)
{
        for (size_t i = 0; i < ctx->n_failed; i++)
                if (ctx->failed_tickets[i] == ticket)
                        return true;
        return false;
}

static int event_get(aqua_ctx *ctx, struct CUevent_st **ret)
{
        if (ctx->n_spare) {
                *ret = ctx->spare_events[--ctx->n_spare];
                return 0;
        }
        return gpu_event_new(ctx->gpu, ret);
}

static void event_put(aqua_ctx *ctx, struct CUevent_st *ev)
{
        if (ctx->n_spare == ctx->cap_spare) {
                size_t cap = ctx->cap_spare ? ctx->cap_spare * 2 : 16;
                struct CUevent_st **a = realloc(ctx->spare_events, cap * sizeof(*a));

                if (!a) {
                        gpu_event_free(ctx->gpu, ev);
                        return;
                }
                ctx->spare_events = a;
                ctx->cap_spare = cap;
        }
        ctx->spare_events[ctx->n_spare++] = ev;
}

static void inflight_remove(aqua_ctx *ctx, size_t i)
{
        event_put(ctx, ctx->copies[i].ev);
        memmove(&ctx->copies[i], &ctx->copies[i + 1],
                (ctx->n_copies - i - 1) * sizeof(ctx->copies[0]));
        ctx->n_copies--;
}

/* Forget batches that have completed; only when the table is full, to keep batches cheap. */
static int inflight_reserve(aqua_ctx *ctx)
{
        size_t kept = 0;

        if (ctx->n_copies < ctx->cap_copies)
                return 0;
        /* One pass that keeps the order: thousands may be in flight (one batch per block). */
        for (size_t i = 0; i < ctx->n_copies; i++) {
                int q = gpu_event_query(ctx->gpu, ctx->copies[i].ev);
                if (q < 0)
                        copy_failed(ctx, &ctx->copies[i]);
                if (q <= 0)
                        event_put(ctx, ctx->copies[i].ev);
                else
                        ctx->copies[kept++] = ctx->copies[i];
        }
        ctx->n_copies = kept;
        if (ctx->n_copies < ctx->cap_copies)
                return 0;
        size_t cap = ctx->cap_copies ? ctx->cap_copies * 2 : 32;
        struct copy_inflight *a = realloc(ctx->copies, cap * sizeof(*a));

        if (!a)
                return -ENOMEM;
        ctx->copies = a;
        ctx->cap_copies = cap;
        return 0;
}

int copies_wait_all(aqua_ctx *ctx)
{
        int r = 0;

        while (ctx->n_copies) {
                int k = gpu_event_sync(ctx->gpu, ctx->copies[0].ev);

                if (k < 0) {
                        copy_failed(ctx, &ctx->copies[0]);
                        if (r == 0)
                                r = -EIO;
                }
                inflight_remove(ctx, 0);
        }
        return r;
}

void copies_clear(aqua_ctx *ctx)
{
        copies_wait_all(ctx);
        for (size_t i = 0; i < ctx->n_spare; i++)
                gpu_event_free(ctx->gpu, ctx->spare_events[i]);
        free(ctx->spare_events);
        free(ctx->copies);
        free(ctx->failed_tickets);
        ctx->spare_events = NULL;
        ctx->copies = NULL;
        ctx->failed_tickets = NULL;
        ctx->n_failed = 0;
        ctx->n_spare = ctx->cap_spare = ctx->n_copies = ctx->cap_copies = 0;
}

/* Pieces merged in a buffer of the caller's stack when few, else on the heap. */
_public_ int aqua_copy_batch(aqua_ctx *ctx, const struct aqua_copy_piece *pieces, size_t n,
                             struct CUstream_st *stream, struct CUevent_st *wait_event,
                             struct CUevent_st *done_event, aqua_ticket *ret_ticket)
{
        _cleanup_free_ struct aqua_copy_piece *merged = NULL;
        struct CUevent_st *ev = NULL, *record[2];
        size_t m;
        int r;

        if (!ctx || !pieces || n == 0)
                return -EINVAL;
        for (size_t i = 0; i < n; i++)
                if (pieces[i].bytes == 0)
                        return -EINVAL;
        merged = malloc(n * sizeof(*merged));
        if (!merged)
                return -ENOMEM;
        memcpy(merged, pieces, n * sizeof(*merged));
        m = copy_merge(merged, n);
        r = inflight_reserve(ctx);
        if (r < 0)
                return r;
        r = event_get(ctx, &ev);
        if (r < 0)
                return r;
        record[0] = ev;
        record[1] = done_event;
        r = gpu_copy_batch(ctx->gpu, stream, wait_event, merged, m, !ctx->no_batch_copy, record, 2);
        if (r < 0 && r != GPU_E_QUEUED) {
                event_put(ctx, ev);
                return r == -ENOMEM ? r : -EIO;
        }
        uint64_t bytes = 0;
        for (size_t i = 0; i < m; i++)
                bytes += merged[i].bytes;
        struct copy_inflight c = {++ctx->next_ticket, ev, merged[0].dst, merged[0].src, bytes, n};
        if (r == GPU_E_QUEUED) {
                /* Queued, and already known to have faulted: lost, reported as at a sync. */
                event_put(ctx, ev);
                return copy_failed(ctx, &c);
        }
        ctx->copies[ctx->n_copies++] = c;
        if (ret_ticket)
                *ret_ticket = ctx->next_ticket;
        return 0;
}

static ssize_t inflight_find(aqua_ctx *ctx, aqua_ticket ticket)
{
        for (size_t i = 0; i < ctx->n_copies; i++)
                if (ctx->copies[i].ticket == ticket)
                        return (ssize_t)i;
        return -1;
}

_public_ int aqua_copy_query(aqua_ctx *ctx, aqua_ticket ticket)
{
        ssize_t i;
        int r;

        if (!ctx || ticket == 0 || ticket > ctx->next_ticket)
                return -EINVAL;
        i = inflight_find(ctx, ticket);
        if (i < 0)
                return ticket_failed(ctx, ticket) ? -EIO : 0;
        r = gpu_event_query(ctx->gpu, ctx->copies[i].ev);
        if (r < 0)
                r = copy_failed(ctx, &ctx->copies[i]);
        if (r <= 0)
                inflight_remove(ctx, (size_t)i);
        return r;
}

_public_ int aqua_copy_wait(aqua_ctx *ctx, aqua_ticket ticket)
{
        ssize_t i;
        int r;

        if (!ctx || ticket == 0 || ticket > ctx->next_ticket)
                return -EINVAL;
        i = inflight_find(ctx, ticket);
        if (i < 0)
                return ticket_failed(ctx, ticket) ? -EIO : 0;
        r = gpu_event_sync(ctx->gpu, ctx->copies[i].ev);
        if (r < 0)
                r = copy_failed(ctx, &ctx->copies[i]);
        inflight_remove(ctx, (size_t)i);
        return r;
}

/* ---------------------------------------------------------------- layers */

struct aqua_layers {
        aqua_ctx *ctx;
        struct CUstream_st *streams[2]; /* offload, prefetch */
        bool own[2];
        unsigned n;
        struct layer {
                struct CUevent_st *ev; /* recorded after the layer's last transfer */
                aqua_ticket ticket;    /* 0: nothing queued yet */
        } layer[];
};

_public_ int aqua_layers_new(aqua_ctx *ctx, unsigned n_layers, struct CUstream_st *offload_stream,
                             struct CUstream_st *prefetch_stream, aqua_layers **ret)
{
        aqua_layers *l;
        int r = 0;

        if (!ctx || !ret || n_layers == 0 || n_layers > 1u << 20)
                return -EINVAL;
        l = calloc(1, sizeof(*l) + n_layers * sizeof(l->layer[0]));
        if (!l)
                return -ENOMEM;
        l->ctx = ctx;
        l->n = n_layers;
        l->streams[0] = offload_stream;
        l->streams[1] = prefetch_stream;
        for (int k = 0; k < 2 && r == 0; k++)
                if (!l->streams[k]) {
                        r = gpu_stream_new(ctx->gpu, &l->streams[k]);
                        l->own[k] = r == 0;
                }
        for (unsigned i = 0; i < n_layers && r == 0; i++)
                r = gpu_event_new(ctx->gpu, &l->layer[i].ev);
        if (r < 0) {
                aqua_layers_free(l);
                return r == -ENOMEM ? r : -EIO;
        }
        *ret = l;
        return 0;
}

_public_ aqua_layers *aqua_layers_free(aqua_layers *l)
{
        if (!l)
                return NULL;
        for (int k = 0; k < 2; k++)
                if (l->streams[k]) {
                        gpu_stream_sync(l->ctx->gpu, l->streams[k]);
                        if (l->own[k])
                                gpu_stream_free(l->ctx->gpu, l->streams[k]);
                }
        for (unsigned i = 0; i < l->n; i++)
                if (l->layer[i].ev)
                        gpu_event_free(l->ctx->gpu, l->layer[i].ev);
        free(l);
        return NULL;
}

static int layer_queue(aqua_layers *l, int dir, unsigned layer, const struct aqua_copy_piece *p,
                       size_t n, struct CUevent_st *after)
{
        if (!l || layer >= l->n)
                return -EINVAL;
        return aqua_copy_batch(l->ctx, p, n, l->streams[dir], after, l->layer[layer].ev,
                               &l->layer[layer].ticket);
}

_public_ int aqua_layers_offload(aqua_layers *l, unsigned layer,
                                 const struct aqua_copy_piece *pieces, size_t n,
                                 struct CUevent_st *computed)
{
        return layer_queue(l, 0, layer, pieces, n, computed);
}

_public_ int aqua_layers_prefetch(aqua_layers *l, unsigned layer,
                                  const struct aqua_copy_piece *pieces, size_t n,
                                  struct CUevent_st *after)
{
        return layer_queue(l, 1, layer, pieces, n, after);
}

_public_ int aqua_layers_event(aqua_layers *l, unsigned layer, struct CUevent_st **ret)
{
        if (!l || !ret || layer >= l->n)
                return -EINVAL;
        *ret = l->layer[layer].ev;
        return 0;
}

_public_ int aqua_layers_query(aqua_layers *l, unsigned layer)
{
        if (!l || layer >= l->n)
                return -EINVAL;
        return l->layer[layer].ticket ? aqua_copy_query(l->ctx, l->layer[layer].ticket) : 0;
}

_public_ int aqua_layers_wait(aqua_layers *l, unsigned layer)
{
        if (!l || layer >= l->n)
                return -EINVAL;
        return l->layer[layer].ticket ? aqua_copy_wait(l->ctx, l->layer[layer].ticket) : 0;
}
