/*
 * Whether a client process is provably gone, for holders aquad cannot hear after a restart. A
 * process is named by its pid, its start time (in clock ticks after boot, /proc/PID/stat) and
 * the boot it ran in: pids are reused, the triple is not.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define PROC_BOOT_ID_LEN 37 /* a UUID and its NUL */

struct proc_id {
        pid_t pid;
        uint64_t start_time;
        char boot_id[PROC_BOOT_ID_LEN];
};

/* This boot's id (/proc/sys/kernel/random/boot_id); 0 or a negative errno. */
int proc_boot_id(char ret[PROC_BOOT_ID_LEN]);
/* The identity of the running process pid; 0 or a negative errno (-ESRCH: no such process). */
int proc_identify(pid_t pid, struct proc_id *ret);

/*
 * The cgroup v2 path of process pid (the "0::" line of /proc/PID/cgroup, e.g.
 * "/kubepods.slice/.../cri-containerd-ID.scope"): 0, or a negative errno (-ENOENT: none).
 */
int proc_cgroup(pid_t pid, char *ret, size_t size);

enum proc_liveness {
        PROC_ALIVE,   /* the same process still runs */
        PROC_GONE,    /* provably gone: no such pid, another process under it, or another boot */
        PROC_UNKNOWN, /* cannot be told (no identity recorded, /proc hidden from aquad) */
};

/* What can be known of the process id names. */
enum proc_liveness proc_liveness(const struct proc_id *id);
