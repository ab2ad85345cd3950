/* Profile, summary, CSV and plot files, each written whole or not at all. */
#include "report.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "parse-util.h"
#include "util.h"

static const char *const phase_names[] = {"preflight", "search", "burst"};

void yaml_put_string(FILE *f, const char *s)
{
        fputc('"', f);
        for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
                if (*p == '"' || *p == '\\')
                        fprintf(f, "\\%c", *p);
                else if (*p < 0x20 || *p == 0x7f)
                        fprintf(f, "\\x%02x", *p);
                else
                        fputc(*p, f);
        }
        fputc('"', f);
}

int write_file_atomic(const char *path, int (*fill)(FILE *f, const void *userdata),
                      const void *userdata)
{
        _cleanup_free_ char *tmp = NULL;
        FILE *f;
        int fd, r;

        if (asprintf(&tmp, "%s.XXXXXX", path) < 0)
                return -ENOMEM;
        fd = mkostemp(tmp, O_CLOEXEC);
        if (fd < 0)
                return -errno;
        f = fdopen(fd, "w");
        if (!f) {
                r = -errno;
                close(fd);
                unlink(tmp);
                return r;
        }
        r = fill(f, userdata);
        if (fflush(f) != 0 && r >= 0)
                r = -errno;
        if (r >= 0 && fchmod(fd, 0644) < 0)
                r = -errno;
        if (fclose(f) != 0 && r >= 0)
                r = -errno;
        if (r >= 0 && rename(tmp, path) < 0)
                r = -errno;
        if (r < 0)
                unlink(tmp);
        return r;
}

struct report_ctx {
        const struct report_info *info;
        const struct search *st;
        uint64_t memory;
};

static const struct burst_need *plan_need(const struct report_info *info, const struct search *st)
{
        for (size_t i = 0; i < st->n_bursts; i++)
                if (st->bursts[i].factor == info->plan_burst)
                        return &st->bursts[i];
        return NULL;
}

static void comment_size(FILE *f, uint64_t bytes)
{
        char buf[32];

        fprintf(f, "  # %s\n", format_size(buf, sizeof(buf), bytes));
}

static int fill_profile(FILE *f, const void *userdata)
{
        const struct report_ctx *c = userdata;
        const struct search_params *p = c->info->params;
        const struct search_point *best = &c->st->points[c->st->best];

        fprintf(f, "# Model profile written by aqua-profile (%s target).\n", c->info->target);
        fprintf(f, "# Highest rate meeting the SLA (TTFT p%g <= %g s, TBT p%g <= %g ms): "
                   "%.4g req/s%s;\n",
                p->sla.ttft_percentile, p->sla.ttft, p->sla.tbt_percentile, p->sla.tbt * 1e3,
                c->st->rate, c->st->capped ? " (the search's ceiling)" : "");
        fprintf(f, "# there TTFT p99 %.3f s, TBT p99 %.1f ms.\n", best->s.ttft_p99,
                best->s.tbt_p99 * 1e3);
        if (c->st->role == ROLE_PRODUCER)
                fprintf(f, "# memory: HBM free at that rate, which it can lend.\n");
        else
                fprintf(f, "# memory: swap space a %gx burst needs beyond its KV cache.\n",
                        c->info->plan_burst);
        fputs("name: ", f);
        yaml_put_string(f, c->info->model);
        fprintf(f, "\nrole: %s\n", role_names[c->st->role]);
        fprintf(f, "memory: %" PRIu64, c->memory);
        comment_size(f, c->memory);
        fprintf(f, "tp: %" PRId64 "\n", c->info->tp > 0 ? c->info->tp : 1);
        if (c->info->gpu_memory) {
                fprintf(f, "gpu-memory: %" PRIu64, c->info->gpu_memory);
                comment_size(f, c->info->gpu_memory);
        }
        return 0;
}

int report_write_profile(const char *path, const struct report_info *info, const struct search *st)
{
        struct report_ctx c = {info, st, 0};

        if (!st->found)
                return REPORT_E_INCOMPLETE;
        if (st->role == ROLE_PRODUCER)
                c.memory = st->free_memory;
        else {
                const struct burst_need *b = plan_need(info, st);
                if (!b)
                        return REPORT_E_INCOMPLETE;
                c.memory = b->swap;
        }
        return write_file_atomic(path, fill_profile, &c);
}

static void put_summary(FILE *f, const char *indent, const struct run_summary *s)
{
        fprintf(f, "%srequests: %zu\n", indent, s->n_requests);
        fprintf(f, "%sfailed: %zu\n", indent, s->n_failed);
        fprintf(f, "%sttft-p50: %.6f\n", indent, s->ttft_p50);
        fprintf(f, "%sttft-p99: %.6f\n", indent, s->ttft_p99);
        fprintf(f, "%stbt-p50: %.6f\n", indent, s->tbt_p50);
        fprintf(f, "%stbt-p99: %.6f\n", indent, s->tbt_p99);
        /* At the SLA's own percentiles, which need not be 50 or 99. */
        fprintf(f, "%sttft-sla: %.6f\n", indent, s->ttft_sla);
        fprintf(f, "%stbt-sla: %.6f\n", indent, s->tbt_sla);
        fprintf(f, "%sthroughput: %.4f\n", indent, s->throughput);
        fprintf(f, "%stokens-per-second: %.2f\n", indent, s->token_throughput);
        fprintf(f, "%speak-kv-demand: %" PRIu64 "\n", indent, s->peak_kv_demand);
}

/* The nonzero counts of n as a flow mapping, or nothing when all are zero. */
static void put_notes(FILE *f, const char *indent, const char *key, const struct run_notes *n)
{
        const char *sep = "";

        if (!run_notes_any(n))
                return;
        fprintf(f, "%s%s: {", indent, key);
#define PUT(field, name)                                                                           \
        if (n->field) {                                                                            \
                fprintf(f, "%s%s: %zu", sep, name, n->field);                                      \
                sep = ", ";                                                                        \
        }
        RUN_NOTES_FIELDS(PUT)
#undef PUT
        fputs("}\n", f);
}

static int fill_summary(FILE *f, const void *userdata)
{
        const struct report_ctx *c = userdata;
        const struct search *st = c->st;
        const struct search_params *p = c->info->params;

        fprintf(f, "# Everything aqua-profile measured; seconds, bytes, requests per second.\n");
        fputs("name: ", f);
        yaml_put_string(f, c->info->model);
        fprintf(f, "\ntarget: %s\n", c->info->target);
        fprintf(f, "complete: %s\n", st->complete ? "true" : "false");
        fprintf(f, "sla:\n  ttft: %g\n  ttft-percentile: %g\n  tbt: %g\n  tbt-percentile: %g\n"
                   "  max-failure-rate: %g\n",
                p->sla.ttft, p->sla.ttft_percentile, p->sla.tbt, p->sla.tbt_percentile,
                p->sla.max_failure_rate);
        fprintf(f, "kv-cache: %" PRIu64 "\n", st->kv_capacity);
        if (st->found) {
                fprintf(f, "rate: %.6g\n", st->rate);
                fprintf(f, "rate-capped: %s\n", st->capped ? "true" : "false");
                fprintf(f, "at-rate:\n");
                put_summary(f, "  ", &st->points[st->best].s);
                if (st->points[st->best].kv_usage_peak >= 0)
                        fprintf(f, "  kv-usage-peak: %.4f\n", st->points[st->best].kv_usage_peak);
                fprintf(f, "free-memory: %" PRIu64 "\n", st->free_memory);
                fprintf(f, "free-memory-source: %s\n",
                        st->kv_from_metrics ? "metrics" : "estimate");
                fprintf(f, "role: %s\n", role_names[st->role]);
        }
        if (st->metrics_error) {
                fputs("metrics-error: ", f);
                yaml_put_string(f, st->metrics_error);
                fputc('\n', f);
        }
        /* What the server did that it should not have (profiler/README.md), over every run. */
        put_notes(f, "", "server-notes", &st->notes);
        if (st->first_failure) {
                fputs("first-failure: ", f);
                yaml_put_string(f, st->first_failure);
                fputc('\n', f);
        }
        if (st->n_bursts > 0) {
                fprintf(f, "swap:\n");
                for (size_t i = 0; i < st->n_bursts; i++)
                        fprintf(f, "  - burst: %g\n    peak-kv-demand: %" PRIu64
                                   "\n    bytes: %" PRIu64 "\n",
                                st->bursts[i].factor, st->bursts[i].peak_demand,
                                st->bursts[i].swap);
        }
        fprintf(f, "runs:\n");
        for (size_t i = 0; i < st->n_points; i++) {
                const struct search_point *pt = &st->points[i];

                fprintf(f, "  - phase: %s\n    rate: %.6g\n    burst: %g\n    meets-sla: %s\n",
                        phase_names[pt->phase], pt->rate, pt->burst, pt->meets ? "true" : "false");
                put_summary(f, "    ", &pt->s);
                put_notes(f, "    ", "notes", &pt->notes);
        }
        return 0;
}

int report_write_summary(const char *path, const struct report_info *info, const struct search *st)
{
        struct report_ctx c = {info, st, 0};

        return write_file_atomic(path, fill_summary, &c);
}

static int fill_csv(FILE *f, const void *userdata)
{
        const struct search *st = userdata;

        fprintf(f, "phase,rate,burst,meets_sla,requests,failed,ttft_p50,ttft_p99,tbt_p50,tbt_p99,"
                   "throughput,tokens_per_s,peak_kv_demand\n");
        for (size_t i = 0; i < st->n_points; i++) {
                const struct search_point *pt = &st->points[i];
                const struct run_summary *s = &pt->s;

                fprintf(f, "%s,%.6g,%g,%d,%zu,%zu,%.6f,%.6f,%.6f,%.6f,%.4f,%.2f,%" PRIu64 "\n",
                        phase_names[pt->phase], pt->rate, pt->burst, pt->meets, s->n_requests,
                        s->n_failed, s->ttft_p50, s->ttft_p99, s->tbt_p50, s->tbt_p99,
                        s->throughput, s->token_throughput, s->peak_kv_demand);
        }
        return 0;
}

int report_write_csv(const char *path, const struct search *st)
{
        return write_file_atomic(path, fill_csv, st);
}

static bool in_path(const char *prog)
{
        const char *path = getenv("PATH");
        _cleanup_free_ char *copy = NULL;
        char *save = NULL;

        if (!path || !(copy = strdup(path)))
                return false;
        for (char *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
                char full[PATH_MAX];

                if (snprintf(full, sizeof(full), "%s/%s", d, prog) < (int)sizeof(full) &&
                    access(full, X_OK) == 0)
                        return true;
        }
        return false;
}

struct plot_ctx {
        const char *csv, *image, *title;
        const struct sla *sla;
};

static void put_gp_string(FILE *f, const char *s)
{
        /* gnuplot single-quoted strings: a quote is written twice. */
        fputc('\'', f);
        for (; *s; s++) {
                if (*s == '\'')
                        fputc('\'', f);
                fputc(*s, f);
        }
        fputc('\'', f);
}

static int fill_plot(FILE *f, const void *userdata)
{
        const struct plot_ctx *c = userdata;
        const char *ext = strrchr(c->image, '.');
        bool svg = ext && strcmp(ext, ".svg") == 0;

        fprintf(f, "# TTFT and TBT against request rate; run: gnuplot THIS_FILE\n");
        fprintf(f, "set terminal %s size 1100,500\n", svg ? "svg" : "pngcairo");
        fputs("set output ", f);
        put_gp_string(f, c->image);
        fputs("\nset datafile separator ','\nset key top left\nset grid\n", f);
        fputs("set logscale y\nset xlabel 'rate (requests/s)'\n", f);
        fputs("set multiplot layout 1,2 title ", f);
        put_gp_string(f, c->title);
        fputs("\nsearch(col) = strcol(1) eq 'search' ? column(col) : NaN\n", f);
        fputs("set ylabel 'TTFT (s)'\nplot ", f);
        put_gp_string(f, c->csv);
        fputs(" using 2:(search(7)) smooth unique with linespoints title 'TTFT p50', ''"
              " using 2:(search(8)) smooth unique with linespoints title 'TTFT p99'", f);
        if (c->sla)
                fprintf(f, ", %g with lines dashtype 2 title 'SLA (p%g)'", c->sla->ttft,
                        c->sla->ttft_percentile);
        fputs("\n", f);
        fputs("set ylabel 'TBT (ms)'\nplot ", f);
        put_gp_string(f, c->csv);
        fputs(" using 2:(search(9)*1000) smooth unique with linespoints title 'TBT p50', ''"
              " using 2:(search(10)*1000) smooth unique with linespoints title 'TBT p99'", f);
        if (c->sla)
                fprintf(f, ", %g with lines dashtype 2 title 'SLA (p%g)'", c->sla->tbt * 1e3,
                        c->sla->tbt_percentile);
        fputs("\n", f);
        fputs("unset multiplot\n", f);
        return 0;
}

int report_plot(const char *csv_path, const char *script_path, const char *image_path,
                const char *title, const struct sla *sla)
{
        struct plot_ctx c = {csv_path, image_path, title, sla};
        int r, status;
        pid_t pid;

        r = write_file_atomic(script_path, fill_plot, &c);
        if (r < 0)
                return r;
        if (!in_path("gnuplot"))
                return REPORT_E_NO_GNUPLOT;
        pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                int null = open("/dev/null", O_RDWR | O_CLOEXEC);
                /* Its warnings (a one-point range, say) are noise; failure is reported by status. */
                if (null >= 0) {
                        dup2(null, STDIN_FILENO);
                        dup2(null, STDOUT_FILENO);
                        dup2(null, STDERR_FILENO);
                }
                execlp("gnuplot", "gnuplot", script_path, (char *)NULL);
                _exit(127);
        }
        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return -errno;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                return -EIO;
        return 0;
}
