/* aqua-profile merge: the topology files of several hosts as one file of their NVLink domain. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe.h"
#include "report.h"
#include "topology.h"
#include "util.h"

struct merge {
        const char *const *inputs;
        struct topology *t; /* [n], one per input */
        size_t n;
        uint64_t fabric;
};

_printf_(3, 4) static int fail(char **ret_error, int r, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        if (ret_error && vasprintf(ret_error, fmt, ap) < 0)
                *ret_error = NULL;
        va_end(ap);
        return r;
}

/* A file name in a comment: a control character (a newline) would end the comment. */
static void put_comment(FILE *f, const char *s)
{
        for (; *s; s++)
                fputc((unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s, f);
}

static void put_optional(FILE *f, const char *key, const char *value)
{
        if (!value)
                return;
        fprintf(f, "    %s: ", key);
        yaml_put_string(f, value);
        fputc('\n', f);
}

static size_t put_link(FILE *f, size_t a, size_t b, uint64_t bandwidth)
{
        fprintf(f, "  - {a: %zu, b: %zu, bandwidth: %" PRIu64 "}\n", a, b, bandwidth);
        return 1;
}

static int fill_merged(FILE *f, const void *userdata)
{
        const struct merge *m = userdata;
        size_t first = 0, total = 0, n_links = 0;

        fprintf(f, "# GPU topology of one NVLink domain, by aqua-profile merge from:");
        for (size_t i = 0; i < m->n; i++) {
                fputc(' ', f);
                put_comment(f, m->inputs[i]);
        }
        if (m->fabric)
                fprintf(f, "\n# Every two GPUs on different hosts are linked at %.2f GB/s.\n",
                        (double)m->fabric / 1e9);
        else
                fprintf(f, "\n# No links across hosts.\n");
        fprintf(f, "devices:\n");
        for (size_t i = 0; i < m->n; i++)
                for (size_t k = 0; k < m->t[i].n_devices; k++) {
                        const struct topology_device *d = &m->t[i].devices[k];

                        fprintf(f, "  - host: ");
                        yaml_put_string(f, d->host);
                        fprintf(f, "   # GPU %zu of ", k);
                        put_comment(f, m->inputs[i]);
                        fputc('\n', f);
                        put_optional(f, "name", d->name);
                        put_optional(f, "uuid", d->uuid);
                        put_optional(f, "pci-domain", d->pci_domain);
                        put_optional(f, "pci-bus", d->pci_bus);
                        put_optional(f, "pci-device", d->pci_device);
                        fprintf(f, "    memory: %" PRIu64 "\n", d->memory);
                        total++;
                }
        fprintf(f, "all-linked: false\nlinks:\n");
        for (size_t i = 0; i < m->n; i++) {
                const struct topology *t = &m->t[i];
                size_t n = t->n_devices;

                for (size_t a = 0; a < n; a++)
                        for (size_t b = a + 1; b < n; b++) {
                                uint64_t bw = MAX(t->bandwidth[a * n + b], t->bandwidth[b * n + a]);

                                if (bw)
                                        n_links += put_link(f, first + a, first + b, bw);
                        }
                /* Every GPU of this host to every GPU of the hosts after it. */
                for (size_t a = first; m->fabric && a < first + n; a++)
                        for (size_t b = first + n; b < total; b++)
                                n_links += put_link(f, a, b, m->fabric);
                first += n;
        }
        if (n_links == 0)
                fprintf(f, "  []\n");
        return ferror(f) ? -EIO : 0;
}

/* Every device of input i names a host, and no host of it is in an earlier input. */
static int check_hosts(const struct merge *m, size_t i, char **ret_error)
{
        for (size_t k = 0; k < m->t[i].n_devices; k++) {
                const char *host = m->t[i].devices[k].host;

                if (!host)
                        return fail(ret_error, -EINVAL,
                                    "%s: devices[%zu]: no host (probe it with aqua-profile probe, "
                                    "or add host: NAME to each device)",
                                    m->inputs[i], k);
                for (size_t j = 0; j < i; j++)
                        for (size_t l = 0; l < m->t[j].n_devices; l++)
                                if (strcmp(m->t[j].devices[l].host, host) == 0)
                                        return fail(ret_error, -EINVAL,
                                                    "%s: devices[%zu]: host %s is in %s too (one "
                                                    "file per host)",
                                                    m->inputs[i], k, host, m->inputs[j]);
        }
        return 0;
}

int probe_merge_topology(const char *const *inputs, size_t n_inputs, uint64_t fabric_bandwidth,
                         const char *output, char **ret_error)
{
        struct merge m = {.inputs = inputs, .fabric = fabric_bandwidth};
        size_t total = 0;
        int r = 0;

        if (n_inputs == 0)
                return fail(ret_error, -EINVAL, "no topology files to merge");
        m.t = calloc(n_inputs, sizeof(*m.t));
        if (!m.t)
                return -ENOMEM;
        for (size_t i = 0; i < n_inputs; i++) {
                r = topology_load(inputs[i], &m.t[i], ret_error);
                if (r < 0)
                        goto done;
                m.n = i + 1;
                r = check_hosts(&m, i, ret_error);
                if (r < 0)
                        goto done;
                total += m.t[i].n_devices;
        }
        if (total > TOPOLOGY_MAX_DEVICES) {
                r = fail(ret_error, -EINVAL, "%zu devices in all: a topology file holds at most %d",
                         total, TOPOLOGY_MAX_DEVICES);
                goto done;
        }
        r = write_file_atomic(output, fill_merged, &m);
        if (r < 0)
                r = fail(ret_error, r, "%s: %s", output, strerror(-r));
done:
        for (size_t i = 0; i < m.n; i++)
                topology_free(&m.t[i]);
        free(m.t);
        return r;
}
