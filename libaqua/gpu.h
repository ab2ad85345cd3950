/*
 * The one GPU of a context, through the CUDA driver loaded at run time: what libaqua needs of the
 * Driver API (identity, exportable allocations, import, address ranges, maps, copies), with
 * driver errors turned into negative errnos. Every call makes the device's primary context
 * current for its duration and restores the caller's.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GPU_UUID_LEN 48

struct gpu_dev;

struct gpu_peer {
        char uuid[GPU_UUID_LEN];
        int ordinal;
};

struct gpu_info {
        int ordinal;
        char uuid[GPU_UUID_LEN]; /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
        uint64_t capacity;
        uint64_t granularity;
        bool fabric;    /* CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED */
        size_t n_peers; /* devices this one can access directly */
        struct gpu_peer peers[16];
};

/* Load the driver (once per process), open device `ordinal`. -ELIBACC: no usable driver. */
int gpu_open(int ordinal, struct gpu_dev **ret);
struct gpu_dev *gpu_free(struct gpu_dev *g);
const struct gpu_info *gpu_info(const struct gpu_dev *g);
/* The name of the last error a driver call returned on the calling thread (for reports). */
const char *gpu_last_error(const struct gpu_dev *g);

/* An opaque driver allocation handle (CUmemGenericAllocationHandle). */
typedef uint64_t gpu_handle;

/*
 * Producer: an exportable allocation of size bytes on this device, as a POSIX fd and, with
 * fabric, as a fabric handle too. -ENOMEM: full; -ENOKEY: fabric memory without an IMEX channel.
 */
int gpu_alloc_exportable(struct gpu_dev *g, uint64_t size, bool fabric, gpu_handle *ret);
/* A new fd for an allocation (the caller closes it). */
int gpu_export(struct gpu_dev *g, gpu_handle h, int *ret_fd);
/* The fabric handle (CUmemFabricHandle) of an allocation made with fabric. */
#define GPU_FABRIC_HANDLE_LEN 64
int gpu_export_fabric(struct gpu_dev *g, gpu_handle h, uint8_t ret[GPU_FABRIC_HANDLE_LEN]);
/* Drop a handle: the allocation is freed once no mapping or importer holds it. */
int gpu_release(struct gpu_dev *g, gpu_handle h);

/* Consumer: a handle for an allocation exported by another process (fd stays the caller's). */
int gpu_import(struct gpu_dev *g, int fd, gpu_handle *ret);
/* The same for a fabric handle, exported on any host of the NVLink domain. */
int gpu_import_fabric(struct gpu_dev *g, const uint8_t fabric[GPU_FABRIC_HANDLE_LEN],
                      gpu_handle *ret);
/* Reserve an address range of size bytes (a multiple of the granularity). */
int gpu_reserve(struct gpu_dev *g, uint64_t size, uint64_t *ret_dptr);
int gpu_unreserve(struct gpu_dev *g, uint64_t dptr, uint64_t size);
/* Map h at dptr and allow this device to read and write it. */
int gpu_map(struct gpu_dev *g, uint64_t dptr, uint64_t size, gpu_handle h);
int gpu_unmap(struct gpu_dev *g, uint64_t dptr, uint64_t size);

/*
 * Host memory for data moved off a peer: an allocation on the host location that can be mapped
 * into a device range (-EOPNOTSUPP where the driver cannot), or pinned host memory.
 */
int gpu_alloc_host_mappable(struct gpu_dev *g, uint64_t size, gpu_handle *ret);
int gpu_host_alloc(struct gpu_dev *g, uint64_t size, void **ret);
int gpu_host_free(struct gpu_dev *g, void *p);

/* Copy size bytes between device or host addresses (unified addressing), synchronously. */
int gpu_copy(struct gpu_dev *g, uint64_t dst, uint64_t src, uint64_t size);

/* The context's own memory for tensors: a plain (not exportable) allocation on this device. */
int gpu_alloc_local(struct gpu_dev *g, uint64_t size, gpu_handle *ret);

/* Streams and events, typed as cuda.h's CUstream / CUevent (declared in aqua.h). */
struct CUstream_st;
struct CUevent_st;
struct aqua_copy_piece;

/* NULL: libaqua's own stream. */
struct CUstream_st *gpu_stream(struct gpu_dev *g, struct CUstream_st *s);
int gpu_stream_new(struct gpu_dev *g, struct CUstream_st **ret);
void gpu_stream_free(struct gpu_dev *g, struct CUstream_st *s);
int gpu_stream_sync(struct gpu_dev *g, struct CUstream_st *s);
int gpu_event_new(struct gpu_dev *g, struct CUevent_st **ret);
void gpu_event_free(struct gpu_dev *g, struct CUevent_st *e);
/* 0: completed, AQUA_PENDING: not yet, or a negative errno. */
int gpu_event_query(struct gpu_dev *g, struct CUevent_st *e);
int gpu_event_sync(struct gpu_dev *g, struct CUevent_st *e);

/*
 * Queue pieces (already merged) on stream s (NULL: libaqua's own) in one go: after wait (may
 * be NULL), one cuMemcpyBatchAsync when use_batch and the driver has it, else one
 * cuMemcpyAsync per piece; then record each of the n_record events (NULL entries skipped).
 * One context switch for all of it. Returns 0, GPU_E_QUEUED (the copies were queued but an event
 * could not be recorded after them: the driver reported a fault, theirs or earlier work's, so
 * their completion cannot be waited for and their data is lost), or a negative errno (nothing
 * was queued, unless the driver lacks batches and failed half-way).
 */
#define GPU_E_QUEUED (-ECANCELED)
int gpu_copy_batch(struct gpu_dev *g, struct CUstream_st *s, struct CUevent_st *wait,
                   const struct aqua_copy_piece *pieces, size_t n, bool use_batch,
                   struct CUevent_st *const *record, size_t n_record);

/*
 * Producer: zero size bytes of allocation h through a temporary mapping on this device, then read
 * them back through buf (len bytes of pinned host memory) and check. Returns 0 (zero and
 * verified), 1 (a byte read back was not zero), or a negative errno when the driver failed.
 */
int gpu_scrub(struct gpu_dev *g, gpu_handle h, uint64_t size, void *buf, size_t len);

/* cuMemGetInfo on this device. */
int gpu_mem_info(struct gpu_dev *g, uint64_t *ret_free, uint64_t *ret_total);
