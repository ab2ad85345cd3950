/* The link probe: GPU pair bandwidth by peer copies (and NCCL), and the topology file it makes. */
#pragma once

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda-driver.h"

/* Named outcomes. */
enum {
        PROBE_E_DRIVER = 1, /* the driver refused something; the result's error says what */
        PROBE_E_CANCELLED,  /* *cancelled was set; what was measured so far is in the result */
};

struct probe_device {
        char name[256];
        char uuid[48]; /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
        int pci_domain, pci_bus, pci_device;
        uint64_t memory;
};

struct probe_gpu;
struct probe_result;
typedef void (*probe_progress_fn)(const struct probe_result *r, const char *method, int src,
                                  int dst, double gbps, size_t done, size_t total, void *userdata);
struct probe_params;
/*
 * A further method timed on the GPUs the copy probe set up (probe-gpu.h), after it: it fills
 * its part of r and returns 0, PROBE_E_CANCELLED or PROBE_E_DRIVER. probe_nccl (probe-nccl.h) is
 * one; the caller chooses it, so that probe.c knows no method but its own.
 */
typedef int (*probe_method_fn)(const struct cuda_driver *d, const struct probe_gpu *gpus,
                               const struct probe_params *p,
                               const volatile sig_atomic_t *cancelled,
                               probe_progress_fn progress, void *userdata, struct probe_result *r);

struct probe_params {
        uint64_t size;  /* bytes per copy */
        int iterations; /* timed copies per ordered pair (the median counts), after one warm-up */
        probe_method_fn nccl; /* NCCL send/recv (probe_nccl); NULL: not asked for */
        const char *nccl_library; /* NULL: $AQUA_NCCL_LIBRARY if set, else libnccl.so.2 */
        const char *host;         /* the devices' host; NULL: gethostname() */
};

/* Bandwidths are GB/s (1e9 bytes per second) in row-major n x n matrices: [src * n + dst]. */
#define PROBE_NOT_MEASURED (-1.0)

struct probe_result {
        int n_devices;
        struct probe_device *devices;
        bool *peer;    /* cuDeviceCanAccessPeer(src, dst) */
        double *copy;  /* peer copy bandwidth; PROBE_NOT_MEASURED off the links or if cut short */
        double *nccl;  /* NCCL send/recv bandwidth; PROBE_NOT_MEASURED where not run */
        bool complete; /* every linked pair was measured by the copy probe */
        bool peer_access; /* cuCtxEnablePeerAccess was called (simcuda has none and needs none) */
        bool nccl_ran;
        char *nccl_note; /* why NCCL did not run, or its version when it did */
        char *driver;    /* the driver library loaded */
        int driver_version;
        uint64_t size;
        int iterations;
        char *error; /* with PROBE_E_DRIVER */
        char *host;  /* the host the devices are on, written per device; NULL: none known */
};

/* probe_progress_fn (above) reports each measurement as it ends: method "copy" or "nccl", done
 * out of total for it. */

/*
 * Query every device and peer link of the driver d, then time size-byte copies on every ordered
 * pair with peer access (one warm-up, the median of iterations), then NCCL where it can run.
 * Checks *cancelled between copies. Returns 0, PROBE_E_CANCELLED or PROBE_E_DRIVER (ret->error
 * says which call failed), or a negative errno; *ret holds what was found in every case but a
 * negative errno, for probe_result_done().
 */
int probe_run(const struct cuda_driver *d, const struct probe_params *p,
              const volatile sig_atomic_t *cancelled, probe_progress_fn progress, void *userdata,
              struct probe_result *ret);
void probe_result_done(struct probe_result *r);

static inline double probe_at(const double *m, const struct probe_result *r, int src, int dst)
{
        return m[(size_t)src * (size_t)r->n_devices + (size_t)dst];
}

/*
 * The bandwidth written for the undirected link a-b: the slower direction of the copy probe,
 * since a lease moves data both ways. PROBE_NOT_MEASURED if either direction is missing.
 */
double probe_link_bandwidth(const struct probe_result *r, int a, int b);

/*
 * The topology file (simcuda's AQUA_SIM_TOPOLOGY format, see simcuda/README.md): devices with
 * name, uuid, PCI ids and memory; one link per peer-linked pair with its bandwidth (left out
 * where it was not measured). Per-direction and NCCL figures go in comments. Written to a
 * temporary file and renamed, so path is whole or untouched.
 */
int probe_write_topology(const char *path, const struct probe_result *r);

/*
 * Combine the topology files of several hosts (each device with its host, as the probe writes
 * them) into one file of an NVLink domain: the devices in input order, each input's links, and
 * where fabric_bandwidth > 0 a link at that bandwidth (bytes per second) between every two
 * GPUs on different hosts. A device without a host, a host in two inputs, or more than
 * TOPOLOGY_MAX_DEVICES devices are errors. Written like probe_write_topology. Returns 0 or a
 * negative errno with *ret_error naming the file and the cause.
 */
int probe_merge_topology(const char *const *inputs, size_t n_inputs, uint64_t fabric_bandwidth,
                         const char *output, char **ret_error);
