/* Prometheus exposition text, histograms, and the HTTP endpoint driven from a poll loop as aquad
 * does. */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "prometheus.h"

static int render_sample(struct prom_text *t, void *userdata)
{
        const struct prom_label labels[] = {{"gpu", "0"}, {"client", "a \"quoted\"\\name\n"}};

        prom_family(t, "aqua_bytes_lent", "gauge", "Bytes a producer has lent.\nSecond line");
        prom_sample_u64(t, "aqua_bytes_lent", labels, 2, UINT64_C(85899345920));
        prom_sample_double(t, "aqua_load", NULL, 0, 0.25);
        if (userdata)
                (*(int *)userdata)++;
        return 0;
}

static char *render(prom_render_fn fn, void *userdata)
{
        char *s = NULL;
        size_t len = 0;

        cr_assert_eq(prom_render_string(fn, userdata, &s, &len), 0);
        cr_assert_eq(strlen(s), len);
        return s;
}

Test(prometheus, writes_help_type_and_escaped_labels)
{
        _cleanup_free_ char *s = render(render_sample, NULL);

        cr_assert_str_eq(s, "# HELP aqua_bytes_lent Bytes a producer has lent.\\nSecond line\n"
                            "# TYPE aqua_bytes_lent gauge\n"
                            "aqua_bytes_lent{gpu=\"0\",client=\"a \\\"quoted\\\"\\\\name\\n\"} "
                            "85899345920\n"
                            "aqua_load 0.25\n");
}

static struct prom_histogram hist;

static int render_histogram(struct prom_text *t, void *userdata)
{
        prom_histogram_write(t, "aqua_reclaim_seconds", "Reclaim latency.", &hist);
        return 0;
}

Test(prometheus, histogram_buckets_are_cumulative_and_upper_inclusive)
{
        static const double bounds[] = {0.01, 0.1, 1};
        _cleanup_free_ char *s = NULL;

        prom_histogram_init(&hist, bounds, 3);
        prom_histogram_observe(&hist, 0.005);
        prom_histogram_observe(&hist, 0.1);
        prom_histogram_observe(&hist, 0.5);
        prom_histogram_observe(&hist, 7);
        s = render(render_histogram, NULL);
        cr_assert_str_eq(s, "# HELP aqua_reclaim_seconds Reclaim latency.\n"
                            "# TYPE aqua_reclaim_seconds histogram\n"
                            "aqua_reclaim_seconds_bucket{le=\"0.01\"} 1\n"
                            "aqua_reclaim_seconds_bucket{le=\"0.1\"} 2\n"
                            "aqua_reclaim_seconds_bucket{le=\"1\"} 3\n"
                            "aqua_reclaim_seconds_bucket{le=\"+Inf\"} 4\n"
                            "aqua_reclaim_seconds_sum 7.6050000000000004\n"
                            "aqua_reclaim_seconds_count 4\n");
}

static int render_failing(struct prom_text *t, void *userdata)
{
        return -EIO;
}

Test(prometheus, refuses_addresses_that_are_not_host_and_port)
{
        static const char *const bad[] = {
            "9464",      ":9464",    "127.0.0.1:",     "127.0.0.1:http",
            "[::1]9464", "::1:9464", "127.0.0.1:70000"};
        struct prom_server *m = NULL;
        char err[256];

        for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
                cr_assert_eq(prom_server_new(bad[i], render_sample, NULL, &m, err, sizeof(err)),
                             -EINVAL, "%s", bad[i]);
                cr_assert(strstr(err, bad[i]), "%s", err);
                cr_assert_null(m);
        }
}

/* ------------------------------------------------------------------ over HTTP */

struct fetch {
        char url[128];
        const char *method; /* NULL: GET */
        long status;
        char *body;
        size_t len;
        char content_type[128];
        atomic_bool done;
};

static size_t collect(char *data, size_t size, size_t n, void *userdata)
{
        struct fetch *f = userdata;
        char *b = realloc(f->body, f->len + size * n + 1);

        if (!b)
                return 0;
        memcpy(b + f->len, data, size * n);
        f->len += size * n;
        b[f->len] = '\0';
        f->body = b;
        return size * n;
}

static void *fetch_main(void *arg)
{
        struct fetch *f = arg;
        CURL *c = curl_easy_init();
        char *ct = NULL;

        curl_easy_setopt(c, CURLOPT_URL, f->url);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, f);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
        if (f->method)
                curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, f->method);
        if (curl_easy_perform(c) == CURLE_OK) {
                curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &f->status);
                if (curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct) == CURLE_OK && ct)
                        snprintf(f->content_type, sizeof(f->content_type), "%s", ct);
        }
        curl_easy_cleanup(c);
        atomic_store(&f->done, true);
        return NULL;
}

/* Fetch path from m, running m from this thread's poll loop as aquad's loop runs it. */
static void fetch(struct prom_server *m, const char *path, const char *method, struct fetch *f)
{
        pthread_t th;

        memset(f, 0, sizeof(*f));
        snprintf(f->url, sizeof(f->url), "http://127.0.0.1:%u%s", prom_server_port(m), path);
        f->method = method;
        cr_assert_eq(pthread_create(&th, NULL, fetch_main, f), 0);
        while (!atomic_load(&f->done)) {
                struct pollfd p = {.fd = prom_server_fd(m), .events = POLLIN};
                int timeout = prom_server_timeout_ms(m);

                /* Short waits: the client's finishing is not an event on m's descriptor. */
                poll(&p, 1, timeout < 0 || timeout > 50 ? 50 : timeout);
                cr_assert_eq(prom_server_dispatch(m), 0);
        }
        pthread_join(th, NULL);
}

static struct prom_server *serve(prom_render_fn fn, void *userdata)
{
        struct prom_server *m = NULL;
        char err[256] = "";

        cr_assert_eq(prom_server_new("127.0.0.1:0", fn, userdata, &m, err, sizeof(err)), 0, "%s",
                     err);
        cr_assert_gt(prom_server_port(m), 0);
        cr_assert_geq(prom_server_fd(m), 0);
        return m;
}

Test(prometheus, serves_the_exposition_on_get_metrics)
{
        int renders = 0;
        _cleanup_(prom_server_freep) struct prom_server *m = serve(render_sample, &renders);
        struct fetch f;

        fetch(m, "/metrics", NULL, &f);
        cr_assert_eq(f.status, 200);
        cr_assert_str_eq(f.content_type, "text/plain; version=0.0.4; charset=utf-8");
        cr_assert(strstr(f.body, "aqua_bytes_lent{gpu=\"0\""), "%s", f.body);
        cr_assert(strstr(f.body, "\naqua_load 0.25\n"), "%s", f.body);
        cr_assert_eq(renders, 1);
        cr_assert_eq(prom_server_scrapes(m), 1);
        free(f.body);

        /* Each scrape renders afresh. */
        fetch(m, "/metrics", NULL, &f);
        cr_assert_eq(f.status, 200);
        cr_assert_eq(renders, 2);
        free(f.body);
}

Test(prometheus, answers_other_paths_and_methods_with_errors)
{
        _cleanup_(prom_server_freep) struct prom_server *m = serve(render_sample, NULL);
        struct fetch f;

        fetch(m, "/", NULL, &f);
        cr_assert_eq(f.status, 404);
        cr_assert_str_eq(f.body, "aquad serves /metrics\n");
        free(f.body);
        fetch(m, "/metrics", "DELETE", &f);
        cr_assert_eq(f.status, 405);
        free(f.body);
        cr_assert_eq(prom_server_scrapes(m), 0);
}

Test(prometheus, a_failing_render_is_a_server_error)
{
        _cleanup_(prom_server_freep) struct prom_server *m = serve(render_failing, NULL);
        struct fetch f;

        fetch(m, "/metrics", NULL, &f);
        cr_assert_eq(f.status, 500);
        free(f.body);
}

Test(prometheus, says_which_address_is_taken)
{
        _cleanup_(prom_server_freep) struct prom_server *m = serve(render_sample, NULL);
        struct prom_server *m2 = NULL;
        char address[64], err[256];

        snprintf(address, sizeof(address), "127.0.0.1:%u", prom_server_port(m));
        cr_assert_lt(prom_server_new(address, render_sample, NULL, &m2, err, sizeof(err)), 0);
        cr_assert(strstr(err, address), "%s", err);
        cr_assert_null(m2);
}
