/*
 * libaqua's view of the CUDA driver: libcuda is dlopen'ed at run time (never linked), and every
 * entry point libaqua calls is resolved once into one table, at an explicit ABI version.
 */
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

/*
 * X(name, version): required entry points, each resolved with cuGetProcAddress for that explicit
 * ABI version (the CUDA release that introduced the signature libaqua calls), then by the
 * versioned symbol name cuda.h maps them to. A field's type is cudaTypedefs.h's
 * PFN_<name>_v<version>, and the build fails unless that is the very prototype cuda.h declares
 * for the name: the ABI asked for, the type called through and the code's calls agree, whatever
 * the driver's own CUDA version (a CUDA 13 driver asked for cuCtxSynchronize at 13000 hands out
 * the ABI that takes a CUcontext; at 2000, the one that takes none).
 * Fields keep cuda.h's mapping: d->cuMemGetInfo(...) calls what cuMemGetInfo_v2 names.
 */
/* clang-format off */
#define CUDA_DRIVER_REQUIRED(X)                                                                    \
        X(cuInit, 2000) X(cuDriverGetVersion, 2020) X(cuGetErrorName, 6000)                        \
        X(cuGetErrorString, 6000) X(cuDeviceGet, 2000) X(cuDeviceGetCount, 2000)                   \
        X(cuDeviceGetName, 2000) X(cuDeviceGetUuid, 11040) X(cuDeviceTotalMem, 3020)               \
        X(cuDeviceGetAttribute, 2000) X(cuDeviceGetPCIBusId, 4010) X(cuDeviceCanAccessPeer, 4000)  \
        X(cuDeviceGetP2PAttribute, 8000) X(cuDevicePrimaryCtxRetain, 7000)                         \
        X(cuDevicePrimaryCtxRelease, 11000) X(cuCtxSetCurrent, 4000) X(cuCtxGetCurrent, 4000)      \
        X(cuCtxGetDevice, 2000) X(cuCtxSynchronize, 2000) X(cuMemGetInfo, 3020)                    \
        X(cuMemAlloc, 3020) X(cuMemFree, 3020) X(cuMemAllocHost, 3020) X(cuMemHostAlloc, 2020)     \
        X(cuMemFreeHost, 2000) X(cuMemGetAllocationGranularity, 10020) X(cuMemCreate, 10020)       \
        X(cuMemRelease, 10020) X(cuMemExportToShareableHandle, 10020)                              \
        X(cuMemImportFromShareableHandle, 10020) X(cuMemAddressReserve, 10020)                     \
        X(cuMemAddressFree, 10020) X(cuMemMap, 10020) X(cuMemUnmap, 10020)                         \
        X(cuMemSetAccess, 10020) X(cuMemGetAccess, 10020) X(cuMemRetainAllocationHandle, 11000)    \
        X(cuMemGetAllocationPropertiesFromHandle, 10020) X(cuMemGetAddressRange, 3020)             \
        X(cuMemcpy, 4000) X(cuMemcpyAsync, 4000) X(cuMemcpyHtoD, 3020) X(cuMemcpyDtoH, 3020)       \
        X(cuMemcpyDtoD, 3020) X(cuMemcpyHtoDAsync, 3020) X(cuMemcpyDtoHAsync, 3020)                \
        X(cuMemcpyDtoDAsync, 3020) X(cuMemcpyPeer, 4000) X(cuMemcpyPeerAsync, 4000)                \
        X(cuMemsetD8Async, 3020) X(cuStreamCreate, 2000) X(cuStreamDestroy, 4000)                  \
        X(cuStreamSynchronize, 2000) X(cuStreamQuery, 2000) X(cuStreamWaitEvent, 3020)             \
        X(cuEventCreate, 2000) X(cuEventRecord, 2000) X(cuEventQuery, 2000)                        \
        X(cuEventSynchronize, 2000) X(cuEventElapsedTime, 12080) X(cuEventDestroy, 4000)
/* clang-format on */

/*
 * Optional entry points: NULL when the driver predates their version. cuMemcpyBatchAsync's
 * CUDA 13 ABI (no failIdx) differs from 12.8's, so it is taken only from a 13.0 or newer driver.
 */
#define CUDA_DRIVER_OPTIONAL(X) X(cuMemcpyBatchAsync, 13000)

struct cuda_driver {
        void *dl;
        char *path;  /* what was loaded */
        int version; /* cuDriverGetVersion, e.g. 13000 */
/* cudaTypedefs.h's PFN_<name>_v<version> (pasted here, before cuda.h's macros rename the name) */
#define CUDA_DRIVER_FIELD(name, abi) PFN_##name##_v##abi name;
        CUDA_DRIVER_REQUIRED(CUDA_DRIVER_FIELD)
        CUDA_DRIVER_OPTIONAL(CUDA_DRIVER_FIELD)
#undef CUDA_DRIVER_FIELD
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
