/* aqua-profile probe: measure GPU pair bandwidth and write the topology file. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "parse-util.h"
#include "probe-cli.h"
#include "probe-nccl.h"
#include "probe.h"
#include "util.h"

#define DEFAULT_OUTPUT     "topology.yaml"
#define DEFAULT_SIZE       (UINT64_C(64) << 20)
#define DEFAULT_ITERATIONS 10

static volatile sig_atomic_t cancelled;

static void on_signal(int sig)
{
        cancelled = 1;
        signal(sig, SIG_DFL);
}

struct progress {
        bool tty;
        bool quiet;
        bool open; /* a self-rewriting line is on screen */
};

static void show_progress(const struct probe_result *r, const char *method, int src, int dst,
                          double gbps, size_t done, size_t total, void *userdata)
{
        struct progress *pr = userdata;

        if (pr->quiet)
                return;
        if (pr->tty) {
                fprintf(stderr, "\r\033[K[%s %zu/%zu] GPU %d -> GPU %d: %.2f GB/s", method, done,
                        total, src, dst, gbps);
                pr->open = true;
        } else
                log_info("%s %zu/%zu: GPU %d -> GPU %d: %.2f GB/s", method, done, total, src, dst,
                         gbps);
}

static void print_matrix(const struct probe_result *r, const double *m, const char *title)
{
        printf("%s (GB/s, row: from, column: to; '-' no peer access):\n      ", title);
        for (int j = 0; j < r->n_devices; j++)
                printf(" %9d", j);
        printf("\n");
        for (int i = 0; i < r->n_devices; i++) {
                printf("  %3d ", i);
                for (int j = 0; j < r->n_devices; j++) {
                        double v = probe_at(m, r, i, j);

                        if (i == j)
                                printf(" %9s", "");
                        else if (!r->peer[(size_t)i * (size_t)r->n_devices + (size_t)j])
                                printf(" %9s", "-");
                        else if (v == PROBE_NOT_MEASURED)
                                printf(" %9s", "?");
                        else
                                printf(" %9.2f", v);
                }
                printf("\n");
        }
}

static void print_result(const struct probe_result *r)
{
        char size[32];
        int unlinked = 0;

        for (int i = 0; i < r->n_devices; i++)
                printf("GPU %d: %s, %s, %s, PCI %04x:%02x:%02x\n", i, r->devices[i].name,
                       format_size(size, sizeof(size), r->devices[i].memory), r->devices[i].uuid,
                       (unsigned)r->devices[i].pci_domain, (unsigned)r->devices[i].pci_bus,
                       (unsigned)r->devices[i].pci_device);
        if (r->n_devices < 2)
                return;
        print_matrix(r, r->copy, "peer copy (cuMemcpyPeerAsync)");
        if (r->nccl_ran)
                print_matrix(r, r->nccl, "NCCL send/recv");
        for (int i = 0; i < r->n_devices; i++)
                for (int j = 0; j < r->n_devices; j++)
                        if (i != j && !r->peer[(size_t)i * (size_t)r->n_devices + (size_t)j]) {
                                if (unlinked++ == 0)
                                        printf("no peer access:");
                                printf(" %d->%d", i, j);
                        }
        if (unlinked)
                printf("\n");
        printf("NCCL: %s\n", r->nccl_note ? r->nccl_note : "not run");
}

static void help(void)
{
        printf("Usage: aqua-profile probe [OPTIONS]\n\n"
               "Measure the bandwidth of every GPU pair with peer access: peer copies through\n"
               "the CUDA driver ($AQUA_CUDA_LIBRARY or libcuda.so.1) and, where a real GPU runs\n"
               "kernels, NCCL send/recv ($AQUA_NCCL_LIBRARY or libnccl.so.2). Writes the topology\n"
               "file (simcuda's AQUA_SIM_TOPOLOGY format) that pairing and placement read.\n\n"
               "  -o, --output FILE     topology file (default " DEFAULT_OUTPUT ")\n"
               "  -s, --size SIZE       bytes per copy (default 64MiB)\n"
               "  -n, --iters N         timed copies per pair, the median counts (default 10)\n"
               "      --host NAME       the host written for each device (default: gethostname)\n"
               "      --no-nccl         peer copies only\n"
               "  -q, --quiet           no progress line\n"
               "  -v, --verbose         debug messages\n"
               "  -h, --help            this text\n");
}

int probe_main(int argc, char **argv)
{
        enum { OPT_NO_NCCL = 0x100, OPT_HOST };
        static const struct option opts[] = {
            {"output", required_argument, NULL, 'o'},
            {"size", required_argument, NULL, 's'},
            {"iters", required_argument, NULL, 'n'},
            {"iterations", required_argument, NULL, 'n'},
            {"no-nccl", no_argument, NULL, OPT_NO_NCCL},
            {"host", required_argument, NULL, OPT_HOST},
            {"quiet", no_argument, NULL, 'q'},
            {"verbose", no_argument, NULL, 'v'},
            {"help", no_argument, NULL, 'h'},
            {},
        };
        struct probe_params p = {
            .size = DEFAULT_SIZE, .iterations = DEFAULT_ITERATIONS, .nccl = probe_nccl};
        struct progress pr = {.tty = isatty(STDERR_FILENO)};
        _cleanup_(probe_result_done) struct probe_result r = {0};
        struct cuda_driver *d = NULL;
        _cleanup_free_ char *error = NULL;
        const char *output = DEFAULT_OUTPUT;
        int64_t iters;
        int c, outcome, w;

        while ((c = getopt_long(argc, argv, "o:s:n:qvh", opts, NULL)) >= 0) {
                switch (c) {
                case 'o':
                        output = optarg;
                        break;
                case 's':
                        if (parse_size(optarg, &p.size) < 0 || p.size == 0) {
                                log_error("--size: expected a size such as 64MiB, got \"%s\"",
                                          optarg);
                                return 2;
                        }
                        break;
                case 'n':
                        if (parse_int64(optarg, 10, &iters) < 0 || iters < 1 || iters > 100000) {
                                log_error("--iters: expected 1..100000, got \"%s\"", optarg);
                                return 2;
                        }
                        p.iterations = (int)iters;
                        break;
                case OPT_NO_NCCL:
                        p.nccl = NULL;
                        break;
                case OPT_HOST:
                        if (!*optarg || strlen(optarg) > 255) {
                                log_error("--host: expected a name of 1 to 255 characters");
                                return 2;
                        }
                        p.host = optarg;
                        break;
                case 'q':
                        pr.quiet = true;
                        break;
                case 'v':
                        log_set_max_level(LOG_LEVEL_DEBUG);
                        break;
                case 'h':
                        help();
                        return 0;
                default:
                        return 2;
                }
        }
        if (optind != argc) {
                log_error("Unexpected argument \"%s\"; see aqua-profile probe --help",
                          argv[optind]);
                return 2;
        }

        outcome = cuda_driver_open(NULL, &d, &error);
        if (outcome < 0) {
                log_error("%s", error ? error : "cannot load the CUDA driver");
                return 1;
        }
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
        outcome = probe_run(d, &p, &cancelled, show_progress, &pr, &r);
        if (pr.open)
                fputc('\n', stderr);
        d = cuda_driver_close(d);
        if (outcome < 0)
                return log_error_errno(outcome, "Probe failed: %m"), 1;
        /* A figure measured next to a failing driver is not worth a topology file. */
        if (outcome == PROBE_E_DRIVER)
                return log_error("%s", r.error ? r.error : "the CUDA driver failed"), 1;
        if (outcome == PROBE_E_CANCELLED)
                log_warning("Interrupted: writing the links found, with the bandwidths measured "
                            "so far");
        print_result(&r);
        w = probe_write_topology(output, &r);
        if (w < 0)
                return log_error_errno(w, "Failed to write %s: %m", output), 1;
        printf("topology: %s\n", output);
        return outcome == 0 ? 0 : outcome == PROBE_E_CANCELLED ? 130 : 1;
}

static void merge_help(void)
{
        printf("Usage: aqua-profile merge [OPTIONS] FILE...\n\n"
               "Join the topology files of the hosts of one NVLink domain (each written by\n"
               "aqua-profile probe on its host, every device with its host) into one file for\n"
               "aquad and aqua-place: the devices in the order given, each file's links, and\n"
               "with --fabric-bandwidth a link between every two GPUs on different hosts.\n\n"
               "  -o, --output FILE            merged file (default " DEFAULT_OUTPUT ")\n"
               "  -f, --fabric-bandwidth BW    bytes per second across hosts, e.g. 900GB\n"
               "                               (default: no links across hosts)\n"
               "  -h, --help                   this text\n");
}

int merge_main(int argc, char **argv)
{
        static const struct option opts[] = {
            {"output", required_argument, NULL, 'o'},
            {"fabric-bandwidth", required_argument, NULL, 'f'},
            {"help", no_argument, NULL, 'h'},
            {},
        };
        _cleanup_free_ char *error = NULL;
        const char *output = DEFAULT_OUTPUT;
        uint64_t fabric = 0;
        int c, r;

        while ((c = getopt_long(argc, argv, "o:f:h", opts, NULL)) >= 0) {
                switch (c) {
                case 'o':
                        output = optarg;
                        break;
                case 'f':
                        if (parse_size(optarg, &fabric) < 0 || fabric == 0) {
                                log_error("--fabric-bandwidth: expected a bandwidth such as "
                                          "900GB, got \"%s\"",
                                          optarg);
                                return 2;
                        }
                        break;
                case 'h':
                        merge_help();
                        return 0;
                default:
                        return 2;
                }
        }
        if (optind == argc) {
                log_error("No topology files to merge; see aqua-profile merge --help");
                return 2;
        }
        r = probe_merge_topology((const char *const *)argv + optind, (size_t)(argc - optind),
                                 fabric, output, &error);
        if (r < 0) {
                if (error)
                        log_error("%s", error);
                else
                        log_error_errno(r, "Failed to merge: %m");
                return 1;
        }
        printf("topology: %s\n", output);
        return 0;
}
