/*
 * LD_PRELOAD into aquad for bench/run: fdatasync as a disk would make it. Each call sleeps
 * AQUA_BENCH_SYNC_US microseconds (default 0) before the real one, and is counted in the
 * unsigned long at the start of the file AQUA_BENCH_SYNC_COUNTER names (when set), which
 * bench-churn maps to read.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static int (*real_fdatasync)(int);
static _Atomic unsigned long *counter;
static long delay_us;

__attribute__((constructor)) static void init(void)
{
        const char *us = getenv("AQUA_BENCH_SYNC_US"), *path = getenv("AQUA_BENCH_SYNC_COUNTER");

        real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
        delay_us = us ? atol(us) : 0;
        if (path) {
                int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
                if (fd >= 0 && ftruncate(fd, sizeof(unsigned long)) == 0) {
                        void *m = mmap(NULL, sizeof(unsigned long), PROT_READ | PROT_WRITE,
                                       MAP_SHARED, fd, 0);
                        if (m != MAP_FAILED)
                                counter = m;
                }
                if (fd >= 0)
                        close(fd);
        }
}

__attribute__((visibility("default"))) int fdatasync(int fd)
{
        if (counter)
                atomic_fetch_add(counter, 1);
        if (delay_us > 0) {
                struct timespec ts = {delay_us / 1000000, (delay_us % 1000000) * 1000};
                nanosleep(&ts, NULL);
        }
        return real_fdatasync(fd);
}
