/* Initialization, device queries and primary contexts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "account.h"
#include "gpunode.h"
#include "sim.h"

struct sim sim = {
    .init_lock = PTHREAD_MUTEX_INITIALIZER,
    .stream_lock = PTHREAD_MUTEX_INITIALIZER,
    .progress = PTHREAD_COND_INITIALIZER,
};

static _Thread_local struct CUctx_st *current;

struct CUctx_st *sim_current_ctx(void)
{
        return current;
}

/*
 * The driver's files for each device under $AQUA_DRIVER_ROOT (common/gpunode.h): what a host
 * shows of its GPUs, so that aquad can tell which process may use which simulated GPU. A failure
 * is reported and leaves the machine as it is: no node, no evidence, refused where it counts.
 */
static void publish_nodes(void)
{
        for (int i = 0; i < sim.n_devices; i++) {
                const unsigned char *b = (const unsigned char *)sim.devices[i].uuid.bytes;
                char uuid[GPUNODE_UUID_LEN], bus[32];
                int r;

                snprintf(uuid, sizeof(uuid),
                         "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                         b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                         b[12], b[13], b[14], b[15]);
                snprintf(bus, sizeof(bus), "%04x:%02x:%02x.0", sim.devices[i].pci_domain,
                         sim.devices[i].pci_bus, sim.devices[i].pci_device);
                r = gpunode_publish(gpunode_root(), (unsigned)i, uuid, bus);
                if (r < 0)
                        fprintf(stderr, "simcuda: cannot write device %d's files under %s: %s\n", i,
                                gpunode_root(), strerror(-r));
        }
}

/*
 * A bad simulated machine is reported on stderr once, since a driver's only other channel,
 * the error code, cannot say which variable is wrong.
 */
SIM_API cuInit(unsigned int Flags)
{
        SIM_COUNT();
        static CUresult failed = CUDA_SUCCESS;
        _cleanup_free_ char *error = NULL;
        CUresult res = CUDA_SUCCESS;
        int r;

        if (Flags != 0)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&sim.init_lock);
        if (sim.initialized || failed)
                goto out;
        r = sim_config_load(&error);
        if (r < 0) {
                fprintf(stderr, "simcuda: %s\n", error ? error : strerror(-r));
                failed = CUDA_ERROR_NO_DEVICE;
                goto out;
        }
        sim.strict = !getenv("AQUA_SIM_STRICT") || strcmp(getenv("AQUA_SIM_STRICT"), "0") != 0;
        r = account_open(sim.machine);
        if (r < 0) {
                fprintf(stderr,
                        "simcuda: cannot open the memory accounting folder of machine %s: %s\n",
                        sim.machine, strerror(-r));
                failed = CUDA_ERROR_OPERATING_SYSTEM;
                goto out;
        }
        r = fabric_open();
        if (r < 0) {
                fprintf(stderr, "simcuda: cannot open the folder of fabric %s: %s\n", sim.fabric,
                        strerror(-r));
                failed = CUDA_ERROR_OPERATING_SYSTEM;
                goto out;
        }
        if (getenv(GPUNODE_ROOT_ENV))
                publish_nodes();
        for (int i = 0; i < sim.n_devices; i++) {
                struct CUctx_st *ctx = calloc(1, sizeof(*ctx));

                if (!ctx) {
                        failed = CUDA_ERROR_OUT_OF_MEMORY;
                        goto out;
                }
                ctx->device = i;
                sim.devices[i].primary = ctx;
        }
        sim.initialized = true;
out:
        res = sim.initialized ? CUDA_SUCCESS : failed;
        pthread_mutex_unlock(&sim.init_lock);
        return res;
}

SIM_API cuDriverGetVersion(int *driverVersion)
{
        SIM_COUNT();
        if (!driverVersion)
                return CUDA_ERROR_INVALID_VALUE;
        *driverVersion = SIM_VERSION;
        return CUDA_SUCCESS;
}

SIM_API cuDeviceGet(CUdevice *device, int ordinal)
{
        SIM_COUNT();
        SIM_CHECK_INIT();
        if (!device)
                return CUDA_ERROR_INVALID_VALUE;
        if (!sim_device_valid(ordinal))
                return CUDA_ERROR_INVALID_DEVICE;
        *device = ordinal;
        return CUDA_SUCCESS;
}

SIM_API cuDeviceGetCount(int *count)
{
        SIM_COUNT();
        SIM_CHECK_INIT();
        if (!count)
                return CUDA_ERROR_INVALID_VALUE;
        *count = sim.n_devices;
        return CUDA_SUCCESS;
}

SIM_API cuDeviceGetName(char *name, int len, CUdevice dev)
{
        SIM_COUNT();
        SIM_CHECK_INIT();
        if (!name || len <= 0)
                return CUDA_ERROR_INVALID_VALUE;
        if (!sim_device_valid(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        snprintf(name, (size_t)len, "%s", sim.devices[dev].name);
        return CUDA_SUCCESS;
}

SIM_API cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
        SIM_COUNT();
        SIM_CHECK_INIT();
        if (!uuid)
                return CUDA_ERROR_INVALID_VALUE;
        if (!sim_device_valid(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        *uuid = sim.devices[dev].uuid;
        return CUDA_SUCCESS;
}

SIM_API cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
        SIM_COUNT();
        SIM_CHECK_INIT();
        if (!bytes)
                return CUDA_ERROR_INVALID_VALUE;
        if (!sim_device_valid(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        *bytes = sim.devices[dev].memory;
        return CUDA_SUCCESS;
}

SIM_API cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
        SIM_COUNT();
        const struct sim_device *d;

        SIM_CHECK_INIT();
        if (!pciBusId || len <= 0)
                return CUDA_ERROR_INVALID_VALUE;
        if (!sim_device_valid(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        d = &sim.devices[dev];
        snprintf(pciBusId, (size_t)len, "%08x:%02x:%02x.0", d->pci_domain, d->pci_bus,
                 d->pci_device);
        return CUDA_SUCCESS;
}

/* A Hopper-like device with the VMM and IPC features aqua relies on; the rest reads 0. */
SIM_API cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
        SIM_COUNT();
        const struct sim_device *d;
        int v = 0;

        SIM_CHECK_INIT();
        if (!pi || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
                return CUDA_ERROR_INVALID_VALUE;
        if (!sim_device_valid(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        d = &sim.devices[dev];
        switch (attrib) {
        case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
                v = 1024;
                break;
        case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
                v = 32;
                break;
        case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
                v = 132;
                break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
                v = 9;
                break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE:
                v = CU_COMPUTEMODE_DEFAULT;
                break;
        case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
                v = d->pci_bus;
                break;
        case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
                v = d->pci_device;
                break;
        case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
                v = d->pci_domain;
                break;
        case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
                v = 2;
                break;
        case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
                v = 5120;
                break;
        case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
        case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
        case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
        case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
        case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
        case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
                v = 1;
                break;
        case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
                v = sim.fabric[0] != 0;
                break;
        /*
         * Kept 0 because the behaviour is not there: devices reach pageable memory only through
         * copies (no kernels), cuMemHostRegister is not implemented, and cuMemCreate refuses
         * gpuDirectRDMACapable.
         */
        case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS:
        case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:
        case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED:
        case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
                v = 0;
                break;
        default:
                break;
        }
        *pi = v;
        return CUDA_SUCCESS;
}

SIM_API cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
        SIM_COUNT();
        SIM_CHECK_INIT();
        if (!canAccessPeer)
                return CUDA_ERROR_INVALID_VALUE;
        if (!sim_device_valid(dev) || !sim_device_valid(peerDev))
                return CUDA_ERROR_INVALID_DEVICE;
        *canAccessPeer = sim.link_bandwidth[dev][peerDev] != 0;
        return CUDA_SUCCESS;
}

/* Rank 0 is the fastest link; slower links rank one higher per halving of bandwidth. */
static int link_rank(CUdevice a, CUdevice b)
{
        uint64_t best = 0;
        int rank = 0;

        for (int i = 0; i < sim.n_devices; i++)
                for (int j = 0; j < sim.n_devices; j++)
                        best = MAX(best, sim.link_bandwidth[i][j]);
        for (uint64_t bw = sim.link_bandwidth[a][b]; bw && bw * 2 <= best; bw *= 2)
                rank++;
        return rank;
}

SIM_API cuDeviceGetP2PAttribute(int *value, CUdevice_P2PAttribute attrib, CUdevice srcDevice,
                                CUdevice dstDevice)
{
        SIM_COUNT();
        bool linked;

        SIM_CHECK_INIT();
        if (!value)
                return CUDA_ERROR_INVALID_VALUE;
        if (!sim_device_valid(srcDevice) || !sim_device_valid(dstDevice) || srcDevice == dstDevice)
                return CUDA_ERROR_INVALID_DEVICE;
        linked = sim.link_bandwidth[srcDevice][dstDevice] != 0;
        switch (attrib) {
        case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK:
                *value = linked ? link_rank(srcDevice, dstDevice) : 0;
                break;
        case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED:
        case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED:
        case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED:
                *value = linked;
                break;
        case CU_DEVICE_P2P_ATTRIBUTE_ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED:
                *value = 0;
                break;
        default:
                return CUDA_ERROR_INVALID_VALUE;
        }
        return CUDA_SUCCESS;
}

SIM_API cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
        SIM_COUNT();
        struct CUctx_st *ctx;

        SIM_CHECK_INIT();
        if (!pctx)
                return CUDA_ERROR_INVALID_VALUE;
        if (!sim_device_valid(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        ctx = sim.devices[dev].primary;
        pthread_mutex_lock(&sim.stream_lock);
        ctx->retains++;
        pthread_mutex_unlock(&sim.stream_lock);
        *pctx = ctx;
        return CUDA_SUCCESS;
}

/*
 * The primary context object outlives its last release (its address stays a valid handle, as
 * on the real driver, where a re-retain returns the same context), but the last release
 * destroys the context: its queued work finishes, its streams, events and linear allocations
 * go, and calls made in it return CUDA_ERROR_CONTEXT_IS_DESTROYED until it is retained again.
 */
SIM_API cuDevicePrimaryCtxRelease(CUdevice dev)
{
        SIM_COUNT();
        struct CUctx_st *ctx;
        CUresult res = CUDA_SUCCESS;
        bool last = false;

        SIM_CHECK_INIT();
        if (!sim_device_valid(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        ctx = sim.devices[dev].primary;
        pthread_mutex_lock(&sim.stream_lock);
        if (ctx->retains == 0)
                res = CUDA_ERROR_INVALID_CONTEXT;
        else
                last = --ctx->retains == 0;
        pthread_mutex_unlock(&sim.stream_lock);
        if (last)
                sim_stream_ctx_destroy(ctx);
        return res;
}

SIM_API cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
        SIM_COUNT();
        struct CUctx_st *ctx;

        SIM_CHECK_INIT();
        if (!flags || !active)
                return CUDA_ERROR_INVALID_VALUE;
        if (!sim_device_valid(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        ctx = sim.devices[dev].primary;
        pthread_mutex_lock(&sim.stream_lock);
        *flags = ctx->flags;
        *active = ctx->retains > 0;
        pthread_mutex_unlock(&sim.stream_lock);
        return CUDA_SUCCESS;
}

static bool ctx_valid(const struct CUctx_st *ctx)
{
        for (int i = 0; i < sim.n_devices; i++)
                if (sim.devices[i].primary == ctx)
                        return true;
        return false;
}

SIM_API cuCtxSetCurrent(CUcontext ctx)
{
        SIM_COUNT();
        SIM_CHECK_INIT();
        if (ctx && !ctx_valid(ctx))
                return CUDA_ERROR_INVALID_CONTEXT;
        current = ctx;
        return CUDA_SUCCESS;
}

SIM_API cuCtxGetCurrent(CUcontext *pctx)
{
        SIM_COUNT();
        SIM_CHECK_INIT();
        if (!pctx)
                return CUDA_ERROR_INVALID_VALUE;
        *pctx = current;
        return CUDA_SUCCESS;
}

/* Both ABIs of cuCtxGetDevice and cuCtxSynchronize: ctx NULL is the current context. */
static CUresult ctx_get_device(CUdevice *device, CUcontext ctx)
{
        struct CUctx_st *c;
        CUresult res;

        SIM_CHECK_INIT();
        if (!device)
                return CUDA_ERROR_INVALID_VALUE;
        res = sim_ctx_named(ctx, &c);
        if (res == CUDA_SUCCESS)
                *device = c->device;
        return res;
}

/* Returns the context's sticky error once its work has faulted, as the real call does. */
static CUresult ctx_synchronize(CUcontext ctx)
{
        struct CUctx_st *c;
        CUresult res;

        SIM_CHECK_INIT();
        res = sim_ctx_named(ctx, &c);
        if (res != CUDA_SUCCESS)
                return res;
        sim_stream_drain(c, false);
        return sim_ctx_named(ctx, &c);
}

SIM_API cuCtxGetDevice(CUdevice *device)
{
        SIM_COUNT();
        return ctx_get_device(device, NULL);
}

CUresult CUDAAPI sim_ctx_get_device_13000(CUdevice *device, CUcontext ctx)
{
        SIM_COUNT();
        return ctx_get_device(device, ctx);
}

SIM_API cuCtxSynchronize(void)
{
        SIM_COUNT();
        return ctx_synchronize(NULL);
}

CUresult CUDAAPI sim_ctx_synchronize_13000(CUcontext ctx)
{
        SIM_COUNT();
        return ctx_synchronize(ctx);
}

/* Stream priorities are not modelled: the range a device without them reports, 0 to 0. */
SIM_API cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
        SIM_COUNT();
        struct CUctx_st *ctx;
        CUresult res;

        SIM_CHECK_INIT();
        res = sim_ctx_get(&ctx);
        if (res != CUDA_SUCCESS)
                return res;
        if (leastPriority)
                *leastPriority = 0;
        if (greatestPriority)
                *greatestPriority = 0;
        return CUDA_SUCCESS;
}

/* Only primary contexts are modelled: a context of one's own is refused as not supported. */
SIM_API cuCtxCreate(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                    CUdevice dev)
{
        SIM_COUNT();
        SIM_CHECK_INIT();
        (void)ctxCreateParams;
        (void)flags;
        if (!pctx)
                return CUDA_ERROR_INVALID_VALUE;
        if (!sim_device_valid(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        *pctx = NULL;
        return CUDA_ERROR_NOT_SUPPORTED;
}
