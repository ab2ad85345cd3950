/*
 * The simulated machine: AQUA_SIM_DEVICES=NxSIZE (every pair peer-linked) or a YAML topology named
 * by AQUA_SIM_TOPOLOGY, and the machine id AQUA_SIM_MACHINE that processes share memory under.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parse-util.h"
#include "sim.h"
#include "topology.h"

#define DEFAULT_DEVICES   "2x16GiB"
#define DEFAULT_BANDWIDTH (UINT64_C(400) * 1000 * 1000 * 1000)

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
        struct topology t = {0};
        int r;

        r = topology_load(path, &t, ret_error);
        if (r < 0)
                return r;
        if (t.n_devices > SIM_MAX_DEVICES) {
                r = -EINVAL;
                if (asprintf(ret_error, "%s: devices: at most %d devices", path, SIM_MAX_DEVICES) < 0)
                        *ret_error = NULL;
                goto out;
        }
        sim.n_devices = (int)t.n_devices;
        for (size_t i = 0; i < t.n_devices; i++) {
                struct topology_device *td = &t.devices[i];
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
        for (size_t a = 0; a < t.n_devices; a++)
                for (size_t b = 0; b < t.n_devices; b++)
                        sim.link_bandwidth[a][b] = t.bandwidth[a * t.n_devices + b];
out:
        topology_free(&t);
        return r;
}

/* A name for files: letters, digits, '.', '_', '-', shorter than size. */
static int name_check(const char *var, const char *value, size_t size, char **ret_error)
{
        for (const char *p = value; *p; p++)
                if (!isalnum((unsigned char)*p) && !strchr("._-", *p)) {
                        if (asprintf(ret_error, "%s=%s: use letters, digits, '.', '_', '-'", var,
                                     value) < 0)
                                *ret_error = NULL;
                        return -EINVAL;
                }
        if (strlen(value) >= size) {
                if (asprintf(ret_error, "%s is too long", var) < 0)
                        *ret_error = NULL;
                return -EINVAL;
        }
        return 0;
}

/* AQUA_SIM_FABRIC names the fabric, AQUA_SIM_IMEX_CHANNEL the channel this process may use. */
static int load_fabric(char **ret_error)
{
        const char *fabric = getenv("AQUA_SIM_FABRIC");
        const char *channel = getenv("AQUA_SIM_IMEX_CHANNEL");
        char *end;
        long n;
        int r;

        sim.fabric[0] = 0;
        sim.imex_channel = -1;
        if (fabric && *fabric) {
                r = name_check("AQUA_SIM_FABRIC", fabric, sizeof(sim.fabric), ret_error);
                if (r < 0)
                        return r;
                strcpy(sim.fabric, fabric);
        }
        if (!channel || !*channel)
                return 0;
        errno = 0;
        n = strtol(channel, &end, 10);
        if (errno || *end || n < 0 || n > INT32_MAX) {
                if (asprintf(ret_error, "AQUA_SIM_IMEX_CHANNEL=%s: not a channel number", channel) <
                    0)
                        *ret_error = NULL;
                return -EINVAL;
        }
        sim.imex_channel = (int)n;
        return 0;
}

int sim_config_load(char **ret_error)
{
        const char *machine = getenv("AQUA_SIM_MACHINE");
        const char *topology = getenv("AQUA_SIM_TOPOLOGY");
        const char *devices = getenv("AQUA_SIM_DEVICES");
        const char *host = getenv("AQUA_SIM_HOST_MEMORY");
        int r;

        if (!machine || !*machine)
                machine = "default";
        r = name_check("AQUA_SIM_MACHINE", machine, sizeof(sim.machine), ret_error);
        if (r < 0)
                return r;
        strcpy(sim.machine, machine);
        r = load_fabric(ret_error);
        if (r < 0)
                return r;

        sim.host_memory = 0;
        if (host && *host && (parse_size(host, &sim.host_memory) < 0 || !sim.host_memory)) {
                if (asprintf(ret_error, "AQUA_SIM_HOST_MEMORY=%s: expected a size, e.g. 64GiB",
                             host) < 0)
                        *ret_error = NULL;
                return -EINVAL;
        }
        if (topology && *topology)
                return load_topology(topology, ret_error);
        return load_env_devices(devices && *devices ? devices : DEFAULT_DEVICES, ret_error);
}
