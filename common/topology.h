/*
 * The GPU topology file: devices and the peer links between them with their bandwidth. The link
 * probe (aqua-profile probe) writes it; simcuda simulates it (AQUA_SIM_TOPOLOGY), aquad's pairing
 * and the placer read it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TOPOLOGY_MAX_DEVICES 255 /* an NVL72 domain file has 72; the placer takes up to 255 */

struct topology_device {
        char *name;       /* NULL when the file has none */
        uint64_t memory;  /* bytes */
        char *uuid;       /* "GPU-..." as written, NULL when absent */
        char *pci_domain; /* as written (decimal or 0x hex), NULL when absent */
        char *pci_bus;
        char *pci_device;
        char *host; /* the host it is on ("host" key), NULL when absent: the file's one host */
};

struct topology {
        struct topology_device *devices;
        size_t n_devices;
        /* bandwidth[a * n_devices + b]: bytes per second of the peer link a -> b, 0 for none. */
        uint64_t *bandwidth;
};

/*
 * Load a topology file: devices (1..TOPOLOGY_MAX_DEVICES, each with a memory size and optionally
 * the host it is on), optional all-linked + bandwidth (every pair linked at that bandwidth),
 * links [{a, b, bandwidth}] between device indices, on one host or on two hosts of one NVLink
 * domain. A uuid given twice on one host is an error. Returns 0, or a negative errno with
 * *ret_error naming the file, line and key.
 */
int topology_load(const char *path, struct topology *ret, char **ret_error);
void topology_free(struct topology *t);

/* Bandwidth of the link between the devices with these uuids (either direction), 0 if none. */
uint64_t topology_link_by_uuid(const struct topology *t, const char *a, const char *b);

/*
 * The index of the device with this uuid on this host, or SIZE_MAX. A NULL host, or a device
 * without one, matches any host; a device on the host named wins over one without a host.
 */
size_t topology_find(const struct topology *t, const char *host, const char *uuid);
/* As topology_link_by_uuid, for GPUs named by host and uuid (hosts may be NULL: any). */
uint64_t topology_link_by_host(const struct topology *t, const char *host_a, const char *a,
                               const char *host_b, const char *b);
