/* aqua-profile's config: defaults, and the messages for settings that do not fit together. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "config.h"
#include "target-http.h"
#include "time-util.h"

static int load(const char *yaml, struct profile_config *c, char **error)
{
        return profile_config_load_buffer("t.yaml", yaml, strlen(yaml), c, error);
}

Test(config, a_model_name_is_all_it_takes)
{
        struct profile_config c;
        char *error = NULL;

        cr_assert_eq(load("model: m\n", &c, &error), 0, "%s", error);
        cr_assert_str_eq(c.model, "m");
        cr_assert_eq(c.target.kind, TARGET_KIND_ENGINE_MODEL);
        cr_assert_eq(c.sla.ttft, NSEC_PER_SEC);
        cr_assert_eq(c.sla.tbt, 100 * NSEC_PER_MSEC);
        cr_assert_eq(c.roles.n_bursts, 3);
        cr_assert_str_eq(c.output.directory, ".");
        profile_config_free(&c);
}

Test(config, every_section_is_read)
{
        struct profile_config c;
        char *error = NULL;

        cr_assert_eq(load("model: m\ntp: 2\nkv-bytes-per-token: 64KiB\n"
                          "target: {kind: http, url: 'http://h:8000/v1/chat/completions', api: chat,"
                          " kv-cache: 30GiB, metrics-url: 'http://h:8000/metrics'}\n"
                          "workload: {arrivals: uniform, duration: 30s, warmup: 5s,"
                          " output-tokens: {distribution: uniform, min: 10, max: 20}}\n"
                          "sla: {ttft: 500ms, tbt: 50ms, tbt-percentile: 90}\n"
                          "roles: {bursts: [2, 3], plan-burst: 3}\n"
                          "output: {directory: out, plot: svg}\n",
                          &c, &error),
                     0, "%s", error);
        cr_assert_eq(c.target.kind, TARGET_KIND_HTTP);
        cr_assert_eq(c.target.api, HTTP_API_CHAT);
        cr_assert_eq(c.target.kv_cache, 30ull << 30);
        cr_assert_eq(c.kv_bytes_per_token, 64 << 10);
        cr_assert_eq(c.workload.arrivals, ARRIVAL_UNIFORM);
        cr_assert_eq(c.workload.output.dist, LENGTH_UNIFORM);
        cr_assert_eq(c.sla.tbt, 50 * NSEC_PER_MSEC);
        cr_assert_float_eq(c.sla.tbt_percentile, 90, 1e-12);
        cr_assert_eq(c.roles.n_bursts, 2);
        cr_assert_eq(c.output.plot, PLOT_SVG);
        profile_config_free(&c);
}

static void expect_error(const char *yaml, const char *needle)
{
        struct profile_config c;
        char *error = NULL;

        cr_assert_eq(load(yaml, &c, &error), -EINVAL, "accepted: %s", yaml);
        cr_assert(error && strstr(error, needle), "got: %s", error);
        free(error);
        profile_config_free(&c);
}

Test(config, settings_that_do_not_fit_together_are_named)
{
        expect_error("model: m\ntarget: {kind: http}\n", "t.yaml: target.url: required");
        expect_error("model: m\ntarget: {kind: http, url: 'http://x'}\n", "target.kv-cache");
        expect_error("model: m\nroles: {plan-burst: 3}\n", "roles.plan-burst: 3 is not one of");
        expect_error("model: m\nsearch: {min-rate: 5, max-rate: 1}\n", "search.min-rate");
        expect_error("model: m\nworkload: {arrivals: trace}\n", "workload.trace: required");
        expect_error("model: m\nworkload: {duration: 10s, warmup: 20s}\n", "workload.warmup");
        expect_error("model: m\nworkload: {prompt-tokens: {mean: 5, min: 10, max: 20}}\n",
                     "workload.prompt-tokens");
}

Test(config, the_loader_names_line_and_key)
{
        expect_error("model: m\nsla:\n  tbt: soon\n", "t.yaml:3:");
        expect_error("model: m\nsla:\n  tbt: soon\n", "sla.tbt");
        expect_error("model: m\ncolour: blue\n", "unknown key");
        expect_error("tp: 1\n", "model");
}
