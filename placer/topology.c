/*
 * A server kind's GPUs and peer groups from a topology file as `aqua-profile probe` writes it
 * (simcuda's AQUA_SIM_TOPOLOGY format): GPUs joined by links form the peer groups.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "place.h"

struct topo_device {
        char *name, *uuid, *pci_domain, *pci_bus, *pci_device;
        uint64_t memory;
};

struct topo_link {
        int64_t a, b;
        uint64_t bandwidth;
};

struct topo {
        struct topo_device *devices;
        size_t n_devices;
        struct topo_link *links;
        size_t n_links;
        bool all_linked;
        uint64_t bandwidth;
};

#define MAX_SIZE (INT64_C(1) << 50)

/* Every key the probe (and simcuda) knows, so that the strict loader takes its files. */
static const struct conf_field device_fields[] = {
    CONF_FIELD_STRING(struct topo_device, name, "name", 0),
    CONF_FIELD_SIZE(struct topo_device, memory, "memory", 1, MAX_SIZE, CONF_REQUIRED),
    CONF_FIELD_STRING(struct topo_device, uuid, "uuid", 0),
    CONF_FIELD_STRING(struct topo_device, pci_domain, "pci-domain", 0),
    CONF_FIELD_STRING(struct topo_device, pci_bus, "pci-bus", 0),
    CONF_FIELD_STRING(struct topo_device, pci_device, "pci-device", 0),
    CONF_FIELD_END,
};
static const struct conf_schema device_schema = {"device", device_fields};

static const struct conf_field link_fields[] = {
    CONF_FIELD_INT(struct topo_link, a, "a", 0, PLACE_MAX_GPUS - 1, CONF_REQUIRED),
    CONF_FIELD_INT(struct topo_link, b, "b", 0, PLACE_MAX_GPUS - 1, CONF_REQUIRED),
    CONF_FIELD_SIZE(struct topo_link, bandwidth, "bandwidth", 1, MAX_SIZE, 0),
    CONF_FIELD_END,
};
static const struct conf_schema link_schema = {"link", link_fields};

static const struct conf_field topo_fields[] = {
    CONF_FIELD_LIST(struct topo, devices, n_devices, "devices", CONF_ELEM_STRUCT(&device_schema),
                    PLACE_MAX_GPUS, CONF_REQUIRED),
    CONF_FIELD_LIST(struct topo, links, n_links, "links", CONF_ELEM_STRUCT(&link_schema), 0, 0),
    CONF_FIELD_BOOL(struct topo, all_linked, "all-linked", 0),
    CONF_FIELD_SIZE(struct topo, bandwidth, "bandwidth", 1, MAX_SIZE, 0),
    CONF_FIELD_END,
};
static const struct conf_schema topo_schema = {"topology", topo_fields};

static void topo_free(struct topo *t)
{
        conf_free(&topo_schema, t);
}

/*
 * Groups are connected components of the link graph, each split into cliques where it is not
 * one: the placer pairs any two GPUs of a group, and a pair must have a link of its own. A
 * component is taken greedily: the lowest free GPU, then in order every free GPU of the
 * component linked to all taken so far.
 */
static void groups_from_links(unsigned n, const bool *linked, unsigned *group)
{
        unsigned next = 0;

        for (unsigned i = 0; i < n; i++)
                group[i] = UINT32_MAX;
        for (unsigned i = 0; i < n; i++) {
                if (group[i] != UINT32_MAX)
                        continue;
                group[i] = next;
                for (unsigned j = i + 1; j < n; j++) {
                        bool all = group[j] == UINT32_MAX;

                        for (unsigned m = i; all && m < j; m++)
                                if (group[m] == next && !linked[m * n + j])
                                        all = false;
                        if (all)
                                group[j] = next;
                }
                next++;
        }
}

int place_topology_load(const char *path, unsigned *ret_gpus, uint64_t *ret_gpu_memory,
                        unsigned **ret_groups, char **ret_error)
{
        struct topo t _cleanup_(topo_free) = {};
        _cleanup_free_ bool *linked = NULL;
        _cleanup_free_ unsigned *group = NULL;
        uint64_t smallest = UINT64_MAX;
        unsigned n;
        int r;

        r = conf_load(&topo_schema, path, &t, ret_error);
        if (r == -EINVAL)
                return r;
        if (r < 0)
                return place_error(ret_error, r, "cannot read topology %s: %s", path, strerror(-r));
        n = (unsigned)t.n_devices;
        if (n == 0)
                return place_error(ret_error, -EINVAL, "%s: devices: no GPUs", path);
        linked = calloc((size_t)n * n, sizeof(bool));
        group = calloc(n, sizeof(unsigned));
        if (!linked || !group)
                return -ENOMEM;
        for (unsigned i = 0; i < n; i++) {
                smallest = MIN(smallest, t.devices[i].memory);
                for (unsigned j = 0; j < n; j++)
                        linked[i * n + j] = t.all_linked && i != j;
        }
        for (size_t k = 0; k < t.n_links; k++) {
                const struct topo_link *l = &t.links[k];

                if (l->a >= n || l->b >= n || l->a == l->b)
                        return place_error(
                            ret_error, -EINVAL,
                            "%s: links[%zu]: GPUs %lld and %lld must be two of the %u "
                            "devices",
                            path, k, (long long)l->a, (long long)l->b, n);
                linked[l->a * n + l->b] = linked[l->b * n + l->a] = true;
        }
        groups_from_links(n, linked, group);
        *ret_gpus = n;
        *ret_gpu_memory = smallest;
        *ret_groups = TAKE_PTR(group);
        return 0;
}
