/* aqua-producer: follow a load trace, keep the working set, lend the rest, reclaim and re-offer. */
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lend.h"
#include "load.h"
#include "example-log.h"
#include "example-parse.h"
#include "example-util.h"

static void help(void)
{
        printf("Usage: aqua-producer --trace FILE [OPTIONS]\n"
               "       aqua-producer --load-file FILE --backend aqua [OPTIONS]\n"
               "\n"
               "Stands in for a producer model (vision, audio) sharing a GPU's HBM: follows a\n"
               "load trace (time_s,load with load 0..1 of its peak), computes the working set it\n"
               "must keep at that load (weights + activations + margin) and what it can lend,\n"
               "reclaims at once when its load grows into lent memory, and offers memory again\n"
               "when its load falls, with hysteresis (a load band and a hold time) so the pool\n"
               "does not flap. Runs on a virtual clock; the lending calls go to a dry-run\n"
               "backend that keeps the books, or to aquad through libaqua. Prints each\n"
               "transition and a 'SUMMARY' line.\n"
               "\n"
               "  --trace FILE            load trace (CSV time_s,load, or .yaml with load: [{time, "
               "load}])\n"
               "  --load-file FILE        instead: read the load (one number) from FILE at every\n"
               "                          step, in real time, until SIGINT or SIGTERM\n"
               "  --backend NAME          dry-run (default) or aqua: offer and reclaim GPU memory\n"
               "                          through aquad ($AQUA_ENDPOINT; $AQUA_CUDA_LIBRARY)\n"
               "  --device N              aqua: the producer's CUDA device (0)\n"
               "  --capacity SIZE         GPU memory (80GiB)\n"
               "  --weights SIZE          always kept (16GiB)\n"
               "  --activation-peak SIZE  kept on top at load 1.0 (40GiB)\n"
               "  --margin SIZE           headroom always kept (2GiB)\n"
               "  --chunk SIZE            lending granularity, a power of two (2MiB)\n"
               "  --band LOAD             re-offer only what survives a load rise of this (0.1)\n"
               "  --hold DUR              ...that has held for this long (2s)\n"
               "  --min-offer SIZE        smallest offer (256MiB)\n"
               "  --step DUR              decision interval (100ms)\n"
               "  --realtime[=SPEED]      pace in real time, SPEED times faster (1)\n"
               "  --quiet                 print only the SUMMARY line\n"
               "  -h, --help              show this help\n");
}

enum {
        ARG_TRACE = 0x100,
        ARG_CAPACITY,
        ARG_WEIGHTS,
        ARG_ACTIVATION,
        ARG_MARGIN,
        ARG_CHUNK,
        ARG_BAND,
        ARG_HOLD,
        ARG_MIN_OFFER,
        ARG_STEP,
        ARG_REALTIME,
        ARG_QUIET,
        ARG_LOAD_FILE,
        ARG_BACKEND,
        ARG_DEVICE,
};

static const struct option options[] = {
    {"trace", required_argument, NULL, ARG_TRACE},
    {"capacity", required_argument, NULL, ARG_CAPACITY},
    {"weights", required_argument, NULL, ARG_WEIGHTS},
    {"activation-peak", required_argument, NULL, ARG_ACTIVATION},
    {"margin", required_argument, NULL, ARG_MARGIN},
    {"chunk", required_argument, NULL, ARG_CHUNK},
    {"band", required_argument, NULL, ARG_BAND},
    {"hold", required_argument, NULL, ARG_HOLD},
    {"min-offer", required_argument, NULL, ARG_MIN_OFFER},
    {"step", required_argument, NULL, ARG_STEP},
    {"realtime", optional_argument, NULL, ARG_REALTIME},
    {"quiet", no_argument, NULL, ARG_QUIET},
    {"load-file", required_argument, NULL, ARG_LOAD_FILE},
    {"backend", required_argument, NULL, ARG_BACKEND},
    {"device", required_argument, NULL, ARG_DEVICE},
    {"help", no_argument, NULL, 'h'},
    {},
};

static int size_arg(const char *opt, const char *s, bool zero_ok, uint64_t *ret)
{
        if (parse_size(s, ret) < 0 || (!zero_ok && *ret == 0))
                return log_error_errno(EINVAL, "--%s: expected a size (\"2GiB\"), got \"%s\"", opt,
                                       s);
        return 0;
}

static int dur_arg(const char *opt, const char *s, uint64_t *ret)
{
        if (parse_duration(s, ret) < 0)
                return log_error_errno(EINVAL, "--%s: expected a duration (\"2s\"), got \"%s\"",
                                       opt, s);
        return 0;
}

static double gib(uint64_t b)
{
        return (double)b / (1 << 30);
}

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
        stop = 1;
}

/* The load written in path; keeps `last` while the file cannot be read (a writer replacing it). */
static double read_load(const char *path, double last)
{
        FILE *f = fopen(path, "re");
        double v;

        if (!f)
                return last;
        if (fscanf(f, "%lf", &v) != 1 || !(v >= 0 && v <= 1))
                v = last;
        fclose(f);
        return v;
}

int main(int argc, char **argv)
{
        _cleanup_(lend_backend_free) struct lend_backend backend = {};
        struct lend_config cfg;
        struct lend_state st = {};
        struct load_trace trace = {};
        const char *path = NULL, *load_file = NULL;
        bool aqua = false;
        int device = 0;
        uint64_t step = 100 * NSEC_PER_MSEC;
        double realtime = 0;
        bool quiet = false;
        int c, r = 0;

        log_setup("aqua-producer", LOG_LEVEL_INFO);
        lend_config_defaults(&cfg);
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                const char *name =
                    c >= ARG_TRACE && c <= ARG_DEVICE ? options[c - ARG_TRACE].name : "";
                switch (c) {
                case 'h':
                        help();
                        return EXIT_SUCCESS;
                case ARG_TRACE:
                        path = optarg;
                        break;
                case ARG_CAPACITY:
                        r = size_arg(name, optarg, false, &cfg.capacity);
                        break;
                case ARG_WEIGHTS:
                        r = size_arg(name, optarg, true, &cfg.weights);
                        break;
                case ARG_ACTIVATION:
                        r = size_arg(name, optarg, true, &cfg.activation_peak);
                        break;
                case ARG_MARGIN:
                        r = size_arg(name, optarg, true, &cfg.margin);
                        break;
                case ARG_CHUNK:
                        r = size_arg(name, optarg, false, &cfg.chunk);
                        break;
                case ARG_MIN_OFFER:
                        r = size_arg(name, optarg, true, &cfg.min_offer);
                        break;
                case ARG_BAND:
                        if (parse_double(optarg, &cfg.band) < 0 ||
                            !(cfg.band >= 0 && cfg.band <= 1))
                                r = log_error_errno(EINVAL,
                                                    "--band: expected a load in [0, 1], got \"%s\"",
                                                    optarg);
                        break;
                case ARG_HOLD:
                        r = dur_arg(name, optarg, &cfg.hold_ns);
                        break;
                case ARG_STEP:
                        r = dur_arg(name, optarg, &step);
                        if (r == 0 && step == 0)
                                r = log_error_errno(EINVAL, "--step: must be more than 0");
                        break;
                case ARG_REALTIME:
                        realtime = 1;
                        if (optarg && (parse_double(optarg, &realtime) < 0 || !(realtime > 0)))
                                r = log_error_errno(
                                    EINVAL, "--realtime: expected a speed > 0, got \"%s\"", optarg);
                        break;
                case ARG_QUIET:
                        quiet = true;
                        break;
                case ARG_LOAD_FILE:
                        load_file = optarg;
                        break;
                case ARG_BACKEND:
                        if (strcmp(optarg, "aqua") == 0 || strcmp(optarg, "dry-run") == 0)
                                aqua = optarg[0] == 'a';
                        else
                                r = log_error_errno(
                                    EINVAL, "--backend: expected dry-run or aqua, got \"%s\"",
                                    optarg);
                        break;
                case ARG_DEVICE: {
                        int64_t v;
                        if (parse_int64(optarg, 10, &v) < 0 || v < 0 || v > 1024)
                                r = log_error_errno(
                                    EINVAL, "--device: expected an ordinal, got \"%s\"", optarg);
                        device = (int)v;
                        break;
                }
                default:
                        return EXIT_FAILURE;
                }
                if (r < 0)
                        return EXIT_FAILURE;
        }
        if (optind < argc) {
                log_error("unexpected argument \"%s\" (see --help)", argv[optind]);
                return EXIT_FAILURE;
        }
        if (!path == !load_file) {
                log_error("one of --trace FILE and --load-file FILE is required (see --help)");
                return EXIT_FAILURE;
        }
        if (lend_config_check(&cfg) < 0) {
                log_error("--chunk must be a power of two");
                return EXIT_FAILURE;
        }

        _cleanup_free_ char *error = NULL;
        if (path) {
                r = load_trace_load(path, &trace, &error);
                if (r < 0) {
                        log_error("%s", error ?: strerror(-r));
                        return EXIT_FAILURE;
                }
        } else {
                /* One point, so that the trace-driven code below has a load and an end. */
                trace.p = calloc(1, sizeof(*trace.p));
                if (!trace.p)
                        return log_error_errno(ENOMEM, "Out of memory"), EXIT_FAILURE;
                trace.n = 1;
                trace.p[0].load = read_load(load_file, -1);
                if (trace.p[0].load < 0) {
                        log_error("%s: expected a load between 0 and 1", load_file);
                        load_trace_clear(&trace);
                        return EXIT_FAILURE;
                }
                realtime = 1;
        }
        if (aqua) {
                struct lend_aqua_config ac = {.device = device, .policy = &cfg};
                r = lend_aqua_new(&ac, &backend);
                if (r < 0) {
                        log_error_errno(r, "Failed to connect to aquad as a producer: %m");
                        if (r == -ENOENT || r == -ECONNREFUSED)
                                log_error("Is aquad running? $AQUA_ENDPOINT names it.");
                        else if (r == -ELIBACC)
                                log_error("No CUDA driver: set $AQUA_CUDA_LIBRARY (simcuda's "
                                          "build/simcuda/libcuda.so.1 without a GPU).");
                }
        } else
                r = lend_dry_run_new(&backend);
        if (r < 0) {
                load_trace_clear(&trace);
                return log_error_errno(r, "Failed to set up the lending backend: %m"), EXIT_FAILURE;
        }
        setvbuf(stdout, NULL, _IOLBF, 0);
        struct sigaction sa = {.sa_handler = on_signal};
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);

        if (!quiet)
                printf("Producer on a %.1f GiB GPU: keeps %.1f GiB weights + up to %.1f GiB "
                       "activations "
                       "+ %.1f GiB margin; lends the rest in %" PRIu64
                       " KiB chunks (band %.2f, hold %.1f s), "
                       "backend %s\n",
                       gib(cfg.capacity), gib(cfg.weights), gib(cfg.activation_peak),
                       gib(cfg.margin), cfg.chunk >> 10, cfg.band,
                       (double)cfg.hold_ns / NSEC_PER_SEC, backend.ops->name);

        uint64_t offers = 0, reclaims = 0, offered = 0, reclaimed = 0, max_lent = 0;
        uint64_t end = trace.p[trace.n - 1].time_ns + cfg.hold_ns + step;
        uint64_t start = now_mono_ns();
        double last_load = -1;
        for (uint64_t t = 0; !stop && (load_file || t <= end); t += step) {
                double load = load_file ? read_load(load_file, last_load) : load_at(&trace, t);
                enum lend_action a;
                uint64_t bytes, done = 0;

                if (backend.ops->report_load && load != last_load) {
                        r = backend.ops->report_load(backend.ctx, load);
                        if (r < 0)
                                break;
                }
                last_load = load;
                if (backend.ops->poll) {
                        r = backend.ops->poll(backend.ctx);
                        if (r < 0) {
                                log_error_errno(r, "Polling the lending backend failed: %m");
                                break;
                        }
                }
                lend_decide(&cfg, &st, t, load, &a, &bytes);
                if (a == LEND_OFFER)
                        r = backend.ops->offer(backend.ctx, bytes, &done);
                else if (a == LEND_RECLAIM)
                        r = backend.ops->reclaim(backend.ctx, bytes, &done);
                if (r < 0) {
                        log_error_errno(r, "%s of %" PRIu64 " bytes failed: %m",
                                        lend_action_to_string(a), bytes);
                        break;
                }
                if (a == LEND_NONE)
                        goto pace;
                lend_commit(&st, a, done);
                if (a == LEND_OFFER) {
                        offers++;
                        offered += done;
                } else {
                        reclaims++;
                        reclaimed += done;
                }
                max_lent = MAX(max_lent, st.lent);
                if (!quiet)
                        printf("t=%8.2fs load %.2f  keep %6.1f GiB  %-7s %6.1f GiB  -> lent %6.1f "
                               "GiB\n",
                               (double)t / NSEC_PER_SEC, load, gib(lend_working_set(&cfg, load)),
                               lend_action_to_string(a), gib(done), gib(st.lent));
        pace:
                if (realtime > 0) {
                        uint64_t due = start + (uint64_t)((double)t / realtime),
                                 now = now_mono_ns();
                        if (due > now)
                                sleep_ns(due - now);
                }
        }
        if (r >= 0)
                printf("SUMMARY producer=%s points=%zu offers=%" PRIu64 " reclaims=%" PRIu64
                       " bytes_offered=%" PRIu64 " bytes_reclaimed=%" PRIu64 " max_lent=%" PRIu64
                       " final_lent=%" PRIu64 " final_load=%.3f\n",
                       backend.ops->name, trace.n, offers, reclaims, offered, reclaimed, max_lent,
                       st.lent, last_load);
        load_trace_clear(&trace);
        return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
