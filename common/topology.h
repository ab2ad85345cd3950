/*
 * The GPU topology file: devices and the peer links between them with their bandwidth. The link
 * probe (aqua-profile probe) writes it; simcuda simulates it (AQUA_SIM_TOPOLOGY), aquad's pairing
 * and the placer read it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TOPOLOGY_MAX_DEVICES 64

struct topology_device {
        char *name;       /* NULL when the file has none */
        uint64_t memory;  /* bytes */
        char *uuid;       /* "GPU-..." as written, NULL when absent */
        char *pci_domain; /* as written (decimal or 0x hex), NULL when absent */
        char *pci_bus;
        char *pci_device;
};

struct topology {
        struct topology_device *devices;
        size_t n_devices;
        /* bandwidth[a * n_devices + b]: bytes per second of the peer link a -> b, 0 for none. */
        uint64_t *bandwidth;
};

/*
 * Load a topology file: devices (1..TOPOLOGY_MAX_DEVICES, each with a memory size), optional
 * all-linked + bandwidth (every pair linked at that bandwidth), links [{a, b, bandwidth}] between
 * device indices. Returns 0, or a negative errno with *ret_error naming the file, line and key.
 */
int topology_load(const char *path, struct topology *ret, char **ret_error);
void topology_free(struct topology *t);

/* Bandwidth of the link between the devices with these uuids (either direction), 0 if none. */
uint64_t topology_link_by_uuid(const struct topology *t, const char *a, const char *b);
