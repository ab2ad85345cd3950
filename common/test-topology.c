/* The topology file shared by the link probe, simcuda, aquad and the placer. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <unistd.h>

#include "topology.h"
#include "util.h"

static char path[] = "/tmp/aqua-topology-XXXXXX";

static void write_topology(const char *text)
{
        int fd = mkstemp(path);

        cr_assert_geq(fd, 0);
        cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
        close(fd);
}

static void remove_file(void)
{
        unlink(path);
}

TestSuite(topology, .fini = remove_file);

Test(topology, reads_devices_and_links_in_both_directions)
{
        struct topology t = {0};
        _cleanup_free_ char *error = NULL;

        write_topology("devices:\n"
                       "  - {name: H200, memory: 141GiB, uuid: GPU-a, pci-bus: 0x1b}\n"
                       "  - {memory: 141GiB, uuid: GPU-b}\n"
                       "  - {memory: 141GiB, uuid: GPU-c}\n"
                       "links:\n"
                       "  - {a: 0, b: 1, bandwidth: 450GB}\n"
                       "  - {a: 1, b: 2}\n");
        cr_assert_eq(topology_load(path, &t, &error), 0, "%s", error);
        cr_assert_eq(t.n_devices, 3);
        cr_assert_str_eq(t.devices[0].name, "H200");
        cr_assert_str_eq(t.devices[0].pci_bus, "0x1b");
        cr_assert_eq(t.devices[2].memory, 141ull << 30);
        cr_assert_eq(t.bandwidth[0 * 3 + 1], 450000000000ull);
        cr_assert_eq(t.bandwidth[1 * 3 + 0], 450000000000ull);
        cr_assert_eq(t.bandwidth[1 * 3 + 2], 400000000000ull, "the default bandwidth");
        cr_assert_eq(t.bandwidth[0 * 3 + 2], 0, "no link");
        cr_assert_eq(topology_link_by_uuid(&t, "GPU-b", "GPU-a"), 450000000000ull);
        cr_assert_eq(topology_link_by_uuid(&t, "GPU-a", "GPU-c"), 0);
        cr_assert_eq(topology_link_by_uuid(&t, "GPU-a", "GPU-zzz"), 0);
        topology_free(&t);
}

Test(topology, links_every_pair_when_asked)
{
        struct topology t = {0};
        _cleanup_free_ char *error = NULL;

        write_topology("devices: [{memory: 1GiB}, {memory: 1GiB}]\nall-linked: true\nbandwidth: 100GB\n");
        cr_assert_eq(topology_load(path, &t, &error), 0, "%s", error);
        cr_assert_eq(t.bandwidth[1], 100000000000ull);
        cr_assert_eq(t.bandwidth[2], 100000000000ull);
        cr_assert_eq(t.bandwidth[0], 0);
        topology_free(&t);
}

Test(topology, names_a_link_to_a_device_that_is_not_there)
{
        struct topology t = {0};
        _cleanup_free_ char *error = NULL, *expected = NULL;

        write_topology("devices: [{memory: 1GiB}, {memory: 1GiB}]\nlinks: [{a: 0, b: 2}]\n");
        cr_assert_eq(topology_load(path, &t, &error), -EINVAL);
        cr_assert_geq(asprintf(&expected, "%s: links[0]: devices 0 and 2 must be two of the 2 devices",
                               path), 0);
        cr_assert_str_eq(error, expected);
}

Test(topology, names_a_missing_memory_with_its_line)
{
        struct topology t = {0};
        _cleanup_free_ char *error = NULL, *expected = NULL;

        write_topology("devices:\n  - {uuid: GPU-a}\n");
        cr_assert_eq(topology_load(path, &t, &error), -EINVAL);
        cr_assert_geq(asprintf(&expected, "%s:2:5: devices[0]: missing required key 'memory'", path),
                      0);
        cr_assert_str_eq(error, expected);
}

Test(topology, names_gpus_by_host_and_uuid_and_links_them_across_hosts)
{
        struct topology t = {0};
        _cleanup_free_ char *error = NULL;

        /* Two hosts of one NVLink domain whose GPUs have the same uuids (as simcuda's do). */
        write_topology("devices:\n"
                       "  - {host: node-a, uuid: GPU-0, memory: 1GiB}\n"
                       "  - {host: node-a, uuid: GPU-1, memory: 1GiB}\n"
                       "  - {host: node-b, uuid: GPU-0, memory: 1GiB}\n"
                       "  - {uuid: GPU-9, memory: 1GiB}\n"
                       "links:\n"
                       "  - {a: 0, b: 1, bandwidth: 450GB}\n"
                       "  - {a: 1, b: 2, bandwidth: 900GB}\n");
        cr_assert_eq(topology_load(path, &t, &error), 0, "%s", error);
        cr_assert_str_eq(t.devices[2].host, "node-b");
        cr_assert_null(t.devices[3].host);
        cr_assert_eq(topology_find(&t, "node-b", "GPU-0"), 2);
        cr_assert_eq(topology_find(&t, "node-a", "GPU-0"), 0);
        cr_assert_eq(topology_find(&t, NULL, "GPU-0"), 0, "no host: the first with the uuid");
        cr_assert_eq(topology_find(&t, "node-c", "GPU-0"), SIZE_MAX);
        cr_assert_eq(topology_find(&t, "node-c", "GPU-9"), 3, "a device without a host: any");
        cr_assert_eq(topology_link_by_host(&t, "node-a", "GPU-1", "node-b", "GPU-0"),
                     900000000000ull);
        cr_assert_eq(topology_link_by_host(&t, "node-b", "GPU-0", "node-a", "GPU-1"),
                     900000000000ull);
        cr_assert_eq(topology_link_by_host(&t, "node-a", "GPU-0", "node-b", "GPU-0"), 0);
        cr_assert_eq(topology_link_by_host(&t, "node-a", "GPU-0", "node-a", "GPU-1"),
                     450000000000ull);
        topology_free(&t);
}

Test(topology, names_a_uuid_given_twice_on_one_host)
{
        struct topology t = {0};
        _cleanup_free_ char *error = NULL, *expected = NULL;

        write_topology("devices:\n"
                       "  - {host: node-a, uuid: GPU-0, memory: 1GiB}\n"
                       "  - {host: node-b, uuid: GPU-0, memory: 1GiB}\n"
                       "  - {host: node-a, uuid: GPU-0, memory: 1GiB}\n");
        cr_assert_eq(topology_load(path, &t, &error), -EINVAL);
        cr_assert_geq(asprintf(&expected,
                               "%s: devices[2]: uuid GPU-0 is devices[0]'s too, on the same host "
                               "node-a",
                               path),
                      0);
        cr_assert_str_eq(error, expected);
}

Test(topology, names_a_host_that_is_not_a_string_with_its_line)
{
        struct topology t = {0};
        _cleanup_free_ char *error = NULL;

        write_topology("devices:\n  - {memory: 1GiB}\n  - {memory: 1GiB, host: [a, b]}\n");
        cr_assert_eq(topology_load(path, &t, &error), -EINVAL);
        cr_assert_not_null(strstr(error, ":3:"), "%s", error);
        cr_assert_not_null(strstr(error, "host"), "%s", error);
}
