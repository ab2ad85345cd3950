/*
 * The simulated machine: AQUA_SIM_DEVICES=NxSIZE (every pair peer-linked) or a YAML topology named
 * by AQUA_SIM_TOPOLOGY, and the machine id AQUA_SIM_MACHINE that processes share memory under.
 */
#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "parse-util.h"
#include "sim.h"

#define DEFAULT_DEVICES   "2x16GiB"
#define DEFAULT_BANDWIDTH (UINT64_C(400) * 1000 * 1000 * 1000)

struct topo_device {
        char *name;
        uint64_t memory;
        char *uuid;
        char *pci_domain, *pci_bus, *pci_device; /* decimal or 0x hex, as PCI ids are written */
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

static const struct conf_field device_fields[] = {
    CONF_FIELD_STRING(struct topo_device, name, "name", 0),
    CONF_FIELD_SIZE(struct topo_device, memory, "memory", SIM_GRANULARITY, INT64_C(1) << 50,
                    CONF_REQUIRED),
    CONF_FIELD_STRING(struct topo_device, uuid, "uuid", 0),
    CONF_FIELD_STRING(struct topo_device, pci_domain, "pci-domain", 0),
    CONF_FIELD_STRING(struct topo_device, pci_bus, "pci-bus", 0),
    CONF_FIELD_STRING(struct topo_device, pci_device, "pci-device", 0),
    CONF_FIELD_END,
};
static const struct conf_schema device_schema = {"device", device_fields};

static const struct conf_field link_fields[] = {
    CONF_FIELD_INT(struct topo_link, a, "a", 0, SIM_MAX_DEVICES - 1, CONF_REQUIRED),
    CONF_FIELD_INT(struct topo_link, b, "b", 0, SIM_MAX_DEVICES - 1, CONF_REQUIRED),
    CONF_FIELD_SIZE(struct topo_link, bandwidth, "bandwidth", 1, INT64_C(1) << 50, 0),
    CONF_FIELD_END,
};
static const struct conf_schema link_schema = {"link", link_fields};

static const struct conf_field topo_fields[] = {
    CONF_FIELD_LIST(struct topo, devices, n_devices, "devices", CONF_ELEM_STRUCT(&device_schema),
                    SIM_MAX_DEVICES, CONF_REQUIRED),
    CONF_FIELD_LIST(struct topo, links, n_links, "links", CONF_ELEM_STRUCT(&link_schema), 0, 0),
    CONF_FIELD_BOOL(struct topo, all_linked, "all-linked", 0),
    CONF_FIELD_SIZE(struct topo, bandwidth, "bandwidth", 1, INT64_C(1) << 50, 0),
    CONF_FIELD_END,
};
static const struct conf_schema topo_schema = {"topology", topo_fields};

/* FNV-1a, to derive stable UUIDs from the machine id. */
static uint64_t hash64(const char *s, uint64_t seed)
{
        uint64_t h = UINT64_C(14695981039346656037) ^ seed;

        for (; *s; s++)
                h = (h ^ (unsigned char)*s) * UINT64_C(1099511628211);
        return h;
}

static void default_uuid(int ordinal, CUuuid *ret)
{
        uint64_t a = hash64(sim.machine, 2 * ordinal + 1), b = hash64(sim.machine, 2 * ordinal + 2);

        memcpy(ret->bytes, &a, 8);
        memcpy(ret->bytes + 8, &b, 8);
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" or just 32 hex digits, dashes anywhere. */
static int parse_uuid(const char *s, CUuuid *ret)
{
        CUuuid u;
        int n = 0;

        if (strncmp(s, "GPU-", 4) == 0)
                s += 4;
        for (; *s; s++) {
                int v;

                if (*s == '-')
                        continue;
                if (!isxdigit((unsigned char)*s) || n == 32)
                        return -EINVAL;
                v = isdigit((unsigned char)*s) ? *s - '0' : tolower((unsigned char)*s) - 'a' + 10;
                if (n % 2 == 0)
                        u.bytes[n / 2] = (char)(v << 4);
                else
                        u.bytes[n / 2] |= (char)v;
                n++;
        }
        if (n != 32)
                return -EINVAL;
        *ret = u;
        return 0;
}

static void set_device(int i, const char *name, uint64_t memory)
{
        struct sim_device *d = &sim.devices[i];

        snprintf(d->name, sizeof(d->name), "%s", name ? name : "simcuda GPU");
        d->memory = memory;
        default_uuid(i, &d->uuid);
        d->pci_domain = 0;
        d->pci_bus = 0x10 + i;
        d->pci_device = 0;
}

static int load_env_devices(const char *spec, char **ret_error)
{
        const char *x = strchr(spec, 'x');
        _cleanup_free_ char *count = NULL;
        uint64_t size;
        int64_t n;

        if (!x || !(count = strndup(spec, x - spec)) || parse_int64(count, 10, &n) < 0 || n < 1 ||
            n > SIM_MAX_DEVICES || parse_size(x + 1, &size) < 0 || size < SIM_GRANULARITY) {
                if (asprintf(ret_error,
                             "AQUA_SIM_DEVICES=%s: expected COUNTxSIZE with 1..%d devices of at "
                             "least 2MiB, e.g. 4x80GiB",
                             spec, SIM_MAX_DEVICES) < 0)
                        *ret_error = NULL;
                return -EINVAL;
        }
        sim.n_devices = (int)n;
        for (int i = 0; i < sim.n_devices; i++) {
                set_device(i, NULL, size);
                for (int j = 0; j < sim.n_devices; j++)
                        sim.link_bandwidth[i][j] = i == j ? 0 : DEFAULT_BANDWIDTH;
        }
        return 0;
}

/* An absent id keeps the default already in *ret. */
static int parse_pci(const char *path, size_t i, const char *key, const char *s, int64_t max,
                     int *ret, char **ret_error)
{
        int64_t v;

        if (!s)
                return 0;
        if (parse_int64(s, 0, &v) < 0 || v < 0 || v > max) {
                if (asprintf(ret_error, "%s: devices[%zu].%s: expected 0..%#" PRIx64 ", got \"%s\"",
                             path, i, key, max, s) < 0)
                        *ret_error = NULL;
                return -EINVAL;
        }
        *ret = (int)v;
        return 0;
}

static int load_topology(const char *path, char **ret_error)
{
        struct topo t = {.bandwidth = DEFAULT_BANDWIDTH};
        int r;

        r = conf_load(&topo_schema, path, &t, ret_error);
        if (r < 0)
                goto out;
        sim.n_devices = (int)t.n_devices;
        for (size_t i = 0; i < t.n_devices; i++) {
                struct topo_device *td = &t.devices[i];
                struct sim_device *d = &sim.devices[i];

                set_device((int)i, td->name, td->memory);
                if (td->uuid && parse_uuid(td->uuid, &d->uuid) < 0) {
                        r = -EINVAL;
                        if (asprintf(ret_error, "%s: devices[%zu].uuid: not a UUID: %s", path, i,
                                     td->uuid) < 0)
                                *ret_error = NULL;
                        goto out;
                }
                r = parse_pci(path, i, "pci-domain", td->pci_domain, 0xffff, &d->pci_domain,
                              ret_error);
                if (r >= 0)
                        r = parse_pci(path, i, "pci-bus", td->pci_bus, 0xff, &d->pci_bus,
                                      ret_error);
                if (r >= 0)
                        r = parse_pci(path, i, "pci-device", td->pci_device, 0x1f, &d->pci_device,
                                      ret_error);
                if (r < 0)
                        goto out;
        }
        memset(sim.link_bandwidth, 0, sizeof(sim.link_bandwidth));
        for (int i = 0; t.all_linked && i < sim.n_devices; i++)
                for (int j = 0; j < sim.n_devices; j++)
                        sim.link_bandwidth[i][j] = i == j ? 0 : t.bandwidth;
        for (size_t k = 0; k < t.n_links; k++) {
                struct topo_link *l = &t.links[k];

                if (l->a >= sim.n_devices || l->b >= sim.n_devices || l->a == l->b) {
                        r = -EINVAL;
                        if (asprintf(ret_error,
                                     "%s: links[%zu]: devices %" PRId64 " and %" PRId64
                                     " must be two of the %d devices",
                                     path, k, l->a, l->b, sim.n_devices) < 0)
                                *ret_error = NULL;
                        goto out;
                }
                sim.link_bandwidth[l->a][l->b] = sim.link_bandwidth[l->b][l->a] =
                    l->bandwidth ? l->bandwidth : t.bandwidth;
        }
        if (sim.n_devices == 0) {
                r = -EINVAL;
                if (asprintf(ret_error, "%s: devices: at least one device is needed", path) < 0)
                        *ret_error = NULL;
        }
out:
        conf_free(&topo_schema, &t);
        return r;
}

int sim_config_load(char **ret_error)
{
        const char *machine = getenv("AQUA_SIM_MACHINE");
        const char *topology = getenv("AQUA_SIM_TOPOLOGY");
        const char *devices = getenv("AQUA_SIM_DEVICES");

        if (!machine || !*machine)
                machine = "default";
        for (const char *p = machine; *p; p++)
                if (!isalnum((unsigned char)*p) && !strchr("._-", *p)) {
                        if (asprintf(ret_error,
                                     "AQUA_SIM_MACHINE=%s: use letters, digits, '.', '_', '-'",
                                     machine) < 0)
                                *ret_error = NULL;
                        return -EINVAL;
                }
        if (strlen(machine) >= sizeof(sim.machine)) {
                if (asprintf(ret_error, "AQUA_SIM_MACHINE is too long") < 0)
                        *ret_error = NULL;
                return -EINVAL;
        }
        strcpy(sim.machine, machine);

        if (topology && *topology)
                return load_topology(topology, ret_error);
        return load_env_devices(devices && *devices ? devices : DEFAULT_DEVICES, ret_error);
}
