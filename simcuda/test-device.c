/* simcuda devices, contexts and driver entry points: configuration, queries, and their errors. */
#include "test-sim.h"

static void setup(void)
{
        sim_machine("2x64MiB");
}

TestSuite(device, .init = setup, .fini = sim_machine_cleanup);

Test(device, calls_before_cuInit_are_not_initialized)
{
        CUdevice d;
        int n;

        CU_EXPECT(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
        CU_EXPECT(cuDeviceGet(&d, 0), CUDA_ERROR_NOT_INITIALIZED);
        CU_OK(cuDriverGetVersion(&n));
        cr_assert_geq(n, 12000);
}

Test(device, counts_and_sizes_come_from_AQUA_SIM_DEVICES)
{
        size_t total;
        char name[64];
        int n;

        SIM_ONLY();
        setenv("AQUA_SIM_DEVICES", "3x80GiB", 1);
        CU_OK(cuInit(0));
        CU_OK(cuDeviceGetCount(&n));
        cr_assert_eq(n, 3);
        CU_OK(cuDeviceTotalMem(&total, 2));
        cr_assert_eq(total, UINT64_C(80) << 30);
        CU_OK(cuDeviceGetName(name, sizeof(name), 0));
        cr_assert_str_eq(name, "simcuda GPU");
        CU_EXPECT(cuDeviceTotalMem(&total, 3), CUDA_ERROR_INVALID_DEVICE);
}

Test(device, a_malformed_AQUA_SIM_DEVICES_leaves_no_device)
{
        SIM_ONLY();
        setenv("AQUA_SIM_DEVICES", "lots", 1);
        CU_EXPECT(cuInit(0), CUDA_ERROR_NO_DEVICE);
}

Test(device, a_malformed_AQUA_SIM_HOST_MEMORY_leaves_no_device)
{
        SIM_ONLY();
        setenv("AQUA_SIM_HOST_MEMORY", "lots", 1);
        CU_EXPECT(cuInit(0), CUDA_ERROR_NO_DEVICE);
}

Test(device, reads_a_yaml_topology)
{
        char path[] = "/tmp/simcuda-topo-XXXXXX";
        int fd = mkstemp(path), v, peer;
        const char *yaml = "devices:\n"
                           "  - {name: H200 sim, memory: 141GiB,\n"
                           "     uuid: GPU-00112233-4455-6677-8899-aabbccddeeff, pci-bus: 0x1b}\n"
                           "  - {memory: 141GiB}\n"
                           "  - {memory: 80GiB}\n"
                           "links:\n"
                           "  - {a: 0, b: 1, bandwidth: 450GB}\n"
                           "  - {a: 1, b: 2, bandwidth: 100GB}\n";
        CUuuid uuid;
        char name[64], bus[32];

        SIM_ONLY();
        cr_assert_geq(fd, 0);
        cr_assert_eq(write(fd, yaml, strlen(yaml)), (ssize_t)strlen(yaml));
        close(fd);
        setenv("AQUA_SIM_TOPOLOGY", path, 1);
        CU_OK(cuInit(0));
        unlink(path);

        CU_OK(cuDeviceGetCount(&v));
        cr_assert_eq(v, 3);
        CU_OK(cuDeviceGetName(name, sizeof(name), 0));
        cr_assert_str_eq(name, "H200 sim");
        CU_OK(cuDeviceGetUuid(&uuid, 0));
        cr_assert_eq((unsigned char)uuid.bytes[0], 0x00);
        cr_assert_eq((unsigned char)uuid.bytes[15], 0xff);
        CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0));
        cr_assert_eq(v, 0x1b);
        CU_OK(cuDeviceGetPCIBusId(bus, sizeof(bus), 0));
        cr_assert_str_eq(bus, "00000000:1b:00.0");

        CU_OK(cuDeviceCanAccessPeer(&peer, 0, 1));
        cr_assert_eq(peer, 1);
        CU_OK(cuDeviceCanAccessPeer(&peer, 0, 2));
        cr_assert_eq(peer, 0);
        CU_OK(cuDeviceGetP2PAttribute(&v, CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK, 0, 1));
        cr_assert_eq(v, 0);
        CU_OK(cuDeviceGetP2PAttribute(&v, CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK, 2, 1));
        cr_assert_gt(v, 0, "a slower link ranks after the fastest");
        CU_EXPECT(cuDeviceGetP2PAttribute(&v, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, 1, 1),
                  CUDA_ERROR_INVALID_DEVICE);
}

Test(device, reports_the_features_aqua_needs)
{
        int v;

        CU_OK(cuInit(0));
        CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
        cr_assert_eq(v, 1);
        CU_OK(cuDeviceGetAttribute(
            &v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0));
        cr_assert_eq(v, 1);
        CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0));
        cr_assert_eq(v, 1);
        CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, 0));
        cr_assert_eq(v, CU_COMPUTEMODE_DEFAULT);
        CU_EXPECT(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0), CUDA_ERROR_INVALID_VALUE);
}

Test(device, default_devices_are_all_peers)
{
        int n, peer;

        SIM_ONLY();
        unsetenv("AQUA_SIM_DEVICES");
        CU_OK(cuInit(0));
        CU_OK(cuDeviceGetCount(&n));
        cr_assert_eq(n, 2);
        CU_OK(cuDeviceCanAccessPeer(&peer, 1, 0));
        cr_assert_eq(peer, 1);
}

Test(device, uuids_differ_between_devices)
{
        CUuuid a, b;

        NEED_TWO_DEVICES();
        CU_OK(cuDeviceGetUuid(&a, 0));
        CU_OK(cuDeviceGetUuid(&b, 1));
        cr_assert_neq(memcmp(&a, &b, sizeof(a)), 0);
}

Test(device, primary_context_becomes_current)
{
        CUcontext ctx, cur;
        CUdevice d;
        unsigned flags;
        int active;

        NEED_TWO_DEVICES();
        CU_OK(cuCtxGetCurrent(&cur));
        cr_assert_null(cur);
        CU_EXPECT(cuCtxGetDevice(&d), CUDA_ERROR_INVALID_CONTEXT);
        CU_OK(cuDevicePrimaryCtxRetain(&ctx, 1));
        CU_OK(cuDevicePrimaryCtxGetState(1, &flags, &active));
        cr_assert_eq(active, 1);
        CU_OK(cuCtxSetCurrent(ctx));
        CU_OK(cuCtxGetCurrent(&cur));
        cr_assert_eq(cur, ctx);
        CU_OK(cuCtxGetDevice(&d));
        cr_assert_eq(d, 1);
        CU_OK(cuCtxSynchronize());
        CU_OK(cuCtxSetCurrent(NULL));
        CU_OK(cuDevicePrimaryCtxRelease(1));
}

Test(device, calls_that_need_a_context_say_so)
{
        size_t free, total;
        CUdeviceptr p;
        CUstream s;
        CUevent e;

        CU_OK(cuInit(0));
        CU_EXPECT(cuMemGetInfo(&free, &total), CUDA_ERROR_INVALID_CONTEXT);
        CU_EXPECT(cuMemAlloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);
        CU_EXPECT(cuStreamCreate(&s, 0), CUDA_ERROR_INVALID_CONTEXT);
        CU_EXPECT(cuEventCreate(&e, 0), CUDA_ERROR_INVALID_CONTEXT);
        CU_EXPECT(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
}

Test(device, get_proc_address_resolves_the_versioned_entry_points)
{
        CUdriverProcAddressQueryResult status;
        void *fn;

        CU_OK(cuInit(0));
        CU_OK(cuGetProcAddress("cuMemGetInfo", &fn, CUDA_VERSION, 0, &status));
        cr_assert_eq(status, CU_GET_PROC_ADDRESS_SUCCESS);
        cr_assert_not_null(fn);
        /* The real driver may hand out internal addresses; simcuda returns its exports. */
        if (!on_real_gpu())
                cr_assert_eq(fn, (void *)&cuMemGetInfo);
        CU_OK(cuGetProcAddress("cuMemcpyBatchAsync", &fn, CUDA_VERSION, 0, &status));
        cr_assert_not_null(fn);
        CU_EXPECT(cuGetProcAddress("cuNoSuchThing", &fn, CUDA_VERSION, 0, &status),
                  CUDA_ERROR_NOT_FOUND);
        cr_assert_eq(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
        cr_assert_null(fn);
}

/*
 * cuda.h: the symbol is the base name (cuMemAlloc, not cuMemAlloc_v2), and a cudaVersion newer
 * than the driver is an invalid value. cuMemcpyBatchAsync changed its signature in 13.0: asked
 * for at 12.8 it is the 12.8 function; before 12.8 there is none.
 */
Test(device, get_proc_address_takes_base_names_and_versions_the_driver_knows)
{
        CUdriverProcAddressQueryResult status;
        void *fn, *v13;
        int version;

        CU_OK(cuInit(0));
        CU_OK(cuDriverGetVersion(&version));
        CU_EXPECT(cuGetProcAddress("cuMemGetInfo_v2", &fn, CUDA_VERSION, 0, &status),
                  CUDA_ERROR_NOT_FOUND);
        cr_assert_eq(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
        CU_EXPECT(cuGetProcAddress("cuMemGetInfo", &fn, version + 1000, 0, &status),
                  CUDA_ERROR_INVALID_VALUE);
        CU_OK(cuGetProcAddress("cuMemcpyBatchAsync", &v13, 13000, 0, &status));
        CU_OK(cuGetProcAddress("cuMemcpyBatchAsync", &fn, 12080, 0, &status));
        cr_assert_eq(status, CU_GET_PROC_ADDRESS_SUCCESS);
        cr_assert_not_null(fn);
        cr_assert_neq(fn, v13, "the 12.8 interface is another function");
        CU_EXPECT(cuGetProcAddress("cuMemcpyBatchAsync", &fn, 12060, 0, &status),
                  CUDA_ERROR_NOT_FOUND);
        cr_assert_eq(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}

/*
 * Each name's ABI at each version, called through cudaTypedefs.h's PFN type for that version: the
 * newest ABI at most the version asked for. CUDA 13 gave cuCtxSynchronize and cuCtxGetDevice a
 * context argument; asked for at 12.9 they are the 2.0 ones still.
 */
Test(device, get_proc_address_hands_out_the_abi_of_the_version_asked_for)
{
        PFN_cuCtxSynchronize_v2000 sync_v2000, sync_v12090;
        PFN_cuCtxSynchronize_v13000 sync_v13000;
        PFN_cuCtxGetDevice_v2000 dev_v2000;
        PFN_cuCtxGetDevice_v13000 dev_v13000;
        CUdriverProcAddressQueryResult status;
        CUcontext ctx;
        CUdevice dev = -1;
        void *fn;

        sim_start(1);
        CU_OK(cuCtxGetCurrent(&ctx));
        CU_OK(cuGetProcAddress("cuCtxSynchronize", (void **)&sync_v2000, 2000, 0, &status));
        CU_OK(cuGetProcAddress("cuCtxSynchronize", (void **)&sync_v12090, 12090, 0, &status));
        CU_OK(cuGetProcAddress("cuCtxSynchronize", (void **)&sync_v13000, 13000, 0, &status));
        cr_assert_eq(status, CU_GET_PROC_ADDRESS_SUCCESS);
        cr_assert_eq((void *)sync_v12090, (void *)sync_v2000);
        cr_assert_neq((void *)sync_v13000, (void *)sync_v2000, "13.0 has its own ABI");
        CU_OK(sync_v2000());
        CU_OK(sync_v13000(ctx));
        CU_OK(sync_v13000(NULL)); /* the current context */
        CU_OK(cuGetProcAddress("cuCtxGetDevice", (void **)&dev_v2000, 2000, 0, NULL));
        CU_OK(cuGetProcAddress("cuCtxGetDevice", (void **)&dev_v13000, 13000, 0, NULL));
        CU_OK(dev_v2000(&dev));
        cr_assert_eq(dev, 1);
        dev = -1;
        CU_OK(dev_v13000(&dev, ctx));
        cr_assert_eq(dev, 1);
        if (!on_real_gpu()) {
                /* A handle that names no context; and ABIs simcuda does not model. */
                CU_EXPECT(sync_v13000((CUcontext)&status), CUDA_ERROR_INVALID_CONTEXT);
                CU_EXPECT(cuGetProcAddress("cuMemGetInfo", &fn, 2000, 0, &status),
                          CUDA_ERROR_NOT_FOUND);
                cr_assert_eq(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
        }
        CU_EXPECT(cuGetProcAddress("cuCtxSynchronize", &fn, 1000, 0, &status),
                  CUDA_ERROR_NOT_FOUND);
        cr_assert_eq(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}

Test(device, the_12_8_batch_copy_interface_copies)
{
        CUmemcpyAttributes attr = {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
        CUdeviceptr dst, src;
        size_t size = sizeof(int), idx = 0, fail = 0;
        PFN_cuMemcpyBatchAsync_v12080 batch;
        CUstream s;
        int in = 42, out = 0;

        sim_start(0);
        CU_OK(cuGetProcAddress("cuMemcpyBatchAsync", (void **)&batch, 12080, 0, NULL));
        CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        dst = (CUdeviceptr)&out;
        src = (CUdeviceptr)&in;
        CU_OK(batch(&dst, &src, &size, 1, &attr, &idx, 1, &fail, s));
        CU_OK(cuStreamSynchronize(s));
        cr_assert_eq(out, 42);
        CU_EXPECT(batch(&dst, &src, &size, 1, &attr, &idx, 1, &fail, NULL),
                  CUDA_ERROR_INVALID_VALUE);
        cr_assert_eq(fail, SIZE_MAX);
}

/* Attributes say what the simulated device does: no pageable access, registration or RDMA. */
Test(device, attributes_agree_with_the_behaviour)
{
        CUmemAllocationProp prop = device_prop(0, false);
        CUmemGenericAllocationHandle h;
        CUdeviceptr p;
        char host[64];
        int v = -1;

        SIM_ONLY();
        sim_start(0);
        CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 0));
        cr_assert_eq(v, 0);
        /* Without pageable memory access a device cannot set pageable memory. */
        CU_EXPECT(cuMemsetD8((CUdeviceptr)host, 0, sizeof(host)), CUDA_ERROR_INVALID_VALUE);
        CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 0));
        cr_assert_eq(v, 0);
        CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                                   0));
        cr_assert_eq(v, 0);
        prop.allocFlags.gpuDirectRDMACapable = 1;
        CU_EXPECT(cuMemCreate(&h, GRAN, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
        CU_OK(cuMemAlloc(&p, 64));
}

Test(device, names_errors)
{
        const char *s;

        CU_OK(cuGetErrorName(CUDA_ERROR_INVALID_VALUE, &s));
        cr_assert_str_eq(s, "CUDA_ERROR_INVALID_VALUE");
        CU_OK(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
        cr_assert_str_eq(s, "out of memory");
        CU_EXPECT(cuGetErrorName((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
}

/* What cuda.core's streams and cuda-python's test setup ask of a context and a stream. */
Test(device, streams_name_their_context_and_priorities_are_one_level)
{
        PFN_cuStreamGetCtx_v12050 get_ctx_v2;
        CUcontext ctx, got = NULL;
        CUgreenCtx green = (CUgreenCtx)&got;
        CUstream s;
        int least = 7, greatest = 7;

        ctx = sim_start(0);
        CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CU_OK(cuStreamGetCtx(s, &got));
        cr_assert_eq(got, ctx);
        got = NULL;
        CU_OK(cuStreamGetCtx(NULL, &got));
        cr_assert_eq(got, ctx, "the NULL stream is the current context's");
        CU_OK(cuGetProcAddress("cuStreamGetCtx", (void **)&get_ctx_v2, 13000, 0, NULL));
        CU_OK(get_ctx_v2(s, &got, &green));
        cr_assert_eq(got, ctx);
        cr_assert_null(green, "no green context");
        CU_EXPECT(cuStreamGetCtx(s, NULL), CUDA_ERROR_INVALID_VALUE);
        CU_OK(cuCtxGetStreamPriorityRange(&least, &greatest));
        cr_assert_leq(greatest, least, "a greater priority is a smaller number");
        CU_OK(cuCtxGetStreamPriorityRange(NULL, NULL));
        if (!on_real_gpu()) {
                cr_assert_eq(least, 0);
                cr_assert_eq(greatest, 0, "priorities are not modelled");
                CU_EXPECT(cuCtxCreate(&got, NULL, 0, 0), CUDA_ERROR_NOT_SUPPORTED);
                cr_assert_null(got);
        }
        CU_OK(cuStreamDestroy(s));
}

/* Pointer attributes of linear, VMM and pinned memory, and of an address the driver never saw. */
Test(device, pointer_attributes_describe_each_kind_of_memory)
{
        CUmemGenericAllocationHandle h;
        CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                        CU_POINTER_ATTRIBUTE_RANGE_SIZE};
        unsigned int type = 0, flags = 0;
        int ordinal = -1;
        size_t size = 0;
        void *data[3] = {&type, &ordinal, &size}, *host = NULL, *start = NULL;
        CUcontext ctx, owner = (CUcontext)&h;
        CUdeviceptr d, p;
        static int pageable;

        ctx = sim_start(0);
        CU_OK(cuMemAlloc(&d, 4096));
        CU_OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 16));
        cr_assert_eq(type, CU_MEMORYTYPE_DEVICE);
        CU_OK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, d));
        cr_assert_eq(owner, ctx);
        CU_OK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 16));
        cr_assert_eq((CUdeviceptr)start, d);
        CU_OK(cuPointerGetAttributes(3, attrs, data, d));
        cr_assert_eq(ordinal, 0);
        cr_assert_eq(size, 4096);
        CU_OK(cuMemFree(d));

        p = map_new(0, GRAN, &h); /* read-write for device 0 */
        CU_OK(cuPointerGetAttribute(&flags, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, p));
        cr_assert_eq(flags, CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE);
        CU_OK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p));
        cr_assert_eq(ordinal, 0);
        CU_OK(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, p));
        cr_assert_eq(size, GRAN);
        CU_EXPECT(cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, p),
                  CUDA_ERROR_INVALID_VALUE);
        if (!on_real_gpu()) {
                CU_OK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p));
                cr_assert_null(owner, "VMM memory belongs to no context");
        }

        CU_OK(cuMemAllocHost(&host, 4096));
        CU_OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)host));
        cr_assert_eq(type, CU_MEMORYTYPE_HOST);
        CU_OK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_HOST_POINTER, (CUdeviceptr)host));
        cr_assert_eq(start, host);
        CU_OK(cuMemFreeHost(host));

        /* Unknown to the driver: one attribute is an invalid value, several read as zero. */
        CU_EXPECT(
            cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)&pageable),
            CUDA_ERROR_INVALID_VALUE);
        type = 7;
        size = 7;
        CU_OK(cuPointerGetAttributes(3, attrs, data, (CUdeviceptr)&pageable));
        cr_assert_eq(type, 0);
        cr_assert_eq(size, 0);
        if (!on_real_gpu()) {
                CUpointer_attribute not_modelled = CU_POINTER_ATTRIBUTE_P2P_TOKENS;
                CU_EXPECT(cuPointerGetAttributes(1, &not_modelled, data, p),
                          CUDA_ERROR_INVALID_VALUE);
        }
}
