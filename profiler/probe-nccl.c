/*
 * The NCCL probe: libnccl is dlopen'ed (never linked), one communicator per GPU from
 * ncclCommInitAll in this process, and a grouped ncclSend/ncclRecv per ordered linked pair.
 */
#include <dlfcn.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe-nccl.h"
#include "util.h"

#define DEFAULT_LIBRARY "libnccl.so.2"

/* Our own prototypes: nccl.h declares ncclGroupStart/End without one. */
struct nccl {
        ncclResult_t (*get_version)(int *version);
        const char *(*get_error_string)(ncclResult_t result);
        ncclResult_t (*comm_init_all)(ncclComm_t *comms, int ndev, const int *devlist);
        ncclResult_t (*comm_destroy)(ncclComm_t comm);
        ncclResult_t (*group_start)(void);
        ncclResult_t (*group_end)(void);
        ncclResult_t (*send)(const void *buf, size_t count, ncclDataType_t type, int peer,
                             ncclComm_t comm, cudaStream_t stream);
        ncclResult_t (*recv)(void *buf, size_t count, ncclDataType_t type, int peer,
                             ncclComm_t comm, cudaStream_t stream);
};

static _printf_(2, 3) int set_note(struct probe_result *r, const char *fmt, ...)
{
        va_list ap;
        int n;

        free(r->nccl_note);
        va_start(ap, fmt);
        n = vasprintf(&r->nccl_note, fmt, ap);
        va_end(ap);
        if (n < 0) {
                r->nccl_note = NULL;
                return -ENOMEM;
        }
        return 0;
}

/*
 * Returns 0, 1 when it cannot be used (r->nccl_note says why), or -ENOMEM. Never unloaded
 * (RTLD_NODELETE): NCCL leaves threads behind that would run unmapped code.
 */
static int nccl_open(const char *path, struct nccl *ret, struct probe_result *r)
{
        static const char *const names[] = {
            "ncclGetVersion", "ncclGetErrorString", "ncclCommInitAll", "ncclCommDestroy",
            "ncclGroupStart", "ncclGroupEnd",       "ncclSend",        "ncclRecv"};
        void *fns[ARRAY_SIZE(names)];
        const char *env = getenv("AQUA_NCCL_LIBRARY");
        struct nccl n;
        void *dl;

        if (!path)
                path = env && *env ? env : DEFAULT_LIBRARY;
        dl = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (!dl)
                return set_note(r, "skipped: cannot load %s (%s)", path, dlerror()) ?: 1;
        for (size_t i = 0; i < ARRAY_SIZE(names); i++)
                if (!(fns[i] = dlsym(dl, names[i])))
                        return set_note(r, "skipped: %s lacks %s", path, names[i]) ?: 1;
        /* POSIX: object pointers from dlsym convert to function pointers. */
        memcpy(&n.get_version, &fns[0], sizeof(void *));
        memcpy(&n.get_error_string, &fns[1], sizeof(void *));
        memcpy(&n.comm_init_all, &fns[2], sizeof(void *));
        memcpy(&n.comm_destroy, &fns[3], sizeof(void *));
        memcpy(&n.group_start, &fns[4], sizeof(void *));
        memcpy(&n.group_end, &fns[5], sizeof(void *));
        memcpy(&n.send, &fns[6], sizeof(void *));
        memcpy(&n.recv, &fns[7], sizeof(void *));
        *ret = n;
        return 0;
}

/* NCCL runs CUDA kernels; a driver without cuLaunchKernel (simcuda) cannot run them. */
static bool driver_runs_kernels(const struct cuda_driver *d)
{
        return dlsym(d->dl, "cuLaunchKernel") != NULL;
}

static int nccl_error(const struct nccl *n, struct probe_result *r, ncclResult_t res,
                      const char *what)
{
        free(r->error);
        if (asprintf(&r->error, "%s failed: %s", what, n->get_error_string(res)) < 0)
                r->error = NULL;
        return PROBE_E_DRIVER;
}

/*
 * The receiver's stream waits for the sender's start event and the sender's end event waits for
 * the receiver, so src's start..end spans the whole transfer on both GPUs.
 */
static int time_pair(const struct cuda_driver *d, const struct nccl *n, const struct probe_gpu *g,
                     ncclComm_t *comms, int src, int dst, uint64_t size, struct probe_result *r,
                     float *ret_ms)
{
        const struct probe_gpu *s = &g[src], *t = &g[dst];
        ncclResult_t nres;
        CUresult res;

        d->cuCtxSetCurrent(s->ctx);
        if ((res = d->cuEventRecord(s->start, s->stream)) ||
            (res = d->cuStreamWaitEvent(t->stream, s->start, 0)))
                return probe_driver_error(d, r, res, "cuEventRecord before ncclSend", src);
        if ((nres = n->group_start()) ||
            (nres = n->send((const void *)s->buf, size, ncclUint8, dst, comms[src], s->stream)) ||
            (nres = n->recv((void *)t->buf, size, ncclUint8, src, comms[dst], t->stream)) ||
            (nres = n->group_end()))
                return nccl_error(n, r, nres, "ncclSend/ncclRecv");
        d->cuCtxSetCurrent(t->ctx);
        if ((res = d->cuEventRecord(t->end, t->stream)))
                return probe_driver_error(d, r, res, "cuEventRecord after ncclRecv", dst);
        d->cuCtxSetCurrent(s->ctx);
        if ((res = d->cuStreamWaitEvent(s->stream, t->end, 0)) ||
            (res = d->cuEventRecord(s->end, s->stream)) || (res = d->cuEventSynchronize(s->end)))
                return probe_driver_error(d, r, res, "cuEventRecord after ncclSend", src);
        if (ret_ms && (res = d->cuEventElapsedTime(ret_ms, s->start, s->end)))
                return probe_driver_error(d, r, res, "cuEventElapsedTime", src);
        return 0;
}

static int measure(const struct cuda_driver *d, const struct nccl *n, const struct probe_gpu *g,
                   ncclComm_t *comms, const struct probe_params *p,
                   const volatile sig_atomic_t *cancelled, probe_progress_fn progress,
                   void *userdata, struct probe_result *r)
{
        _cleanup_free_ double *ms = calloc((size_t)p->iterations, sizeof(double));
        int nd = r->n_devices;
        size_t total = 0, done = 0;
        int ret;

        if (!ms)
                return -ENOMEM;
        for (int i = 0; i < nd * nd; i++)
                total += r->peer[i];
        for (int i = 0; i < nd; i++)
                for (int j = 0; j < nd; j++) {
                        double gbps;

                        if (!r->peer[(size_t)i * (size_t)nd + (size_t)j])
                                continue;
                        if (cancelled && *cancelled)
                                return PROBE_E_CANCELLED;
                        ret = time_pair(d, n, g, comms, i, j, p->size, r, NULL);
                        for (int k = 0; ret == 0 && k < p->iterations; k++) {
                                float t;

                                ret = time_pair(d, n, g, comms, i, j, p->size, r, &t);
                                ms[k] = MAX((double)t, 1e-4);
                        }
                        if (ret != 0)
                                return ret;
                        gbps = (double)p->size / (probe_median(ms, (size_t)p->iterations) * 1e-3) /
                               1e9;
                        r->nccl[(size_t)i * (size_t)nd + (size_t)j] = gbps;
                        done++;
                        if (progress)
                                progress(r, "nccl", i, j, gbps, done, total, userdata);
                }
        return 0;
}

int probe_nccl(const struct cuda_driver *d, const struct probe_gpu *gpus,
               const struct probe_params *p, const volatile sig_atomic_t *cancelled,
               probe_progress_fn progress, void *userdata, struct probe_result *r)
{
        _cleanup_free_ ncclComm_t *comms = NULL;
        _cleanup_free_ int *devs = NULL;
        char version[32];
        struct nccl n;
        bool any = false;
        int v = 0, ret;
        ncclResult_t nres;

        for (int i = 0; i < r->n_devices * r->n_devices; i++)
                any |= r->peer[i];
        if (!any)
                return set_note(r, "skipped: no pair of GPUs has a peer link");
        ret = nccl_open(p->nccl_library, &n, r);
        if (ret != 0)
                return ret < 0 ? ret : 0;
        n.get_version(&v);
        snprintf(version, sizeof(version), "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
        /* Loading libnccl touches no driver; running it would need kernels simcuda lacks. */
        if (!driver_runs_kernels(d))
                return set_note(r,
                                "skipped: NCCL %s is here, but the CUDA driver %s runs no kernels "
                                "(simcuda?) and NCCL moves data with kernels",
                                version, d->path);

        comms = calloc((size_t)r->n_devices, sizeof(*comms));
        devs = calloc((size_t)r->n_devices, sizeof(*devs));
        if (!comms || !devs)
                return -ENOMEM;
        for (int i = 0; i < r->n_devices; i++)
                devs[i] = i;
        nres = n.comm_init_all(comms, r->n_devices, devs);
        if (nres != ncclSuccess)
                ret = nccl_error(&n, r, nres, "ncclCommInitAll");
        else {
                ret = measure(d, &n, gpus, comms, p, cancelled, progress, userdata, r);
                for (int i = 0; i < r->n_devices; i++)
                        n.comm_destroy(comms[i]);
        }
        if (ret == 0) {
                r->nccl_ran = true;
                ret = set_note(r, "NCCL %s, send/recv in one process", version);
        } else if (ret == PROBE_E_DRIVER) {
                /* The copy figures stand on their own: NCCL failing is a note, not an end. */
                for (int i = 0; i < r->n_devices * r->n_devices; i++)
                        r->nccl[i] = PROBE_NOT_MEASURED;
                ret = set_note(r, "failed: %s (NCCL %s)", r->error ? r->error : "unknown error",
                               version);
                free(r->error);
                r->error = NULL;
        } else if (ret == PROBE_E_CANCELLED && set_note(r, "interrupted (NCCL %s)", version) < 0)
                ret = -ENOMEM;
        return ret;
}
