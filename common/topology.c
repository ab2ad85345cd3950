/* The GPU topology file, read through the schema-driven config loader. */
#include "topology.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "util.h"

#define DEFAULT_BANDWIDTH (UINT64_C(400) * 1000 * 1000 * 1000)

struct topo_link {
        int64_t a, b;
        uint64_t bandwidth;
};

struct topo_file {
        struct topology_device *devices;
        size_t n_devices;
        struct topo_link *links;
        size_t n_links;
        bool all_linked;
        uint64_t bandwidth;
};

static const struct conf_field device_fields[] = {
        CONF_FIELD_STRING(struct topology_device, name, "name", 0),
        CONF_FIELD_SIZE(struct topology_device, memory, "memory", 2 << 20, INT64_C(1) << 50,
                        CONF_REQUIRED),
        CONF_FIELD_STRING(struct topology_device, uuid, "uuid", 0),
        CONF_FIELD_STRING(struct topology_device, pci_domain, "pci-domain", 0),
        CONF_FIELD_STRING(struct topology_device, pci_bus, "pci-bus", 0),
        CONF_FIELD_STRING(struct topology_device, pci_device, "pci-device", 0),
        CONF_FIELD_STRING(struct topology_device, host, "host", 0),
        CONF_FIELD_END,
};
static const struct conf_schema device_schema = {"device", device_fields};

static const struct conf_field link_fields[] = {
        CONF_FIELD_INT(struct topo_link, a, "a", 0, TOPOLOGY_MAX_DEVICES - 1, CONF_REQUIRED),
        CONF_FIELD_INT(struct topo_link, b, "b", 0, TOPOLOGY_MAX_DEVICES - 1, CONF_REQUIRED),
        CONF_FIELD_SIZE(struct topo_link, bandwidth, "bandwidth", 1, INT64_C(1) << 50, 0),
        CONF_FIELD_END,
};
static const struct conf_schema link_schema = {"link", link_fields};

static const struct conf_field topo_fields[] = {
        CONF_FIELD_LIST(struct topo_file, devices, n_devices, "devices",
                        CONF_ELEM_STRUCT(&device_schema), TOPOLOGY_MAX_DEVICES, CONF_REQUIRED),
        CONF_FIELD_LIST(struct topo_file, links, n_links, "links", CONF_ELEM_STRUCT(&link_schema),
                        0, 0),
        CONF_FIELD_BOOL(struct topo_file, all_linked, "all-linked", 0),
        CONF_FIELD_SIZE(struct topo_file, bandwidth, "bandwidth", 1, INT64_C(1) << 50, 0),
        CONF_FIELD_END,
};
static const struct conf_schema topo_schema = {"topology", topo_fields};

_printf_(2, 3) static int invalid(char **ret_error, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        if (ret_error && vasprintf(ret_error, fmt, ap) < 0)
                *ret_error = NULL;
        va_end(ap);
        return -EINVAL;
}

/* Two hosts as written: both absent, or the same name. */
static bool same_host(const char *a, const char *b)
{
        return a == b || (a && b && strcmp(a, b) == 0);
}

int topology_load(const char *path, struct topology *ret, char **ret_error)
{
        struct topo_file f = {.bandwidth = DEFAULT_BANDWIDTH};
        uint64_t *bw = NULL;
        size_t n;
        int r;

        r = conf_load(&topo_schema, path, &f, ret_error);
        if (r < 0)
                goto fail;
        n = f.n_devices;
        if (n == 0) {
                r = invalid(ret_error, "%s: devices: at least one device is needed", path);
                goto fail;
        }
        for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j < i; j++) {
                        const struct topology_device *x = &f.devices[i], *y = &f.devices[j];

                        if (x->uuid && y->uuid && strcmp(x->uuid, y->uuid) == 0 &&
                            same_host(x->host, y->host)) {
                                r = invalid(ret_error,
                                            "%s: devices[%zu]: uuid %s is devices[%zu]'s too, on "
                                            "the same host%s%s",
                                            path, i, x->uuid, j, x->host ? " " : "",
                                            x->host ? x->host : "");
                                goto fail;
                        }
                }
        bw = calloc(n * n, sizeof(*bw));
        if (!bw) {
                r = -ENOMEM;
                goto fail;
        }
        for (size_t a = 0; f.all_linked && a < n; a++)
                for (size_t b = 0; b < n; b++)
                        bw[a * n + b] = a == b ? 0 : f.bandwidth;
        for (size_t k = 0; k < f.n_links; k++) {
                const struct topo_link *l = &f.links[k];

                if ((size_t)l->a >= n || (size_t)l->b >= n || l->a == l->b) {
                        r = invalid(ret_error,
                                    "%s: links[%zu]: devices %" PRId64 " and %" PRId64
                                    " must be two of the %zu devices",
                                    path, k, l->a, l->b, n);
                        goto fail;
                }
                bw[l->a * n + l->b] = bw[l->b * n + l->a] = l->bandwidth ? l->bandwidth : f.bandwidth;
        }
        *ret = (struct topology){.devices = f.devices, .n_devices = n, .bandwidth = bw};
        f.devices = NULL;
        f.n_devices = 0;
        conf_free(&topo_schema, &f);
        return 0;
fail:
        free(bw);
        conf_free(&topo_schema, &f);
        return r;
}

void topology_free(struct topology *t)
{
        struct topo_file f;

        if (!t)
                return;
        f = (struct topo_file){.devices = t->devices, .n_devices = t->n_devices};
        conf_free(&topo_schema, &f);
        free(t->bandwidth);
        *t = (struct topology){0};
}

size_t topology_find(const struct topology *t, const char *host, const char *uuid)
{
        size_t any = SIZE_MAX;

        for (size_t i = 0; i < t->n_devices; i++) {
                const struct topology_device *d = &t->devices[i];

                if (!d->uuid || strcmp(d->uuid, uuid) != 0)
                        continue;
                if (host && d->host && strcmp(d->host, host) == 0)
                        return i;
                if ((!host || !d->host) && any == SIZE_MAX)
                        any = i;
        }
        return any;
}

uint64_t topology_link_by_host(const struct topology *t, const char *host_a, const char *a,
                               const char *host_b, const char *b)
{
        size_t ia = topology_find(t, host_a, a), ib = topology_find(t, host_b, b);

        if (ia == SIZE_MAX || ib == SIZE_MAX)
                return 0;
        return MAX(t->bandwidth[ia * t->n_devices + ib], t->bandwidth[ib * t->n_devices + ia]);
}

uint64_t topology_link_by_uuid(const struct topology *t, const char *a, const char *b)
{
        return topology_link_by_host(t, NULL, a, NULL, b);
}
