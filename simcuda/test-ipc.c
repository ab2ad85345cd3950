/*
 * Two processes of one machine: memory shared through POSIX-fd handles passed over SCM_RIGHTS,
 * and cuMemGetInfo that counts what every process holds, including after one dies.
 */
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "test-sim.h"

static void setup(void)
{
        sim_machine("2x256MiB");
}

TestSuite(ipc, .init = setup, .fini = sim_machine_cleanup);

static int send_msg(int sock, int value, int fd)
{
        char control[CMSG_SPACE(sizeof(int))] = {0};
        struct iovec iov = {.iov_base = &value, .iov_len = sizeof(value)};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};

        if (fd >= 0) {
                struct cmsghdr *c;

                msg.msg_control = control;
                msg.msg_controllen = sizeof(control);
                c = CMSG_FIRSTHDR(&msg);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int));
                memcpy(CMSG_DATA(c), &fd, sizeof(int));
        }
        return sendmsg(sock, &msg, MSG_NOSIGNAL) == sizeof(value) ? 0 : -1;
}

/* Receive one int and, if one came along, an fd (else *ret_fd = -1). */
static int recv_msg(int sock, int *ret_value, int *ret_fd)
{
        char control[CMSG_SPACE(sizeof(int))];
        struct iovec iov = {.iov_base = ret_value, .iov_len = sizeof(*ret_value)};
        struct msghdr msg = {.msg_iov = &iov,
                             .msg_iovlen = 1,
                             .msg_control = control,
                             .msg_controllen = sizeof(control)};
        struct cmsghdr *c;

        if (recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) != sizeof(*ret_value))
                return -1;
        if (ret_fd) {
                *ret_fd = -1;
                c = CMSG_FIRSTHDR(&msg);
                if (c && c->cmsg_type == SCM_RIGHTS)
                        memcpy(ret_fd, CMSG_DATA(c), sizeof(int));
        }
        return 0;
}

/*
 * Child: import the fd, map it for the other device (device 1; device 0 on a one-GPU machine),
 * read the parent's value, answer with its own.
 */
static void importer(int sock, const void *arg)
{
        (void)arg;
        CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1},
                               .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CUmemGenericAllocationHandle h;
        CUcontext ctx;
        CUdeviceptr p;
        int value, fd, answer = 0xbeef, n;

        CHILD_OK(cuInit(0));
        CHILD_OK(cuDeviceGetCount(&n));
        acc.location.id = n > 1 ? 1 : 0;
        CHILD_OK(cuDevicePrimaryCtxRetain(&ctx, acc.location.id));
        CHILD_OK(cuCtxSetCurrent(ctx));
        if (recv_msg(sock, &value, &fd) < 0 || fd < 0)
                _exit(2);
        CHILD_OK(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        close(fd);
        CHILD_OK(cuMemAddressReserve(&p, GRAN, 0, 0, 0));
        CHILD_OK(cuMemMap(p, GRAN, 0, h, 0));
        CHILD_OK(cuMemSetAccess(p, GRAN, &acc, 1));
        CHILD_OK(cuMemcpyDtoH(&value, p, sizeof(value)));
        if (value != 0x1234)
                _exit(3);
        CHILD_OK(cuMemcpyHtoD(p + 4096, &answer, sizeof(answer)));
        if (send_msg(sock, 1, -1) < 0)
                _exit(4);
        /* Stay mapped until the parent has read. */
        if (recv_msg(sock, &value, NULL) < 0)
                _exit(5);
        CHILD_OK(cuMemUnmap(p, GRAN));
        CHILD_OK(cuMemRelease(h));
        _exit(0);
}

Test(ipc, two_processes_share_memory_through_posix_fds)
{
        CUmemGenericAllocationHandle h;
        int sv[1], fd, value = 0x1234, status;
        CUdeviceptr p;
        pid_t pid;

        pid = sim_fork_child(importer, NULL, &sv[0]);
        sim_start(0);
        p = map_new(0, GRAN, &h);
        CU_OK(cuMemcpyHtoD(p, &value, sizeof(value)));
        CU_OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        cr_assert_eq(send_msg(sv[0], 0, fd), 0);
        close(fd);
        cr_assert_eq(recv_msg(sv[0], &value, NULL), 0, "the importer gave up");
        CU_OK(cuMemcpyDtoH(&value, p + 4096, sizeof(value)));
        cr_assert_eq(value, 0xbeef, "the importer's write is visible here");
        send_msg(sv[0], 0, -1);
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "importer status %#x", status);
}

/* Child: allocate what the parent says, report, and wait to be told to exit (or be killed). */
struct holding {
        size_t private_bytes, shared_bytes;
};

static void holder(int sock, const void *arg)
{
        size_t private_bytes = ((const struct holding *)arg)->private_bytes;
        size_t shared_bytes = ((const struct holding *)arg)->shared_bytes;
        CUmemAllocationProp priv = device_prop(0, false), shared = device_prop(0, true);
        CUmemGenericAllocationHandle a, b;
        CUcontext ctx;
        int fd = -1, value;

        CHILD_OK(cuInit(0));
        CHILD_OK(cuDevicePrimaryCtxRetain(&ctx, 0));
        CHILD_OK(cuCtxSetCurrent(ctx));
        if (recv_msg(sock, &value, NULL) < 0)
                _exit(2);
        CHILD_OK(cuMemCreate(&a, private_bytes, &priv, 0));
        if (shared_bytes) {
                CHILD_OK(cuMemCreate(&b, shared_bytes, &shared, 0));
                CHILD_OK(cuMemExportToShareableHandle(&fd, b,
                                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        }
        if (send_msg(sock, 1, fd) < 0)
                _exit(3);
        (void)recv_msg(sock, &value, NULL);
        _exit(0);
}

Test(ipc, memory_info_counts_other_processes_until_they_exit)
{
        int sv[1], value, status;
        size_t before, during;
        pid_t pid;

        pid = sim_fork_child(holder, &(struct holding){8 * GRAN, 0}, &sv[0]);
        sim_start(0);
        before = sim_used_bytes();
        cr_assert_eq(send_msg(sv[0], 0, -1), 0);
        cr_assert_eq(recv_msg(sv[0], &value, NULL), 0, "the child could not allocate");
        during = sim_used_bytes();
        cr_assert_geq(during - before, 8 * GRAN);
        cr_assert_eq(send_msg(sv[0], 0, -1), 0);
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %#x", status);
        if (!on_real_gpu())
                cr_assert_eq(sim_used_bytes(), before, "the exited child's memory is free again");
}

Test(ipc, a_killed_process_frees_only_what_nobody_else_holds)
{
        CUmemGenericAllocationHandle h;
        int sv[1], value, fd, status;
        CUdeviceptr p;
        pid_t pid;

        SIM_ONLY(); /* exact byte counts */
        pid = sim_fork_child(holder, &(struct holding){4 * GRAN, 2 * GRAN}, &sv[0]);
        sim_start(0);
        cr_assert_eq(sim_used_bytes(), 0);
        cr_assert_eq(send_msg(sv[0], 0, -1), 0);
        cr_assert_eq(recv_msg(sv[0], &value, &fd), 0);
        cr_assert_geq(fd, 0);
        cr_assert_eq(sim_used_bytes(), 6 * GRAN);

        kill(pid, SIGKILL);
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFSIGNALED(status));
        cr_assert_eq(sim_used_bytes(), 2 * GRAN,
                     "the fd this process holds keeps the shared chunk");

        /* Only a mapping left: still counted, as the memory is still there. */
        CU_OK(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        close(fd);
        CU_OK(cuMemAddressReserve(&p, 2 * GRAN, 0, 0, 0));
        CU_OK(cuMemMap(p, 2 * GRAN, 0, h, 0));
        CU_OK(cuMemRelease(h));
        cr_assert_eq(sim_used_bytes(), 2 * GRAN);
        CU_OK(cuMemUnmap(p, 2 * GRAN));
        cr_assert_eq(sim_used_bytes(), 0);
}
