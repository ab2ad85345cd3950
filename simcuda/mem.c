/* Linear allocations (cuMemAlloc, pinned host memory) and the machine-wide cuMemGetInfo. */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "account.h"
#include "sim.h"

struct linear {
        uintptr_t ptr;
        size_t size;   /* as asked */
        size_t mapped; /* rounded to pages */
        bool host;
        const struct CUctx_st *ctx; /* made in; its destruction frees it */
};

static pthread_mutex_t linear_lock = PTHREAD_MUTEX_INITIALIZER;
static struct linear *linears; /* sorted by ptr */
static size_t n_linears;

/* Index of the first range ending after p. */
static size_t linear_lower(uintptr_t p)
{
        size_t lo = 0, hi = n_linears;

        while (lo < hi) {
                size_t mid = (lo + hi) / 2;

                if (linears[mid].ptr + linears[mid].size <= p)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return lo;
}

static CUresult linear_add(uintptr_t p, size_t size, size_t mapped, bool host,
                           const struct CUctx_st *ctx)
{
        struct linear l = {.ptr = p, .size = size, .mapped = mapped, .host = host, .ctx = ctx}, *a;
        size_t at;

        pthread_mutex_lock(&linear_lock);
        a = realloc(linears, (n_linears + 1) * sizeof(*linears));
        if (!a) {
                pthread_mutex_unlock(&linear_lock);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        linears = a;
        at = linear_lower(p);
        memmove(&linears[at + 1], &linears[at], (n_linears - at) * sizeof(*linears));
        linears[at] = l;
        n_linears++;
        pthread_mutex_unlock(&linear_lock);
        return CUDA_SUCCESS;
}

/* Remove the range starting exactly at p of the given kind. */
static bool linear_remove(uintptr_t p, bool host, struct linear *ret)
{
        bool found = false;
        size_t at;

        pthread_mutex_lock(&linear_lock);
        at = linear_lower(p);
        if (at < n_linears && linears[at].ptr == p && linears[at].host == host) {
                *ret = linears[at];
                memmove(&linears[at], &linears[at + 1], (n_linears - at - 1) * sizeof(*linears));
                n_linears--;
                found = true;
        }
        pthread_mutex_unlock(&linear_lock);
        return found;
}

CUresult sim_linear_check(uintptr_t p, size_t n, bool *ret_found)
{
        CUresult res = CUDA_SUCCESS;
        size_t at;

        pthread_mutex_lock(&linear_lock);
        at = linear_lower(p);
        *ret_found = at < n_linears && linears[at].ptr <= p;
        if (*ret_found && n > linears[at].ptr + linears[at].size - p)
                res = CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_unlock(&linear_lock);
        return res;
}

void sim_linear_release_ctx(const struct CUctx_st *ctx)
{
        size_t kept = 0;

        pthread_mutex_lock(&linear_lock);
        for (size_t i = 0; i < n_linears; i++) {
                if (linears[i].ctx == ctx)
                        munmap((void *)linears[i].ptr, linears[i].mapped);
                else
                        linears[kept++] = linears[i];
        }
        n_linears = kept;
        pthread_mutex_unlock(&linear_lock);
}

static size_t page_round(size_t n)
{
        size_t page = (size_t)sysconf(_SC_PAGESIZE);

        return n > SIZE_MAX - page ? 0 : ALIGN_UP(n, page);
}

SIM_API cuMemGetInfo(size_t *free, size_t *total)
{
        SIM_COUNT();
        struct CUctx_st *ctx;
        uint64_t used, cap;
        CUresult res;

        SIM_CHECK_INIT();
        if (!free || !total)
                return CUDA_ERROR_INVALID_VALUE;
        res = sim_ctx_get(&ctx);
        if (res != CUDA_SUCCESS)
                return res;
        if (account_used(ctx->device, &used) < 0)
                return CUDA_ERROR_OPERATING_SYSTEM;
        cap = sim.devices[ctx->device].memory;
        *free = used < cap ? cap - used : 0;
        *total = cap;
        return CUDA_SUCCESS;
}

/* Device memory from cuMemAlloc is a device backing file mapped read-write at once. */
SIM_API cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
        SIM_COUNT();
        size_t mapped = page_round(bytesize);
        struct CUctx_st *ctx;
        CUresult res;
        void *p;
        int fd;

        SIM_CHECK_INIT();
        if (!dptr || bytesize == 0 || mapped == 0)
                return CUDA_ERROR_INVALID_VALUE;
        res = sim_ctx_get(&ctx);
        if (res != CUDA_SUCCESS)
                return res;
        res = sim_backing_new(CU_MEM_LOCATION_TYPE_DEVICE, ctx->device, 0, mapped, &fd);
        if (res != CUDA_SUCCESS)
                return res;
        p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, SIM_HEADER_SIZE);
        /* The mapping holds the file (and its accounting record) from now on. */
        safe_close(fd);
        if (p == MAP_FAILED)
                return CUDA_ERROR_OUT_OF_MEMORY;
        res = linear_add((uintptr_t)p, bytesize, mapped, false, ctx);
        if (res != CUDA_SUCCESS) {
                munmap(p, mapped);
                return res;
        }
        *dptr = (CUdeviceptr)p;
        return CUDA_SUCCESS;
}

SIM_API cuMemFree(CUdeviceptr dptr)
{
        SIM_COUNT();
        struct linear l;

        SIM_CHECK_INIT();
        if (!dptr)
                return CUDA_SUCCESS;
        /* Like cudaFree, wait for queued work that may still touch it. */
        sim_stream_drain(NULL, false);
        if (!linear_remove(dptr, false, &l))
                return CUDA_ERROR_INVALID_VALUE;
        munmap((void *)l.ptr, l.mapped);
        return CUDA_SUCCESS;
}

SIM_API cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
        SIM_COUNT();
        const unsigned known =
            CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
        size_t mapped = page_round(bytesize);
        struct CUctx_st *ctx;
        CUresult res;
        void *p;

        SIM_CHECK_INIT();
        if (!pp || bytesize == 0 || mapped == 0 || (Flags & ~known))
                return CUDA_ERROR_INVALID_VALUE;
        res = sim_ctx_get(&ctx);
        if (res != CUDA_SUCCESS)
                return res;
        p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
                return CUDA_ERROR_OUT_OF_MEMORY;
        res = linear_add((uintptr_t)p, bytesize, mapped, true, ctx);
        if (res != CUDA_SUCCESS) {
                munmap(p, mapped);
                return res;
        }
        *pp = p;
        return CUDA_SUCCESS;
}

SIM_API cuMemAllocHost(void **pp, size_t bytesize)
{
        SIM_COUNT();
        return cuMemHostAlloc(pp, bytesize, 0);
}

SIM_API cuMemFreeHost(void *p)
{
        SIM_COUNT();
        struct linear l;

        SIM_CHECK_INIT();
        sim_stream_drain(NULL, false);
        if (!p || !linear_remove((uintptr_t)p, true, &l))
                return CUDA_ERROR_INVALID_VALUE;
        munmap((void *)l.ptr, l.mapped);
        return CUDA_SUCCESS;
}

SIM_API cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
        SIM_COUNT();
        bool found;

        SIM_CHECK_INIT();
        if (!pdptr || Flags != 0)
                return CUDA_ERROR_INVALID_VALUE;
        if (sim_linear_check((uintptr_t)p, 1, &found) != CUDA_SUCCESS || !found)
                return CUDA_ERROR_INVALID_VALUE;
        *pdptr = (CUdeviceptr)p; /* unified addressing: the same address */
        return CUDA_SUCCESS;
}

SIM_API cuMemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
        SIM_COUNT();
        uintptr_t base;
        size_t size, at;
        bool mapped, found;

        SIM_CHECK_INIT();
        if (sim_vm_range(dptr, &base, &size, &mapped)) {
                if (!mapped)
                        return CUDA_ERROR_NOT_FOUND;
        } else {
                pthread_mutex_lock(&linear_lock);
                at = linear_lower(dptr);
                found = at < n_linears && linears[at].ptr <= dptr && !linears[at].host;
                if (found) {
                        base = linears[at].ptr;
                        size = linears[at].size;
                }
                pthread_mutex_unlock(&linear_lock);
                if (!found)
                        return CUDA_ERROR_NOT_FOUND;
        }
        if (pbase)
                *pbase = base;
        if (psize)
                *psize = size;
        return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ pointer attributes */

/* A known address: a VMM mapping, linear device memory or pinned host memory. */
static bool pointer_find(uintptr_t p, int dev, struct sim_pointer *ret)
{
        size_t at;
        bool found;

        if (sim_vm_pointer(p, dev, ret))
                return true;
        pthread_mutex_lock(&linear_lock);
        at = linear_lower(p);
        found = at < n_linears && linears[at].ptr <= p;
        if (found)
                *ret = (struct sim_pointer){
                    .base = linears[at].ptr,
                    .size = linears[at].size,
                    .device = linears[at].ctx ? linears[at].ctx->device : -1,
                    .host = linears[at].host,
                    .ctx = linears[at].ctx,
                };
        pthread_mutex_unlock(&linear_lock);
        return found;
}

/*
 * The size of what an attribute writes, for those modelled (0: not modelled). Attributes whose
 * data is a driver-defined boolean are left out rather than written at a guessed width.
 */
static size_t attribute_size(CUpointer_attribute a)
{
        switch (a) {
        case CU_POINTER_ATTRIBUTE_CONTEXT:
                return sizeof(CUcontext);
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
                return sizeof(unsigned int);
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
                return sizeof(int);
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
                return sizeof(CUdeviceptr);
        case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
                return sizeof(void *);
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
                return sizeof(size_t);
        case CU_POINTER_ATTRIBUTE_BUFFER_ID:
                return sizeof(unsigned long long);
        default:
                return 0;
        }
}

/* One modelled attribute of a known pointer; CUDA_ERROR_INVALID_VALUE where it has none. */
static CUresult pointer_attribute(const struct sim_pointer *pt, uintptr_t p,
                                  CUpointer_attribute attribute, void *data)
{
        switch (attribute) {
        case CU_POINTER_ATTRIBUTE_CONTEXT:
                /* VMM memory belongs to no context. */
                *(CUcontext *)data = (CUcontext)pt->ctx;
                return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
                *(unsigned int *)data =
                    pt->host || pt->device < 0 ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
                return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
                *(CUdeviceptr *)data = p; /* unified addressing */
                return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_HOST_POINTER:
                if (!pt->host)
                        return CUDA_ERROR_INVALID_VALUE;
                *(void **)data = (void *)p;
                return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
                *(int *)data = pt->device;
                return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_BUFFER_ID:
                *(unsigned long long *)data = pt->base; /* unique while the memory lives */
                return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
                *(void **)data = (void *)pt->base;
                return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
                *(size_t *)data = pt->size;
                return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
                /* Linear and pinned memory: every device reads and writes it. */
                *(unsigned int *)data = !pt->vmm ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
                                        : (pt->access & CU_MEM_ACCESS_FLAGS_PROT_READWRITE) ==
                                                CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                                            ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
                                        : pt->access & CU_MEM_ACCESS_FLAGS_PROT_READ
                                            ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ
                                            : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE;
                return CUDA_SUCCESS;
        default:
                return CUDA_ERROR_INVALID_VALUE;
        }
}

static int current_device(void)
{
        struct CUctx_st *ctx = sim_current_ctx();
        return ctx ? ctx->device : -1;
}

SIM_API cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
        SIM_COUNT();
        struct sim_pointer pt;

        SIM_CHECK_INIT();
        if (!data)
                return CUDA_ERROR_INVALID_VALUE;
        /* Documented: an address the driver does not know is an invalid value. */
        if (!pointer_find(ptr, current_device(), &pt))
                return CUDA_ERROR_INVALID_VALUE;
        return pointer_attribute(&pt, ptr, attribute, data);
}

SIM_API cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
                               void **data, CUdeviceptr ptr)
{
        SIM_COUNT();
        struct sim_pointer pt;
        bool known;

        SIM_CHECK_INIT();
        if (numAttributes == 0 || !attributes || !data)
                return CUDA_ERROR_INVALID_VALUE;
        known = pointer_find(ptr, current_device(), &pt);
        for (unsigned i = 0; i < numAttributes; i++) {
                size_t n = attribute_size(attributes[i]);
                if (!data[i] || n == 0)
                        return CUDA_ERROR_INVALID_VALUE;
                /* Documented: an unknown pointer is no error; its attributes read as zero. */
                if (!known || pointer_attribute(&pt, ptr, attributes[i], data[i]) != CUDA_SUCCESS)
                        memset(data[i], 0, n);
        }
        return CUDA_SUCCESS;
}
