/* The side channel: frames with descriptors, credentials, EOF, and bad datagrams. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "side.h"
#include "util.h"

static int sv[2] = {-1, -1};

static void open_pair(void)
{
        cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
}

static void close_pair(void)
{
        sv[0] = safe_close(sv[0]);
        sv[1] = safe_close(sv[1]);
}

TestSuite(side, .init = open_pair, .fini = close_pair);

static bool same_file(int a, int b)
{
        struct stat sa, sb;

        return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
               sa.st_ino == sb.st_ino;
}

Test(side, passes_descriptors_with_a_frame)
{
        Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
        Aqua__SideFrame *got = NULL;
        uint64_t ids[2] = {7, 9};
        int fds[2], in[4];
        size_t n = 0;

        fds[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        fds[1] = memfd_create("chunk", MFD_CLOEXEC);
        f.kind = AQUA__SIDE_FRAME__KIND__KIND_GRANT_FDS;
        f.lease_id = 5;
        f.n_chunk_ids = 2;
        f.chunk_ids = ids;
        cr_assert_eq(side_send(sv[0], &f, fds, 2), 0);
        cr_assert_eq(side_recv(sv[1], &got, in, 4, &n), 0);
        cr_assert_eq(n, 2);
        cr_assert_eq(got->kind, AQUA__SIDE_FRAME__KIND__KIND_GRANT_FDS);
        cr_assert_eq(got->lease_id, 5);
        cr_assert_eq(got->n_chunk_ids, 2);
        cr_assert_eq(got->chunk_ids[1], 9);
        cr_assert(same_file(fds[0], in[0]));
        cr_assert(same_file(fds[1], in[1]));
        cr_assert_eq(fcntl(in[0], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
        aqua__side_frame__free_unpacked(got, NULL);
        side_close_fds(in, n);
        side_close_fds(fds, 2);
}

Test(side, sends_an_empty_frame_that_is_not_eof)
{
        Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
        Aqua__SideFrame *got = NULL;
        size_t n = 0;

        cr_assert_eq(side_send(sv[0], &f, NULL, 0), 0);
        cr_assert_eq(side_recv(sv[1], &got, NULL, 0, &n), 0);
        cr_assert_eq(got->kind, AQUA__SIDE_FRAME__KIND__KIND_UNSPECIFIED);
        aqua__side_frame__free_unpacked(got, NULL);
}

Test(side, reports_eof_when_the_peer_closes)
{
        Aqua__SideFrame *got = NULL;
        size_t n = 0;

        sv[0] = safe_close(sv[0]);
        cr_assert_eq(side_recv(sv[1], &got, NULL, 0, &n), SIDE_E_EOF);
}

Test(side, closes_descriptors_that_arrive_with_a_bad_datagram)
{
        const uint8_t junk[] = {0xff, 0xff, 0xff};
        Aqua__SideFrame *got = NULL;
        int fd = memfd_create("x", MFD_CLOEXEC), in[2];
        size_t n = 0;
        union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
        } control = {0};
        struct iovec iov = {.iov_base = (void *)junk, .iov_len = sizeof(junk)};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                             .msg_controllen = sizeof(control.buf)};
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);

        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
        cr_assert_eq(sendmsg(sv[0], &msg, 0), (ssize_t)sizeof(junk));

        int before = fcntl(fd, F_GETFD);
        cr_assert_eq(side_recv(sv[1], &got, in, 2, &n), SIDE_E_MALFORMED);
        cr_assert_null(got);
        /* The received copy was closed: the next descriptor number is free again. */
        int probe = dup(fd);
        cr_assert_geq(before, 0);
        cr_assert_lt(probe, 64);
        close(probe);
        close(fd);
}

Test(side, refuses_more_descriptors_than_the_caller_has_room_for)
{
        Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
        Aqua__SideFrame *got = NULL;
        int fds[3], in[2];
        size_t n = 0;

        for (int i = 0; i < 3; i++)
                fds[i] = memfd_create("x", MFD_CLOEXEC);
        cr_assert_eq(side_send(sv[0], &f, fds, 3), 0);
        cr_assert_eq(side_recv(sv[1], &got, in, 2, &n), SIDE_E_MALFORMED);
        side_close_fds(fds, 3);
}

Test(side, names_the_peer_by_its_credentials)
{
        struct side_cred cred;

        cr_assert_eq(side_peer_cred(sv[1], &cred), 0);
        cr_assert_eq(cred.pid, getpid());
        cr_assert_eq(cred.uid, getuid());
        cr_assert_eq(cred.gid, getgid());
}
