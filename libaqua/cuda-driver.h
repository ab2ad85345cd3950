/*
 * libaqua's view of the CUDA driver: libcuda is dlopen'ed at run time (never linked), and every
 * entry point libaqua calls is resolved once into one table, typed from cuda.h.
 */
#pragma once

#include <cuda.h>

/*
 * X(name, cuda_version): required entry points, looked up with cuGetProcAddress at the ABI of
 * the cuda.h we build with, then by the versioned symbol name cuda.h maps them to.
 * Fields keep cuda.h's mapping too: d->cuMemGetInfo(...) calls cuMemGetInfo_v2.
 */
/* clang-format off */
#define CUDA_DRIVER_REQUIRED(X)                                                                    \
        X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGet)       \
        X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetUuid) X(cuDeviceTotalMem)              \
        X(cuDeviceGetAttribute) X(cuDeviceGetPCIBusId) X(cuDeviceCanAccessPeer)                    \
        X(cuDeviceGetP2PAttribute) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)        \
        X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize)                \
        X(cuMemGetInfo) X(cuMemAlloc) X(cuMemFree) X(cuMemAllocHost) X(cuMemHostAlloc)             \
        X(cuMemFreeHost) X(cuMemGetAllocationGranularity) X(cuMemCreate) X(cuMemRelease)           \
        X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle) X(cuMemAddressReserve)   \
        X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuMemGetAccess)          \
        X(cuMemRetainAllocationHandle) X(cuMemGetAllocationPropertiesFromHandle)                   \
        X(cuMemGetAddressRange) X(cuMemcpy) X(cuMemcpyAsync) X(cuMemcpyHtoD) X(cuMemcpyDtoH)       \
        X(cuMemcpyDtoD) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync)             \
        X(cuMemcpyPeer) X(cuMemcpyPeerAsync) X(cuMemsetD8Async) X(cuStreamCreate)                  \
        X(cuStreamDestroy)                                                                         \
        X(cuStreamSynchronize) X(cuStreamQuery) X(cuStreamWaitEvent) X(cuEventCreate)              \
        X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize) X(cuEventElapsedTime)               \
        X(cuEventDestroy)
/* clang-format on */

/*
 * Optional entry points: NULL when the driver predates them. cuMemcpyBatchAsync's CUDA 13
 * signature differs from 12.8's, so it is taken only from a 13.0 or newer driver.
 */
#define CUDA_DRIVER_OPTIONAL(X) X(cuMemcpyBatchAsync, 13000)

struct cuda_driver {
        void *dl;
        char *path;  /* what was loaded */
        int version; /* cuDriverGetVersion, e.g. 13000 */
#define CUDA_DRIVER_FIELD(name)                  __typeof__(name) *name;
#define CUDA_DRIVER_OPT_FIELD(name, min_version) __typeof__(name) *name;
        CUDA_DRIVER_REQUIRED(CUDA_DRIVER_FIELD)
        CUDA_DRIVER_OPTIONAL(CUDA_DRIVER_OPT_FIELD)
#undef CUDA_DRIVER_FIELD
#undef CUDA_DRIVER_OPT_FIELD
};

/*
 * Load the driver at path (NULL: $AQUA_CUDA_LIBRARY if set, else libcuda.so.1) and resolve the
 * table. Does not call cuInit. Returns 0, -ENOENT when the library cannot be loaded, -ENOSYS when
 * a required entry point is missing, -ENOMEM; on failure *ret_error (if not NULL) gets a message
 * naming the library and what is missing, for the caller to free.
 */
int cuda_driver_open(const char *path, struct cuda_driver **ret, char **ret_error);

/* Free the table (the library itself stays mapped); accepts NULL; returns NULL. */
struct cuda_driver *cuda_driver_close(struct cuda_driver *d);

/*
 * The process-wide table, opened with the default path on first use and kept until exit.
 * A failure is remembered: later calls return the same error and message.
 */
int cuda_driver_get(const struct cuda_driver **ret, char **ret_error);
