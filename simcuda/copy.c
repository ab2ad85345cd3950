/*
 * Copies. Synchronous forms wait for the legacy default stream (and the streams that synchronize
 * with it) and then copy on the calling thread; asynchronous forms queue on a stream. Bandwidth
 * is whatever memcpy achieves on the host.
 */
#include <string.h>

#include "sim.h"

static CUresult check_pair(uintptr_t dst, bool dst_device, uintptr_t src, bool src_device, size_t n)
{
        CUresult res = sim_vm_check(dst, n, true, dst_device);

        if (res != CUDA_SUCCESS)
                return res;
        return sim_vm_check(src, n, false, src_device);
}

static CUresult copy_sync(uintptr_t dst, bool dst_device, uintptr_t src, bool src_device, size_t n)
{
        struct CUctx_st *ctx = sim_current_ctx();
        CUresult res;

        SIM_CHECK_INIT();
        if (!ctx)
                return CUDA_ERROR_INVALID_CONTEXT;
        res = check_pair(dst, dst_device, src, src_device, n);
        if (res != CUDA_SUCCESS)
                return res;
        sim_stream_drain(ctx, true);
        if (n)
                memmove((void *)dst, (const void *)src, n);
        return CUDA_SUCCESS;
}

static CUresult copy_async(uintptr_t dst, bool dst_device, uintptr_t src, bool src_device, size_t n,
                           CUstream hStream)
{
        struct sim_piece *piece;
        struct CUstream_st *s;
        CUresult res;

        SIM_CHECK_INIT();
        res = check_pair(dst, dst_device, src, src_device, n);
        if (res != CUDA_SUCCESS)
                return res;
        res = sim_stream_resolve(hStream, sim_current_ctx(), &s);
        if (res != CUDA_SUCCESS)
                return res;
        piece = malloc(sizeof(*piece));
        if (!piece)
                return CUDA_ERROR_OUT_OF_MEMORY;
        *piece = (struct sim_piece){(void *)dst, (const void *)src, n};
        return sim_stream_copy(s, piece, 1, NULL);
}

SIM_API cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
        SIM_COUNT();
        return copy_sync(dst, false, src, false, ByteCount);
}

SIM_API cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
        SIM_COUNT();
        return copy_sync(dstDevice, true, (uintptr_t)srcHost, false, ByteCount);
}

SIM_API cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
        SIM_COUNT();
        return copy_sync((uintptr_t)dstHost, false, srcDevice, true, ByteCount);
}

SIM_API cuMemcpyDtoD(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
        SIM_COUNT();
        return copy_sync(dstDevice, true, srcDevice, true, ByteCount);
}

SIM_API cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
        SIM_COUNT();
        return copy_async(dst, false, src, false, ByteCount, hStream);
}

SIM_API cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                          CUstream hStream)
{
        SIM_COUNT();
        return copy_async(dstDevice, true, (uintptr_t)srcHost, false, ByteCount, hStream);
}

SIM_API cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
        SIM_COUNT();
        return copy_async((uintptr_t)dstHost, false, srcDevice, true, ByteCount, hStream);
}

SIM_API cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                          CUstream hStream)
{
        SIM_COUNT();
        return copy_async(dstDevice, true, srcDevice, true, ByteCount, hStream);
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
        return copy_sync(dstDevice, true, srcDevice, true, ByteCount);
}

SIM_API cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                          CUcontext srcContext, size_t ByteCount, CUstream hStream)
{
        SIM_COUNT();
        SIM_CHECK_INIT();
        if (!ctx_ok(dstContext) || !ctx_ok(srcContext))
                return CUDA_ERROR_INVALID_CONTEXT;
        return copy_async(dstDevice, true, srcDevice, true, ByteCount, hStream);
}

SIM_API cuMemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
        SIM_COUNT();
        struct CUctx_st *ctx = sim_current_ctx();
        CUresult res;

        SIM_CHECK_INIT();
        if (!ctx)
                return CUDA_ERROR_INVALID_CONTEXT;
        res = sim_vm_check(dstDevice, N, true, true);
        if (res != CUDA_SUCCESS)
                return res;
        sim_stream_drain(ctx, true);
        memset((void *)dstDevice, uc, N);
        return CUDA_SUCCESS;
}

SIM_API cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
        SIM_COUNT();
        struct CUstream_st *s;
        CUresult res;

        SIM_CHECK_INIT();
        res = sim_vm_check(dstDevice, N, true, true);
        if (res != CUDA_SUCCESS)
                return res;
        res = sim_stream_resolve(hStream, sim_current_ctx(), &s);
        if (res != CUDA_SUCCESS)
                return res;
        return sim_stream_memset(s, (void *)dstDevice, uc, N);
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
        res = sim_vm_check_pieces(dsts, srcs, sizes, count);
        if (res != CUDA_SUCCESS)
                return res;
        pieces = malloc(count * sizeof(*pieces));
        if (!pieces)
                return CUDA_ERROR_OUT_OF_MEMORY;
        for (size_t i = 0; i < count; i++) {
                while (k + 1 < numAttrs && attrsIdxs[k + 1] <= i)
                        k++;
                pieces[i] = (struct sim_piece){(void *)dsts[i], (const void *)srcs[i], sizes[i]};
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
