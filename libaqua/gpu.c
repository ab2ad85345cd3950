/* The context's GPU through the run-time loaded CUDA driver, with driver errors as errnos. */
#include "gpu.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alog.h"
#include "aqua/aqua.h"
#include "cuda-driver.h"
#include "util.h"

struct gpu_dev {
        const struct cuda_driver *d;
        CUdevice dev;
        CUcontext primary;
        CUstream stream; /* libaqua's own copies; never the engine's streams */
        struct gpu_info info;
};

/* The caller's current context, restored when a scope that switched ends. */
struct ctx_scope {
        const struct gpu_dev *g;
        CUcontext saved;
        bool switched;
};

static void ctx_scope_end(struct ctx_scope *s)
{
        if (s->switched)
                s->g->d->cuCtxSetCurrent(s->saved);
}

#define WITH_PRIMARY(g)                                                                            \
        _cleanup_(ctx_scope_end) struct ctx_scope _scope_ = {.g = (g)};                            \
        do {                                                                                       \
                if ((g)->d->cuCtxGetCurrent(&_scope_.saved) == CUDA_SUCCESS &&                     \
                    _scope_.saved != (g)->primary &&                                               \
                    (g)->d->cuCtxSetCurrent((g)->primary) == CUDA_SUCCESS)                         \
                        _scope_.switched = true;                                                   \
        } while (0)

/* The name of the last error a driver call returned on this thread, for reports. */
static _Thread_local const char *last_error;

const char *gpu_last_error(const struct gpu_dev *g)
{
        (void)g;
        return last_error ? last_error : "no CUDA error";
}

static int cu_errno(const struct gpu_dev *g, CUresult r, const char *what)
{
        const char *name = NULL;

        if (r == CUDA_SUCCESS)
                return 0;
        g->d->cuGetErrorName(r, &name);
        last_error = name ? name : "an unnamed CUDA error";
        alog_debug("%s on device %d: %s (%d)", what, g->info.ordinal, name ? name : "?", (int)r);
        switch (r) {
        case CUDA_ERROR_OUT_OF_MEMORY:
                return -ENOMEM;
        case CUDA_ERROR_NOT_SUPPORTED:
                return -EOPNOTSUPP;
        case CUDA_ERROR_INVALID_VALUE:
                return -EINVAL;
        case CUDA_ERROR_INVALID_DEVICE:
        case CUDA_ERROR_NO_DEVICE:
                return -ENODEV;
        case CUDA_ERROR_NOT_PERMITTED:
                /* The only permission the driver checks for aqua: a fabric handle's IMEX channel.
                 */
                return -ENOKEY;
        default:
                return -EIO;
        }
}

#define CU(g, call) cu_errno((g), (g)->d->call, #call)

static void format_uuid(const CUuuid *u, char *buf, size_t len)
{
        const unsigned char *b = (const unsigned char *)u->bytes;

        snprintf(buf, len,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                 b[14], b[15]);
}

static CUmemAllocationProp device_prop(const struct gpu_dev *g, bool exportable)
{
        return (CUmemAllocationProp){
            .type = CU_MEM_ALLOCATION_TYPE_PINNED,
            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = g->info.ordinal},
            .requestedHandleTypes =
                exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE,
        };
}

static int gpu_query(struct gpu_dev *g)
{
        CUmemAllocationProp prop = device_prop(g, true);
        struct gpu_info *gi = &g->info;
        CUuuid uuid;
        size_t total = 0, gran = 0;
        int count = 0, fabric = 0, r;

        r = CU(g, cuDeviceGetUuid(&uuid, g->dev));
        if (r < 0)
                return r;
        format_uuid(&uuid, gi->uuid, sizeof(gi->uuid));
        r = CU(g, cuDeviceTotalMem(&total, g->dev));
        if (r < 0)
                return r;
        gi->capacity = total;
        r = CU(g, cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        if (r < 0)
                return r;
        /* Everything libaqua aligns relies on a power of two. */
        if (gran == 0 || (gran & (gran - 1)))
                return -EIO;
        gi->granularity = gran;
        if (g->d->cuDeviceGetAttribute(&fabric, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
                                       g->dev) == CUDA_SUCCESS)
                gi->fabric = fabric == 1;
        r = CU(g, cuDeviceGetCount(&count));
        if (r < 0)
                return r;
        for (int i = 0; i < count && gi->n_peers < ARRAY_SIZE(gi->peers); i++) {
                CUdevice other;
                int can = 0;

                if (i == gi->ordinal || g->d->cuDeviceGet(&other, i) != CUDA_SUCCESS ||
                    g->d->cuDeviceCanAccessPeer(&can, g->dev, other) != CUDA_SUCCESS || !can ||
                    g->d->cuDeviceGetUuid(&uuid, other) != CUDA_SUCCESS)
                        continue;
                format_uuid(&uuid, gi->peers[gi->n_peers].uuid, GPU_UUID_LEN);
                gi->peers[gi->n_peers++].ordinal = i;
        }
        return 0;
}

int gpu_open(int ordinal, struct gpu_dev **ret)
{
        _cleanup_free_ char *err = NULL;
        struct gpu_dev *g;
        int count = 0, r;

        g = calloc(1, sizeof(*g));
        if (!g)
                return -ENOMEM;
        g->info.ordinal = ordinal;
        r = cuda_driver_get(&g->d, &err);
        if (r < 0) {
                alog_error("%s", err ? err : "cannot load the CUDA driver");
                free(g);
                return -ELIBACC;
        }
        r = CU(g, cuInit(0));
        if (r == 0)
                r = CU(g, cuDeviceGetCount(&count));
        if (r == 0 && ordinal >= count)
                r = -ENODEV;
        if (r == 0)
                r = CU(g, cuDeviceGet(&g->dev, ordinal));
        if (r < 0) {
                free(g);
                return r == -EIO ? -ELIBACC : r;
        }
        r = CU(g, cuDevicePrimaryCtxRetain(&g->primary, g->dev));
        if (r < 0) {
                free(g);
                return r;
        }
        r = gpu_query(g);
        if (r == 0) {
                WITH_PRIMARY(g);
                r = CU(g, cuStreamCreate(&g->stream, CU_STREAM_NON_BLOCKING));
        }
        if (r < 0) {
                gpu_free(g);
                return r;
        }
        *ret = g;
        return 0;
}

struct gpu_dev *gpu_free(struct gpu_dev *g)
{
        if (!g)
                return NULL;
        if (g->stream) {
                WITH_PRIMARY(g);
                g->d->cuStreamDestroy(g->stream);
        }
        if (g->primary)
                g->d->cuDevicePrimaryCtxRelease(g->dev);
        free(g);
        return NULL;
}

const struct gpu_info *gpu_info(const struct gpu_dev *g)
{
        return &g->info;
}

int gpu_alloc_exportable(struct gpu_dev *g, uint64_t size, bool fabric, gpu_handle *ret)
{
        CUmemAllocationProp prop = device_prop(g, true);
        CUmemGenericAllocationHandle h;
        int r;

        if (fabric)
                prop.requestedHandleTypes |= CU_MEM_HANDLE_TYPE_FABRIC;
        WITH_PRIMARY(g);
        r = CU(g, cuMemCreate(&h, size, &prop, 0));
        if (r == -ENOKEY && fabric)
                alog_error("device %d: the driver does not permit fabric memory "
                           "(CUDA_ERROR_NOT_PERMITTED): this user has no IMEX channel "
                           "(/dev/nvidia-caps-imex-channels/channelN)",
                           g->info.ordinal);
        if (r < 0)
                return r;
        *ret = h;
        return 0;
}

int gpu_export(struct gpu_dev *g, gpu_handle h, int *ret_fd)
{
        int fd = -1, r;

        WITH_PRIMARY(g);
        r = CU(g,
               cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        if (r < 0)
                return r;
        *ret_fd = fd;
        return 0;
}

int gpu_export_fabric(struct gpu_dev *g, gpu_handle h, uint8_t ret[GPU_FABRIC_HANDLE_LEN])
{
        CUmemFabricHandle fh;
        int r;

        WITH_PRIMARY(g);
        r = CU(g, cuMemExportToShareableHandle(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0));
        if (r < 0)
                return r;
        memcpy(ret, fh.data, GPU_FABRIC_HANDLE_LEN);
        return 0;
}

int gpu_release(struct gpu_dev *g, gpu_handle h)
{
        WITH_PRIMARY(g);
        return CU(g, cuMemRelease(h));
}

int gpu_import(struct gpu_dev *g, int fd, gpu_handle *ret)
{
        CUmemGenericAllocationHandle h;
        int r;

        WITH_PRIMARY(g);
        r = CU(g, cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        if (r < 0)
                return r;
        *ret = h;
        return 0;
}

int gpu_import_fabric(struct gpu_dev *g, const uint8_t fabric[GPU_FABRIC_HANDLE_LEN],
                      gpu_handle *ret)
{
        CUmemGenericAllocationHandle h;
        CUmemFabricHandle fh;
        int r;

        memcpy(fh.data, fabric, GPU_FABRIC_HANDLE_LEN);
        WITH_PRIMARY(g);
        r = CU(g, cuMemImportFromShareableHandle(&h, &fh, CU_MEM_HANDLE_TYPE_FABRIC));
        if (r == -ENOKEY)
                alog_error("device %d: the driver does not permit importing a fabric handle "
                           "(CUDA_ERROR_NOT_PERMITTED): no IMEX channel, or not the exporter's",
                           g->info.ordinal);
        if (r < 0)
                return r;
        *ret = h;
        return 0;
}

int gpu_reserve(struct gpu_dev *g, uint64_t size, uint64_t *ret_dptr)
{
        CUdeviceptr p;
        int r;

        WITH_PRIMARY(g);
        r = CU(g, cuMemAddressReserve(&p, size, 0, 0, 0));
        if (r < 0)
                return r;
        *ret_dptr = p;
        return 0;
}

int gpu_unreserve(struct gpu_dev *g, uint64_t dptr, uint64_t size)
{
        WITH_PRIMARY(g);
        return CU(g, cuMemAddressFree(dptr, size));
}

int gpu_map(struct gpu_dev *g, uint64_t dptr, uint64_t size, gpu_handle h)
{
        CUmemAccessDesc desc = {
            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = g->info.ordinal},
            .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        int r;

        WITH_PRIMARY(g);
        r = CU(g, cuMemMap(dptr, size, 0, h, 0));
        if (r < 0)
                return r;
        r = CU(g, cuMemSetAccess(dptr, size, &desc, 1));
        if (r < 0)
                g->d->cuMemUnmap(dptr, size);
        return r;
}

int gpu_unmap(struct gpu_dev *g, uint64_t dptr, uint64_t size)
{
        WITH_PRIMARY(g);
        return CU(g, cuMemUnmap(dptr, size));
}

int gpu_alloc_host_mappable(struct gpu_dev *g, uint64_t size, gpu_handle *ret)
{
        CUmemAllocationProp prop = {
            .type = CU_MEM_ALLOCATION_TYPE_PINNED,
            .location = {.type = CU_MEM_LOCATION_TYPE_HOST},
        };
        CUmemGenericAllocationHandle h;
        CUresult cr;

        WITH_PRIMARY(g);
        cr = g->d->cuMemCreate(&h, size, &prop, 0);
        /* Drivers before host locations reject the location type itself. */
        if (cr == CUDA_ERROR_INVALID_VALUE || cr == CUDA_ERROR_NOT_SUPPORTED ||
            cr == CUDA_ERROR_INVALID_DEVICE)
                return -EOPNOTSUPP;
        if (cr != CUDA_SUCCESS)
                return cu_errno(g, cr, "cuMemCreate on the host");
        *ret = h;
        return 0;
}

int gpu_host_alloc(struct gpu_dev *g, uint64_t size, void **ret)
{
        void *p = NULL;
        int r;

        WITH_PRIMARY(g);
        r = CU(g, cuMemHostAlloc(&p, size, 0));
        if (r < 0)
                return r;
        *ret = p;
        return 0;
}

int gpu_host_free(struct gpu_dev *g, void *p)
{
        WITH_PRIMARY(g);
        return CU(g, cuMemFreeHost(p));
}

int gpu_copy(struct gpu_dev *g, uint64_t dst, uint64_t src, uint64_t size)
{
        int r;

        WITH_PRIMARY(g);
        r = CU(g, cuMemcpyAsync(dst, src, size, g->stream));
        if (r < 0)
                return r;
        /* Device-to-device cuMemcpy may return early; the caller unmaps the source next. */
        return CU(g, cuStreamSynchronize(g->stream));
}

int gpu_alloc_local(struct gpu_dev *g, uint64_t size, gpu_handle *ret)
{
        CUmemAllocationProp prop = device_prop(g, false);
        CUmemGenericAllocationHandle h;
        int r;

        WITH_PRIMARY(g);
        r = CU(g, cuMemCreate(&h, size, &prop, 0));
        if (r < 0)
                return r;
        *ret = h;
        return 0;
}

CUstream gpu_stream(struct gpu_dev *g, CUstream s)
{
        return s ? s : g->stream;
}

int gpu_stream_new(struct gpu_dev *g, CUstream *ret)
{
        CUstream s;
        int r;

        WITH_PRIMARY(g);
        r = CU(g, cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        if (r < 0)
                return r;
        *ret = s;
        return 0;
}

void gpu_stream_free(struct gpu_dev *g, CUstream s)
{
        WITH_PRIMARY(g);
        g->d->cuStreamDestroy(s);
}

int gpu_stream_sync(struct gpu_dev *g, CUstream s)
{
        WITH_PRIMARY(g);
        return CU(g, cuStreamSynchronize(gpu_stream(g, s)));
}

int gpu_event_new(struct gpu_dev *g, CUevent *ret)
{
        CUevent e;
        int r;

        WITH_PRIMARY(g);
        r = CU(g, cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
        if (r < 0)
                return r;
        *ret = e;
        return 0;
}

void gpu_event_free(struct gpu_dev *g, CUevent e)
{
        WITH_PRIMARY(g);
        g->d->cuEventDestroy(e);
}

int gpu_event_query(struct gpu_dev *g, CUevent e)
{
        CUresult cr;

        WITH_PRIMARY(g);
        cr = g->d->cuEventQuery(e);
        if (cr == CUDA_ERROR_NOT_READY)
                return AQUA_PENDING;
        return cu_errno(g, cr, "cuEventQuery");
}

int gpu_event_sync(struct gpu_dev *g, CUevent e)
{
        WITH_PRIMARY(g);
        return CU(g, cuEventSynchronize(e));
}

/* One cuMemcpyBatchAsync for the pieces: their addresses go into three parallel arrays. */
static int copy_batch_call(struct gpu_dev *g, CUstream s, const struct aqua_copy_piece *p, size_t n)
{
        _cleanup_free_ CUdeviceptr *addrs = malloc(2 * n * sizeof(*addrs));
        _cleanup_free_ size_t *sizes = malloc(n * sizeof(*sizes));
        CUmemcpyAttributes attr = {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
        size_t attr_idx = 0;

        if (!addrs || !sizes)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                addrs[i] = p[i].dst;
                addrs[n + i] = p[i].src;
                sizes[i] = p[i].bytes;
        }
        return CU(g, cuMemcpyBatchAsync(addrs, addrs + n, sizes, n, &attr, &attr_idx, 1, s));
}

int gpu_copy_batch(struct gpu_dev *g, CUstream s, CUevent wait,
                   const struct aqua_copy_piece *pieces, size_t n, bool use_batch,
                   CUevent const *record, size_t n_record)
{
        int r;

        WITH_PRIMARY(g);
        s = gpu_stream(g, s);
        if (wait) {
                r = CU(g, cuStreamWaitEvent(s, wait, 0));
                if (r < 0)
                        return r;
        }
        if (n > 1 && use_batch && g->d->cuMemcpyBatchAsync)
                r = copy_batch_call(g, s, pieces, n);
        else {
                r = 0;
                for (size_t i = 0; i < n && r == 0; i++)
                        r = CU(g, cuMemcpyAsync(pieces[i].dst, pieces[i].src, pieces[i].bytes, s));
        }
        if (r < 0)
                return r;
        /* The copies are queued: an error from here on (a fault of theirs the driver already
         * knows of, sticky) leaves them without a completion to wait for. */
        for (size_t i = 0; i < n_record; i++)
                if (record[i]) {
                        r = CU(g, cuEventRecord(record[i], s));
                        if (r < 0)
                                return GPU_E_QUEUED;
                }
        return 0;
}

static bool all_zero(const void *buf, size_t len)
{
        const uint64_t *w = buf;

        /* len is a multiple of 8: chunks are multiples of the allocation granularity. */
        for (size_t i = 0; i < len / 8; i++)
                if (w[i])
                        return false;
        return true;
}

int gpu_scrub(struct gpu_dev *g, gpu_handle h, uint64_t size, void *buf, size_t len)
{
        uint64_t dptr = 0;
        int r, verdict = 0;

        r = gpu_reserve(g, size, &dptr);
        if (r < 0)
                return r;
        r = gpu_map(g, dptr, size, h);
        if (r < 0) {
                gpu_unreserve(g, dptr, size);
                return r;
        }
        {
                WITH_PRIMARY(g);
                r = CU(g, cuMemsetD8Async(dptr, 0, size, g->stream));
                if (r >= 0)
                        r = CU(g, cuStreamSynchronize(g->stream));
        }
        /* Read back what the device holds now: a write that did not land shows here. */
        for (uint64_t off = 0; r >= 0 && off < size && verdict == 0; off += len) {
                size_t n = (size_t)MIN((uint64_t)len, size - off);
                r = gpu_copy(g, (uint64_t)(uintptr_t)buf, dptr + off, n);
                if (r >= 0 && !all_zero(buf, n))
                        verdict = 1;
        }
        gpu_unmap(g, dptr, size);
        gpu_unreserve(g, dptr, size);
        return r < 0 ? r : verdict;
}

int gpu_mem_info(struct gpu_dev *g, uint64_t *ret_free, uint64_t *ret_total)
{
        size_t free_b = 0, total = 0;
        int r;

        WITH_PRIMARY(g);
        r = CU(g, cuMemGetInfo(&free_b, &total));
        if (r < 0)
                return r;
        *ret_free = free_b;
        *ret_total = total;
        return 0;
}
