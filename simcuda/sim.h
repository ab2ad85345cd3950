/* simcuda's internal state shared by its modules: devices, contexts, and the locks that guard them.
 */
#pragma once

#include <cuda.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "util.h"

/* Calls per entry point (calls.c): every entry point starts with SIM_COUNT(). */
struct sim_counter {
        const char *name;
        _Atomic unsigned long long n;
        _Atomic bool linked;
        struct sim_counter *next;
};
void sim_count(struct sim_counter *c);
#define SIM_COUNT()                                                                                \
        do {                                                                                       \
                static struct sim_counter counter_ = {.name = __func__};                           \
                sim_count(&counter_);                                                              \
        } while (0)

/* Entry points of the Driver API carry default visibility; everything else stays hidden. */
#define SIM_API __attribute__((visibility("default"))) CUresult CUDAAPI

#define SIM_MAX_DEVICES 64
/* The account id of host-location memory (device ids are 0 .. SIM_MAX_DEVICES - 1). */
#define SIM_HOST_ACCOUNT SIM_MAX_DEVICES
#define SIM_GRANULARITY  (UINT64_C(2) << 20)
#define SIM_VERSION      13000
/* Every backing file starts with one page describing the allocation; data follows it. */
#define SIM_HEADER_SIZE 4096

struct sim_device {
        char name[128];
        uint64_t memory;
        CUuuid uuid;
        int pci_domain, pci_bus, pci_device;
        struct CUctx_st *primary;
};

/*
 * A primary context. The object stays at one address for the process's life (a re-retain returns
 * the same handle, as on the real driver), but each activation is a new epoch: streams and events
 * remember the epoch they were made in and are dead handles once it has ended.
 */
struct CUctx_st {
        int device;
        unsigned retains; /* primary context retain count; 0: destroyed (or never made) */
        unsigned epoch;   /* bumped when the last retain is released */
        unsigned flags;
        CUresult sticky; /* a fault made the context unusable: every call returns this */
        struct CUstream_st *null_stream; /* created on first use */
        struct CUstream_st *streams; /* every live stream of this context, under sim.stream_lock */
};

struct sim {
        pthread_mutex_t init_lock;
        bool initialized;
        int n_devices;
        struct sim_device devices[SIM_MAX_DEVICES];
        /* Peer link bandwidth in bytes/s; 0 means no peer link between the pair. */
        uint64_t link_bandwidth[SIM_MAX_DEVICES][SIM_MAX_DEVICES];
        char machine[128];
        /* AQUA_SIM_STRICT (default on): unmapping or revoking memory under queued work faults. */
        bool strict;
        /* AQUA_SIM_HOST_MEMORY: host-location VMM memory of the whole machine (0: no limit). */
        uint64_t host_memory;
        /* AQUA_SIM_FABRIC: the fabric this machine's devices share memory on ("": none), and
         * AQUA_SIM_IMEX_CHANNEL: the IMEX channel granted to this process (-1: none). */
        char fabric[128];
        int imex_channel;

        /* Streams, events and their queues: one lock, one condition for any progress. */
        pthread_mutex_t stream_lock;
        pthread_cond_t progress;
};

extern struct sim sim;

static inline bool sim_device_valid(CUdevice d)
{
        return d >= 0 && d < sim.n_devices;
}

/* The calling thread's current context, or NULL. */
struct CUctx_st *sim_current_ctx(void);
/*
 * The current context for a call that needs one: CUDA_ERROR_INVALID_CONTEXT without one,
 * CUDA_ERROR_CONTEXT_IS_DESTROYED after its last release, its sticky error after a fault.
 */
CUresult sim_ctx_get(struct CUctx_st **ret);
/* Why work cannot be given to ctx now (CUDA_SUCCESS: it can); caller holds sim.stream_lock. */
CUresult sim_ctx_usable_locked(const struct CUctx_st *ctx);
/* The context a CUDA 13 ABI names: ctx, or the current one for NULL; its sticky error, or
 * CUDA_ERROR_INVALID_CONTEXT for a handle that names none. */
CUresult sim_ctx_named(CUcontext ctx, struct CUctx_st **ret);
/* CUDA 13's ABIs of calls that now take the context (cuGetProcAddress at 13000). */
CUresult CUDAAPI sim_ctx_synchronize_13000(CUcontext ctx);
CUresult CUDAAPI sim_ctx_get_device_13000(CUdevice *device, CUcontext ctx);

#define SIM_CHECK_INIT()                                                                           \
        do {                                                                                       \
                if (!sim.initialized)                                                              \
                        return CUDA_ERROR_NOT_INITIALIZED;                                         \
        } while (0)

/* Config (config.c): fill sim.devices and sim.link_bandwidth from the environment. */
int sim_config_load(char **ret_error);

/*
 * Address space (vmm.c). Every reservation has a twin range, the copy engine's view, where each
 * mapping is mapped again read-write: copies run there, so the program's own view can carry the
 * CPU's protection (none for device-only host memory) while devices copy by their own access.
 *
 * sim_vm_translate: may device dev copy through [p, p+n)? Inside a reservation every byte must be
 * mapped with access for dev; cuMemAlloc'd and pinned host memory must hold the range; other
 * addresses are pageable host memory, refused when must_be_device. *ret: where the copy engine
 * reaches p.
 */
CUresult sim_vm_translate(uintptr_t p, size_t n, bool write, bool must_be_device, int dev,
                          void **ret);
struct sim_piece;
/* sim_vm_translate of every piece of a batch (write dsts[i], read srcs[i]) under one lock. */
CUresult sim_vm_translate_pieces(const CUdeviceptr *dsts, const CUdeviceptr *srcs,
                                 const size_t *sizes, size_t count, int dev, struct sim_piece *ret);
/* The mapping holding p; false when p is outside every reservation. */
bool sim_vm_range(uintptr_t p, uintptr_t *ret_base, size_t *ret_size, bool *ret_mapped);
/* What cuPointerGetAttribute reports of an address. */
struct sim_pointer {
        uintptr_t base;
        size_t size;
        int device;           /* where the memory is; -1: host */
        unsigned char access; /* VMM: the asking device's CU_MEM_ACCESS_FLAGS_* */
        unsigned handle_types;
        bool vmm, host;             /* a VMM mapping; pinned host memory */
        const struct CUctx_st *ctx; /* linear memory: the context it was made in */
};
/* A mapped VMM address, seen by device dev. */
bool sim_vm_pointer(uintptr_t p, int dev, struct sim_pointer *ret);
/* A backing file for size bytes at a location (device memory is charged to the machine). */
CUresult sim_backing_new(int loc_type, int loc_id, unsigned handle_types, uint64_t size,
                         int *ret_fd);

/* Fabric handles (fabric.c): the fabric's folder, opened by cuInit when AQUA_SIM_FABRIC is set. */
int fabric_open(void);
/* Link the backing file fd into the fabric and describe it in *ret. */
CUresult sim_fabric_export(int fd, int loc_id, uint64_t size, CUmemFabricHandle *ret);
/* Open what a handle names, holding it alive; CUDA_ERROR_NOT_PERMITTED without the same channel. */
CUresult sim_fabric_import(const CUmemFabricHandle *handle, int *ret_fd, int *ret_loc_id,
                           uint64_t *ret_size);

/* Linear allocations (mem.c): cuMemAlloc and pinned host memory. *ret_found: p is in one. */
CUresult sim_linear_check(uintptr_t p, size_t n, bool *ret_found);
/* Free what cuMemAlloc and cuMemHostAlloc gave out in ctx (its context is being destroyed). */
void sim_linear_release_ctx(const struct CUctx_st *ctx);

/* Streams (stream.c). */
/* The stream a handle names; 0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD name ctx's default. */
CUresult sim_stream_resolve(CUstream s, struct CUctx_st *ctx, struct CUstream_st **ret);
/* The device whose copy engine runs s's work. */
int sim_stream_device(const struct CUstream_st *s);
/*
 * Wait for the work queued so far on the streams of ctx (every context when NULL): all of them,
 * or only the legacy default stream and the streams that synchronize with it.
 */
void sim_stream_drain(struct CUctx_st *ctx, bool only_blocking);
/*
 * Strict mode: memory of the copy engine's view [lo, hi) goes away (or loses access for dev; -1:
 * every device; write_only: it stays readable). Queued work touching it is what a GPU would fault
 * on: its context gets CUDA_ERROR_ILLEGAL_ADDRESS and runs nothing more. Returns once no copy
 * touches the range any longer. Without strict mode, waits for the queued work instead.
 */
void sim_stream_fault_range(uintptr_t lo, uintptr_t hi, int dev, bool write_only);
/* The last release of ctx: wait for its work, then end its epoch (its streams and events). */
void sim_stream_ctx_destroy(struct CUctx_st *ctx);
struct sim_piece {
        void *dst;
        const void *src;
        size_t size;
};
/* Queue copies on s; takes ownership of pieces (and staging, freed after the copy). */
CUresult sim_stream_copy(struct CUstream_st *s, struct sim_piece *pieces, size_t n, void *staging);
/* cuMemcpyBatchAsync as CUDA 12.8 declared it (with failIdx), for cuGetProcAddress at 12080. */
CUresult CUDAAPI sim_memcpy_batch_12080(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                        size_t count, CUmemcpyAttributes *attrs, size_t *attrsIdxs,
                                        size_t numAttrs, size_t *failIdx, CUstream hStream);
CUresult sim_stream_memset(struct CUstream_st *s, void *dst, unsigned char value, size_t n);
/*
 * Strict mode: work a device may not do (a copy or memset touching memory it has no access to,
 * or an unmapped part of a reservation) is accepted and faults where a GPU would: queued, it
 * gives its context the sticky CUDA_ERROR_ILLEGAL_ADDRESS when its turn comes (nothing of it
 * runs); synchronous, at once. sim_ctx_fault returns that error for the synchronous caller.
 */
CUresult sim_stream_fault(struct CUstream_st *s);
/* The stream's own error before anything else: its context's sticky one, or a stale handle. */
CUresult sim_stream_check(struct CUstream_st *s);
CUresult sim_ctx_fault(struct CUctx_st *ctx);
