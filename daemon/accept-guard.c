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
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/stat.h>
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

/*
 * Per-user shares of AF_UNIX connections. libzmq closes what it accepted without telling us, so
 * each one is remembered with its inode and a user's count is checked against the descriptors
 * (fstat) only when it reaches the share: stale entries, closed or reused, drop out then.
 */
#define SHARE_FDS   65536 /* descriptors tracked: those below this number */
#define SHARE_USERS 256   /* users with connections counted at once */

static pthread_mutex_t share_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_long share_max;
static atomic_ulong share_refused;
static struct {
        uid_t uid;
        ino_t ino; /* 0: not tracked */
} share_fd[SHARE_FDS];
static struct {
        uid_t uid;
        long n; /* connections counted; may include closed ones until rechecked */
} share_user[SHARE_USERS];

void accept_guard_share(long max)
{
        atomic_store(&share_max, max);
}

unsigned long accept_guard_share_refused(void)
{
        return atomic_load(&share_refused);
}

static long *user_count(uid_t uid)
{
        for (size_t i = 0; i < SHARE_USERS; i++)
                if (share_user[i].n && share_user[i].uid == uid)
                        return &share_user[i].n;
        for (size_t i = 0; i < SHARE_USERS; i++)
                if (!share_user[i].n) {
                        share_user[i].uid = uid;
                        return &share_user[i].n;
                }
        return NULL; /* more users than that at once: not shared out */
}

/* uid's connections that are still open. */
static long recount(uid_t uid)
{
        long n = 0;

        for (int fd = 0; fd < SHARE_FDS; fd++) {
                struct stat st;

                if (!share_fd[fd].ino || share_fd[fd].uid != uid)
                        continue;
                if (fstat(fd, &st) < 0 || st.st_ino != share_fd[fd].ino) {
                        share_fd[fd].ino = 0;
                        continue;
                }
                n++;
        }
        return n;
}

/* Whether connection fd, just accepted, is within its user's share (else it is closed). */
static bool within_share(int fd)
{
        long max = atomic_load(&share_max), *n;
        struct ucred cred;
        socklen_t len = sizeof(cred);
        int domain;
        socklen_t dlen = sizeof(domain);
        struct stat st;
        bool ok = true;

        if (max <= 0 || fd >= SHARE_FDS ||
            getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &dlen) < 0 || domain != AF_UNIX ||
            getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || cred.uid == 0 ||
            cred.uid == geteuid() || fstat(fd, &st) < 0)
                return true;
        pthread_mutex_lock(&share_lock);
        n = user_count(cred.uid);
        if (n && *n >= max)
                *n = recount(cred.uid);
        if (n && *n >= max)
                ok = false;
        else if (n) {
                share_fd[fd].uid = cred.uid;
                share_fd[fd].ino = st.st_ino;
                (*n)++;
        }
        pthread_mutex_unlock(&share_lock);
        if (!ok) {
                close(fd);
                atomic_fetch_add(&share_refused, 1);
        }
        return ok;
}

/* Exported (the build hides symbols by default): libzmq's calls must bind to these. */
__attribute__((visibility("default"))) int accept4(int fd, struct sockaddr *addr, socklen_t *len,
                                                   int flags)
{
        int r = real_accept4(fd, addr, len, flags);

        if (r < 0 && (errno == EMFILE || errno == ENFILE) && fd != atomic_load(&passthrough))
                return drop_one(fd);
        /* The side channel keeps its own shares (transport/server.c). */
        if (r >= 0 && fd != atomic_load(&passthrough) && !within_share(r)) {
                errno = EAGAIN;
                return -1;
        }
        return r;
}

__attribute__((visibility("default"))) int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
        return accept4(fd, addr, len, 0);
}
