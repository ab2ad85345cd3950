/* The topology file the probe writes: simcuda's AQUA_SIM_TOPOLOGY format, with figures in comments.
 */
#include <inttypes.h>
#include <stdio.h>

#include "parse-util.h"
#include "probe.h"
#include "report.h"
#include "util.h"

static void put_bandwidth(FILE *f, double gbps)
{
        /* Decimal GB (the unit parse_size reads as 1e9 bytes), read as GB/s. */
        if (gbps >= 0.01)
                fprintf(f, "%.2fGB", gbps);
        else
                fprintf(f, "%.0f", MAX(gbps * 1e9, 1.0));
}

static void comment_figure(FILE *f, const char *label, double gbps)
{
        if (gbps == PROBE_NOT_MEASURED)
                fprintf(f, "  %s -", label);
        else
                fprintf(f, "  %s %.2f", label, gbps);
}

static int fill_topology(FILE *f, const void *userdata)
{
        const struct probe_result *r = userdata;
        char size[32];
        size_t unlinked = 0;

        fprintf(f, "# GPU topology measured by aqua-profile probe (driver %s, version %d).\n",
                r->driver, r->driver_version);
        fprintf(f,
                "# Link bandwidth: the slower direction of %d peer copies of %s each (median),\n",
                r->iterations, format_size(size, sizeof(size), r->size));
        fprintf(f, "# in GB/s; %s.\n",
                r->peer_access ? "peer access enabled with cuCtxEnablePeerAccess"
                               : "the driver has no cuCtxEnablePeerAccess (simcuda needs none)");
        fprintf(f, "# NCCL: %s.\n", r->nccl_note ? r->nccl_note : "not run");
        if (!r->complete)
                fprintf(f, "# INCOMPLETE: the probe was interrupted; links without a bandwidth "
                           "were not measured.\n");
        fprintf(f, "devices:\n");
        for (int i = 0; i < r->n_devices; i++) {
                const struct probe_device *d = &r->devices[i];

                fprintf(f, "  - name: ");
                yaml_put_string(f, d->name);
                fprintf(f, "   # GPU %d, %s\n", i, format_size(size, sizeof(size), d->memory));
                if (r->host) {
                        fprintf(f, "    host: ");
                        yaml_put_string(f, r->host);
                        fputc('\n', f);
                }
                fprintf(f, "    uuid: %s\n", d->uuid);
                fprintf(f, "    pci-domain: 0x%04x\n    pci-bus: 0x%02x\n    pci-device: 0x%02x\n",
                        (unsigned)d->pci_domain, (unsigned)d->pci_bus, (unsigned)d->pci_device);
                fprintf(f, "    memory: %" PRIu64 "\n", d->memory);
        }
        fprintf(f, "all-linked: false\n");
        fprintf(f, "links:%s\n", r->n_devices > 1 ? "" : " []");
        for (int a = 0; a < r->n_devices; a++)
                for (int b = a + 1; b < r->n_devices; b++) {
                        double bw = probe_link_bandwidth(r, a, b);

                        /* Peer access can be one-sided; a link needs both directions. */
                        if (!r->peer[(size_t)a * (size_t)r->n_devices + (size_t)b] ||
                            !r->peer[(size_t)b * (size_t)r->n_devices + (size_t)a]) {
                                unlinked++;
                                continue;
                        }
                        fprintf(f, "  - {a: %d, b: %d", a, b);
                        if (bw != PROBE_NOT_MEASURED) {
                                fprintf(f, ", bandwidth: ");
                                put_bandwidth(f, bw);
                        }
                        fprintf(f, "}   # GB/s:");
                        comment_figure(f, "copy a->b", probe_at(r->copy, r, a, b));
                        comment_figure(f, "b->a", probe_at(r->copy, r, b, a));
                        if (r->nccl_ran) {
                                comment_figure(f, "nccl a->b", probe_at(r->nccl, r, a, b));
                                comment_figure(f, "b->a", probe_at(r->nccl, r, b, a));
                        }
                        fputc('\n', f);
                }
        if (r->n_devices > 1 && unlinked == (size_t)r->n_devices * (size_t)(r->n_devices - 1) / 2)
                fprintf(f, "  []\n");
        if (unlinked > 0) {
                fprintf(f, "# No peer access (cuDeviceCanAccessPeer):");
                for (int a = 0; a < r->n_devices; a++)
                        for (int b = a + 1; b < r->n_devices; b++)
                                if (!r->peer[(size_t)a * (size_t)r->n_devices + (size_t)b] ||
                                    !r->peer[(size_t)b * (size_t)r->n_devices + (size_t)a])
                                        fprintf(f, " %d-%d", a, b);
                fputc('\n', f);
        }
        return ferror(f) ? -EIO : 0;
}

int probe_write_topology(const char *path, const struct probe_result *r)
{
        return write_file_atomic(path, fill_topology, r);
}
