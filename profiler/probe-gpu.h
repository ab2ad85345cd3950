/* What the copy probe sets up on each GPU, shared with the NCCL probe that reuses it. */
#pragma once

#include "probe.h"

struct probe_gpu {
        CUcontext ctx; /* the primary context, retained */
        CUdeviceptr buf;
        CUstream stream;
        CUevent start, end;
};

/* Record "what failed" with the driver's error name in r->error; returns PROBE_E_DRIVER. */
int probe_driver_error(const struct cuda_driver *d, struct probe_result *r, CUresult res,
                       const char *what, int dev);

/* Median of n values (sorts v). */
double probe_median(double *v, size_t n);

/*
 * NCCL send/recv between every peer-linked ordered pair, timed with the GPUs' events. Does not
 * run (and says why in r->nccl_note) when the driver runs no kernels (simcuda) or libnccl cannot
 * be loaded. Returns 0, PROBE_E_CANCELLED or PROBE_E_DRIVER.
 */
int probe_nccl(const struct cuda_driver *d, const struct probe_gpu *gpus,
               const struct probe_params *p, const volatile sig_atomic_t *cancelled,
               probe_progress_fn progress, void *userdata, struct probe_result *r);
