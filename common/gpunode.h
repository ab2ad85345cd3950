/*
 * The evidence a host gives that a process may use a GPU: the GPU's device node, which only a
 * process the host lets use that GPU can open (its permissions, a container's device cgroup,
 * systemd's DeviceAllow=). The NVIDIA driver lists each GPU in
 * ROOT/proc/driver/nvidia/gpus/BUS/information ("GPU UUID:" and "Device Minor:" lines, as its
 * open kernel modules write them) and its node is ROOT/dev/nvidiaMINOR (character device 195,
 * MINOR). simcuda writes the same files under a root of its own (AQUA_DRIVER_ROOT), its nodes
 * regular files. A client opens its GPU's node and passes the descriptor on the side channel;
 * aquad finds which GPU that descriptor is.
 */
#pragma once

#include <stddef.h>

/* The variable naming the root the driver's files are under for libaqua and simcuda ("/"). */
#define GPUNODE_ROOT_ENV "AQUA_DRIVER_ROOT"
#define GPUNODE_UUID_LEN 48

/* The root libaqua and simcuda use: $AQUA_DRIVER_ROOT, else "/". */
const char *gpunode_root(void);

/* Whether the driver under root lists a GPU of this uuid ("GPU-..."); its minor in *ret_minor. */
int gpunode_find(const char *root, const char *uuid, unsigned *ret_minor);

/* Open uuid's node read-only: a descriptor, -ENOENT (no such GPU here), or open's -errno. */
int gpunode_open(const char *root, const char *uuid);

/*
 * The uuid of the GPU whose node fd is (a character device of the same number, or the same
 * file where the root holds simulated nodes): 0, -ENOENT (no GPU's node), or a -errno.
 */
int gpunode_uuid_of_fd(const char *root, int fd, char ret_uuid[GPUNODE_UUID_LEN]);

/*
 * simcuda: list a GPU under root as the driver does, minor and uuid, its node a regular file
 * of mode 0666 made if absent (a test restricts it as a host would). 0 or a -errno.
 */
int gpunode_publish(const char *root, unsigned minor, const char *uuid, const char *bus);
