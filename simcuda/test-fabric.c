/*
 * Fabric handles between simulated hosts: two machines on one fabric share memory through a
 * 64-byte CUmemFabricHandle; without an IMEX channel (or with different ones) the driver refuses.
 */
#include <sys/wait.h>

#include "test-sim.h"

static char fabric[64], exporter_machine[64], importer_machine[64];

static void setup(void)
{
        snprintf(fabric, sizeof(fabric), "test-%d", (int)getpid());
        snprintf(exporter_machine, sizeof(exporter_machine), "test-%d-a", (int)getpid());
        snprintf(importer_machine, sizeof(importer_machine), "test-%d-b", (int)getpid());
        setenv("AQUA_SIM_MACHINE", exporter_machine, 1);
        setenv("AQUA_SIM_DEVICES", "1x256MiB", 1);
        unsetenv("AQUA_SIM_TOPOLOGY");
        setenv("AQUA_SIM_FABRIC", fabric, 1);
        setenv("AQUA_SIM_IMEX_CHANNEL", "0", 1);
}

/* Remove what the machines and the fabric left behind. */
static void cleanup(void)
{
        char name[96];

        sim_machine_cleanup();
        setenv("AQUA_SIM_MACHINE", importer_machine, 1);
        sim_machine_cleanup();
        snprintf(name, sizeof(name), "fabric-%s", fabric);
        setenv("AQUA_SIM_MACHINE", name, 1);
        sim_machine_cleanup();
}

TestSuite(fabric, .init = setup, .fini = cleanup);

static CUmemAllocationProp fabric_prop(void)
{
        CUmemAllocationProp prop = device_prop(0, false);

        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
        return prop;
}

Test(fabric, the_attribute_follows_the_fabric_setting)
{
        int v = -1;

        SIM_ONLY();
        sim_start(0);
        CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0));
        cr_assert_eq(v, 1);
}

Test(fabric, no_fabric_means_no_fabric_memory)
{
        CUmemAllocationProp prop = fabric_prop();
        CUmemGenericAllocationHandle h;
        int v = -1;

        SIM_ONLY();
        unsetenv("AQUA_SIM_FABRIC");
        sim_start(0);
        CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0));
        cr_assert_eq(v, 0);
        CU_EXPECT(cuMemCreate(&h, GRAN, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
}

Test(fabric, without_an_imex_channel_fabric_memory_is_not_permitted)
{
        CUmemAllocationProp prop = fabric_prop();
        CUmemGenericAllocationHandle h;
        CUmemFabricHandle fh = {{0}};

        SIM_ONLY();
        unsetenv("AQUA_SIM_IMEX_CHANNEL");
        sim_start(0);
        CU_EXPECT(cuMemCreate(&h, GRAN, &prop, 0), CUDA_ERROR_NOT_PERMITTED);
        CU_EXPECT(cuMemImportFromShareableHandle(&h, &fh, CU_MEM_HANDLE_TYPE_FABRIC),
                  CUDA_ERROR_NOT_PERMITTED);
}

Test(fabric, posix_only_memory_has_no_fabric_handle_and_garbage_is_refused)
{
        CUmemGenericAllocationHandle h, g;
        CUmemFabricHandle fh;

        SIM_ONLY();
        sim_start(0);
        (void)map_new(0, GRAN, &h);
        CU_EXPECT(cuMemExportToShareableHandle(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0),
                  CUDA_ERROR_INVALID_VALUE);
        memset(&fh, 0x5a, sizeof(fh));
        CU_EXPECT(cuMemImportFromShareableHandle(&g, &fh, CU_MEM_HANDLE_TYPE_FABRIC),
                  CUDA_ERROR_INVALID_VALUE);
}

/* Entries in the fabric's folder. */
static int fabric_entries(void)
{
        const char *base = getenv("AQUA_SIM_RUNTIME_DIR");
        char path[512];
        struct dirent *de;
        int n = 0;
        DIR *d;

        snprintf(path, sizeof(path), "%s/aqua-sim-%u-fabric-%s", base && *base ? base : "/dev/shm",
                 (unsigned)getuid(), fabric);
        d = opendir(path);
        cr_assert_not_null(d, "%s", path);
        while ((de = readdir(d)))
                n += strncmp(de->d_name, "f-", 2) == 0;
        closedir(d);
        return n;
}

Test(fabric, a_handle_of_released_memory_names_nothing)
{
        CUmemAllocationProp prop = fabric_prop();
        CUmemGenericAllocationHandle h, g;
        CUmemFabricHandle fh, again;

        SIM_ONLY();
        sim_start(0);
        CU_OK(cuMemCreate(&h, GRAN, &prop, 0));
        CU_OK(cuMemExportToShareableHandle(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0));
        CU_OK(cuMemExportToShareableHandle(&again, h, CU_MEM_HANDLE_TYPE_FABRIC, 0));
        cr_assert_arr_eq(fh.data, again.data, sizeof(fh.data), "one allocation, one handle");
        cr_assert_eq(fabric_entries(), 1);
        CU_OK(cuMemRelease(h));
        CU_EXPECT(cuMemImportFromShareableHandle(&g, &fh, CU_MEM_HANDLE_TYPE_FABRIC),
                  CUDA_ERROR_INVALID_VALUE);
        /* The next export sweeps the entry of the freed memory. */
        CU_OK(cuMemCreate(&h, GRAN, &prop, 0));
        CU_OK(cuMemExportToShareableHandle(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0));
        cr_assert_eq(fabric_entries(), 1, "only the live allocation's entry is left");
        CU_OK(cuMemRelease(h));
}

/*
 * Child, another machine on the fabric: import the handle, map it, check the exporter's bytes,
 * write its own, then (told to) check the memory still reads after the exporter let go.
 */
static void importer(int sock, const void *arg)
{
        const char *channel = arg;
        CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                               .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        static unsigned char buf[GRAN];
        CUmemGenericAllocationHandle h;
        CUmemFabricHandle fh;
        CUcontext ctx;
        CUdeviceptr p;
        CUresult res;
        char go;

        setenv("AQUA_SIM_MACHINE", importer_machine, 1);
        setenv("AQUA_SIM_IMEX_CHANNEL", channel, 1);
        CHILD_OK(cuInit(0));
        CHILD_OK(cuDevicePrimaryCtxRetain(&ctx, 0));
        CHILD_OK(cuCtxSetCurrent(ctx));
        if (recv(sock, &fh, sizeof(fh), 0) != sizeof(fh))
                _exit(2);
        res = cuMemImportFromShareableHandle(&h, &fh, CU_MEM_HANDLE_TYPE_FABRIC);
        if (res == CUDA_ERROR_NOT_PERMITTED)
                _exit(1);
        CHILD_OK(res);
        CHILD_OK(cuMemAddressReserve(&p, GRAN, 0, 0, 0));
        CHILD_OK(cuMemMap(p, GRAN, 0, h, 0));
        CHILD_OK(cuMemSetAccess(p, GRAN, &acc, 1));
        CHILD_OK(cuMemRelease(h));
        CHILD_OK(cuMemcpyDtoH(buf, p, GRAN));
        for (size_t i = 0; i < GRAN; i++)
                if (buf[i] != (unsigned char)(i * 7))
                        _exit(3);
        memset(buf, 0xc3, GRAN);
        CHILD_OK(cuMemcpyHtoD(p, buf, GRAN));
        if (send(sock, "w", 1, 0) != 1 || recv(sock, &go, 1, 0) != 1)
                _exit(4);
        /* The exporter has released and unmapped: the mapping keeps the memory. */
        memset(buf, 0, GRAN);
        CHILD_OK(cuMemcpyDtoH(buf, p, GRAN));
        for (size_t i = 0; i < GRAN; i++)
                if (buf[i] != 0xc3)
                        _exit(5);
        if (send(sock, "r", 1, 0) != 1 || recv(sock, &go, 1, 0) != 1)
                _exit(6);
        CHILD_OK(cuMemUnmap(p, GRAN));
        if (send(sock, "u", 1, 0) != 1)
                _exit(7);
        _exit(0);
}

Test(fabric, two_machines_share_memory_and_a_mapping_outlives_the_exporter)
{
        CUmemAllocationProp prop = fabric_prop();
        static unsigned char buf[GRAN];
        CUmemGenericAllocationHandle h;
        CUmemFabricHandle fh;
        int sock, status;
        size_t before;
        CUdeviceptr p;
        char ack;
        pid_t pid;

        SIM_ONLY();
        pid = sim_fork_child(importer, "0", &sock);
        sim_start(0);
        before = sim_used_bytes();
        CU_OK(cuMemCreate(&h, GRAN, &prop, 0));
        CU_OK(cuMemAddressReserve(&p, GRAN, 0, 0, 0));
        CU_OK(cuMemMap(p, GRAN, 0, h, 0));
        set_rw(p, GRAN, 0);
        for (size_t i = 0; i < GRAN; i++)
                buf[i] = (unsigned char)(i * 7);
        CU_OK(cuMemcpyHtoD(p, buf, GRAN));
        CU_OK(cuMemExportToShareableHandle(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0));
        cr_assert_eq(send(sock, &fh, sizeof(fh), 0), (ssize_t)sizeof(fh));
        cr_assert_eq(recv(sock, &ack, 1, 0), 1, "the importer gave up");
        CU_OK(cuMemcpyDtoH(buf, p, GRAN));
        cr_assert_eq(buf[0], 0xc3, "the importer's write is visible here");
        cr_assert_eq(buf[GRAN - 1], 0xc3);
        CU_OK(cuMemUnmap(p, GRAN));
        CU_OK(cuMemRelease(h));
        cr_assert_eq(sim_used_bytes(), before + GRAN, "the importer still holds it: still counted");
        cr_assert_eq(send(sock, "g", 1, 0), 1);
        cr_assert_eq(recv(sock, &ack, 1, 0), 1, "the importer lost the memory");
        cr_assert_eq(send(sock, "g", 1, 0), 1);
        cr_assert_eq(recv(sock, &ack, 1, 0), 1);
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "importer status %#x", status);
        cr_assert_eq(sim_used_bytes(), before, "freed once the last importer let go");
}

Test(fabric, an_importer_on_another_imex_channel_is_not_permitted)
{
        CUmemAllocationProp prop = fabric_prop();
        CUmemGenericAllocationHandle h;
        CUmemFabricHandle fh;
        int sock, status;
        pid_t pid;

        SIM_ONLY();
        pid = sim_fork_child(importer, "1", &sock);
        sim_start(0);
        CU_OK(cuMemCreate(&h, GRAN, &prop, 0));
        CU_OK(cuMemExportToShareableHandle(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0));
        cr_assert_eq(send(sock, &fh, sizeof(fh), 0), (ssize_t)sizeof(fh));
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1,
                  "importer status %#x, expected CUDA_ERROR_NOT_PERMITTED", status);
        CU_OK(cuMemRelease(h));
}
