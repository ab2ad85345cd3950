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
