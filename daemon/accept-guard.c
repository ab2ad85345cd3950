/*
 * accept() and accept4() for this process, in front of libc's: out of descriptors (EMFILE,
 * ENFILE), the connection waiting first is taken with a spare descriptor kept for this, closed
 * at once (its client sees the connection end and tries again) and the caller is told EAGAIN.
 *
 * Why: libzmq 4.3's ipc:// listener aborts the whole process when accept() fails with EMFILE
 * (ipc_listener.cpp asserts on every errno but EAGAIN, EINTR, ECONNABORTED, EPROTO and ENFILE),
 * and it accepts in its own I/O thread, as fast as clients connect: aquad's descriptor guard
 * (transport/fdguard.c) pauses its listeners before they run out, but a burst can outrun it.
 * This is the backstop. It is linked into the aquad executable, whose definitions the dynamic
 * linker binds libzmq's calls to ahead of libc's. The side channel's own accept, which pauses
 * by itself on EMFILE, sees the errno unchanged.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "accept-guard.h"

static pthread_mutex_t spare_lock = PTHREAD_MUTEX_INITIALIZER;
static int spare = -1;
static atomic_int passthrough = -1;
static atomic_ulong dropped;

void accept_guard_init(void)
{
        pthread_mutex_lock(&spare_lock);
        if (spare < 0)
                spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
        pthread_mutex_unlock(&spare_lock);
}

void accept_guard_passthrough(int fd)
{
        atomic_store(&passthrough, fd);
}

unsigned long accept_guard_dropped(void)
{
        return atomic_load(&dropped);
}

static int real_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
        return (int)syscall(SYS_accept4, fd, addr, len, flags);
}

/* Out of descriptors: take the first waiting connection with the spare one and end it. */
static int drop_one(int fd)
{
        int r;

        pthread_mutex_lock(&spare_lock);
        if (spare >= 0) {
                close(spare);
                r = real_accept4(fd, NULL, NULL, SOCK_CLOEXEC);
                if (r >= 0) {
                        close(r);
                        atomic_fetch_add(&dropped, 1);
                }
                spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
        }
        pthread_mutex_unlock(&spare_lock);
        errno = EAGAIN;
        return -1;
}

/* Exported (the build hides symbols by default): libzmq's calls must bind to these. */
__attribute__((visibility("default"))) int accept4(int fd, struct sockaddr *addr, socklen_t *len,
                                                   int flags)
{
        int r = real_accept4(fd, addr, len, flags);

        if (r < 0 && (errno == EMFILE || errno == ENFILE) && fd != atomic_load(&passthrough))
                return drop_one(fd);
        return r;
}

__attribute__((visibility("default"))) int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
        return accept4(fd, addr, len, 0);
}
