/* The copy probe: devices and peer links from the driver, and timed peer copies on every pair. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parse-util.h"
#include "probe-gpu.h"
#include "util.h"

int probe_driver_error(const struct cuda_driver *d, struct probe_result *r, CUresult res,
                       const char *what, int dev)
{
        const char *name = NULL;

        if (d->cuGetErrorName(res, &name) != CUDA_SUCCESS || !name)
                name = "an unknown error";
        free(r->error);
        if ((dev >= 0 ? asprintf(&r->error, "%s on GPU %d failed: %s", what, dev, name)
                      : asprintf(&r->error, "%s failed: %s", what, name)) < 0)
                r->error = NULL;
        return PROBE_E_DRIVER;
}

static int cmp_double(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;

        return (x > y) - (x < y);
}

double probe_median(double *v, size_t n)
{
        qsort(v, n, sizeof(*v), cmp_double);
        return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double probe_link_bandwidth(const struct probe_result *r, int a, int b)
{
        double x = probe_at(r->copy, r, a, b), y = probe_at(r->copy, r, b, a);

        if (x == PROBE_NOT_MEASURED || y == PROBE_NOT_MEASURED)
                return PROBE_NOT_MEASURED;
        return MIN(x, y);
}

void probe_result_done(struct probe_result *r)
{
        free(r->devices);
        free(r->peer);
        free(r->copy);
        free(r->nccl);
        free(r->nccl_note);
        free(r->driver);
        free(r->error);
        free(r->host);
        *r = (struct probe_result){0};
}

static void format_uuid(const CUuuid *u, char *buf, size_t len)
{
        const unsigned char *b = (const unsigned char *)u->bytes;

        snprintf(buf, len,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                 b[14], b[15]);
}

static int query_devices(const struct cuda_driver *d, struct probe_result *r)
{
        size_t n;
        CUresult res;
        int count;

        res = d->cuDeviceGetCount(&count);
        if (res != CUDA_SUCCESS)
                return probe_driver_error(d, r, res, "cuDeviceGetCount", -1);
        n = (size_t)count;
        /* At least one element each, so that no device still gives non-NULL arrays. */
        r->devices = calloc(MAX(n, 1), sizeof(*r->devices));
        r->peer = calloc(MAX(n * n, 1), sizeof(*r->peer));
        r->copy = calloc(MAX(n * n, 1), sizeof(*r->copy));
        r->nccl = calloc(MAX(n * n, 1), sizeof(*r->nccl));
        if (!r->devices || !r->peer || !r->copy || !r->nccl)
                return -ENOMEM;
        r->n_devices = count;
        for (size_t i = 0; i < n * n; i++)
                r->copy[i] = r->nccl[i] = PROBE_NOT_MEASURED;

        for (int i = 0; i < count; i++) {
                struct probe_device *dev = &r->devices[i];
                size_t total;
                CUuuid uuid;

                if ((res = d->cuDeviceGetName(dev->name, sizeof(dev->name), i)) != CUDA_SUCCESS)
                        return probe_driver_error(d, r, res, "cuDeviceGetName", i);
                if ((res = d->cuDeviceGetUuid(&uuid, i)) != CUDA_SUCCESS)
                        return probe_driver_error(d, r, res, "cuDeviceGetUuid", i);
                format_uuid(&uuid, dev->uuid, sizeof(dev->uuid));
                if ((res = d->cuDeviceTotalMem(&total, i)) != CUDA_SUCCESS)
                        return probe_driver_error(d, r, res, "cuDeviceTotalMem", i);
                dev->memory = total;
                if ((res = d->cuDeviceGetAttribute(&dev->pci_domain,
                                                   CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, i)) ||
                    (res = d->cuDeviceGetAttribute(&dev->pci_bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
                                                   i)) ||
                    (res = d->cuDeviceGetAttribute(&dev->pci_device,
                                                   CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, i)))
                        return probe_driver_error(d, r, res, "cuDeviceGetAttribute(PCI)", i);
                for (int j = 0; j < count; j++) {
                        int can = 0;

                        if (i == j)
                                continue;
                        res = d->cuDeviceCanAccessPeer(&can, i, j);
                        if (res != CUDA_SUCCESS)
                                return probe_driver_error(d, r, res, "cuDeviceCanAccessPeer", i);
                        r->peer[(size_t)i * n + (size_t)j] = can;
                }
        }
        return 0;
}

static void release_gpus(const struct cuda_driver *d, struct probe_gpu *g, int n)
{
        for (int i = 0; g && i < n; i++) {
                if (!g[i].ctx)
                        continue;
                d->cuCtxSetCurrent(g[i].ctx);
                if (g[i].stream)
                        d->cuStreamSynchronize(g[i].stream);
                if (g[i].start)
                        d->cuEventDestroy(g[i].start);
                if (g[i].end)
                        d->cuEventDestroy(g[i].end);
                if (g[i].stream)
                        d->cuStreamDestroy(g[i].stream);
                if (g[i].buf)
                        d->cuMemFree(g[i].buf);
                d->cuDevicePrimaryCtxRelease(i);
        }
        if (n > 0)
                d->cuCtxSetCurrent(NULL);
        free(g);
}

/* Only a GPU on some link needs a buffer; one per GPU serves as source and as destination. */
static int setup_gpus(const struct cuda_driver *d, uint64_t size, struct probe_result *r,
                      struct probe_gpu **ret)
{
        struct probe_gpu *g = calloc((size_t)MAX(r->n_devices, 1), sizeof(*g));
        int n = r->n_devices;
        CUresult res;
        int ret_code = 0;

        if (!g)
                return -ENOMEM;
        for (int i = 0; i < n; i++) {
                bool linked = false;

                for (int j = 0; j < n; j++)
                        linked |= r->peer[(size_t)i * (size_t)n + (size_t)j];
                if (!linked)
                        continue;
                if ((res = d->cuDevicePrimaryCtxRetain(&g[i].ctx, i)) != CUDA_SUCCESS) {
                        g[i].ctx = NULL;
                        ret_code = probe_driver_error(d, r, res, "cuDevicePrimaryCtxRetain", i);
                        goto fail;
                }
                if ((res = d->cuCtxSetCurrent(g[i].ctx)) != CUDA_SUCCESS) {
                        ret_code = probe_driver_error(d, r, res, "cuCtxSetCurrent", i);
                        goto fail;
                }
                if ((res = d->cuMemAlloc(&g[i].buf, size)) != CUDA_SUCCESS) {
                        char what[64], b[32];

                        snprintf(what, sizeof(what), "cuMemAlloc of --size %s",
                                 format_size(b, sizeof(b), size));
                        ret_code = probe_driver_error(d, r, res, what, i);
                        goto fail;
                }
                if ((res = d->cuStreamCreate(&g[i].stream, CU_STREAM_NON_BLOCKING)) ||
                    (res = d->cuEventCreate(&g[i].start, CU_EVENT_DEFAULT)) ||
                    (res = d->cuEventCreate(&g[i].end, CU_EVENT_DEFAULT))) {
                        ret_code = probe_driver_error(d, r, res, "creating a stream and events", i);
                        goto fail;
                }
        }
        *ret = g;
        return 0;
fail:
        release_gpus(d, g, n);
        return ret_code;
}

/*
 * Without peer access a real driver stages peer copies through host memory, which would measure
 * PCIe instead of NVLink. simcuda has no cuCtxEnablePeerAccess: every mapping is already shared.
 */
static int enable_peer_access(const struct cuda_driver *d, const struct probe_gpu *g,
                              struct probe_result *r)
{
        __typeof__(cuCtxEnablePeerAccess) *enable = dlsym(d->dl, "cuCtxEnablePeerAccess");
        int n = r->n_devices;

        if (!enable)
                return 0;
        for (int i = 0; i < n; i++)
                for (int j = 0; j < n; j++) {
                        CUresult res;

                        if (!r->peer[(size_t)i * (size_t)n + (size_t)j])
                                continue;
                        d->cuCtxSetCurrent(g[i].ctx);
                        res = enable(g[j].ctx, 0);
                        if (res != CUDA_SUCCESS && res != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
                                return probe_driver_error(d, r, res, "cuCtxEnablePeerAccess", i);
                }
        r->peer_access = true;
        return 0;
}

/* One copy from src to dst on src's stream, timed by src's events; *ret_ms when timed. */
static int time_copy(const struct cuda_driver *d, const struct probe_gpu *g, int src, int dst,
                     uint64_t size, struct probe_result *r, float *ret_ms)
{
        const struct probe_gpu *s = &g[src], *t = &g[dst];
        CUresult res;

        d->cuCtxSetCurrent(s->ctx);
        if ((res = d->cuEventRecord(s->start, s->stream)) ||
            (res = d->cuMemcpyPeerAsync(t->buf, t->ctx, s->buf, s->ctx, size, s->stream)) ||
            (res = d->cuEventRecord(s->end, s->stream)) || (res = d->cuEventSynchronize(s->end)))
                return probe_driver_error(d, r, res, "cuMemcpyPeerAsync", src);
        if (ret_ms && (res = d->cuEventElapsedTime(ret_ms, s->start, s->end)))
                return probe_driver_error(d, r, res, "cuEventElapsedTime", src);
        return 0;
}

static int copy_probe(const struct cuda_driver *d, const struct probe_gpu *g,
                      const struct probe_params *p, const volatile sig_atomic_t *cancelled,
                      probe_progress_fn progress, void *userdata, struct probe_result *r)
{
        _cleanup_free_ double *ms = calloc((size_t)p->iterations, sizeof(double));
        int n = r->n_devices;
        size_t total = 0, done = 0;
        int ret;

        if (!ms)
                return -ENOMEM;
        for (int i = 0; i < n * n; i++)
                total += r->peer[i];
        for (int i = 0; i < n; i++)
                for (int j = 0; j < n; j++) {
                        double gbps;

                        if (!r->peer[(size_t)i * (size_t)n + (size_t)j])
                                continue;
                        if (cancelled && *cancelled)
                                return PROBE_E_CANCELLED;
                        ret = time_copy(d, g, i, j, p->size, r, NULL); /* warm-up */
                        for (int k = 0; ret == 0 && k < p->iterations; k++) {
                                float t;

                                if (cancelled && *cancelled)
                                        return PROBE_E_CANCELLED;
                                ret = time_copy(d, g, i, j, p->size, r, &t);
                                /* A copy faster than the timer's resolution still moved bytes. */
                                ms[k] = MAX((double)t, 1e-4);
                        }
                        if (ret != 0)
                                return ret;
                        gbps = (double)p->size / (probe_median(ms, (size_t)p->iterations) * 1e-3) /
                               1e9;
                        r->copy[(size_t)i * (size_t)n + (size_t)j] = gbps;
                        done++;
                        if (progress)
                                progress(r, "copy", i, j, gbps, done, total, userdata);
                }
        r->complete = true;
        return 0;
}

int probe_run(const struct cuda_driver *d, const struct probe_params *p,
              const volatile sig_atomic_t *cancelled, probe_progress_fn progress, void *userdata,
              struct probe_result *ret)
{
        struct probe_result r = {.size = p->size, .iterations = p->iterations};
        struct probe_gpu *gpus = NULL;
        char hostname[256] = "";
        CUresult res;
        int outcome;

        if (p->size == 0 || p->iterations < 1)
                return -EINVAL;
        r.driver = strdup(d->path);
        if (!r.driver)
                return -ENOMEM;
        r.driver_version = d->version;
        if (p->host)
                r.host = strdup(p->host);
        else if (gethostname(hostname, sizeof(hostname) - 1) == 0 && hostname[0])
                r.host = strdup(hostname);
        if ((p->host || hostname[0]) && !r.host) {
                probe_result_done(&r);
                return -ENOMEM;
        }
        res = d->cuInit(0);
        if (res != CUDA_SUCCESS) {
                outcome = probe_driver_error(d, &r, res, "cuInit", -1);
                goto out;
        }
        outcome = query_devices(d, &r);
        if (outcome != 0)
                goto out;
        outcome = setup_gpus(d, p->size, &r, &gpus);
        if (outcome != 0)
                goto out;
        outcome = enable_peer_access(d, gpus, &r);
        if (outcome == 0)
                outcome = copy_probe(d, gpus, p, cancelled, progress, userdata, &r);
        if (outcome == 0 && p->nccl)
                outcome = p->nccl(d, gpus, p, cancelled, progress, userdata, &r);
        else if (outcome == 0 && !(r.nccl_note = strdup("not asked for (--no-nccl)")))
                outcome = -ENOMEM;
        release_gpus(d, gpus, r.n_devices);
out:
        if (outcome < 0) {
                probe_result_done(&r);
                return outcome;
        }
        *ret = r;
        return outcome;
}
