/* Output files: the profile loads with the placer's schema, the summary and CSV hold every run, the plot draws. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf.h"
#include "report.h"
#include "util.h"

/* The keys aqua-place reads from a profile (placer/README.md), and nothing else. */
struct placer_profile {
        char *name;
        int role;
        uint64_t memory;
        int64_t tp;
        uint64_t gpu_memory;
};
static const struct conf_field placer_fields[] = {
        CONF_FIELD_STRING(struct placer_profile, name, "name", 0),
        CONF_FIELD_ENUM(struct placer_profile, role, "role", role_names, CONF_REQUIRED),
        CONF_FIELD_SIZE(struct placer_profile, memory, "memory", 0, INT64_C(1) << 50, CONF_REQUIRED),
        CONF_FIELD_INT(struct placer_profile, tp, "tp", 1, 4096, 0),
        CONF_FIELD_SIZE(struct placer_profile, gpu_memory, "gpu-memory", 0, INT64_C(1) << 50, 0),
        CONF_FIELD_END,
};
static const struct conf_schema placer_schema = {"profile", placer_fields};

static char dir[] = "/tmp/aqua-test-report-XXXXXX";
static struct search_params params;
static struct search st;
static struct burst_need needs[2];
static struct search_point points[3];

static void setup(void)
{
        cr_assert_not_null(mkdtemp(dir));
        params = (struct search_params){.sla = {1, 99, 0.1, 99, 0.01}};
        points[0] = (struct search_point){.phase = PHASE_SEARCH, .rate = 1, .burst = 1,
                                          .meets = true, .kv_usage_peak = -1,
                                          .s = {.n_requests = 10, .ttft_p50 = 0.1,
                                                .ttft_p99 = 0.2, .tbt_p50 = 0.02,
                                                .tbt_p99 = 0.05}};
        points[1] = points[0];
        points[1].rate = 2;
        points[1].meets = false;
        points[1].s.ttft_p99 = 3;
        points[2] = points[0];
        points[2].phase = PHASE_BURST;
        points[2].burst = 2;
        needs[0] = (struct burst_need){2, 5000, 0};
        needs[1] = (struct burst_need){4, 9000, 3 << 20};
        st = (struct search){.points = points, .n_points = 3, .found = true, .rate = 1,
                             .best = 0, .kv_capacity = 8000, .free_memory = 100,
                             .role = ROLE_CONSUMER, .bursts = needs, .n_bursts = 2,
                             .complete = true};
}

static void teardown(void)
{
        _cleanup_free_ char *cmd = NULL;

        cr_assert(asprintf(&cmd, "rm -rf '%s'", dir) > 0);
        cr_assert_eq(system(cmd), 0);
}

TestSuite(report, .init = setup, .fini = teardown);

static char *path_in(const char *name)
{
        char *p = NULL;

        cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
        return p;
}

static struct report_info info(const char *model)
{
        return (struct report_info){.model = model, .tp = 2, .gpu_memory = 80ull << 30,
                                    .target = "engine-model", .params = &params,
                                    .plan_burst = 4};
}

Test(report, a_consumer_profile_loads_with_the_placer_schema)
{
        _cleanup_free_ char *path = path_in("m.profile.yaml");
        struct report_info in = info("odd \"name\"\\ here");
        struct placer_profile pp = {.role = -1};
        char *error = NULL;

        cr_assert_eq(report_write_profile(path, &in, &st), 0);
        cr_assert_eq(conf_load(&placer_schema, path, &pp, &error), 0, "%s", error);
        cr_assert_str_eq(pp.name, "odd \"name\"\\ here");
        cr_assert_eq(pp.role, ROLE_CONSUMER);
        cr_assert_eq(pp.memory, 3 << 20, "the swap at the plan burst");
        cr_assert_eq(pp.tp, 2);
        cr_assert_eq(pp.gpu_memory, 80ull << 30);
        conf_free(&placer_schema, &pp);
}

Test(report, a_producer_lends_its_free_memory)
{
        _cleanup_free_ char *path = path_in("p.profile.yaml");
        struct report_info in = info("p");
        struct placer_profile pp = {.role = -1};
        char *error = NULL;

        st.role = ROLE_PRODUCER;
        cr_assert_eq(report_write_profile(path, &in, &st), 0);
        cr_assert_eq(conf_load(&placer_schema, path, &pp, &error), 0, "%s", error);
        cr_assert_eq(pp.role, ROLE_PRODUCER);
        cr_assert_eq(pp.memory, 100);
        conf_free(&placer_schema, &pp);
}

Test(report, no_profile_is_written_before_the_plan_burst_was_measured)
{
        _cleanup_free_ char *path = path_in("c.profile.yaml");
        struct report_info in = info("c");

        st.n_bursts = 1;
        cr_assert_eq(report_write_profile(path, &in, &st), REPORT_E_INCOMPLETE);
        cr_assert_neq(access(path, F_OK), 0);
        st.found = false;
        cr_assert_eq(report_write_profile(path, &in, &st), REPORT_E_INCOMPLETE);
}

static char *slurp(const char *path)
{
        FILE *f = fopen(path, "re");
        char *buf = calloc(1, 65536);

        cr_assert_not_null(f);
        cr_assert(fread(buf, 1, 65535, f) > 0);
        fclose(f);
        return buf;
}

Test(report, summary_and_csv_hold_every_run)
{
        _cleanup_free_ char *csv = path_in("m.csv"), *sum = path_in("m.summary.yaml");
        _cleanup_free_ char *c = NULL, *s = NULL;
        struct report_info in = info("m");
        size_t lines = 0;

        st.complete = false;
        cr_assert_eq(report_write_csv(csv, &st), 0);
        cr_assert_eq(report_write_summary(sum, &in, &st), 0);
        c = slurp(csv);
        for (char *p = c; *p; p++)
                lines += *p == '\n';
        cr_assert_eq(lines, 4, "a header and three runs");
        cr_assert(strncmp(c, "phase,rate,burst,meets_sla,", 27) == 0);
        cr_assert(strstr(c, "\nburst,1,2,1,10,"), "%s", c);
        s = slurp(sum);
        cr_assert(strstr(s, "complete: false\n"), "%s", s);
        cr_assert(strstr(s, "  - burst: 4\n    peak-kv-demand: 9000\n    bytes: 3145728\n"), "%s",
                  s);
}

Test(report, the_summary_says_what_the_server_did_and_where_free_memory_came_from)
{
        _cleanup_free_ char *sum = path_in("n.summary.yaml"), *s = NULL;
        struct report_info in = info("n");

        st.notes = (struct run_notes){.overloaded = 3, .no_usage = 7};
        points[1].notes = (struct run_notes){.overloaded = 3};
        st.first_failure = "http://x answered HTTP 503: busy";
        st.metrics_error = "http://x/metrics answered HTTP 404";
        cr_assert_eq(report_write_summary(sum, &in, &st), 0);
        s = slurp(sum);
        cr_assert(strstr(s, "free-memory-source: estimate\n"), "%s", s);
        cr_assert(strstr(s, "metrics-error: \"http://x/metrics answered HTTP 404\"\n"), "%s", s);
        cr_assert(strstr(s, "server-notes: {overloaded: 3, no-usage: 7}\n"), "%s", s);
        cr_assert(strstr(s, "first-failure: \"http://x answered HTTP 503: busy\"\n"), "%s", s);
        cr_assert(strstr(s, "    meets-sla: false\n"), "%s", s);
        cr_assert(strstr(s, "    notes: {overloaded: 3}\n"), "%s", s);
        cr_assert_eq(strstr(s, "notes: {}"), NULL, "runs without notes have none");
        st.notes = (struct run_notes){0};
        points[1].notes = (struct run_notes){0};
        st.first_failure = st.metrics_error = NULL;
}

Test(report, the_plot_is_drawn_or_its_absence_explained)
{
        _cleanup_free_ char *csv = path_in("m.csv"), *gp = path_in("m.gp"), *png = path_in("m.png");
        _cleanup_free_ char *old_path = getenv("PATH") ? strdup(getenv("PATH")) : NULL;
        struct stat sb;
        int r;

        cr_assert_eq(report_write_csv(csv, &st), 0);
        r = report_plot(csv, gp, png, "m's plot", &params.sla);
        cr_assert(r == 0 || r == REPORT_E_NO_GNUPLOT, "%d", r);
        cr_assert_eq(stat(gp, &sb), 0, "the script is always written");
        if (r == 0)
                cr_assert(stat(png, &sb) == 0 && sb.st_size > 0);

        setenv("PATH", "/nonexistent", 1);
        r = report_plot(csv, gp, png, "m", NULL);
        if (old_path)
                setenv("PATH", old_path, 1);
        cr_assert_eq(r, REPORT_E_NO_GNUPLOT);
}
