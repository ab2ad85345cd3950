/* The NCCL probe, a method for probe_params.nccl (probe.h). */
#pragma once

#include "probe-gpu.h"

/*
 * NCCL send/recv between every peer-linked ordered pair, timed with the GPUs' events. Does not
 * run (and says why in r->nccl_note) when the driver runs no kernels (simcuda) or libnccl cannot
 * be loaded. Returns 0, PROBE_E_CANCELLED or PROBE_E_DRIVER.
 */
int probe_nccl(const struct cuda_driver *d, const struct probe_gpu *gpus,
               const struct probe_params *p, const volatile sig_atomic_t *cancelled,
               probe_progress_fn progress, void *userdata, struct probe_result *r);
