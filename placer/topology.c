/*
 * A server kind's GPUs and peer groups from a topology file as `aqua-profile probe` writes it
 * (simcuda's AQUA_SIM_TOPOLOGY format): GPUs joined by links form the peer groups.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "place.h"
#include "topology.h"

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
        struct topology t _cleanup_(topology_free) = {0};
        _cleanup_free_ bool *linked = NULL;
        _cleanup_free_ unsigned *group = NULL;
        uint64_t smallest = UINT64_MAX;
        unsigned n;
        int r;

        r = topology_load(path, &t, ret_error);
        if (r == -EINVAL)
                return r;
        if (r < 0)
                return place_error(ret_error, r, "cannot read topology %s: %s", path, strerror(-r));
        n = (unsigned)t.n_devices;
        /* TOPOLOGY_MAX_DEVICES (255) keeps n within PLACE_MAX_GPUS. */
        linked = calloc((size_t)n * n, sizeof(bool));
        group = calloc(n, sizeof(unsigned));
        if (!linked || !group)
                return -ENOMEM;
        for (unsigned i = 0; i < n; i++) {
                smallest = MIN(smallest, t.devices[i].memory);
                for (unsigned j = 0; j < n; j++)
                        linked[i * n + j] = t.bandwidth[i * n + j] > 0;
        }
        groups_from_links(n, linked, group);
        *ret_gpus = n;
        *ret_gpu_memory = smallest;
        *ret_groups = TAKE_PTR(group);
        return 0;
}
