/*
 * The side channel beside the ZeroMQ socket: an AF_UNIX SOCK_SEQPACKET connection per client
 * carrying SideFrames with file descriptors (SCM_RIGHTS). The kernel's SO_PEERCRED on it is
 * what identifies a client, and EOF on it is how the daemon learns at once that a client died.
 */
#pragma once

#include <stddef.h>
#include <sys/types.h>

#include "aqua.pb-c.h"

#define SIDE_MAX_FDS   253 /* SCM_MAX_FD on Linux */
#define SIDE_MAX_FRAME 65536
#define SIDE_TOKEN_LEN 16

enum {
        SIDE_E_EOF = 1,   /* the peer closed the connection */
        SIDE_E_MALFORMED, /* a datagram that is not a SideFrame, truncated, or too many fds */
};

struct side_cred {
        pid_t pid;
        uid_t uid;
        gid_t gid;
};

/* Send one frame with n_fds descriptors (which stay open in the caller). */
int side_send(int sock, Aqua__SideFrame *frame, const int *fds, size_t n_fds);

/*
 * Receive one frame. Received descriptors are stored in fds (room for max_fds) with
 * O_CLOEXEC set, their number in *ret_n_fds; on any failure none stay open. Free the frame
 * with aqua__side_frame__free_unpacked(). Returns 0, SIDE_E_EOF, SIDE_E_MALFORMED, or
 * a negative errno (-EAGAIN on a non-blocking socket with nothing to read).
 */
int side_recv(int sock, Aqua__SideFrame **ret_frame, int *fds, size_t max_fds, size_t *ret_n_fds);

/* The peer's pid, uid and gid as the kernel recorded them at connect time. */
int side_peer_cred(int sock, struct side_cred *ret);

/* Close n descriptors. */
void side_close_fds(int *fds, size_t n);
