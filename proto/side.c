/* SideFrames over SOCK_SEQPACKET with SCM_RIGHTS, and peer credentials. */
#include "side.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util.h"

int side_send(int sock, Aqua__SideFrame *frame, const int *fds, size_t n_fds)
{
        union {
                char buf[CMSG_SPACE(sizeof(int) * SIDE_MAX_FDS)];
                struct cmsghdr align;
        } control;
        uint8_t data[SIDE_MAX_FRAME];
        struct iovec iov;
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        size_t len;
        ssize_t n;

        if (n_fds > SIDE_MAX_FDS)
                return -E2BIG;
        len = aqua__side_frame__get_packed_size(frame);
        if (len > sizeof(data))
                return -EMSGSIZE;
        aqua__side_frame__pack(frame, data);
        /* A zero-length datagram reads as EOF on the other side; a frame is never empty. */
        if (len == 0)
                data[len++] = 0;
        iov = (struct iovec){.iov_base = data, .iov_len = len};

        if (n_fds > 0) {
                struct cmsghdr *c;

                memset(&control, 0, sizeof(control));
                msg.msg_control = control.buf;
                msg.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
                c = CMSG_FIRSTHDR(&msg);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
                memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
        }
        do
                n = sendmsg(sock, &msg, MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return -errno;
        return 0;
}

void side_close_fds(int *fds, size_t n)
{
        for (size_t i = 0; i < n; i++)
                fds[i] = safe_close(fds[i]);
}

int side_recv(int sock, Aqua__SideFrame **ret_frame, int *fds, size_t max_fds, size_t *ret_n_fds)
{
        union {
                char buf[CMSG_SPACE(sizeof(int) * SIDE_MAX_FDS)];
                struct cmsghdr align;
        } control;
        uint8_t data[SIDE_MAX_FRAME];
        struct iovec iov = {.iov_base = data, .iov_len = sizeof(data)};
        struct msghdr msg = {
                .msg_iov = &iov,
                .msg_iovlen = 1,
                .msg_control = control.buf,
                .msg_controllen = sizeof(control.buf),
        };
        int got[SIDE_MAX_FDS];
        size_t n_got = 0;
        Aqua__SideFrame *frame;
        ssize_t n;

        do
                n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return -errno;

        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                        continue;
                size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                if (n_got + k > SIDE_MAX_FDS)
                        k = SIDE_MAX_FDS - n_got;
                memcpy(got + n_got, CMSG_DATA(c), k * sizeof(int));
                n_got += k;
        }

        if (n == 0 && n_got == 0)
                return SIDE_E_EOF;
        if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || n_got > max_fds)
                goto malformed;
        frame = aqua__side_frame__unpack(NULL, (size_t)n == 1 && data[0] == 0 ? 0 : (size_t)n, data);
        if (!frame)
                goto malformed;

        if (n_got > 0)
                memcpy(fds, got, n_got * sizeof(int));
        *ret_n_fds = n_got;
        *ret_frame = frame;
        return 0;

malformed:
        side_close_fds(got, n_got);
        return SIDE_E_MALFORMED;
}

int side_peer_cred(int sock, struct side_cred *ret)
{
        struct ucred cred;
        socklen_t len = sizeof(cred);

        if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
                return -errno;
        *ret = (struct side_cred){.pid = cred.pid, .uid = cred.uid, .gid = cred.gid};
        return 0;
}
