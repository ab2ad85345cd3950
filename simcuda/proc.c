/* Error names and strings, and cuGetProcAddress over the same table the library exports. */
#include <string.h>

#include "sim.h"

/* clang-format off */
#define E(code) {code, #code}
static const struct {
        CUresult code;
        const char *name;
} error_names[] = {
        E(CUDA_SUCCESS),
        E(CUDA_ERROR_INVALID_VALUE),
        E(CUDA_ERROR_OUT_OF_MEMORY),
        E(CUDA_ERROR_NOT_INITIALIZED),
        E(CUDA_ERROR_DEINITIALIZED),
        E(CUDA_ERROR_PROFILER_DISABLED),
        E(CUDA_ERROR_PROFILER_NOT_INITIALIZED),
        E(CUDA_ERROR_PROFILER_ALREADY_STARTED),
        E(CUDA_ERROR_PROFILER_ALREADY_STOPPED),
        E(CUDA_ERROR_STUB_LIBRARY),
        E(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER),
        E(CUDA_ERROR_DEVICE_UNAVAILABLE),
        E(CUDA_ERROR_NO_DEVICE),
        E(CUDA_ERROR_INVALID_DEVICE),
        E(CUDA_ERROR_DEVICE_NOT_LICENSED),
        E(CUDA_ERROR_INVALID_IMAGE),
        E(CUDA_ERROR_INVALID_CONTEXT),
        E(CUDA_ERROR_CONTEXT_ALREADY_CURRENT),
        E(CUDA_ERROR_MAP_FAILED),
        E(CUDA_ERROR_UNMAP_FAILED),
        E(CUDA_ERROR_ARRAY_IS_MAPPED),
        E(CUDA_ERROR_ALREADY_MAPPED),
        E(CUDA_ERROR_NO_BINARY_FOR_GPU),
        E(CUDA_ERROR_ALREADY_ACQUIRED),
        E(CUDA_ERROR_NOT_MAPPED),
        E(CUDA_ERROR_NOT_MAPPED_AS_ARRAY),
        E(CUDA_ERROR_NOT_MAPPED_AS_POINTER),
        E(CUDA_ERROR_ECC_UNCORRECTABLE),
        E(CUDA_ERROR_UNSUPPORTED_LIMIT),
        E(CUDA_ERROR_CONTEXT_ALREADY_IN_USE),
        E(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED),
        E(CUDA_ERROR_INVALID_PTX),
        E(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT),
        E(CUDA_ERROR_NVLINK_UNCORRECTABLE),
        E(CUDA_ERROR_JIT_COMPILER_NOT_FOUND),
        E(CUDA_ERROR_UNSUPPORTED_PTX_VERSION),
        E(CUDA_ERROR_JIT_COMPILATION_DISABLED),
        E(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY),
        E(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC),
        E(CUDA_ERROR_CONTAINED),
        E(CUDA_ERROR_INVALID_SOURCE),
        E(CUDA_ERROR_FILE_NOT_FOUND),
        E(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND),
        E(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED),
        E(CUDA_ERROR_OPERATING_SYSTEM),
        E(CUDA_ERROR_INVALID_HANDLE),
        E(CUDA_ERROR_ILLEGAL_STATE),
        E(CUDA_ERROR_LOSSY_QUERY),
        E(CUDA_ERROR_NOT_FOUND),
        E(CUDA_ERROR_NOT_READY),
        E(CUDA_ERROR_ILLEGAL_ADDRESS),
        E(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES),
        E(CUDA_ERROR_LAUNCH_TIMEOUT),
        E(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING),
        E(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED),
        E(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED),
        E(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE),
        E(CUDA_ERROR_CONTEXT_IS_DESTROYED),
        E(CUDA_ERROR_ASSERT),
        E(CUDA_ERROR_TOO_MANY_PEERS),
        E(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED),
        E(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
        E(CUDA_ERROR_HARDWARE_STACK_ERROR),
        E(CUDA_ERROR_ILLEGAL_INSTRUCTION),
        E(CUDA_ERROR_MISALIGNED_ADDRESS),
        E(CUDA_ERROR_INVALID_ADDRESS_SPACE),
        E(CUDA_ERROR_INVALID_PC),
        E(CUDA_ERROR_LAUNCH_FAILED),
        E(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE),
        E(CUDA_ERROR_TENSOR_MEMORY_LEAK),
        E(CUDA_ERROR_NOT_PERMITTED),
        E(CUDA_ERROR_NOT_SUPPORTED),
        E(CUDA_ERROR_SYSTEM_NOT_READY),
        E(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH),
        E(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE),
        E(CUDA_ERROR_MPS_CONNECTION_FAILED),
        E(CUDA_ERROR_MPS_RPC_FAILURE),
        E(CUDA_ERROR_MPS_SERVER_NOT_READY),
        E(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED),
        E(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED),
        E(CUDA_ERROR_MPS_CLIENT_TERMINATED),
        E(CUDA_ERROR_CDP_NOT_SUPPORTED),
        E(CUDA_ERROR_CDP_VERSION_MISMATCH),
        E(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
        E(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
        E(CUDA_ERROR_STREAM_CAPTURE_MERGE),
        E(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED),
        E(CUDA_ERROR_STREAM_CAPTURE_UNJOINED),
        E(CUDA_ERROR_STREAM_CAPTURE_ISOLATION),
        E(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT),
        E(CUDA_ERROR_CAPTURED_EVENT),
        E(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD),
        E(CUDA_ERROR_TIMEOUT),
        E(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE),
        E(CUDA_ERROR_EXTERNAL_DEVICE),
        E(CUDA_ERROR_INVALID_CLUSTER_SIZE),
        E(CUDA_ERROR_FUNCTION_NOT_LOADED),
        E(CUDA_ERROR_INVALID_RESOURCE_TYPE),
        E(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION),
        E(CUDA_ERROR_KEY_ROTATION),
        E(CUDA_ERROR_UNKNOWN),
};
#undef E
/* clang-format on */

/* The messages programs print most; other codes read as their name. */
static const struct {
        CUresult code;
        const char *text;
} error_strings[] = {
    {CUDA_SUCCESS, "no error"},
    {CUDA_ERROR_INVALID_VALUE, "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "device not ready"},
    {CUDA_ERROR_NOT_SUPPORTED, "operation not supported"},
    {CUDA_ERROR_NOT_PERMITTED, "operation not permitted"},
    {CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS"},
    {CUDA_ERROR_ALREADY_MAPPED, "resource already mapped"},
};

SIM_API cuGetErrorName(CUresult error, const char **pStr)
{
        SIM_COUNT();
        if (!pStr)
                return CUDA_ERROR_INVALID_VALUE;
        for (size_t i = 0; i < ARRAY_SIZE(error_names); i++)
                if (error_names[i].code == error) {
                        *pStr = error_names[i].name;
                        return CUDA_SUCCESS;
                }
        *pStr = NULL;
        return CUDA_ERROR_INVALID_VALUE;
}

SIM_API cuGetErrorString(CUresult error, const char **pStr)
{
        SIM_COUNT();
        CUresult res;

        if (!pStr)
                return CUDA_ERROR_INVALID_VALUE;
        for (size_t i = 0; i < ARRAY_SIZE(error_strings); i++)
                if (error_strings[i].code == error) {
                        *pStr = error_strings[i].text;
                        return CUDA_SUCCESS;
                }
        res = cuGetErrorName(error, pStr);
        return res;
}

/*
 * Every entry point: the name cuGetProcAddress is asked for, the CUDA version that introduced
 * the ABI implemented here, and the function (cuda.h's macros turn the name into the versioned
 * symbol, e.g. cuMemGetInfo into cuMemGetInfo_v2).
 */
/* clang-format off */
#define SIM_ENTRY_POINTS(X)                                                                        \
        X(cuInit, 2000) X(cuDriverGetVersion, 2020) X(cuGetErrorName, 6000)                        \
        X(cuGetErrorString, 6000) X(cuGetProcAddress, 12000) X(cuDeviceGet, 2000)                  \
        X(cuDeviceGetCount, 2000) X(cuDeviceGetName, 2000) X(cuDeviceGetUuid, 11040)               \
        X(cuDeviceTotalMem, 3020) X(cuDeviceGetAttribute, 2000) X(cuDeviceGetPCIBusId, 4010)       \
        X(cuDeviceCanAccessPeer, 4000) X(cuDeviceGetP2PAttribute, 8000)                            \
        X(cuDevicePrimaryCtxRetain, 7000) X(cuDevicePrimaryCtxRelease, 11000)                      \
        X(cuDevicePrimaryCtxGetState, 7000) X(cuCtxSetCurrent, 4000) X(cuCtxGetCurrent, 4000)      \
        X(cuCtxGetDevice, 2000) X(cuCtxSynchronize, 2000) X(cuMemGetInfo, 3020)                    \
        X(cuMemAlloc, 3020) X(cuMemFree, 3020) X(cuMemGetAddressRange, 3020)                       \
        X(cuMemAllocHost, 3020) X(cuMemHostAlloc, 2020) X(cuMemFreeHost, 2000)                     \
        X(cuMemHostGetDevicePointer, 3020) X(cuMemGetAllocationGranularity, 10020)                 \
        X(cuMemCreate, 10020) X(cuMemRelease, 10020) X(cuMemExportToShareableHandle, 10020)        \
        X(cuMemImportFromShareableHandle, 10020) X(cuMemAddressReserve, 10020)                     \
        X(cuMemAddressFree, 10020) X(cuMemMap, 10020) X(cuMemUnmap, 10020)                         \
        X(cuMemSetAccess, 10020) X(cuMemGetAccess, 10020) X(cuMemRetainAllocationHandle, 11000)    \
        X(cuMemGetAllocationPropertiesFromHandle, 10020) X(cuMemcpy, 4000)                         \
        X(cuMemcpyAsync, 4000) X(cuMemcpyHtoD, 3020) X(cuMemcpyDtoH, 3020) X(cuMemcpyDtoD, 3020)   \
        X(cuMemcpyHtoDAsync, 3020) X(cuMemcpyDtoHAsync, 3020) X(cuMemcpyDtoDAsync, 3020)           \
        X(cuMemcpyPeer, 4000) X(cuMemcpyPeerAsync, 4000) X(cuMemcpyBatchAsync, 13000)              \
        X(cuMemsetD8, 3020) X(cuMemsetD8Async, 3020) X(cuStreamCreate, 2000)                       \
        X(cuStreamDestroy, 4000) X(cuStreamSynchronize, 2000) X(cuStreamQuery, 2000)               \
        X(cuStreamWaitEvent, 3020) X(cuLaunchHostFunc, 10000) X(cuEventCreate, 2000)               \
        X(cuEventRecord, 2000) X(cuEventQuery, 2000) X(cuEventSynchronize, 2000)                   \
        X(cuEventElapsedTime, 12080) X(cuEventDestroy, 4000) X(cuStreamGetCtx, 9020)              \
        X(cuCtxGetStreamPriorityRange, 5050) X(cuCtxCreate, 12050)                                 \
        X(cuPointerGetAttribute, 4000) X(cuPointerGetAttributes, 7000)
/* clang-format on */

#define ENTRY(name, version) {#name, version, (void *)&name},

struct entry_point {
        const char *name; /* the base name, as asked for */
        int version;
        void *fn;
};

static const struct entry_point entry_points[] = {SIM_ENTRY_POINTS(ENTRY)};

/*
 * The other ABIs implemented, older or newer than the one above: cuGetProcAddress hands out, for
 * a name, the newest ABI whose version is at most the one asked for, as cudaTypedefs.h's
 * PFN_<name>_v<version> types it.
 */
static const struct entry_point other_abis[] = {
    {"cuMemcpyBatchAsync", 12080, (void *)&sim_memcpy_batch_12080},
    {"cuCtxSynchronize", 13000, (void *)&sim_ctx_synchronize_13000},
    {"cuCtxGetDevice", 13000, (void *)&sim_ctx_get_device_13000},
    /* Same prototype and, as far as simcuda models it, the same behaviour as the newer one. */
    {"cuDeviceGetUuid", 9020, (void *)&cuDeviceGetUuid},
    {"cuEventElapsedTime", 2000, (void *)&cuEventElapsedTime},
    {"cuStreamGetCtx", 12050, (void *)&cuStreamGetCtx_v2},
};

/* The newest ABI of symbol at most cudaVersion; *ret_known: the name has some ABI here. */
static const struct entry_point *find_abi(const char *symbol, int cudaVersion, bool *ret_known)
{
        const struct entry_point *best = NULL;

        *ret_known = false;
        for (size_t k = 0; k < 2; k++) {
                const struct entry_point *v = k ? other_abis : entry_points;
                size_t n = k ? ARRAY_SIZE(other_abis) : ARRAY_SIZE(entry_points);
                for (size_t i = 0; i < n; i++) {
                        if (strcmp(symbol, v[i].name) != 0)
                                continue;
                        *ret_known = true;
                        if (v[i].version <= cudaVersion && (!best || v[i].version > best->version))
                                best = &v[i];
                }
        }
        return best;
}

SIM_API cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *symbolStatus)
{
        SIM_COUNT();
        const cuuint64_t known =
            CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

        /* Documented: a cudaVersion newer than the driver is an invalid value. */
        if (!symbol || !pfn || (flags & ~known) || cudaVersion > SIM_VERSION)
                return CUDA_ERROR_INVALID_VALUE;
        *pfn = NULL;
        /* Only base names: "cuMemGetInfo_v2" is not a symbol cuGetProcAddress knows. */
        bool has_name;
        const struct entry_point *e = find_abi(symbol, cudaVersion, &has_name);
        if (!e) {
                if (symbolStatus)
                        *symbolStatus = has_name ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                                 : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
                return CUDA_ERROR_NOT_FOUND;
        }
        *pfn = e->fn;
        if (symbolStatus)
                *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
}
