/*
 * Copies. Synchronous forms wait for the legacy default stream (and the streams that synchronize
 * with it) and then copy on the calling thread; asynchronous forms queue on a stream. Each side
 * is checked against the access of the device doing the copy (the stream's, or the current
 * context's for synchronous forms) and copied through the copy engine's view. Bandwidth is
 * whatever memcpy achieves on the host.
 */
#include <string.h>

#include "sim.h"

/* One copy of n bytes: dst is written by dst_dev, src read by src_dev (the same but for peers). */
struct copy {
        uintptr_t dst, src;
        bool dst_device, src_device;
        int dst_dev, src_dev;
        size_t n;
};

static CUresult copy_translate(const struct copy *c, struct sim_piece *ret)
{
        void *dst, *src;
        CUresult res = sim_vm_translate(c->dst, c->n, true, c->dst_device, c->dst_dev, &dst);

        if (res == CUDA_SUCCESS)
                res = sim_vm_translate(c->src, c->n, false, c->src_device, c->src_dev, &src);
        if (res == CUDA_SUCCESS)
                *ret = (struct sim_piece){dst, src, c->n};
        return res;
}

static CUresult copy_sync(struct copy c, const struct CUctx_st *peer_dst,
                          const struct CUctx_st *peer_src)
{
        struct sim_piece piece;
        struct CUctx_st *ctx;
        CUresult res;

        SIM_CHECK_INIT();
        res = sim_ctx_get(&ctx);
        if (res != CUDA_SUCCESS)
                return res;
        c.dst_dev = peer_dst ? peer_dst->device : ctx->device;
        c.src_dev = peer_src ? peer_src->device : ctx->device;
        res = copy_translate(&c, &piece);
        if (res == CUDA_ERROR_ILLEGAL_ADDRESS) {
                sim_stream_drain(ctx, true);
                return sim_ctx_fault(ctx);
        }
        if (res != CUDA_SUCCESS)
                return res;
        sim_stream_drain(ctx, true);
        if (c.n)
                memmove(piece.dst, piece.src, c.n);
        return CUDA_SUCCESS;
}

/*
 * Queued work whose addresses did not pass (res): the stream's own error (its context's sticky
 * one, a stale handle) is what the driver reports first; else a fault is queued to happen when
 * its turn comes, and a refusal returned. Work that passes learns the stream's error when queued.
 */
static CUresult not_queued(struct CUstream_st *s, CUresult res)
{
        CUresult own = sim_stream_check(s);

        if (own != CUDA_SUCCESS)
                return own;
        return res == CUDA_ERROR_ILLEGAL_ADDRESS ? sim_stream_fault(s) : res;
}

static CUresult copy_async(struct copy c, const struct CUctx_st *peer_dst,
                           const struct CUctx_st *peer_src, CUstream hStream)
{
        struct sim_piece *piece;
        struct CUstream_st *s;
        CUresult res;

        SIM_CHECK_INIT();
        res = sim_stream_resolve(hStream, sim_current_ctx(), &s);
        if (res != CUDA_SUCCESS)
                return res;
        c.dst_dev = peer_dst ? peer_dst->device : sim_stream_device(s);
        c.src_dev = peer_src ? peer_src->device : sim_stream_device(s);
        piece = malloc(sizeof(*piece));
        if (!piece)
                return CUDA_ERROR_OUT_OF_MEMORY;
        res = copy_translate(&c, piece);
        if (res != CUDA_SUCCESS) {
                free(piece);
                return not_queued(s, res);
        }
        return sim_stream_copy(s, piece, 1, NULL);
}

static struct copy copy_of(uintptr_t dst, bool dst_device, uintptr_t src, bool src_device, size_t n)
{
        return (struct copy){
            .dst = dst, .dst_device = dst_device, .src = src, .src_device = src_device, .n = n};
}

SIM_API cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
        SIM_COUNT();
        return copy_sync(copy_of(dst, false, src, false, ByteCount), NULL, NULL);
}

SIM_API cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
        SIM_COUNT();
        return copy_sync(copy_of(dstDevice, true, (uintptr_t)srcHost, false, ByteCount), NULL,
                         NULL);
}

SIM_API cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
        SIM_COUNT();
        return copy_sync(copy_of((uintptr_t)dstHost, false, srcDevice, true, ByteCount), NULL,
                         NULL);
}

SIM_API cuMemcpyDtoD(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
        SIM_COUNT();
        return copy_sync(copy_of(dstDevice, true, srcDevice, true, ByteCount), NULL, NULL);
}

SIM_API cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
        SIM_COUNT();
        return copy_async(copy_of(dst, false, src, false, ByteCount), NULL, NULL, hStream);
}

SIM_API cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                          CUstream hStream)
{
        SIM_COUNT();
        return copy_async(copy_of(dstDevice, true, (uintptr_t)srcHost, false, ByteCount), NULL,
                          NULL, hStream);
}

SIM_API cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
        SIM_COUNT();
        return copy_async(copy_of((uintptr_t)dstHost, false, srcDevice, true, ByteCount), NULL,
                          NULL, hStream);
}

SIM_API cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                          CUstream hStream)
{
        SIM_COUNT();
        return copy_async(copy_of(dstDevice, true, srcDevice, true, ByteCount), NULL, NULL,
                          hStream);
}

static bool ctx_ok(CUcontext c)
{
        for (int i = 0; i < sim.n_devices; i++)
                if (sim.devices[i].primary == c)
                        return true;
        return false;
}

SIM_API cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                     CUcontext srcContext, size_t ByteCount)
{
        SIM_COUNT();
        SIM_CHECK_INIT();
        if (!ctx_ok(dstContext) || !ctx_ok(srcContext))
                return CUDA_ERROR_INVALID_CONTEXT;
        /* Each side is reached by the device of the context it is named with. */
        return copy_sync(copy_of(dstDevice, true, srcDevice, true, ByteCount), dstContext,
                         srcContext);
}

SIM_API cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                          CUcontext srcContext, size_t ByteCount, CUstream hStream)
{
        SIM_COUNT();
        SIM_CHECK_INIT();
        if (!ctx_ok(dstContext) || !ctx_ok(srcContext))
                return CUDA_ERROR_INVALID_CONTEXT;
        return copy_async(copy_of(dstDevice, true, srcDevice, true, ByteCount), dstContext,
                          srcContext, hStream);
}

SIM_API cuMemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
        SIM_COUNT();
        struct CUctx_st *ctx;
        CUresult res;
        void *dst;

        SIM_CHECK_INIT();
        res = sim_ctx_get(&ctx);
        if (res != CUDA_SUCCESS)
                return res;
        res = sim_vm_translate(dstDevice, N, true, true, ctx->device, &dst);
        if (res == CUDA_ERROR_ILLEGAL_ADDRESS) {
                sim_stream_drain(ctx, true);
                return sim_ctx_fault(ctx);
        }
        if (res != CUDA_SUCCESS)
                return res;
        sim_stream_drain(ctx, true);
        memset(dst, uc, N);
        return CUDA_SUCCESS;
}

SIM_API cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
        SIM_COUNT();
        struct CUstream_st *s;
        CUresult res;
        void *dst;

        SIM_CHECK_INIT();
        res = sim_stream_resolve(hStream, sim_current_ctx(), &s);
        if (res != CUDA_SUCCESS)
                return res;
        res = sim_vm_translate(dstDevice, N, true, true, sim_stream_device(s), &dst);
        if (res != CUDA_SUCCESS)
                return not_queued(s, res);
        return sim_stream_memset(s, dst, uc, N);
}

/* The attribute layout rules cuMemcpyBatchAsync documents. */
static CUresult batch_check_attrs(size_t count, const CUmemcpyAttributes *attrs,
                                  const size_t *attrsIdxs, size_t numAttrs)
{
        if (!attrs || !attrsIdxs || numAttrs == 0 || numAttrs > count || attrsIdxs[0] != 0)
                return CUDA_ERROR_INVALID_VALUE;
        for (size_t k = 0; k < numAttrs; k++) {
                if (k > 0 && attrsIdxs[k] <= attrsIdxs[k - 1])
                        return CUDA_ERROR_INVALID_VALUE;
                if (attrsIdxs[k] >= count)
                        return CUDA_ERROR_INVALID_VALUE;
                if (attrs[k].srcAccessOrder < CU_MEMCPY_SRC_ACCESS_ORDER_STREAM ||
                    attrs[k].srcAccessOrder > CU_MEMCPY_SRC_ACCESS_ORDER_ANY)
                        return CUDA_ERROR_INVALID_VALUE;
                if (attrs[k].flags & ~(unsigned)CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE)
                        return CUDA_ERROR_INVALID_VALUE;
        }
        return CUDA_SUCCESS;
}

/*
 * One queued operation for the whole batch. Sources marked DURING_API_CALL are read before
 * returning (into a staging buffer), as the caller may reuse them as soon as the call returns.
 */
SIM_API cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                           CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
                           CUstream hStream)
{
        SIM_COUNT();
        _cleanup_free_ struct sim_piece *pieces = NULL;
        _cleanup_free_ char *staging = NULL;
        size_t staged = 0, k = 0;
        struct CUstream_st *s;
        CUresult res;

        SIM_CHECK_INIT();
        if (!dsts || !srcs || !sizes || count == 0)
                return CUDA_ERROR_INVALID_VALUE;
        /* The legacy NULL stream is documented as not allowed. */
        if (!hStream || hStream == CU_STREAM_LEGACY)
                return CUDA_ERROR_INVALID_VALUE;
        res = batch_check_attrs(count, attrs, attrsIdxs, numAttrs);
        if (res != CUDA_SUCCESS)
                return res;
        res = sim_stream_resolve(hStream, sim_current_ctx(), &s);
        if (res != CUDA_SUCCESS)
                return res;
        pieces = malloc(count * sizeof(*pieces));
        if (!pieces)
                return CUDA_ERROR_OUT_OF_MEMORY;
        res = sim_vm_translate_pieces(dsts, srcs, sizes, count, sim_stream_device(s), pieces);
        if (res != CUDA_SUCCESS)
                return not_queued(s, res); /* a fault: the whole batch, none of it lands */
        for (size_t i = 0; i < count; i++) {
                while (k + 1 < numAttrs && attrsIdxs[k + 1] <= i)
                        k++;
                if (attrs[k].srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL &&
                    size_add_overflows(staged, sizes[i], &staged))
                        return CUDA_ERROR_INVALID_VALUE;
        }
        if (staged) {
                size_t off = 0;

                staging = malloc(staged);
                if (!staging)
                        return CUDA_ERROR_OUT_OF_MEMORY;
                k = 0;
                for (size_t i = 0; i < count; i++) {
                        while (k + 1 < numAttrs && attrsIdxs[k + 1] <= i)
                                k++;
                        if (attrs[k].srcAccessOrder != CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL)
                                continue;
                        memcpy(staging + off, pieces[i].src, pieces[i].size);
                        pieces[i].src = staging + off;
                        off += pieces[i].size;
                }
        }
        return sim_stream_copy(s, TAKE_PTR(pieces), count, TAKE_PTR(staging));
}

/*
 * The 12.8 interface: the same batch, and failIdx, which the driver sets to the copy that failed
 * or SIZE_MAX when an error concerns no one copy (the case for every error here).
 */
CUresult CUDAAPI sim_memcpy_batch_12080(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                        size_t count, CUmemcpyAttributes *attrs, size_t *attrsIdxs,
                                        size_t numAttrs, size_t *failIdx, CUstream hStream)
{
        SIM_COUNT();
        if (failIdx)
                *failIdx = SIZE_MAX;
        return cuMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, hStream);
}
