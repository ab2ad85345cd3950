/* Virtual memory management on simcuda: mapping, access, lifetimes, and each misuse's error code.
 */
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>

#include "test-sim.h"

static void setup(void)
{
        sim_machine("2x64MiB");
}

TestSuite(vmm, .init = setup, .fini = sim_machine_cleanup);

/*
 * Touch p and report whether it faulted. Our own handler (installed after ASan's) jumps back,
 * so the fault is observed, not fatal.
 */
static sigjmp_buf fault_jump;

static void on_fault(int sig)
{
        siglongjmp(fault_jump, 1);
}

static bool touch_faults(CUdeviceptr p, bool write)
{
        struct sigaction sa = {.sa_handler = on_fault}, old_segv, old_bus;
        volatile bool faulted = false;

        sigaction(SIGSEGV, &sa, &old_segv);
        sigaction(SIGBUS, &sa, &old_bus);
        if (sigsetjmp(fault_jump, 1) == 0) {
                if (write)
                        *(volatile int *)p = 1;
                else
                        (void)*(volatile int *)p;
        } else {
                faulted = true;
        }
        sigaction(SIGSEGV, &old_segv, NULL);
        sigaction(SIGBUS, &old_bus, NULL);
        return faulted;
}

static bool write_faults(CUdeviceptr p)
{
        return touch_faults(p, true);
}

static bool read_faults(CUdeviceptr p)
{
        return touch_faults(p, false);
}

Test(vmm, granularity_is_2MiB)
{
        CUmemAllocationProp prop = device_prop(0, true);
        size_t g;

        sim_start(0);
        CU_OK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        cr_assert_eq(g, GRAN);
}

Test(vmm, mapped_memory_holds_data_across_copies)
{
        CUdeviceptr p;
        char in[64] = "through the device", out[64] = {0};

        sim_start(0);
        p = map_new(0, GRAN, NULL);
        CU_OK(cuMemcpyHtoD(p + 100, in, sizeof(in)));
        CU_OK(cuMemcpyDtoH(out, p + 100, sizeof(out)));
        cr_assert_str_eq(out, in);
}

Test(vmm, device_pointers_are_host_addresses)
{
        CUdeviceptr p;

        SIM_ONLY();
        sim_start(0);
        p = map_new(0, GRAN, NULL);
        *(int *)p = 42;
        cr_assert_eq(((int *)p)[0], 42);
}

Test(vmm, new_mappings_fault_until_access_is_set)
{
        CUmemAllocationProp prop = device_prop(0, false);
        CUmemGenericAllocationHandle h;
        CUdeviceptr p;

        SIM_ONLY();
        sim_start(0);
        CU_OK(cuMemCreate(&h, GRAN, &prop, 0));
        CU_OK(cuMemAddressReserve(&p, GRAN, 0, 0, 0));
        CU_OK(cuMemMap(p, GRAN, 0, h, 0));
        cr_assert(write_faults(p));
        set_rw(p, GRAN, 0);
        cr_assert(!write_faults(p));
}

Test(vmm, unmapped_access_faults)
{
        CUmemGenericAllocationHandle h;
        CUdeviceptr p;

        SIM_ONLY();
        sim_start(0);
        p = map_new(0, GRAN, &h);
        cr_assert(!write_faults(p));
        CU_OK(cuMemUnmap(p, GRAN));
        cr_assert(write_faults(p));
}

Test(vmm, memory_outlives_its_handle_while_mapped)
{
        CUmemGenericAllocationHandle h, again;
        CUdeviceptr p;
        int v = 7, out = 0;

        sim_start(0);
        p = map_new(0, GRAN, &h);
        CU_OK(cuMemRelease(h));
        CU_OK(cuMemcpyHtoD(p, &v, sizeof(v)));
        CU_OK(cuMemRetainAllocationHandle(&again, (void *)(p + 4096)));
        CU_OK(cuMemcpyDtoH(&out, p, sizeof(out)));
        cr_assert_eq(out, 7);
        CU_OK(cuMemUnmap(p, GRAN));
        CU_OK(cuMemRelease(again));
        CU_OK(cuMemAddressFree(p, GRAN));
}

Test(vmm, address_range_names_the_mapping)
{
        CUdeviceptr p, base;
        size_t size;

        sim_start(0);
        p = map_new(0, 2 * GRAN, NULL);
        CU_OK(cuMemGetAddressRange(&base, &size, p + 12345));
        cr_assert_eq(base, p);
        cr_assert_eq(size, 2 * GRAN);
}

Test(vmm, host_memory_maps_beside_device_memory_in_one_range)
{
        CUmemAllocationProp dev = device_prop(0, false);
        CUmemAllocationProp host = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_HOST_NUMA, .id = 0}};
        CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                               .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CUmemGenericAllocationHandle hd, hh;
        CUmemAllocationProp got;
        CUdeviceptr p;
        size_t free_before, free_after, total;
        static char in[2 * GRAN], out[2 * GRAN];

        sim_start(0);
        CU_OK(cuMemGetInfo(&free_before, &total));
        CU_OK(cuMemCreate(&hd, GRAN, &dev, 0));
        CU_OK(cuMemCreate(&hh, GRAN, &host, 0));
        CU_OK(cuMemGetAllocationPropertiesFromHandle(&got, hh));
        cr_assert_eq(got.location.type, CU_MEM_LOCATION_TYPE_HOST_NUMA);
        CU_OK(cuMemGetInfo(&free_after, &total));
        cr_assert_eq(free_before - free_after, GRAN, "only the device chunk counts on the device");

        CU_OK(cuMemAddressReserve(&p, 2 * GRAN, 0, 0, 0));
        CU_OK(cuMemMap(p, GRAN, 0, hd, 0));
        CU_OK(cuMemMap(p + GRAN, GRAN, 0, hh, 0));
        CU_OK(cuMemSetAccess(p, 2 * GRAN, &acc, 1));
        for (size_t i = 0; i < sizeof(in); i++)
                in[i] = (char)(i * 7);
        /* One copy crosses from device memory into host memory without noticing the seam. */
        CU_OK(cuMemcpyHtoD(p, in, sizeof(in)));
        CU_OK(cuMemcpyDtoH(out, p, sizeof(out)));
        cr_assert_eq(memcmp(in, out, sizeof(in)), 0);
        CU_OK(cuMemUnmap(p, 2 * GRAN));
        CU_OK(cuMemRelease(hd));
        CU_OK(cuMemRelease(hh));
        CU_OK(cuMemAddressFree(p, 2 * GRAN));
}

Test(vmm, peer_device_maps_memory_of_another)
{
        CUmemGenericAllocationHandle h;
        CUmemAccessDesc acc[2] = {
            {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
             .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
            {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1},
             .flags = CU_MEM_ACCESS_FLAGS_PROT_READ},
        };
        CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1};
        CUmemAllocationProp prop = device_prop(0, false);
        unsigned long long flags;
        CUdeviceptr p;

        NEED_TWO_DEVICES();
        sim_start(1);
        CU_OK(cuMemCreate(&h, GRAN, &prop, 0));
        CU_OK(cuMemAddressReserve(&p, GRAN, 0, 0, 0));
        CU_OK(cuMemMap(p, GRAN, 0, h, 0));
        CU_OK(cuMemSetAccess(p, GRAN, acc, 2));
        CU_OK(cuMemGetAccess(&flags, &loc, p));
        cr_assert_eq(flags, CU_MEM_ACCESS_FLAGS_PROT_READ);
}

Test(vmm, allocation_sizes_must_be_multiples_of_the_granularity)
{
        CUmemAllocationProp prop = device_prop(0, false);
        CUmemGenericAllocationHandle h;

        sim_start(0);
        CU_EXPECT(cuMemCreate(&h, GRAN + 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE);
        CU_EXPECT(cuMemCreate(&h, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);
}

Test(vmm, creating_on_a_missing_device_is_an_invalid_device)
{
        CUmemAllocationProp prop = device_prop(7, false);
        CUmemGenericAllocationHandle h;

        sim_start(0);
        CU_EXPECT(cuMemCreate(&h, GRAN, &prop, 0), CUDA_ERROR_INVALID_DEVICE);
}

Test(vmm, plain_host_allocations_cannot_be_exportable)
{
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_HOST},
                                    .requestedHandleTypes =
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR};
        CUmemGenericAllocationHandle h;

        sim_start(0);
        CU_EXPECT(cuMemCreate(&h, GRAN, &prop, 0), CUDA_ERROR_INVALID_VALUE);
}

Test(vmm, host_memory_past_AQUA_SIM_HOST_MEMORY_is_out_of_memory_until_some_is_released)
{
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_HOST}};
        CUmemGenericAllocationHandle a, b, c;
        CUdeviceptr p;

        SIM_ONLY();
        setenv("AQUA_SIM_HOST_MEMORY", "4MiB", 1);
        sim_start(0);
        CU_OK(cuMemCreate(&a, GRAN, &prop, 0));
        CU_OK(cuMemCreate(&b, GRAN, &prop, 0));
        CU_EXPECT(cuMemCreate(&c, GRAN, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
        /* A mapping keeps released memory counted; unmapping it gives the room back. */
        CU_OK(cuMemAddressReserve(&p, GRAN, 0, 0, 0));
        CU_OK(cuMemMap(p, GRAN, 0, a, 0));
        CU_OK(cuMemRelease(a));
        CU_EXPECT(cuMemCreate(&c, GRAN, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
        CU_OK(cuMemUnmap(p, GRAN));
        CU_OK(cuMemCreate(&c, GRAN, &prop, 0));
        /* Device memory is not host memory. */
        prop.location = (CUmemLocation){.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
        CU_OK(cuMemCreate(&a, 4 * GRAN, &prop, 0));
}

Test(vmm, mapping_over_a_mapped_range_is_refused)
{
        CUmemAllocationProp prop = device_prop(0, false);
        CUmemGenericAllocationHandle a, b;
        CUdeviceptr p;

        sim_start(0);
        CU_OK(cuMemCreate(&a, 2 * GRAN, &prop, 0));
        CU_OK(cuMemCreate(&b, GRAN, &prop, 0));
        CU_OK(cuMemAddressReserve(&p, 2 * GRAN, 0, 0, 0));
        CU_OK(cuMemMap(p, 2 * GRAN, 0, a, 0));
        CU_EXPECT(cuMemMap(p + GRAN, GRAN, 0, b, 0), CUDA_ERROR_INVALID_VALUE);
}

Test(vmm, unaligned_maps_and_maps_past_the_allocation_are_refused)
{
        CUmemAllocationProp prop = device_prop(0, false);
        CUmemGenericAllocationHandle h;
        CUdeviceptr p;

        sim_start(0);
        CU_OK(cuMemCreate(&h, GRAN, &prop, 0));
        CU_OK(cuMemAddressReserve(&p, 4 * GRAN, 0, 0, 0));
        CU_EXPECT(cuMemMap(p + 4096, GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
        CU_EXPECT(cuMemMap(p, 2 * GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
}

/* cuda.h on cuMemMap's offset: "must currently be zero". */
Test(vmm, maps_at_a_nonzero_offset_are_refused)
{
        CUmemAllocationProp prop = device_prop(0, false);
        CUmemGenericAllocationHandle h;
        CUdeviceptr p;

        sim_start(0);
        CU_OK(cuMemCreate(&h, 2 * GRAN, &prop, 0));
        CU_OK(cuMemAddressReserve(&p, 2 * GRAN, 0, 0, 0));
        CU_REFUSED(cuMemMap(p, GRAN, GRAN, h, 0), CUDA_ERROR_INVALID_VALUE);
        CU_OK(cuMemMap(p, 2 * GRAN, 0, h, 0));
        CU_OK(cuMemUnmap(p, 2 * GRAN));
        CU_OK(cuMemRelease(h));
        CU_OK(cuMemAddressFree(p, 2 * GRAN));
}

Test(vmm, unmapping_part_of_a_mapping_is_refused)
{
        CUdeviceptr p;

        sim_start(0);
        p = map_new(0, 2 * GRAN, NULL);
        CU_EXPECT(cuMemUnmap(p, GRAN), CUDA_ERROR_INVALID_VALUE);
        CU_EXPECT(cuMemUnmap(p + GRAN, GRAN), CUDA_ERROR_INVALID_VALUE);
        CU_OK(cuMemUnmap(p, 2 * GRAN));
}

Test(vmm, setting_access_on_an_unmapped_range_is_refused)
{
        CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                               .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CUdeviceptr p;

        sim_start(0);
        CU_OK(cuMemAddressReserve(&p, GRAN, 0, 0, 0));
        CU_EXPECT(cuMemSetAccess(p, GRAN, &acc, 1), CUDA_ERROR_INVALID_VALUE);
}

Test(vmm, exporting_a_handle_made_without_fd_sharing_is_refused)
{
        CUmemAllocationProp prop = device_prop(0, false);
        CUmemGenericAllocationHandle h;
        int fd;

        sim_start(0);
        CU_OK(cuMemCreate(&h, GRAN, &prop, 0));
        CU_EXPECT(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                  CUDA_ERROR_INVALID_VALUE);
}

Test(vmm, importing_a_closed_fd_is_refused)
{
        CUmemAllocationProp prop = device_prop(0, true);
        CUmemGenericAllocationHandle h, imported;
        int fd;

        sim_start(0);
        CU_OK(cuMemCreate(&h, GRAN, &prop, 0));
        CU_OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        close(fd);
        CU_EXPECT(cuMemImportFromShareableHandle(&imported, (void *)(intptr_t)fd,
                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                  CUDA_ERROR_INVALID_VALUE);
}

Test(vmm, importing_an_fd_that_is_not_device_memory_is_refused)
{
        CUmemGenericAllocationHandle imported;
        int fd;

        SIM_ONLY();
        sim_start(0);
        fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        CU_EXPECT(cuMemImportFromShareableHandle(&imported, (void *)(intptr_t)fd,
                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                  CUDA_ERROR_INVALID_VALUE);
        close(fd);
}

Test(vmm, export_and_import_in_one_process_share_bytes)
{
        CUmemGenericAllocationHandle h, imported;
        CUdeviceptr a, b;
        int fd, v = 99, out = 0;

        sim_start(0);
        a = map_new(0, GRAN, &h);
        CU_OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        CU_OK(cuMemImportFromShareableHandle(&imported, (void *)(intptr_t)fd,
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        close(fd);
        CU_OK(cuMemAddressReserve(&b, GRAN, 0, 0, 0));
        CU_OK(cuMemMap(b, GRAN, 0, imported, 0));
        set_rw(b, GRAN, 0);
        CU_OK(cuMemcpyHtoD(a + 64, &v, sizeof(v)));
        CU_OK(cuMemcpyDtoH(&out, b + 64, sizeof(out)));
        cr_assert_eq(out, 99);
}

/*
 * The handle goes with its last release even while a mapping keeps the memory: releasing it
 * again, mapping, exporting or querying it is refused, and the memory is freed (and no longer
 * counted) when the mapping goes.
 */
Test(vmm, a_released_handle_is_gone_while_its_memory_stays_mapped)
{
        CUmemAllocationProp prop = device_prop(0, true);
        CUmemGenericAllocationHandle h;
        CUdeviceptr p, q;
        size_t free0, free1, total;
        int fd = -1, v = 5, out = 0;

        sim_start(0);
        CU_OK(cuMemGetInfo(&free0, &total));
        p = map_new(0, GRAN, &h);
        CU_OK(cuMemRelease(h));
        CU_REFUSED(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
        CU_OK(cuMemAddressReserve(&q, GRAN, 0, 0, 0));
        CU_REFUSED(cuMemMap(q, GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
        CU_REFUSED(
            cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_ERROR_INVALID_VALUE);
        CU_REFUSED(cuMemGetAllocationPropertiesFromHandle(&prop, h), CUDA_ERROR_INVALID_VALUE);
        /* The mapping still holds the memory and its data. */
        CU_OK(cuMemcpyHtoD(p, &v, sizeof(v)));
        CU_OK(cuMemcpyDtoH(&out, p, sizeof(out)));
        cr_assert_eq(out, 5);
        CU_OK(cuMemGetInfo(&free1, &total));
        cr_assert_eq(free0 - free1, GRAN);
        CU_OK(cuMemUnmap(p, GRAN));
        CU_OK(cuMemGetInfo(&free1, &total));
        cr_assert_eq(free1, free0, "the last mapping freed the memory");
        CU_OK(cuMemAddressFree(p, GRAN));
        CU_OK(cuMemAddressFree(q, GRAN));
}

/*
 * Access is per device: device 0 copies only where device 0 was given access, whichever other
 * device may touch the range. The device of a copy is its stream's, or the current context's
 * for synchronous calls.
 */
Test(vmm, copies_need_access_for_the_device_that_makes_them)
{
        CUmemGenericAllocationHandle h;
        CUmemAccessDesc ro0 = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                               .flags = CU_MEM_ACCESS_FLAGS_PROT_READ};
        CUcontext c1;
        CUstream s1;
        CUdeviceptr p;
        int v = 3, out = 0;

        NEED_TWO_DEVICES();
        c1 = sim_start(1);
        CU_OK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
        p = map_new(1, GRAN, &h); /* read-write for device 1 only */
        sim_start(0);
        /* Device 1's stream may, whichever context is current. */
        CU_OK(cuMemcpyHtoDAsync(p, &v, sizeof(v), s1));
        CU_OK(cuStreamSynchronize(s1));
        /* Read access for device 0: it reads. */
        CU_OK(cuMemSetAccess(p, GRAN, &ro0, 1));
        CU_OK(cuMemcpyDtoH(&out, p, sizeof(out)));
        cr_assert_eq(out, 3);
        CU_OK(cuCtxSetCurrent(c1));
        CU_OK(cuMemcpyHtoD(p, &v, sizeof(v)));
}

/*
 * A copy or memset by a device without access is what a GPU faults on: queued, it is accepted
 * and the fault comes when it runs; synchronous, at once. Either way nothing of it lands, and the
 * context has the sticky CUDA_ERROR_ILLEGAL_ADDRESS: every later call on it returns that, until
 * its last release. Other contexts go on.
 */
static void fault_case(int which)
{
        CUmemGenericAllocationHandle h;
        CUcontext c0, c1;
        CUstream s0;
        CUdeviceptr p;
        int v = 5, out = 0;

        c1 = sim_start(1);
        p = map_new(1, GRAN, &h); /* read-write for device 1 only */
        CU_OK(cuMemsetD8(p, 0, sizeof(v)));
        c0 = sim_start(0);
        CU_OK(cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));
        switch (which) {
        case 0:
                CU_OK(cuMemcpyHtoDAsync(p, &v, sizeof(v), s0));
                CU_EXPECT(cuStreamSynchronize(s0), CUDA_ERROR_ILLEGAL_ADDRESS);
                break;
        case 1:
                CU_OK(cuMemsetD8Async(p, 1, 64, s0));
                CU_EXPECT(cuStreamSynchronize(s0), CUDA_ERROR_ILLEGAL_ADDRESS);
                break;
        case 2:
                CU_EXPECT(cuMemcpyHtoD(p, &v, sizeof(v)), CUDA_ERROR_ILLEGAL_ADDRESS);
                CU_EXPECT(cuMemsetD8(p, 1, 64), CUDA_ERROR_ILLEGAL_ADDRESS);
                break;
        case 3:
                CU_EXPECT(cuMemcpyDtoH(&out, p, sizeof(out)), CUDA_ERROR_ILLEGAL_ADDRESS);
                break;
        default:
                CU_EXPECT(cuMemsetD8(p, 1, 64), CUDA_ERROR_ILLEGAL_ADDRESS);
        }
        CU_EXPECT(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
        CU_EXPECT(cuMemcpyHtoDAsync((CUdeviceptr)&out, &v, sizeof(v), s0),
                  CUDA_ERROR_ILLEGAL_ADDRESS);
        CU_EXPECT(cuMemGetInfo(&(size_t){0}, &(size_t){0}), CUDA_ERROR_ILLEGAL_ADDRESS);
        /* Device 1's context is not device 0's: the bytes are as they were. */
        CU_OK(cuCtxSetCurrent(c1));
        CU_OK(cuMemcpyDtoH(&out, p, sizeof(out)));
        cr_assert_eq(out, 0, "a faulted copy or memset landed (case %d)", which);
        /* The last release ends the faulted context; the next one is new. */
        CU_OK(cuDevicePrimaryCtxRelease(0));
        CU_OK(cuDevicePrimaryCtxRetain(&c0, 0));
        CU_OK(cuCtxSetCurrent(c0));
        CU_OK(cuCtxSynchronize());
}

/* SIM_ONLY: a real GPU's fault also lands in the machine's logs; run them there on purpose. */
Test(vmm, a_queued_copy_without_access_faults_when_it_runs)
{
        SIM_ONLY();
        NEED_TWO_DEVICES();
        fault_case(0);
}

Test(vmm, a_queued_memset_without_access_faults_when_it_runs)
{
        SIM_ONLY();
        NEED_TWO_DEVICES();
        fault_case(1);
}

Test(vmm, synchronous_copies_and_memsets_without_access_fault_at_once)
{
        SIM_ONLY();
        NEED_TWO_DEVICES();
        fault_case(2);
}

Test(vmm, a_synchronous_read_without_access_faults)
{
        SIM_ONLY();
        NEED_TWO_DEVICES();
        fault_case(3);
}

Test(vmm, a_synchronous_memset_without_access_faults)
{
        SIM_ONLY();
        NEED_TWO_DEVICES();
        fault_case(4);
}

/*
 * Host memory mapped for devices only is not the CPU's to touch (on a GPU system the CPU has no
 * mapping of it); devices copy through it, and access for the host location opens it.
 */
Test(vmm, host_memory_mapped_for_devices_only_faults_on_the_cpu)
{
        CUmemAllocationProp host = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_HOST}};
        CUmemAccessDesc cpu = {.location = {.type = CU_MEM_LOCATION_TYPE_HOST},
                               .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CUmemGenericAllocationHandle h;
        CUdeviceptr p;
        int v = 9, out = 0;

        sim_start(0);
        CU_OK(cuMemCreate(&h, GRAN, &host, 0));
        CU_OK(cuMemAddressReserve(&p, GRAN, 0, 0, 0));
        CU_OK(cuMemMap(p, GRAN, 0, h, 0));
        set_rw(p, GRAN, 0);
        CU_OK(cuMemcpyHtoD(p, &v, sizeof(v)));
        CU_OK(cuMemcpyDtoH(&out, p, sizeof(out)));
        cr_assert_eq(out, 9);
        if (!on_real_gpu()) { /* a fault here on a GPU machine would end the test */
                cr_assert(read_faults(p), "the CPU read device-only host memory");
                cr_assert(write_faults(p), "the CPU wrote device-only host memory");
        }
        CU_OK(cuMemSetAccess(p, GRAN, &cpu, 1));
        cr_assert_eq(*(volatile int *)p, 9);
        CU_OK(cuMemUnmap(p, GRAN));
        CU_OK(cuMemRelease(h));
        CU_OK(cuMemAddressFree(p, GRAN));
}

Test(vmm, releasing_an_unknown_handle_is_refused)
{
        SIM_ONLY(); /* undefined behaviour on the real driver */
        sim_start(0);
        CU_EXPECT(cuMemRelease(12345), CUDA_ERROR_INVALID_VALUE);
}

Test(vmm, copies_from_unmapped_device_addresses_are_refused)
{
        CUdeviceptr p;
        char buf[16];

        sim_start(0);
        CU_OK(cuMemAddressReserve(&p, GRAN, 0, 0, 0));
        CU_EXPECT(cuMemcpyDtoH(buf, p, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
}

Test(vmm, linear_allocations_count_and_free)
{
        size_t free0, free1, total;
        CUdeviceptr p, base;
        size_t size;

        sim_start(0);
        CU_OK(cuMemGetInfo(&free0, &total));
        CU_OK(cuMemAlloc(&p, 3 * GRAN));
        CU_OK(cuMemGetInfo(&free1, &total));
        cr_assert_geq(free0 - free1, 3 * GRAN);
        CU_OK(cuMemGetAddressRange(&base, &size, p + 5));
        cr_assert_eq(base, p);
        cr_assert_eq(size, 3 * GRAN);
        CU_EXPECT(cuMemFree(p + 8), CUDA_ERROR_INVALID_VALUE);
        CU_OK(cuMemFree(p));
        CU_OK(cuMemGetInfo(&free1, &total));
        cr_assert_eq(free1, free0);
}

Test(vmm, pinned_host_memory_is_a_device_pointer)
{
        CUdeviceptr d, dev;
        void *h;
        char out[8] = {0};

        sim_start(0);
        CU_OK(cuMemHostAlloc(&h, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
        memcpy(h, "pinned", 7);
        CU_OK(cuMemHostGetDevicePointer(&d, h, 0));
        CU_OK(cuMemAlloc(&dev, 4096));
        CU_OK(cuMemcpyDtoD(dev, d, 7));
        CU_OK(cuMemcpyDtoH(out, dev, 7));
        cr_assert_str_eq(out, "pinned");
        CU_OK(cuMemFreeHost(h));
        CU_OK(cuMemFree(dev));
}

Test(vmm, the_device_runs_out_of_memory)
{
        CUmemAllocationProp prop = device_prop(0, false);
        CUmemGenericAllocationHandle h;
        size_t free, total;

        SIM_ONLY();
        sim_start(0);
        CU_OK(cuMemGetInfo(&free, &total));
        cr_assert_eq(total, UINT64_C(64) << 20);
        CU_OK(cuMemCreate(&h, total, &prop, 0));
        CU_EXPECT(cuMemCreate(&h, GRAN, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
        CU_OK(cuMemGetInfo(&free, &total));
        cr_assert_eq(free, 0);
}
