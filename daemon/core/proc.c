/* Process identity and liveness from /proc, for releasing memory only when its holder is gone. */
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

static int read_small_file(const char *path, char *buf, size_t size)
{
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t n;

        if (fd < 0)
                return -errno;
        n = read(fd, buf, size - 1);
        if (n < 0)
                return -errno;
        buf[n] = 0;
        return 0;
}

int proc_boot_id(char ret[PROC_BOOT_ID_LEN])
{
        char buf[64];
        int r = read_small_file("/proc/sys/kernel/random/boot_id", buf, sizeof(buf));

        if (r < 0)
                return r;
        buf[strcspn(buf, "\n")] = 0;
        if (strlen(buf) != PROC_BOOT_ID_LEN - 1)
                return -EBADMSG;
        memcpy(ret, buf, PROC_BOOT_ID_LEN);
        return 0;
}

/* Field 22 of /proc/PID/stat; the command name before it may hold spaces and parentheses. */
static int start_time(pid_t pid, uint64_t *ret)
{
        char path[64], buf[1024], *p, *end;
        int r;

        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        r = read_small_file(path, buf, sizeof(buf));
        if (r < 0)
                return r == -ENOENT ? -ESRCH : r;
        p = strrchr(buf, ')');
        if (!p)
                return -EBADMSG;
        /* After ") " come fields 3 (state) to 52; the start time is field 22. */
        p++;
        for (int field = 3; field < 22; field++) {
                p = strchr(p + 1, ' ');
                if (!p)
                        return -EBADMSG;
        }
        errno = 0;
        *ret = strtoull(p + 1, &end, 10);
        if (errno || end == p + 1)
                return -EBADMSG;
        return 0;
}

int proc_identify(pid_t pid, struct proc_id *ret)
{
        struct proc_id id = {.pid = pid};
        int r;

        if (pid <= 0)
                return -EINVAL;
        r = proc_boot_id(id.boot_id);
        if (r < 0)
                return r;
        r = start_time(pid, &id.start_time);
        if (r < 0)
                return r;
        *ret = id;
        return 0;
}

int proc_cgroup(pid_t pid, char *ret, size_t size)
{
        char path[64], line[4096];
        FILE *f;
        int r = -ENOENT;

        if (pid <= 0 || size == 0)
                return -EINVAL;
        snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
        f = fopen(path, "re");
        if (!f)
                return -errno;
        while (r == -ENOENT && fgets(line, sizeof(line), f)) {
                size_t n = strcspn(line, "\n");

                line[n] = '\0';
                if (strncmp(line, "0::", 3) != 0)
                        continue;
                r = n - 3 < size ? 0 : -ENAMETOOLONG;
                if (r == 0)
                        memcpy(ret, line + 3, n - 2);
        }
        fclose(f);
        return r;
}

enum proc_liveness proc_liveness(const struct proc_id *id)
{
        char boot[PROC_BOOT_ID_LEN];
        uint64_t start;
        int r;

        if (id->pid <= 0 || !id->start_time || !id->boot_id[0])
                return PROC_UNKNOWN;
        if (proc_boot_id(boot) == 0 && strcmp(boot, id->boot_id) != 0)
                return PROC_GONE; /* every process of that boot is gone */
        /* kill(0) sees processes /proc may hide (hidepid, ProtectProc=invisible). */
        if (kill(id->pid, 0) < 0 && errno == ESRCH)
                return PROC_GONE;
        r = start_time(id->pid, &start);
        if (r == 0)
                return start == id->start_time ? PROC_ALIVE : PROC_GONE;
        return PROC_UNKNOWN;
}
