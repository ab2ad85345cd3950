/*
 * Shared set-up for the driver-level tests: a private simulated machine per test process, and
 * helpers that work the same on simcuda and on a real driver (tests/gpu/run.sh sets
 * AQUA_TEST_REAL_GPU=1 there; simulator-only tests skip themselves).
 */
#pragma once

#include <criterion/criterion.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CU_OK(call)                                                                                \
        do {                                                                                       \
                CUresult _r = (call);                                                              \
                const char *_n = NULL;                                                             \
                cuGetErrorName(_r, &_n);                                                           \
                cr_assert_eq(_r, CUDA_SUCCESS, "%s = %d (%s)", #call, _r, _n ? _n : "?");          \
        } while (0)

#define CU_EXPECT(call, code)                                                                      \
        do {                                                                                       \
                CUresult _r = (call);                                                              \
                cr_assert_eq(_r, (code), "%s = %d, expected %s", #call, _r, #code);                \
        } while (0)

#define GRAN (UINT64_C(2) << 20)

/*
 * A call the driver must refuse: with exactly code here; on a real GPU with some error (the
 * driver may name the same misuse differently, or report it as the fault it becomes).
 */
#define CU_REFUSED(call, code)                                                                     \
        do {                                                                                       \
                CUresult _r = (call);                                                              \
                if (on_real_gpu())                                                                 \
                        cr_assert_neq(_r, CUDA_SUCCESS, "%s succeeded", #call);                    \
                else                                                                               \
                        cr_assert_eq(_r, (code), "%s = %d, expected %s", #call, _r, #code);        \
        } while (0)

static inline bool on_real_gpu(void)
{
        const char *v = getenv("AQUA_TEST_REAL_GPU");

        return v && *v && strcmp(v, "0") != 0;
}

#define SIM_ONLY()                                                                                 \
        do {                                                                                       \
                if (on_real_gpu())                                                                 \
                        cr_skip_test("needs the simulator's configuration or layout");             \
        } while (0)

/* Tests of two devices skip on a machine with one (a real single-GPU machine). */
#define NEED_TWO_DEVICES()                                                                         \
        do {                                                                                       \
                int n_ = 0;                                                                        \
                CU_OK(cuInit(0));                                                                  \
                CU_OK(cuDeviceGetCount(&n_));                                                      \
                if (n_ < 2)                                                                        \
                        cr_skip_test("needs two devices, found %d", n_);                           \
        } while (0)

/* Each test runs in its own process; give it its own machine so tests never share memory. */
static inline void sim_machine(const char *devices)
{
        char id[64];

        snprintf(id, sizeof(id), "test-%d", (int)getpid());
        setenv("AQUA_SIM_MACHINE", id, 1);
        setenv("AQUA_SIM_DEVICES", devices, 1);
        unsetenv("AQUA_SIM_TOPOLOGY");
}

/* Remove the machine's accounting folder (what a test leaves behind in /dev/shm). */
static inline void sim_machine_cleanup(void)
{
        const char *base = getenv("AQUA_SIM_RUNTIME_DIR");
        const char *id = getenv("AQUA_SIM_MACHINE");
        char path[512];
        DIR *d;
        struct dirent *de;

        if (!id)
                return;
        snprintf(path, sizeof(path), "%s/aqua-sim-%u-%s", base && *base ? base : "/dev/shm",
                 (unsigned)getuid(), id);
        d = opendir(path);
        if (!d)
                return;
        while ((de = readdir(d)))
                if (de->d_name[0] != '.')
                        unlinkat(dirfd(d), de->d_name, 0);
        closedir(d);
        rmdir(path);
}

/* In a forked child: exit with a status naming the line of a call that failed. */
#define CHILD_OK(call)                                                                             \
        do {                                                                                       \
                if ((call) != CUDA_SUCCESS)                                                        \
                        _exit(10 + __LINE__ % 100);                                                \
        } while (0)

/*
 * Fork a child running fn(sock, arg), which must _exit, before either side touches the driver, as
 * CUDA requires; the two talk over a SOCK_SEQPACKET pair. *ret_sock: the parent's end.
 */
static inline pid_t sim_fork_child(void (*fn)(int sock, const void *arg), const void *arg,
                                   int *ret_sock)
{
        int sv[2];
        pid_t pid;

        cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
        pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
                close(sv[0]);
                fn(sv[1], arg);
                _exit(99);
        }
        close(sv[1]);
        *ret_sock = sv[0];
        return pid;
}

/* Device memory in use on the current context's device, by every process of the machine. */
static inline size_t sim_used_bytes(void)
{
        size_t free, total;

        CU_OK(cuMemGetInfo(&free, &total));
        return total - free;
}

/* cuInit, then make device's primary context current. */
static inline CUcontext sim_start(int device)
{
        CUcontext ctx;

        CU_OK(cuInit(0));
        CU_OK(cuDevicePrimaryCtxRetain(&ctx, device));
        CU_OK(cuCtxSetCurrent(ctx));
        return ctx;
}

static inline CUmemAllocationProp device_prop(int device, bool exportable)
{
        CUmemAllocationProp prop = {
            .type = CU_MEM_ALLOCATION_TYPE_PINNED,
            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device},
            .requestedHandleTypes =
                exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE,
        };
        return prop;
}

static inline void set_rw(CUdeviceptr p, size_t size, int device)
{
        CUmemAccessDesc desc = {
            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device},
            .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };

        CU_OK(cuMemSetAccess(p, size, &desc, 1));
}

/* Reserve size bytes and map a fresh allocation of device there, read-write for device. */
static inline CUdeviceptr map_new(int device, size_t size, CUmemGenericAllocationHandle *ret)
{
        CUmemAllocationProp prop = device_prop(device, true);
        CUmemGenericAllocationHandle h;
        CUdeviceptr p;

        CU_OK(cuMemCreate(&h, size, &prop, 0));
        CU_OK(cuMemAddressReserve(&p, size, 0, 0, 0));
        CU_OK(cuMemMap(p, size, 0, h, 0));
        set_rw(p, size, device);
        if (ret)
                *ret = h;
        return p;
}
