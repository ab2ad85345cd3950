/*
 * Virtual memory management: physical allocations are files (device memory in the machine's
 * accounting folder, host memory in a memfd), address reservations are PROT_NONE ranges, and
 * cuMemMap/cuMemSetAccess are mmap(MAP_FIXED)/mprotect inside them. Device pointers are host
 * addresses, so mapped memory is usable directly and unmapped access faults. Each reservation
 * has a twin, the copy engine's view, where every mapping is mapped again read-write: devices
 * copy there after their own access was checked, so the program's view can carry what the CPU
 * may do (nothing, for host memory mapped for devices only).
 */
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "account.h"
#include "sim.h"

#define HEADER_MAGIC "SIMCUDA1"
#define HOST_SLOT    SIM_MAX_DEVICES /* access[] index for host locations */

struct header {
        char magic[8];
        int32_t loc_type, loc_id;
        uint32_t handle_types;
        uint64_t size;
};

struct alloc {
        uint64_t id; /* the CUmemGenericAllocationHandle */
        int fd;
        uint64_t size;
        CUmemAllocationProp prop;
        unsigned handles; /* cuMemCreate/Import/RetainAllocationHandle not yet released */
        unsigned maps;
        bool fabric_exported; /* fabric holds the handle every export of it returns */
        CUmemFabricHandle fabric;
};

struct mapping {
        uintptr_t ptr;
        size_t size;
        struct alloc *alloc;
        unsigned char access[SIM_MAX_DEVICES + 1];
};

struct reservation {
        uintptr_t base;
        size_t size;
        uintptr_t engine;     /* the copy engine's view: base + k is engine + k there */
        struct mapping *maps; /* sorted by ptr */
        size_t n_maps;
};

static pthread_mutex_t vm_lock = PTHREAD_MUTEX_INITIALIZER;
static struct alloc **allocs; /* sorted by id */
static size_t n_allocs;
static struct reservation *resv; /* sorted by base */
static size_t n_resv;
static uint64_t next_id = UINT64_C(0x51c0000001);

/* Grow-and-insert for the sorted arrays below. */
static int insert_at(void **array, size_t *n, size_t elem, size_t at, const void *item)
{
        char *a = realloc(*array, (*n + 1) * elem);

        if (!a)
                return -ENOMEM;
        memmove(a + (at + 1) * elem, a + at * elem, (*n - at) * elem);
        memcpy(a + at * elem, item, elem);
        *array = a;
        (*n)++;
        return 0;
}

static void remove_at(void *array, size_t *n, size_t elem, size_t at)
{
        char *a = array;

        memmove(a + at * elem, a + (at + 1) * elem, (*n - at - 1) * elem);
        (*n)--;
}

static struct alloc *alloc_find(uint64_t id, size_t *ret_at)
{
        size_t lo = 0, hi = n_allocs;

        while (lo < hi) {
                size_t mid = (lo + hi) / 2;

                if (allocs[mid]->id < id)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        if (ret_at)
                *ret_at = lo;
        return lo < n_allocs && allocs[lo]->id == id ? allocs[lo] : NULL;
}

/*
 * The allocation a live handle names. Memory released while still mapped lives on, but its
 * handle is gone: it can no longer be released again, mapped, exported or queried.
 */
static struct alloc *handle_find(uint64_t id)
{
        struct alloc *a = alloc_find(id, NULL);

        return a && a->handles > 0 ? a : NULL;
}

static void alloc_maybe_free_locked(struct alloc *a)
{
        size_t at;

        if (a->handles > 0 || a->maps > 0)
                return;
        if (alloc_find(a->id, &at))
                remove_at(allocs, &n_allocs, sizeof(*allocs), at);
        safe_close(a->fd);
        free(a);
}

/* The reservation holding [p, p+n), or NULL. */
static struct reservation *resv_find(uintptr_t p, size_t n)
{
        size_t lo = 0, hi = n_resv;

        while (lo < hi) {
                size_t mid = (lo + hi) / 2;

                if (resv[mid].base + resv[mid].size <= p)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        if (lo == n_resv || p < resv[lo].base || n > resv[lo].base + resv[lo].size - p)
                return NULL;
        return &resv[lo];
}

/* Index of the first mapping of r that ends after p. */
static size_t map_lower(const struct reservation *r, uintptr_t p)
{
        size_t lo = 0, hi = r->n_maps;

        while (lo < hi) {
                size_t mid = (lo + hi) / 2;

                if (r->maps[mid].ptr + r->maps[mid].size <= p)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return lo;
}

/*
 * The run of mappings [first, first + *ret_count) that exactly tiles [p, p+n), or -1 when the
 * range starts or ends inside a mapping or has a hole.
 */
static ssize_t map_run(const struct reservation *r, uintptr_t p, size_t n, size_t *ret_count)
{
        size_t i = map_lower(r, p), first = i;
        uintptr_t at = p;

        if (i == r->n_maps || r->maps[i].ptr != p)
                return -1;
        while (at < p + n) {
                if (i == r->n_maps || r->maps[i].ptr != at)
                        return -1;
                at += r->maps[i].size;
                i++;
        }
        if (at != p + n)
                return -1;
        *ret_count = i - first;
        return (ssize_t)first;
}

/*
 * What the CPU may do through the program's view of m. Host memory: what the host location was
 * given, so memory mapped for devices only faults like device memory does on a GPU. Device
 * memory stays readable by the CPU wherever some device may read it (see the README).
 */
static int cpu_prot(const struct mapping *m)
{
        unsigned char best = 0;

        if (m->alloc->prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
                best = m->access[HOST_SLOT];
        else
                for (size_t i = 0; i < HOST_SLOT; i++)
                        best = MAX(best, m->access[i]);
        return best == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
               : best == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                          : PROT_NONE;
}

/*
 * Mappings the checks of one batch found open, by 2 MiB granule (mappings are granule-aligned):
 * a batch's pieces fall in a few dozen mappings, so most checks end here without a search.
 * Valid only while vm_lock stays held.
 */
#define VM_HITS 64

struct vm_hits {
        struct vm_hit {
                uintptr_t lo, hi;
                uintptr_t engine; /* where lo is in the copy engine's view */
        } slot[VM_HITS];
};

static struct vm_hit *hit_slot(struct vm_hits *h, uintptr_t p)
{
        return &h->slot[(p / SIM_GRANULARITY) % VM_HITS];
}

static CUresult translate_locked(uintptr_t p, size_t n, bool write, bool must_be_device, int dev,
                                 struct vm_hits *hits, uintptr_t *ret)
{
        unsigned char need =
            write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
        struct vm_hit *hit = hits ? hit_slot(hits, p) : NULL;
        struct reservation *r;
        CUresult res;
        bool found;

        if (p + n < p)
                return CUDA_ERROR_INVALID_VALUE;
        if (hit && p >= hit->lo && p < hit->hi && n <= hit->hi - p) {
                *ret = hit->engine + (p - hit->lo);
                return CUDA_SUCCESS;
        }
        *ret = p;
        if (n == 0)
                return CUDA_SUCCESS;
        r = resv_find(p, 1);
        if (r) {
                size_t i = map_lower(r, p);
                uintptr_t at = p;

                /* Every byte must lie in a mapping (the driver refuses an address it has no
                 * mapping for) that this device was given access to (a GPU faults when it gets
                 * there: strict mode; refused when relaxed). */
                for (; at < p + n; i++) {
                        if (i == r->n_maps || r->maps[i].ptr > at)
                                return CUDA_ERROR_INVALID_VALUE;
                        if ((r->maps[i].access[dev] & need) != need)
                                return sim.strict ? CUDA_ERROR_ILLEGAL_ADDRESS
                                                  : CUDA_ERROR_INVALID_VALUE;
                        at = r->maps[i].ptr + r->maps[i].size;
                }
                *ret = r->engine + (p - r->base);
                /* Remembered under the granule of p: the next piece there needs no search. */
                if (hit && r->maps[i - 1].ptr <= p)
                        *hit = (struct vm_hit){r->maps[i - 1].ptr, at,
                                               r->engine + (r->maps[i - 1].ptr - r->base)};
                return CUDA_SUCCESS;
        }
        res = sim_linear_check(p, n, &found);
        if (!found && must_be_device)
                return CUDA_ERROR_INVALID_VALUE;
        return res;
}

CUresult sim_vm_translate(uintptr_t p, size_t n, bool write, bool must_be_device, int dev,
                          void **ret)
{
        uintptr_t at = 0;
        CUresult res;

        pthread_mutex_lock(&vm_lock);
        res = translate_locked(p, n, write, must_be_device, dev, NULL, &at);
        pthread_mutex_unlock(&vm_lock);
        *ret = (void *)at;
        return res;
}

CUresult sim_vm_translate_pieces(const CUdeviceptr *dsts, const CUdeviceptr *srcs,
                                 const size_t *sizes, size_t count, int dev, struct sim_piece *ret)
{
        /* One per direction: a mapping open for reading is not always open for writing. */
        struct vm_hits dst_hits = {0}, src_hits = {0};
        CUresult res = CUDA_SUCCESS;

        pthread_mutex_lock(&vm_lock);
        for (size_t i = 0; i < count && res == CUDA_SUCCESS; i++) {
                uintptr_t d = 0, s = 0;

                res = translate_locked(dsts[i], sizes[i], true, false, dev, &dst_hits, &d);
                if (res == CUDA_SUCCESS)
                        res = translate_locked(srcs[i], sizes[i], false, false, dev, &src_hits, &s);
                ret[i] = (struct sim_piece){(void *)d, (const void *)s, sizes[i]};
        }
        pthread_mutex_unlock(&vm_lock);
        return res;
}

/* Accepts the properties aqua and other VMM users pass; returns the code the driver documents. */
static CUresult prop_check(const CUmemAllocationProp *prop)
{
        if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
                return CUDA_ERROR_INVALID_VALUE;
        if (prop->requestedHandleTypes &
            ~(unsigned)(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC))
                return CUDA_ERROR_NOT_SUPPORTED;
        /* CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED reads 0 without AQUA_SIM_FABRIC. */
        if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC) && !sim.fabric[0])
                return CUDA_ERROR_NOT_SUPPORTED;
        /* CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED reads 0. */
        if (prop->allocFlags.gpuDirectRDMACapable)
                return CUDA_ERROR_NOT_SUPPORTED;
        switch (prop->location.type) {
        case CU_MEM_LOCATION_TYPE_DEVICE:
                return sim_device_valid(prop->location.id) ? CUDA_SUCCESS
                                                           : CUDA_ERROR_INVALID_DEVICE;
        case CU_MEM_LOCATION_TYPE_HOST:
                /* Documented: host allocations are not IPC capable. */
                return prop->requestedHandleTypes ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
        case CU_MEM_LOCATION_TYPE_HOST_NUMA:
                /* One simulated NUMA node. */
                return prop->location.id == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
        default:
                return CUDA_ERROR_INVALID_VALUE;
        }
}

CUresult sim_backing_new(int loc_type, int loc_id, unsigned handle_types, uint64_t size,
                         int *ret_fd)
{
        struct header h = {
            .loc_type = loc_type, .loc_id = loc_id, .handle_types = handle_types, .size = size};
        _cleanup_close_ int fd = -1;
        int r;

        memcpy(h.magic, HEADER_MAGIC, sizeof(h.magic));
        if (loc_type == CU_MEM_LOCATION_TYPE_DEVICE) {
                r = account_create(loc_id, size, sim.devices[loc_id].memory, &fd);
                if (r == -ENOSPC)
                        return CUDA_ERROR_OUT_OF_MEMORY;
                if (r < 0)
                        return CUDA_ERROR_OPERATING_SYSTEM;
        } else if (sim.host_memory) {
                r = account_create(SIM_HOST_ACCOUNT, size, sim.host_memory, &fd);
                if (r == -ENOSPC)
                        return CUDA_ERROR_OUT_OF_MEMORY;
                if (r < 0)
                        return CUDA_ERROR_OPERATING_SYSTEM;
        } else {
                fd = memfd_create("simcuda-host", MFD_CLOEXEC);
                if (fd < 0)
                        return CUDA_ERROR_OUT_OF_MEMORY;
                if (ftruncate(fd, SIM_HEADER_SIZE + size) < 0)
                        return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (pwrite(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h))
                return CUDA_ERROR_OPERATING_SYSTEM;
        *ret_fd = TAKE_FD(fd);
        return CUDA_SUCCESS;
}

/* Register a backing fd as a new handle (taking the fd). */
static CUresult alloc_add(int fd, uint64_t size, const CUmemAllocationProp *prop,
                          CUmemGenericAllocationHandle *ret_id)
{
        struct alloc *a = calloc(1, sizeof(*a));
        size_t at;

        if (!a) {
                safe_close(fd);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        a->fd = fd;
        a->size = size;
        a->prop = *prop;
        a->handles = 1;
        pthread_mutex_lock(&vm_lock);
        a->id = next_id++;
        (void)alloc_find(a->id, &at);
        if (insert_at((void **)&allocs, &n_allocs, sizeof(*allocs), at, &a) < 0) {
                pthread_mutex_unlock(&vm_lock);
                safe_close(fd);
                free(a);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *ret_id = a->id;
        pthread_mutex_unlock(&vm_lock);
        return CUDA_SUCCESS;
}

SIM_API cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                      CUmemAllocationGranularity_flags option)
{
        SIM_COUNT();
        CUresult res;

        SIM_CHECK_INIT();
        if (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                             option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
                return CUDA_ERROR_INVALID_VALUE;
        res = prop_check(prop);
        if (res != CUDA_SUCCESS)
                return res;
        *granularity = SIM_GRANULARITY;
        return CUDA_SUCCESS;
}

SIM_API cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                    const CUmemAllocationProp *prop, unsigned long long flags)
{
        SIM_COUNT();
        CUresult res;
        int fd;

        SIM_CHECK_INIT();
        if (!handle || flags != 0 || size == 0 || size % SIM_GRANULARITY != 0)
                return CUDA_ERROR_INVALID_VALUE;
        res = prop_check(prop);
        if (res != CUDA_SUCCESS)
                return res;
        /* Without an IMEX channel the driver refuses fabric memory ("insufficient permission"). */
        if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC) && sim.imex_channel < 0)
                return CUDA_ERROR_NOT_PERMITTED;
        res = sim_backing_new(prop->location.type, prop->location.id, prop->requestedHandleTypes,
                              size, &fd);
        if (res != CUDA_SUCCESS)
                return res;
        return alloc_add(fd, size, prop, handle);
}

SIM_API cuMemRelease(CUmemGenericAllocationHandle handle)
{
        SIM_COUNT();
        struct alloc *a;

        SIM_CHECK_INIT();
        pthread_mutex_lock(&vm_lock);
        a = handle_find(handle);
        if (a) {
                a->handles--;
                alloc_maybe_free_locked(a);
        }
        pthread_mutex_unlock(&vm_lock);
        return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_API cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                               CUmemGenericAllocationHandle handle)
{
        SIM_COUNT();
        struct alloc *a;

        SIM_CHECK_INIT();
        if (!prop)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&vm_lock);
        a = handle_find(handle);
        if (a)
                *prop = a->prop;
        pthread_mutex_unlock(&vm_lock);
        return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* A fabric export: the same handle for every export of one allocation. Caller holds vm_lock. */
static CUresult export_fabric_locked(struct alloc *a, CUmemFabricHandle *ret)
{
        CUresult res;

        if (!(a->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC))
                return CUDA_ERROR_INVALID_VALUE;
        if (!a->fabric_exported) {
                res = sim_fabric_export(a->fd, a->prop.location.id, a->size, &a->fabric);
                if (res != CUDA_SUCCESS)
                        return res;
                a->fabric_exported = true;
        }
        *ret = a->fabric;
        return CUDA_SUCCESS;
}

/* The fd shares the allocation's open file description, so it keeps the memory (and its
 * accounting record) alive in whichever process ends up holding it. */
SIM_API cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                     CUmemAllocationHandleType handleType, unsigned long long flags)
{
        SIM_COUNT();
        CUresult res = CUDA_SUCCESS;
        struct alloc *a;

        SIM_CHECK_INIT();
        if (!shareableHandle || flags != 0)
                return CUDA_ERROR_INVALID_VALUE;
        if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
            handleType != CU_MEM_HANDLE_TYPE_FABRIC)
                return CUDA_ERROR_NOT_SUPPORTED;
        pthread_mutex_lock(&vm_lock);
        a = handle_find(handle);
        if (!a) {
                res = CUDA_ERROR_INVALID_VALUE;
        } else if (handleType == CU_MEM_HANDLE_TYPE_FABRIC) {
                res = export_fabric_locked(a, shareableHandle);
        } else if (!(a->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
                res = CUDA_ERROR_INVALID_VALUE;
        } else {
                int fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 3);

                if (fd < 0)
                        res = CUDA_ERROR_OUT_OF_MEMORY;
                else
                        *(int *)shareableHandle = fd;
        }
        pthread_mutex_unlock(&vm_lock);
        return res;
}

/* A backing file's header, if fd is simcuda memory of its size; else false. */
static bool header_read(int fd, struct header *ret)
{
        struct stat st;

        return fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
               pread(fd, ret, sizeof(*ret), 0) == (ssize_t)sizeof(*ret) &&
               memcmp(ret->magic, HEADER_MAGIC, sizeof(ret->magic)) == 0 &&
               (uint64_t)st.st_size == SIM_HEADER_SIZE + ret->size;
}

/* A fabric handle names a file in the fabric's folder; it keeps the memory alive while held. */
static CUresult import_fabric(CUmemGenericAllocationHandle *handle, const CUmemFabricHandle *fabric)
{
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED};
        _cleanup_close_ int fd = -1;
        struct header h;
        uint64_t size;
        CUresult res;
        int loc_id;

        if (!fabric)
                return CUDA_ERROR_INVALID_VALUE;
        res = sim_fabric_import(fabric, &fd, &loc_id, &size);
        if (res != CUDA_SUCCESS)
                return res;
        if (!header_read(fd, &h) || h.size != size || h.loc_id != loc_id)
                return CUDA_ERROR_INVALID_VALUE;
        if (!sim_device_valid(h.loc_id))
                return CUDA_ERROR_INVALID_DEVICE;
        prop.location.type = (CUmemLocationType)h.loc_type;
        prop.location.id = h.loc_id;
        prop.requestedHandleTypes = (CUmemAllocationHandleType)h.handle_types;
        return alloc_add(TAKE_FD(fd), h.size, &prop, handle);
}

SIM_API cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                       CUmemAllocationHandleType shHandleType)
{
        SIM_COUNT();
        int fd = (int)(intptr_t)osHandle;
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED};
        _cleanup_close_ int dup_fd = -1;
        struct header h;

        SIM_CHECK_INIT();
        if (!handle)
                return CUDA_ERROR_INVALID_VALUE;
        if (shHandleType == CU_MEM_HANDLE_TYPE_FABRIC)
                return import_fabric(handle, osHandle);
        if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
                return CUDA_ERROR_NOT_SUPPORTED;
        /* A closed fd, or one that is not simcuda memory, is not a shareable handle. */
        if (!header_read(fd, &h))
                return CUDA_ERROR_INVALID_VALUE;
        if (h.loc_type == CU_MEM_LOCATION_TYPE_DEVICE && !sim_device_valid(h.loc_id))
                return CUDA_ERROR_INVALID_DEVICE;
        dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (dup_fd < 0)
                return CUDA_ERROR_OUT_OF_MEMORY;
        prop.location.type = (CUmemLocationType)h.loc_type;
        prop.location.id = h.loc_id;
        prop.requestedHandleTypes = (CUmemAllocationHandleType)h.handle_types;
        return alloc_add(TAKE_FD(dup_fd), h.size, &prop, handle);
}

SIM_API cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                            unsigned long long flags)
{
        SIM_COUNT();
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        struct reservation r = {0};
        size_t align, at;
        void *p = MAP_FAILED;

        SIM_CHECK_INIT();
        if (!ptr || flags != 0 || size == 0 || size % page || addr % page ||
            (alignment & (alignment - 1)))
                return CUDA_ERROR_INVALID_VALUE;
        align = MAX(alignment, (size_t)SIM_GRANULARITY);
        if (addr && addr % align == 0)
                p = mmap((void *)addr, size, PROT_NONE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
        if (p == MAP_FAILED) {
                uintptr_t raw, aligned;

                if (size + align < size)
                        return CUDA_ERROR_OUT_OF_MEMORY;
                p = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                         -1, 0);
                if (p == MAP_FAILED)
                        return CUDA_ERROR_OUT_OF_MEMORY;
                raw = (uintptr_t)p;
                aligned = ALIGN_UP(raw, (uintptr_t)align);
                if (aligned > raw)
                        munmap(p, aligned - raw);
                if (raw + align > aligned)
                        munmap((void *)(aligned + size), raw + align - aligned);
                p = (void *)aligned;
        }
        r.base = (uintptr_t)p;
        r.size = size;
        p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
                munmap((void *)r.base, size);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        r.engine = (uintptr_t)p;
        pthread_mutex_lock(&vm_lock);
        for (at = 0; at < n_resv && resv[at].base < r.base; at++)
                ;
        if (insert_at((void **)&resv, &n_resv, sizeof(*resv), at, &r) < 0) {
                pthread_mutex_unlock(&vm_lock);
                munmap((void *)r.base, size);
                munmap((void *)r.engine, size);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        pthread_mutex_unlock(&vm_lock);
        *ptr = r.base;
        return CUDA_SUCCESS;
}

/* Refuses to free a reservation that still has mappings: unmap them first. */
SIM_API cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
        SIM_COUNT();
        struct reservation *r;
        CUresult res = CUDA_SUCCESS;

        SIM_CHECK_INIT();
        pthread_mutex_lock(&vm_lock);
        r = resv_find(ptr, 1);
        if (!r || r->base != ptr || r->size != size || r->n_maps > 0) {
                res = CUDA_ERROR_INVALID_VALUE;
        } else {
                munmap((void *)r->base, r->size);
                munmap((void *)r->engine, r->size);
                free(r->maps);
                remove_at(resv, &n_resv, sizeof(*resv), (size_t)(r - resv));
        }
        pthread_mutex_unlock(&vm_lock);
        return res;
}

/* Put [p, p+size) of r back to reserved-only in both views. */
static int unmap_views(const struct reservation *r, uintptr_t p, size_t size)
{
        const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED;

        if (mmap((void *)p, size, PROT_NONE, flags, -1, 0) == MAP_FAILED ||
            mmap((void *)(r->engine + (p - r->base)), size, PROT_NONE, flags, -1, 0) == MAP_FAILED)
                return -errno;
        return 0;
}

SIM_API cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                 unsigned long long flags)
{
        SIM_COUNT();
        struct mapping m = {.ptr = ptr, .size = size};
        CUresult res = CUDA_ERROR_INVALID_VALUE;
        struct reservation *r;
        struct alloc *a;
        void *engine;
        size_t i;

        SIM_CHECK_INIT();
        /* cuda.h: "offset - Offset into the memory handle to map - must currently be zero". */
        if (flags != 0 || size == 0 || ptr % SIM_GRANULARITY || size % SIM_GRANULARITY ||
            offset != 0)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&vm_lock);
        a = handle_find(handle);
        r = resv_find(ptr, size);
        if (!a || !r || size > a->size)
                goto out;
        i = map_lower(r, ptr);
        if (i < r->n_maps && r->maps[i].ptr < ptr + size)
                goto out; /* cuMemMap only maps over unmapped parts of a reservation */
        engine = (void *)(r->engine + (ptr - r->base));
        /* New mappings start inaccessible, as on the real driver: cuMemSetAccess opens them. */
        if (mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd,
                 (off_t)SIM_HEADER_SIZE) == MAP_FAILED) {
                res = CUDA_ERROR_OUT_OF_MEMORY;
                goto out;
        }
        m.alloc = a;
        if (mmap(engine, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, a->fd,
                 (off_t)SIM_HEADER_SIZE) == MAP_FAILED ||
            insert_at((void **)&r->maps, &r->n_maps, sizeof(m), i, &m) < 0) {
                unmap_views(r, ptr, size);
                res = CUDA_ERROR_OUT_OF_MEMORY;
                goto out;
        }
        a->maps++;
        res = CUDA_SUCCESS;
out:
        pthread_mutex_unlock(&vm_lock);
        return res;
}

SIM_API cuMemUnmap(CUdeviceptr ptr, size_t size)
{
        SIM_COUNT();
        CUresult res = CUDA_ERROR_INVALID_VALUE;
        struct reservation *r;
        size_t count;
        ssize_t first;

        SIM_CHECK_INIT();
        if (size == 0)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&vm_lock);
        r = resv_find(ptr, size);
        if (!r)
                goto out;
        first = map_run(r, ptr, size, &count);
        if (first < 0)
                goto out; /* a hole, or part of a mapping */
        /*
         * The real call does not wait for queued work: work still touching the range faults
         * (strict mode), or, relaxed, is waited for. New work cannot reach the range meanwhile,
         * since queuing it checks the range under vm_lock.
         */
        sim_stream_fault_range(r->engine + (ptr - r->base), r->engine + (ptr - r->base) + size, -1,
                               false);
        if (unmap_views(r, ptr, size) < 0) {
                res = CUDA_ERROR_OUT_OF_MEMORY;
                goto out;
        }
        for (size_t k = 0; k < count; k++) {
                struct alloc *a = r->maps[first].alloc;

                remove_at(r->maps, &r->n_maps, sizeof(*r->maps), (size_t)first);
                a->maps--;
                alloc_maybe_free_locked(a);
        }
        res = CUDA_SUCCESS;
out:
        pthread_mutex_unlock(&vm_lock);
        return res;
}

static CUresult access_slot(const CUmemLocation *loc, const struct alloc *a, int *ret)
{
        int owner = a->prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? a->prop.location.id : -1;

        switch (loc->type) {
        case CU_MEM_LOCATION_TYPE_DEVICE:
                if (!sim_device_valid(loc->id))
                        return CUDA_ERROR_INVALID_DEVICE;
                if (owner >= 0 && owner != loc->id && !sim.link_bandwidth[owner][loc->id])
                        return CUDA_ERROR_INVALID_DEVICE; /* no peer link to the owner */
                *ret = loc->id;
                return CUDA_SUCCESS;
        case CU_MEM_LOCATION_TYPE_HOST:
        case CU_MEM_LOCATION_TYPE_HOST_NUMA:
                /* Documented: host access only to memory that lives on the host. */
                if (owner >= 0)
                        return CUDA_ERROR_INVALID_VALUE;
                *ret = HOST_SLOT;
                return CUDA_SUCCESS;
        default:
                return CUDA_ERROR_INVALID_VALUE;
        }
}

SIM_API cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
        SIM_COUNT();
        CUresult res = CUDA_ERROR_INVALID_VALUE;
        struct reservation *r;
        size_t n_maps;
        ssize_t first;

        SIM_CHECK_INIT();
        if (!desc || count == 0 || size == 0)
                return CUDA_ERROR_INVALID_VALUE;
        for (size_t k = 0; k < count; k++)
                if (desc[k].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
                    desc[k].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
                    desc[k].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
                        return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&vm_lock);
        r = resv_find(ptr, size);
        if (!r)
                goto out;
        first = map_run(r, ptr, size, &n_maps);
        if (first < 0)
                goto out; /* the range must be exactly whole mappings */
        /* Validate everything before changing anything. */
        for (size_t i = (size_t)first; i < (size_t)first + n_maps; i++)
                for (size_t k = 0; k < count; k++) {
                        int slot;

                        res = access_slot(&desc[k].location, r->maps[i].alloc, &slot);
                        if (res != CUDA_SUCCESS)
                                goto out;
                }
        for (size_t i = (size_t)first; i < (size_t)first + n_maps; i++) {
                struct mapping *m = &r->maps[i];
                uintptr_t engine = r->engine + (m->ptr - r->base);

                for (size_t k = 0; k < count; k++) {
                        unsigned char now = (unsigned char)desc[k].flags;
                        int slot;

                        if (access_slot(&desc[k].location, m->alloc, &slot) != CUDA_SUCCESS)
                                continue; /* not reached: validated above */
                        /* A device losing access under its queued work faults, like unmapping. */
                        if (slot != HOST_SLOT && (m->access[slot] & ~now))
                                sim_stream_fault_range(engine, engine + m->size, slot,
                                                       now == CU_MEM_ACCESS_FLAGS_PROT_READ);
                        m->access[slot] = now;
                }
                if (mprotect((void *)m->ptr, m->size, cpu_prot(m)) < 0) {
                        res = CUDA_ERROR_OPERATING_SYSTEM;
                        goto out;
                }
        }
        res = CUDA_SUCCESS;
out:
        pthread_mutex_unlock(&vm_lock);
        return res;
}

/* The mapping holding p, or NULL; caller holds vm_lock. */
static struct mapping *mapping_at(uintptr_t p)
{
        struct reservation *r = resv_find(p, 1);
        size_t i;

        if (!r)
                return NULL;
        i = map_lower(r, p);
        return i < r->n_maps && r->maps[i].ptr <= p ? &r->maps[i] : NULL;
}

SIM_API cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)
{
        SIM_COUNT();
        CUresult res = CUDA_ERROR_INVALID_VALUE;
        struct mapping *m;
        int slot;

        SIM_CHECK_INIT();
        if (!flags || !location)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&vm_lock);
        m = mapping_at(ptr);
        if (m) {
                res = access_slot(location, m->alloc, &slot);
                if (res == CUDA_SUCCESS)
                        *flags = m->access[slot];
        }
        pthread_mutex_unlock(&vm_lock);
        return res;
}

SIM_API cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
        SIM_COUNT();
        struct mapping *m;

        SIM_CHECK_INIT();
        if (!handle)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&vm_lock);
        m = mapping_at((uintptr_t)addr);
        if (m) {
                m->alloc->handles++;
                *handle = m->alloc->id;
        }
        pthread_mutex_unlock(&vm_lock);
        return m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* For a VMM address: the mapping holding it. Returns false when p is not in a reservation. */
bool sim_vm_pointer(uintptr_t p, int dev, struct sim_pointer *ret)
{
        struct mapping *m;

        pthread_mutex_lock(&vm_lock);
        m = mapping_at(p);
        if (m)
                *ret = (struct sim_pointer){
                    .base = m->ptr,
                    .size = m->size,
                    .device = m->alloc->prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE
                                  ? m->alloc->prop.location.id
                                  : -1,
                    .access = dev >= 0 && dev < SIM_MAX_DEVICES ? m->access[dev] : 0,
                    .handle_types = m->alloc->prop.requestedHandleTypes,
                    .vmm = true,
                };
        pthread_mutex_unlock(&vm_lock);
        return m != NULL;
}

bool sim_vm_range(uintptr_t p, uintptr_t *ret_base, size_t *ret_size, bool *ret_mapped)
{
        struct mapping *m;
        bool in;

        pthread_mutex_lock(&vm_lock);
        in = resv_find(p, 1) != NULL;
        m = in ? mapping_at(p) : NULL;
        if (m) {
                *ret_base = m->ptr;
                *ret_size = m->size;
        }
        *ret_mapped = m != NULL;
        pthread_mutex_unlock(&vm_lock);
        return in;
}
