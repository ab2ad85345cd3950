/* aqua-profile: find a model's sustainable rate under an SLA, its role and its swap needs. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "engine-model.h"
#include "log.h"
#include "parse-util.h"
#include "probe-cli.h"
#include "report.h"
#include "search.h"
#include "target-http.h"
#include "time-util.h"
#include "util.h"

static volatile sig_atomic_t cancelled;

static void on_signal(int sig)
{
        cancelled = 1;
        /* A second Ctrl-C is not patient: it ends the program at once. */
        signal(sig, SIG_DFL);
}

struct progress {
        bool tty;
        int step;
};

static void show_progress(const struct search *st, const struct search_point *p, double lo,
                          double hi, void *userdata)
{
        struct progress *pr = userdata;
        char bracket[64];

        pr->step++;
        if (p->phase == PHASE_BURST)
                snprintf(bracket, sizeof(bracket), "burst %gx", p->burst);
        else if (hi < 0)
                snprintf(bracket, sizeof(bracket), "best %.4g, no ceiling yet", lo);
        else if (lo < 0)
                snprintf(bracket, sizeof(bracket), "below %.4g", hi);
        else
                snprintf(bracket, sizeof(bracket), "in [%.4g, %.4g]", lo, hi);
        if (pr->tty)
                fprintf(stderr, "\r\033[K[%2d] %8.4g req/s  TTFT p99 %7.3f s  TBT p99 %7.1f ms  %s  %s",
                        pr->step, p->rate * p->burst, p->s.ttft_p99, p->s.tbt_p99 * 1e3,
                        p->meets ? "meets" : "misses", bracket);
        else
                log_info("step %d: %.4g req/s: TTFT p99 %.3f s, TBT p99 %.1f ms, %s SLA; %s",
                         pr->step, p->rate * p->burst, p->s.ttft_p99, p->s.tbt_p99 * 1e3,
                         p->meets ? "meets" : "misses", bracket);
}

static int make_target(const struct profile_config *c, struct target **ret)
{
        if (c->target.kind == TARGET_KIND_HTTP) {
                struct http_params hp = {
                        .url = c->target.url,
                        .api = c->target.api,
                        .model = c->target.served_model,
                        .timeout = c->target.timeout,
                        .drain = c->target.drain,
                        .metrics_url = c->target.metrics_url,
                        .metric = c->target.metric,
                        .kv_bytes_per_token = c->kv_bytes_per_token,
                        .kv_capacity = c->target.kv_cache,
                };
                return http_target_new(&hp, ret);
        }
        struct engine_params ep = {
                .prefill_per_token = c->engine.prefill_per_token,
                .decode_base = c->engine.decode_base,
                .decode_per_seq = c->engine.decode_per_seq,
                .max_batch = c->engine.max_batch,
                .gpu_memory = c->gpu_memory,
                .tp = c->tp,
                .weights = c->engine.weights,
                .memory_utilization = c->engine.memory_utilization,
                .kv_bytes_per_token = c->kv_bytes_per_token,
        };
        return engine_model_new(&ep, ret);
}

static int load_pool(const struct profile_config *c, struct request_pool *ret)
{
        _cleanup_free_ char *error = NULL;
        int r;

        if (!c->workload.dataset)
                return request_pool_synthetic(&c->workload.prompt, &c->workload.output,
                                              (size_t)c->workload.synthetic_requests,
                                              (uint64_t)c->workload.seed, ret);
        r = request_pool_load_sharegpt(c->workload.dataset, (size_t)c->workload.max_requests, ret,
                                       &error);
        if (r == WORKLOAD_E_MALFORMED)
                return log_error_errno(EINVAL, "%s", error ? error : "malformed dataset");
        if (r < 0)
                return log_error_errno(r, "Failed to read dataset %s: %m", c->workload.dataset);
        return 0;
}

static int write_outputs(const struct profile_config *c, const struct search_params *sp,
                         const struct search *st, int outcome)
{
        _cleanup_free_ char *base = NULL, *profile = NULL, *summary = NULL, *csv = NULL,
                            *script = NULL, *image = NULL;
        struct report_info info = {
                .model = c->model,
                .tp = c->tp,
                .gpu_memory = c->gpu_memory,
                .target = target_kind_names[c->target.kind],
                .params = sp,
                .plan_burst = c->roles.plan_burst,
        };
        int r, ret = 0;

        if (mkdir(c->output.directory, 0755) < 0 && errno != EEXIST)
                return log_error_errno(errno, "Failed to create %s: %m", c->output.directory);
        if (asprintf(&base, "%s/%s", c->output.directory, c->model) < 0 ||
            asprintf(&profile, "%s.profile.yaml", base) < 0 ||
            asprintf(&summary, "%s.summary.yaml", base) < 0 ||
            asprintf(&csv, "%s.csv", base) < 0 || asprintf(&script, "%s.gp", base) < 0 ||
            asprintf(&image, "%s.%s", base, c->output.plot == PLOT_SVG ? "svg" : "png") < 0)
                return log_error_errno(ENOMEM, "Out of memory");

        r = report_write_summary(summary, &info, st);
        if (r < 0)
                ret = log_error_errno(r, "Failed to write %s: %m", summary);
        else
                printf("summary: %s\n", summary);
        r = report_write_csv(csv, st);
        if (r < 0)
                ret = log_error_errno(r, "Failed to write %s: %m", csv);
        else
                printf("csv:     %s\n", csv);
        r = report_write_profile(profile, &info, st);
        if (r == REPORT_E_INCOMPLETE)
                log_warning("No profile written: %s",
                            st->found                        ? "the consumer's plan burst was not measured"
                            : outcome == SEARCH_E_CANCELLED ? "the search stopped before finding a rate"
                                                            : "no rate met the SLA");
        else if (r < 0)
                ret = log_error_errno(r, "Failed to write %s: %m", profile);
        else
                printf("profile: %s\n", profile);
        if (c->output.plot != PLOT_NONE && r >= 0 && ret == 0 && st->n_points > 0) {
                r = report_plot(csv, script, image, c->model, &sp->sla);
                if (r == REPORT_E_NO_GNUPLOT)
                        log_warning("gnuplot is not installed: no plot drawn; the script is %s "
                                    "(install gnuplot-nox and run: gnuplot %s)", script, script);
                else if (r < 0)
                        log_warning("gnuplot failed on %s (run gnuplot %s to see why)", script,
                                    script);
                else
                        printf("plot:    %s\n", image);
        }
        return ret;
}

static void print_result(const struct search *st)
{
        char a[32], b[32];

        if (!st->found)
                return;
        const struct run_summary *s = &st->points[st->best].s;
        printf("rate:    %.4g req/s%s (TTFT p50 %.3f s p99 %.3f s, TBT p50 %.1f ms p99 %.1f ms)\n",
               st->rate, st->capped ? " (search ceiling)" : "", s->ttft_p50, s->ttft_p99,
               s->tbt_p50 * 1e3, s->tbt_p99 * 1e3);
        printf("memory:  %s free of %s KV cache: %s\n", format_size(a, sizeof(a), st->free_memory),
               format_size(b, sizeof(b), st->kv_capacity), role_names[st->role]);
        for (size_t i = 0; i < st->n_bursts; i++)
                printf("swap:    %gx burst needs %s\n", st->bursts[i].factor,
                       format_size(a, sizeof(a), st->bursts[i].swap));
}

/* What the server did that a well-behaved OpenAI-compatible one does not, in words. */
static void warn_notes(const struct search *st)
{
        static const struct {
                size_t offset;
                const char *what;
        } says[] = {
#define N(f) offsetof(struct run_notes, f)
            {N(http_status), "answered an HTTP error status"},
            {N(overloaded), "answered 429 or 503 (the server shed load)"},
            {N(transport), "failed in transport (refused, timed out or broken mid-stream)"},
            {N(dropped), "ended the stream without [DONE] or a finish reason"},
            {N(cut_short), "stopped before max_tokens with no finish reason (interrupted)"},
            {N(error_event), "sent an error inside the stream"},
            {N(bad_event), "sent an event that is not JSON"},
            {N(no_tokens), "streamed no text"},
            {N(no_usage), "completed without usage (prompt tokens estimated, tokens counted "
                          "as events)"},
            {N(ended_early), "finished before max_tokens (the server ignores ignore_eos)"},
#undef N
        };

        for (size_t i = 0; i < sizeof(says) / sizeof(says[0]); i++) {
                size_t n = *(const size_t *)((const char *)&st->notes + says[i].offset);
                if (n)
                        log_warning("server: %zu request%s %s", n, n == 1 ? "" : "s", says[i].what);
        }
        if (st->first_failure)
                log_warning("server: the first failure: %s", st->first_failure);
        if (st->found && !st->kv_from_metrics && st->metrics_error)
                log_warning("No KV-cache gauge (%s): free memory is the load generator's "
                            "estimate",
                            st->metrics_error);
}

static void help(void)
{
        printf("Usage: aqua-profile [OPTIONS] CONFIG\n"
               "       aqua-profile probe [-o FILE] [--size SIZE] [--iters N] [--host NAME]\n"
               "       aqua-profile merge [-o FILE] [--fabric-bandwidth BW] FILE...\n\n"
               "Find the highest request rate a model sustains within its SLA, the memory it\n"
               "leaves free there, whether it lends (producer) or borrows (consumer), and the\n"
               "swap space bursts need. Writes NAME.profile.yaml (for aqua-place),\n"
               "NAME.summary.yaml, NAME.csv and a plot into the output directory.\n\n"
               "  -o, --output DIR   output directory (overrides output.directory)\n"
               "  -q, --quiet        no progress line\n"
               "  -v, --verbose      debug messages\n"
               "  -h, --help         this text\n"
               "      --version      print the version\n\n"
               "The probe measures GPU pair bandwidth and writes a topology file; merge joins\n"
               "the files of several hosts into one of their NVLink domain; see\n"
               "aqua-profile probe --help and aqua-profile merge --help.\n");
}

static struct profile_config cfg;
static void cfg_free(void)
{
        profile_config_free(&cfg);
}

int main(int argc, char **argv)
{
        static const struct option opts[] = {
                {"output", required_argument, NULL, 'o'},
                {"quiet", no_argument, NULL, 'q'},
                {"verbose", no_argument, NULL, 'v'},
                {"help", no_argument, NULL, 'h'},
                {"version", no_argument, NULL, 'V'},
                {},
        };
        _cleanup_(request_pool_done) struct request_pool pool = {0};
        _cleanup_(target_freep) struct target *target = NULL;
        _cleanup_(search_done) struct search st = {0};
        _cleanup_free_ double *trace = NULL;
        _cleanup_free_ char *error = NULL;
        const char *outdir = NULL;
        struct progress pr = {.tty = isatty(STDERR_FILENO)};
        struct search_params sp;
        size_t n_trace = 0;
        bool quiet = false;
        int c, r;

        log_setup("aqua-profile", LOG_LEVEL_INFO);
        if (argc >= 2 && strcmp(argv[1], "probe") == 0)
                return probe_main(argc - 1, argv + 1);
        if (argc >= 2 && strcmp(argv[1], "merge") == 0)
                return merge_main(argc - 1, argv + 1);

        while ((c = getopt_long(argc, argv, "o:qvh", opts, NULL)) >= 0) {
                switch (c) {
                case 'o':
                        outdir = optarg;
                        break;
                case 'q':
                        quiet = true;
                        break;
                case 'v':
                        log_set_max_level(LOG_LEVEL_DEBUG);
                        break;
                case 'h':
                        help();
                        return 0;
                case 'V':
                        printf("aqua-profile %s\n", AQUA_PACKAGE_VERSION);
                        return 0;
                default:
                        return 2;
                }
        }
        if (optind != argc - 1) {
                log_error("Expected one config file; see --help");
                return 2;
        }

        atexit(cfg_free);
        r = profile_config_load(argv[optind], &cfg, &error);
        if (r == -EINVAL) {
                log_error("%s", error ? error : "invalid configuration");
                return 1;
        }
        if (r < 0) {
                log_error_errno(r, "Failed to read %s: %m", argv[optind]);
                return 1;
        }
        if (outdir) {
                free(cfg.output.directory);
                cfg.output.directory = strdup(outdir);
                if (!cfg.output.directory)
                        return log_error_errno(ENOMEM, "Out of memory"), 1;
        }

        if (load_pool(&cfg, &pool) < 0)
                return 1;
        if (cfg.workload.arrivals == ARRIVAL_TRACE) {
                r = trace_load(cfg.workload.trace, &trace, &n_trace, &error);
                if (r == WORKLOAD_E_MALFORMED)
                        return log_error("%s", error), 1;
                if (r < 0)
                        return log_error_errno(r, "Failed to read trace %s: %m",
                                               cfg.workload.trace), 1;
        }
        r = make_target(&cfg, &target);
        if (r < 0)
                return log_error_errno(r, "Failed to set up the %s target: %m%s",
                                       target_kind_names[cfg.target.kind],
                                       cfg.target.kind == TARGET_KIND_ENGINE_MODEL
                                               ? " (do the weights leave room for KV cache?)"
                                               : ""), 1;

        sp = (struct search_params){
                .sla = {.ttft = (double)cfg.sla.ttft / NSEC_PER_SEC,
                        .ttft_percentile = cfg.sla.ttft_percentile,
                        .tbt = (double)cfg.sla.tbt / NSEC_PER_SEC,
                        .tbt_percentile = cfg.sla.tbt_percentile,
                        .max_failure_rate = cfg.sla.max_failure_rate},
                .start_rate = cfg.search.start_rate,
                .min_rate = cfg.search.min_rate,
                .max_rate = cfg.search.max_rate,
                .tolerance = cfg.search.tolerance,
                .max_steps = (int)cfg.search.max_steps,
                .arrival = cfg.workload.arrivals,
                .duration = (double)cfg.workload.duration / NSEC_PER_SEC,
                .warmup = (double)cfg.workload.warmup / NSEC_PER_SEC,
                .min_requests = cfg.workload.min_requests,
                .seed = (uint64_t)cfg.workload.seed,
                .trace = trace,
                .n_trace = n_trace,
                .producer_threshold = cfg.roles.producer_threshold,
                .bursts = cfg.roles.bursts,
                .n_bursts = cfg.roles.n_bursts,
                .burst_duration = (double)cfg.roles.burst_duration / NSEC_PER_SEC,
        };

        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
        r = search_run(target, &pool, &sp, &cancelled, quiet ? NULL : show_progress, &pr, &st);
        if (pr.tty && !quiet && pr.step > 0)
                fputc('\n', stderr);
        switch (r) {
        case 0:
                break;
        case SEARCH_E_CANCELLED:
                log_warning("Interrupted: writing what was measured so far");
                break;
        case SEARCH_E_UNATTAINABLE:
        case SEARCH_E_TARGET:
                log_error("%s", st.error ? st.error : "search failed");
                break;
        default:
                log_error_errno(r, "Search failed: %m");
        }
        warn_notes(&st);
        print_result(&st);
        if (st.n_points > 0 && write_outputs(&cfg, &sp, &st, r) < 0)
                return 1;
        return r == 0 ? 0 : r == SEARCH_E_CANCELLED ? 130 : 1;
}
