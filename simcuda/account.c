/*
 * Machine-wide device memory accounting. Each device allocation is a file in a per-machine folder
 * on tmpfs, named d<device>-<size>-<pid>-<n>, and is also the memory itself. Its creator takes an
 * OFD read lock on the file. OFD locks belong to the open file description, which the kernel keeps
 * while any fd (in any process, e.g. one passed over SCM_RIGHTS) or any mmap of it exists, so a
 * file whose lock is gone is memory nobody can reach: the next scan unlinks it. A process that
 * dies therefore frees what only it held, and memory exported by a dead process stays counted for
 * as long as a live one still maps it.
 */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "account.h"
#include "sim.h"

static pthread_mutex_t account_lock = PTHREAD_MUTEX_INITIALIZER;
static int dir_fd = -1;
static int lock_fd = -1;
static char dir_path[PATH_MAX];
static uint64_t counter;

const char *account_dir(void)
{
        return dir_path;
}

int account_folder_open(const char *path)
{
        int fd;

        if (mkdir(path, 0700) < 0 && errno != EEXIST)
                return -errno;
        fd = open(path, O_DIRECTORY | O_RDONLY | O_CLOEXEC);
        return fd < 0 ? -errno : fd;
}

int account_open(const char *machine)
{
        const char *base = getenv("AQUA_SIM_RUNTIME_DIR");
        _cleanup_close_ int dfd = -1, lfd = -1;

        if (!base || !*base)
                base = "/dev/shm";
        if ((size_t)snprintf(dir_path, sizeof(dir_path), "%s/aqua-sim-%u-%s", base,
                             (unsigned)getuid(), machine) >= sizeof(dir_path))
                return -ENAMETOOLONG;
        dfd = account_folder_open(dir_path);
        if (dfd < 0)
                return dfd;
        lfd = openat(dfd, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (lfd < 0)
                return -errno;

        pthread_mutex_lock(&account_lock);
        safe_close(dir_fd);
        safe_close(lock_fd);
        dir_fd = TAKE_FD(dfd);
        lock_fd = TAKE_FD(lfd);
        pthread_mutex_unlock(&account_lock);
        return 0;
}

int account_file_alive(int dfd, const char *name)
{
        _cleanup_close_ int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};

        if (fd < 0)
                return -errno;
        if (fcntl(fd, F_OFD_GETLK, &fl) < 0)
                return -errno;
        return fl.l_type != F_UNLCK;
}

/* Sum one device's live records, unlinking dead ones. Caller holds both locks. */
static int scan_locked(int device, uint64_t *ret_used)
{
        _cleanup_close_ int fd = dup(dir_fd);
        uint64_t used = 0;
        struct dirent *de;
        DIR *d;

        if (fd < 0)
                return -errno;
        d = fdopendir(fd);
        if (!d)
                return -errno;
        TAKE_FD(fd);
        rewinddir(d);
        while ((de = readdir(d))) {
                unsigned dev;
                uint64_t size;
                int r;

                if (sscanf(de->d_name, "d%u-%" SCNu64 "-", &dev, &size) != 2)
                        continue;
                r = account_file_alive(dir_fd, de->d_name);
                if (r == -ENOENT)
                        continue;
                if (r < 0) {
                        closedir(d);
                        return r;
                }
                if (!r)
                        (void)unlinkat(dir_fd, de->d_name, 0);
                else if ((int)dev == device)
                        used += size;
        }
        closedir(d);
        *ret_used = used;
        return 0;
}

/* Threads of one process share lock_fd's description, so flock alone does not order them. */
static int lock_all(void)
{
        pthread_mutex_lock(&account_lock);
        if (dir_fd < 0) {
                pthread_mutex_unlock(&account_lock);
                return -EBADF;
        }
        if (flock(lock_fd, LOCK_EX) < 0) {
                int r = -errno;
                pthread_mutex_unlock(&account_lock);
                return r;
        }
        return 0;
}

static void unlock_all(void)
{
        (void)flock(lock_fd, LOCK_UN);
        pthread_mutex_unlock(&account_lock);
}

int account_used(int device, uint64_t *ret_used)
{
        int r = lock_all();

        if (r < 0)
                return r;
        r = scan_locked(device, ret_used);
        unlock_all();
        return r;
}

int account_create(int device, uint64_t size, uint64_t capacity, int *ret_fd)
{
        struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
        _cleanup_close_ int fd = -1;
        char name[96];
        uint64_t used;
        int r;

        r = lock_all();
        if (r < 0)
                return r;
        r = scan_locked(device, &used);
        if (r < 0)
                goto out;
        if (used > capacity || size > capacity - used) {
                r = -ENOSPC;
                goto out;
        }
        snprintf(name, sizeof(name), "d%d-%" PRIu64 "-%d-%" PRIu64, device, size, (int)getpid(),
                 counter++);
        fd = openat(dir_fd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) {
                r = -errno;
                goto out;
        }
        /* The lock is taken before the scan lock drops, so no scanner ever sees it unheld. */
        if (ftruncate(fd, SIM_HEADER_SIZE + size) < 0 || fcntl(fd, F_OFD_SETLK, &fl) < 0) {
                r = -errno;
                (void)unlinkat(dir_fd, name, 0);
                goto out;
        }
        *ret_fd = TAKE_FD(fd);
        r = 0;
out:
        unlock_all();
        return r;
}
