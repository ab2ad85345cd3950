/*
 * Operating a live aquad: after a lend/borrow/reclaim cycle driven over the raw protocol, the
 * aquactl program's tables and JSON, its changing commands and exit codes, the Prometheus
 * metrics scraped over HTTP, and the sd_notify messages systemd would get.
 */
#include <criterion/criterion.h>
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <json-c/json.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "curve.h"
#include "harness.h"
#include "rawclient.h"
#include "time-util.h"
#include "util.h"

#define MiB        (UINT64_C(1) << 20)
#define BODY(name) AQUA__ENVELOPE__BODY_##name

extern char **environ;

static struct aquad *daemon_;
static struct raw producer, consumer;
static uint16_t metrics_port;
static uint64_t lease_id;

static void teardown(void)
{
        raw_close(&producer);
        raw_close(&consumer);
        aquad_stop_in_teardown(daemon_);
        daemon_ = NULL;
}

TestSuite(ops, .fini = teardown);

/* A port nothing listens on now, for aquad's metrics address. */
static uint16_t free_port(void)
{
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof(sa);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

        cr_assert_geq(fd, 0);
        cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
        cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
        close(fd);
        return ntohs(sa.sin_port);
}

static void hello(struct raw *r, Aqua__Role role, const char *uuid, uint32_t ordinal,
                  const char *name, const char *peer)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *w;
        Aqua__Hello h = AQUA__HELLO__INIT;
        Aqua__PeerLink link = AQUA__PEER_LINK__INIT, *links[] = {&link};

        cr_assert_eq(raw_connect(r, aquad_endpoint(daemon_), aquad_side_path(daemon_)), 0);
        h.token = (ProtobufCBinaryData){.len = SIDE_TOKEN_LEN, .data = r->token};
        h.role = role;
        h.gpu_uuid = (char *)uuid;
        h.gpu_ordinal = ordinal;
        h.gpu_capacity = UINT64_C(80) << 30;
        h.granularity = 2 * MiB;
        h.client_name = (char *)name;
        link.gpu_uuid = (char *)peer;
        link.bandwidth_gbps = 450;
        h.links = links;
        h.n_links = 1;
        e.body_case = BODY(HELLO);
        e.hello = &h;
        w = raw_call(r, &e);
        cr_assert_not_null(w);
        cr_assert_eq(w->body_case, BODY(WELCOME), "hello: error %d", raw_error_code(w));
        raw_free(w);
}

static void load_report(struct raw *r, uint64_t migrations, uint64_t moved, uint64_t dram)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *a;
        Aqua__LoadReport l = AQUA__LOAD_REPORT__INIT;

        l.load = 0.5;
        l.migrations = migrations;
        l.bytes_moved = moved;
        l.dram_bytes = dram;
        e.body_case = BODY(LOAD);
        e.load = &l;
        a = raw_call(r, &e);
        cr_assert_eq(a->body_case, BODY(ACK));
        raw_free(a);
}

/* The consumer answers one reclaim notice by returning what it names. */
static void answer_reclaim(void)
{
        Aqua__Envelope *n, *done, e = AQUA__ENVELOPE__INIT;
        Aqua__Return rt = AQUA__RETURN__INIT;

        n = raw_wait(&consumer, 0, BODY(RECLAIM_NOTICE), RAW_TIMEOUT_MS);
        cr_assert_not_null(n, "no reclaim notice");
        rt.lease_id = n->reclaim_notice->lease_id;
        rt.chunk_ids = n->reclaim_notice->chunk_ids;
        rt.n_chunk_ids = n->reclaim_notice->n_chunk_ids;
        e.body_case = BODY(RETURN);
        e.return_ = &rt;
        done = raw_call(&consumer, &e);
        cr_assert_eq(done->body_case, BODY(RETURN_REPLY), "return: error %d", raw_error_code(done));
        raw_free(done);
        raw_free(n);
        /* The producer hears that its chunks are free. */
        n = raw_wait(&producer, 0, BODY(RECLAIMED), RAW_TIMEOUT_MS);
        cr_assert_not_null(n, "no Reclaimed notice");
        raw_free(n);
}

/*
 * Producer "whisper" (GPU 1) offers 4 x 2 MiB; consumer "vllm" (GPU 0) borrows 12 MiB with DRAM
 * allowed: 8 MiB in one lease, 4 MiB of DRAM budget. It reports 3 migrations of 6 MiB. The
 * producer reclaims 4 MiB: two leased chunks come back through the consumer. Left: one lease of
 * two chunks (4 MiB), 4 MiB of DRAM fallback.
 */
static void cycle_logged(const char *extra, bool logged)
{
        char config[2048];
        Aqua__Envelope *o, *g, *rr, e = AQUA__ENVELOPE__INIT;
        Aqua__ReclaimRequest rq = AQUA__RECLAIM_REQUEST__INIT;
        int fds[8];
        size_t n;

        metrics_port = free_port();
        snprintf(config, sizeof(config), "dram-budget: 64MiB\nmetrics: 127.0.0.1:%u\n%s",
                 metrics_port, extra ? extra : "");
        cr_assert_eq((logged ? aquad_start_logged : aquad_start)(config, &daemon_), 0,
                     "aquad did not start");
        hello(&producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", 1, "whisper", "GPU-C");
        hello(&consumer, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", 0, "vllm", "GPU-P");

        o = raw_offer(&producer, 4, 2 * MiB, NULL);
        cr_assert_eq(o->body_case, BODY(OFFER_REPLY), "offer: error %d", raw_error_code(o));
        raw_free(o);
        g = raw_borrow(&consumer, 12 * MiB, 2 * MiB, true, fds, 8, &n);
        cr_assert_eq(g->body_case, BODY(GRANT), "borrow: error %d", raw_error_code(g));
        cr_assert_eq(n, 4);
        cr_assert_eq(g->grant->dram_bytes, 4 * MiB);
        lease_id = g->grant->lease_id;
        raw_free(g);
        for (size_t i = 0; i < n; i++)
                close(fds[i]);
        load_report(&consumer, 3, 6 * MiB, 4 * MiB);

        rq.bytes = 4 * MiB;
        e.body_case = BODY(RECLAIM_REQUEST);
        e.reclaim_request = &rq;
        rr = raw_call(&producer, &e);
        cr_assert_eq(rr->body_case, BODY(RECLAIM_REPLY), "reclaim: error %d", raw_error_code(rr));
        cr_assert_eq(rr->reclaim_reply->n_pending_chunk_ids, 2);
        raw_free(rr);
        answer_reclaim();
}

static void cycle(const char *extra)
{
        cycle_logged(extra, false);
}

/* ------------------------------------------------------------------ aquactl */

struct run {
        int code;
        char out[16384];
        char err[4096];
};

static void slurp(int fd, char *buf, size_t len)
{
        size_t used = 0;
        ssize_t n;

        lseek(fd, 0, SEEK_SET);
        while (used + 1 < len && (n = read(fd, buf + used, len - 1 - used)) > 0)
                used += (size_t)n;
        buf[used] = '\0';
}

/* Run aquactl against the test's aquad with args (NULL-terminated). */
static void aquactl(struct run *res, const char *const *args)
{
        const char *exe = getenv("AQUACTL");
        char *argv[16];
        char out_path[] = "/tmp/test-ops-out-XXXXXX", err_path[] = "/tmp/test-ops-err-XXXXXX";
        int out = mkstemp(out_path), err = mkstemp(err_path), status;
        posix_spawn_file_actions_t fa;
        size_t n = 0;
        pid_t pid;

        cr_assert_not_null(exe, "AQUACTL is not set");
        argv[n++] = (char *)"aquactl";
        argv[n++] = (char *)"-e";
        argv[n++] = (char *)aquad_endpoint(daemon_);
        argv[n++] = (char *)"--side";
        argv[n++] = (char *)aquad_side_path(daemon_);
        for (; *args && n < ARRAY_SIZE(argv) - 1; args++)
                argv[n++] = (char *)*args;
        argv[n] = NULL;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, out, 1);
        posix_spawn_file_actions_adddup2(&fa, err, 2);
        cr_assert_eq(posix_spawn(&pid, exe, &fa, NULL, argv, environ), 0);
        posix_spawn_file_actions_destroy(&fa);
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFEXITED(status));
        res->code = WEXITSTATUS(status);
        slurp(out, res->out, sizeof(res->out));
        slurp(err, res->err, sizeof(res->err));
        close(out);
        close(err);
        unlink(out_path);
        unlink(err_path);
}

#define AQUACTL(res, ...) aquactl(res, (const char *const[]){__VA_ARGS__, NULL})

/* The line of text that contains all of the given words, or NULL. */
static const char *line_with(const char *text, const char *const *words)
{
        for (const char *line = text; line && *line;) {
                const char *end = strchr(line, '\n');
                size_t len = end ? (size_t)(end - line) : strlen(line);
                bool all = true;

                for (const char *const *w = words; *w && all; w++) {
                        const char *hit = memmem(line, len, *w, strlen(*w));
                        all = hit != NULL;
                }
                if (all)
                        return line;
                line = end ? end + 1 : NULL;
        }
        return NULL;
}

#define HAS_LINE(text, ...)                                                                        \
        cr_assert_not_null(line_with(text, (const char *const[]){__VA_ARGS__, NULL}),              \
                           "no line with " #__VA_ARGS__ " in:\n%s", text)

static struct json_object *json_run(const char *view)
{
        struct run r;
        struct json_object *o;

        AQUACTL(&r, "--json", view);
        cr_assert_eq(r.code, 0, "aquactl --json %s: %s", view, r.err);
        o = json_tokener_parse(r.out);
        cr_assert_not_null(o, "not JSON: %s", r.out);
        return o;
}

static struct json_object *get(struct json_object *o, const char *key)
{
        struct json_object *v = NULL;

        cr_assert(json_object_object_get_ex(o, key, &v), "no %s in %s", key,
                  json_object_to_json_string(o));
        return v;
}

Test(ops, aquactl_tables_show_the_cycle)
{
        struct run r;

        cycle(NULL);
        AQUACTL(&r, "gpus");
        cr_assert_eq(r.code, 0, "%s", r.err);
        HAS_LINE(r.out, "GPU-P", "producer", "whisper", "80 GiB", "4 MiB", "0", "ok");
        HAS_LINE(r.out, "GPU-C", "consumer", "vllm", "50%", "4 MiB", "1", "ok");

        AQUACTL(&r, "leases");
        cr_assert_eq(r.code, 0, "%s", r.err);
        /* Who holds what from whom, and the DRAM fallback per consumer. */
        HAS_LINE(r.out, "0 (vllm)", "1 (whisper)", "granted", "4 MiB", " 2 ");
        HAS_LINE(r.out, "CONSUMER", "BORROWED", "FROM", "DRAM FALLBACK");
        HAS_LINE(r.out, "0 (vllm)", "4 MiB", "1 (whisper)", "ok");

        AQUACTL(&r, "status");
        cr_assert_eq(r.code, 0, "%s", r.err);
        HAS_LINE(r.out, "gpus", "2: producer 1, consumer 1");
        HAS_LINE(r.out, "pool", "4 MiB offered, 4 MiB lent");
        HAS_LINE(r.out, "dram fallback", "4 MiB granted of 64 MiB budget");

        AQUACTL(&r, "pairs");
        HAS_LINE(r.out, "1 (whisper)", "0 (vllm)", "auto", "450 GB/s");
        AQUACTL(&r, "chunks");
        HAS_LINE(r.out, "2 chunks, 2 leased (4 MiB)");
        AQUACTL(&r, "events");
        HAS_LINE(r.out, "lease", "GPU-P");
}

Test(ops, aquactl_json_parses_to_the_same_figures)
{
        struct json_object *doc, *gpus, *l;
        bool seen_producer = false, seen_consumer = false;

        cycle(NULL);
        doc = json_run("status");
        cr_assert_eq(json_object_get_uint64(get(get(doc, "status"), "lent_bytes")), 4 * MiB);
        cr_assert_eq(json_object_get_uint64(get(get(doc, "status"), "pool_bytes")), 4 * MiB);
        cr_assert_eq(json_object_get_uint64(get(get(doc, "status"), "dram_granted")), 4 * MiB);
        gpus = get(doc, "gpus");
        cr_assert_eq(json_object_array_length(gpus), 2);
        for (size_t i = 0; i < 2; i++) {
                struct json_object *g = json_object_array_get_idx(gpus, i);
                const char *role = json_object_get_string(get(g, "role"));

                if (strcmp(role, "producer") == 0) {
                        seen_producer = true;
                        cr_assert_str_eq(json_object_get_string(get(g, "uuid")), "GPU-P");
                        cr_assert_eq(json_object_get_uint64(get(g, "lent_bytes")), 4 * MiB);
                        cr_assert_str_eq(json_object_get_string(get(g, "paired_with")), "GPU-C");
                } else if (strcmp(role, "consumer") == 0) {
                        seen_consumer = true;
                        cr_assert_eq(json_object_get_uint64(get(g, "borrowed_bytes")), 4 * MiB);
                        cr_assert_eq(json_object_get_uint64(get(g, "dram_bytes")), 4 * MiB);
                        cr_assert_str_eq(json_object_get_string(get(g, "client_name")), "vllm");
                }
        }
        cr_assert(seen_producer && seen_consumer);
        json_object_put(doc);

        doc = json_run("leases");
        cr_assert_eq(json_object_array_length(get(doc, "leases")), 1);
        l = json_object_array_get_idx(get(doc, "leases"), 0);
        cr_assert_eq(json_object_get_uint64(get(l, "lease_id")), lease_id);
        cr_assert_str_eq(json_object_get_string(get(l, "state")), "granted");
        cr_assert_eq(json_object_get_uint64(get(l, "bytes")), 4 * MiB);
        cr_assert_eq(json_object_get_int(get(l, "chunks")), 2);
        cr_assert_str_eq(json_object_get_string(get(l, "producer_uuid")), "GPU-P");
        cr_assert_str_eq(json_object_get_string(get(l, "consumer_uuid")), "GPU-C");
        json_object_put(doc);

        doc = json_run("chunks");
        cr_assert_eq(json_object_array_length(get(doc, "chunks")), 2);
        json_object_put(doc);
}

Test(ops, aquactl_changes_the_pool_and_names_what_went_wrong)
{
        struct json_object *doc;
        Aqua__Envelope *o;
        struct run r;

        cycle(NULL);
        AQUACTL(&r, "reclaim", "GPU-X", "2MiB");
        cr_assert_eq(r.code, 5, "%s", r.err);
        cr_assert(strstr(r.err, "unknown GPU 'GPU-X'"), "%s", r.err);

        AQUACTL(&r, "reclaim", "0", "2MiB");
        cr_assert_eq(r.code, 1, "%s", r.err);
        cr_assert(strstr(r.err, "(wrong-role)"), "%s", r.err);

        /* GPUs are named by ordinal too. */
        AQUACTL(&r, "reclaim", "1", "all");
        cr_assert_eq(r.code, 0, "%s", r.err);
        cr_assert_str_eq(r.out, "reclaiming everything lent from GPU 1\n");
        answer_reclaim();

        doc = json_run("leases");
        cr_assert_eq(json_object_array_length(get(doc, "leases")), 0);
        json_object_put(doc);

        AQUACTL(&r, "unpair", "GPU-P");
        cr_assert_eq(r.code, 0, "%s", r.err);
        AQUACTL(&r, "pair", "GPU-P", "GPU-C");
        cr_assert_eq(r.code, 0, "%s", r.err);
        AQUACTL(&r, "pairs");
        HAS_LINE(r.out, "1 (whisper)", "0 (vllm)", "aquactl");

        AQUACTL(&r, "drain", "GPU-P");
        cr_assert_eq(r.code, 0, "%s", r.err);
        AQUACTL(&r, "gpus");
        HAS_LINE(r.out, "GPU-P", "draining");

        /* The drain refuses the producer's offers with an outcome of its own, until undrain. */
        o = raw_offer(&producer, 1, 2 * MiB, NULL);
        cr_assert_eq(raw_error_code(o), AQUA__ERROR_CODE__ERROR_CODE_DRAINING, "offer: %d",
                     raw_error_code(o));
        raw_free(o);
        AQUACTL(&r, "undrain", "GPU-P");
        cr_assert_eq(r.code, 0, "%s", r.err);
        cr_assert_str_eq(r.out, "GPU GPU-P is no longer draining: it may offer again\n");
        o = raw_offer(&producer, 1, 2 * MiB, NULL);
        cr_assert_eq(o->body_case, BODY(OFFER_REPLY), "offer: error %d", raw_error_code(o));
        raw_free(o);
        AQUACTL(&r, "undrain", "GPU-P");
        cr_assert_eq(r.code, 1, "%s", r.out);
        cr_assert(strstr(r.err, "is not draining"), "%s", r.err);
}

Test(ops, aquactl_changes_need_the_admin_list)
{
        struct run r;

        /* Only uid 4242 may change things; the test runs as someone else. */
        cycle(getuid() == 4242 ? "admin: {users: [\"4243\"]}\n" : "admin: {users: [\"4242\"]}\n");
        AQUACTL(&r, "drain", "GPU-P");
        cr_assert_eq(r.code, 4, "%s", r.err);
        cr_assert(strstr(r.err, "permission denied"), "%s", r.err);
        /* So are the drain's end and a reload: another identity may not undo an operator's
         * drain nor make aquad read its config again. */
        AQUACTL(&r, "undrain", "GPU-P");
        cr_assert_eq(r.code, 4, "%s", r.err);
        AQUACTL(&r, "reload");
        cr_assert_eq(r.code, 4, "%s", r.err);
        cr_assert(strstr(r.err, "permission denied"), "%s", r.err);
        /* Looking is still allowed. */
        AQUACTL(&r, "leases");
        cr_assert_eq(r.code, 0, "%s", r.err);
}

/*
 * systemd's ExecReload runs aquactl reload: it returns only with aquad's verdict, exit status 1
 * and aquad's own error for a file aquad refuses (the running configuration kept), and names what
 * a reload does not change.
 */
Test(ops, aquactl_reload_waits_for_aquads_verdict)
{
        struct json_object *doc;
        char port[32];
        struct run r;

        cycle(NULL);
        cr_assert_eq(aquad_config_set(daemon_, "dram-budget", "128MiB"), 0);
        snprintf(port, sizeof(port), "127.0.0.1:%u", free_port());
        cr_assert_eq(aquad_config_set(daemon_, "metrics", port), 0);
        AQUACTL(&r, "reload");
        cr_assert_eq(r.code, 0, "%s", r.err);
        cr_assert_str_eq(r.out, "aquad reloaded its configuration\n"
                                "not changed until aquad restarts: metrics\n");
        doc = json_run("status");
        cr_assert_eq(json_object_get_uint64(get(get(doc, "status"), "dram_budget")), 128 * MiB);
        json_object_put(doc);

        cr_assert_eq(aquad_config_set(daemon_, "dram-budget", "lots"), 0);
        AQUACTL(&r, "reload");
        cr_assert_eq(r.code, 1, "a refused file must fail the reload: %s", r.out);
        cr_assert(strstr(r.err, "is refused, the running configuration is kept"), "%s", r.err);
        cr_assert(strstr(r.err, "dram-budget") && strstr(r.err, "lots"), "%s", r.err);
        doc = json_run("status");
        cr_assert_eq(json_object_get_uint64(get(get(doc, "status"), "dram_budget")), 128 * MiB);
        json_object_put(doc);

        AQUACTL(&r, "reload", "now");
        cr_assert_eq(r.code, 2, "%s", r.err);
}

/* A client chooses its name; aquactl must not pass its bytes on as they are. */
Test(ops, aquactl_shows_a_hostile_client_name_harmlessly)
{
        static const char name[] = "evil\xff\xfe\x1b[31mred\x1b]0;owned\x07";
        struct json_tokener *tok = json_tokener_new();
        struct json_object *doc, *gpus;
        const char *views[] = {"gpus", "pairs", "status", "events"};
        struct run r;

        cr_assert_eq(aquad_start(NULL, &daemon_), 0);
        hello(&producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", 1, name, "GPU-C");
        AQUACTL(&r, "--json", "gpus");
        cr_assert_eq(r.code, 0, "%s", r.err);
        json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
        doc = json_tokener_parse_ex(tok, r.out, (int)strlen(r.out));
        cr_assert_not_null(doc, "not valid JSON (%s): %s",
                           json_tokener_error_desc(json_tokener_get_error(tok)), r.out);
        gpus = get(doc, "gpus");
        cr_assert_eq(json_object_array_length(gpus), 1);
        cr_assert_str_eq(
            json_object_get_string(get(json_object_array_get_idx(gpus, 0), "client_name")),
            "evil\xef\xbf\xbd\xef\xbf\xbd\x1b[31mred\x1b]0;owned\x07");
        json_object_put(doc);
        json_tokener_free(tok);

        for (size_t i = 0; i < ARRAY_SIZE(views); i++) {
                AQUACTL(&r, views[i]);
                cr_assert_eq(r.code, 0, "%s: %s", views[i], r.err);
                cr_assert_null(strchr(r.out, '\x1b'), "%s: %s", views[i], r.out);
                cr_assert_null(strchr(r.out, '\x07'), "%s: %s", views[i], r.out);
                cr_assert_null(strchr(r.out, '\xff'), "%s: %s", views[i], r.out);
        }
        AQUACTL(&r, "gpus");
        HAS_LINE(r.out, "GPU-P", "evil\\xff\\xfe\\x1b[31mred\\x1b]0;owned\\x07");
}

/* ------------------------------------------------------------------ metrics */

static size_t collect(char *data, size_t size, size_t n, void *userdata)
{
        FILE *f = userdata;

        return fwrite(data, size, n, f) * size;
}

/* GET /metrics; returns the body (caller frees), or NULL with why in *ret_error. */
static char *scrape_try_why(char *error, size_t error_len)
{
        char url[64], *body = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&body, &len);
        CURL *c = curl_easy_init();
        long status = 0;
        CURLcode rc;

        snprintf(url, sizeof(url), "http://127.0.0.1:%u/metrics", metrics_port);
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, f);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
        rc = curl_easy_perform(c);
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(c);
        fclose(f);
        if (rc == CURLE_OK && status == 200)
                return body;
        snprintf(error, error_len, "%s, HTTP status %ld", curl_easy_strerror(rc), status);
        free(body);
        return NULL;
}

static char *scrape_try(void)
{
        char error[256];

        return scrape_try_why(error, sizeof(error));
}

static char *scrape(void)
{
        char error[256], *body = scrape_try_why(error, sizeof(error));

        cr_assert_not_null(body, "scrape: %s", error);
        return body;
}

/* The sample line "name value" is in the exposition (name includes its labels). */
#define HAS_SAMPLE(text, sample)                                                                   \
        cr_assert(strstr(text, "\n" sample "\n"), "no sample \"%s\" in:\n%s", sample, text)

Test(ops, metrics_count_the_cycle)
{
        _cleanup_free_ char *m = NULL, *m2 = NULL;
        Aqua__Envelope *bad;

        cycle(NULL);
        m = scrape();
        HAS_SAMPLE(m, "aqua_gpus{role=\"producer\"} 1");
        HAS_SAMPLE(m, "aqua_gpus{role=\"consumer\"} 1");
        HAS_SAMPLE(m, "aqua_clients{role=\"producer\"} 1");
        HAS_SAMPLE(m, "aqua_clients{role=\"consumer\"} 1");
        HAS_SAMPLE(m, "aqua_chunks{state=\"leased\"} 2");
        HAS_SAMPLE(m, "aqua_chunks{state=\"free\"} 0");
        HAS_SAMPLE(m, "aqua_leases{state=\"granted\"} 1");
        HAS_SAMPLE(m, "aqua_pool_bytes 4194304");
        HAS_SAMPLE(m, "aqua_lent_bytes 4194304");
        HAS_SAMPLE(m, "aqua_dram_granted_bytes 4194304");
        HAS_SAMPLE(m, "aqua_chunks_offered_total 4");
        HAS_SAMPLE(m, "aqua_leases_granted_total 1");
        HAS_SAMPLE(m, "aqua_gpu_lent_bytes{gpu=\"1\",uuid=\"GPU-P\"} 4194304");
        HAS_SAMPLE(m, "aqua_gpu_borrowed_bytes{gpu=\"0\",uuid=\"GPU-C\"} 4194304");
        HAS_SAMPLE(m, "aqua_gpu_dram_fallback_bytes{gpu=\"0\",uuid=\"GPU-C\"} 4194304");
        HAS_SAMPLE(m, "aqua_gpu_dram_in_use_bytes{gpu=\"0\",uuid=\"GPU-C\"} 4194304");
        HAS_SAMPLE(m, "aqua_gpu_reported_migrations_total{gpu=\"0\",uuid=\"GPU-C\"} 3");
        HAS_SAMPLE(m, "aqua_gpu_reported_moved_bytes_total{gpu=\"0\",uuid=\"GPU-C\"} 6291456");
        /* What aquad counts itself: the two chunks the consumer returned to the reclaim. */
        HAS_SAMPLE(m, "aqua_gpu_reclaim_returned_chunks_total{gpu=\"0\",uuid=\"GPU-C\"} 2");
        HAS_SAMPLE(m, "aqua_gpu_reclaim_returned_bytes_total{gpu=\"0\",uuid=\"GPU-C\"} 4194304");
        HAS_SAMPLE(m, "aqua_reclaim_returned_chunks_total 2");
        HAS_SAMPLE(m, "aqua_reclaim_returned_bytes_total 4194304");
        HAS_SAMPLE(m, "aqua_gpu_load_ratio{gpu=\"0\",uuid=\"GPU-C\"} 0.5");
        /* State as values, so that a change does not start a new series. */
        HAS_SAMPLE(m, "aqua_gpu_info{gpu=\"1\",uuid=\"GPU-P\",client=\"whisper\"} 1");
        HAS_SAMPLE(m, "aqua_gpu_role{gpu=\"1\",uuid=\"GPU-P\",role=\"producer\"} 1");
        HAS_SAMPLE(m, "aqua_gpu_role{gpu=\"1\",uuid=\"GPU-P\",role=\"consumer\"} 0");
        HAS_SAMPLE(m, "aqua_gpu_role{gpu=\"0\",uuid=\"GPU-C\",role=\"consumer\"} 1");
        HAS_SAMPLE(m, "aqua_gpu_connected{gpu=\"1\",uuid=\"GPU-P\"} 1");
        HAS_SAMPLE(m, "aqua_gpu_pair_info{gpu=\"1\",uuid=\"GPU-P\",paired_with=\"GPU-C\"} 1");
        /* Both reclaimed chunks came back, well inside the deadline. */
        HAS_SAMPLE(m, "aqua_reclaim_seconds_count 2");
        HAS_SAMPLE(m, "aqua_reclaim_seconds_bucket{le=\"+Inf\"} 2");
        HAS_SAMPLE(m, "aqua_deadline_misses_total 0");
        HAS_SAMPLE(m, "aqua_leases_lost_total 0");
        HAS_SAMPLE(m, "aqua_protocol_errors_total 0");
        HAS_SAMPLE(m, "aqua_side_frames_malformed_total 0");

        /* A message that is not an Envelope is a protocol error. */
        bad = raw_call_bytes(&consumer, "\xff\xff\xff", 3, 0);
        cr_assert_not_null(bad);
        raw_free(bad);
        m2 = scrape();
        HAS_SAMPLE(m2, "aqua_protocol_errors_total 1");
        HAS_SAMPLE(m2, "aqua_error_replies_total{code=\"malformed\"} 1");
}

static char *read_file(const char *path)
{
        char *text = NULL;
        size_t len = 0;
        FILE *f = fopen(path, "re");

        cr_assert_not_null(f, "%s: %s", path, strerror(errno));
        cr_assert_eq(getdelim(&text, &len, '\0', f) > 0, true, "%s is empty", path);
        fclose(f);
        return text;
}

/* An operator reads deploy/README.md's table to know what a family means: every family aquad
 * serves is named there, as `name` or `name{labels}`. */
Test(ops, every_metric_family_served_is_in_the_deploy_readme)
{
        _cleanup_free_ char *m = NULL, *doc = NULL;
        const char *path = getenv("AQUA_DEPLOY_README");
        char missing[2048] = "";
        size_t n = 0;

        cr_assert_not_null(path, "AQUA_DEPLOY_README is not set");
        doc = read_file(path);
        cycle(NULL);
        m = scrape();
        for (const char *at = strstr(m, "# TYPE "); at; at = strstr(at + 1, "# TYPE ")) {
                char name[128], plain[132], labelled[132];

                if (sscanf(at, "# TYPE %127s", name) != 1)
                        continue;
                n++;
                snprintf(plain, sizeof(plain), "`%s`", name);
                snprintf(labelled, sizeof(labelled), "`%s{", name);
                if (!strstr(doc, plain) && !strstr(doc, labelled))
                        snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing),
                                 " %s", name);
        }
        cr_assert_gt(n, 40, "only %zu families scraped", n);
        cr_assert_str_empty(missing, "families aquad serves that %s does not name:%s", path,
                            missing);
}

/* The families a Prometheus query text names (aqua_...), each once, into names[]. */
static size_t names_in(const char *text, char names[][128], size_t n, size_t max)
{
        for (const char *at = strstr(text, "aqua_"); at; at = strstr(at + 1, "aqua_")) {
                char name[128];
                size_t k = 0;
                bool seen = false;

                if (at > text && (isalnum((unsigned char)at[-1]) || at[-1] == '_'))
                        continue;
                while (k + 1 < sizeof(name) && (islower((unsigned char)at[k]) ||
                                                isdigit((unsigned char)at[k]) || at[k] == '_'))
                        name[k] = at[k], k++;
                name[k] = '\0';
                /* A recording rule's name (aqua_dashboard:...) is not a family. */
                if (at[k] == ':')
                        continue;
                for (size_t i = 0; i < n && !seen; i++)
                        seen = strcmp(names[i], name) == 0;
                if (!seen && n < max)
                        snprintf(names[n++], 128, "%s", name);
        }
        return n;
}

/* The alerting rules and the Grafana dashboard in deploy/ query only families aquad serves (a
 * histogram's by its _bucket, _sum and _count series): a rule or a panel on a name aquad does
 * not serve would stay silent or empty for ever. */
Test(ops, the_alert_rules_and_the_dashboard_query_only_what_aquad_serves)
{
        const char *dir = getenv("AQUA_DEPLOY_DIR");
        const char *files[] = {"prometheus/aqua-rules.yml", "prometheus/aqua-rules.test.yml",
                               "grafana/aqua.json"};
        static char names[256][128];
        _cleanup_free_ char *m = NULL;
        char missing[2048] = "";
        size_t n = 0;

        cr_assert_not_null(dir, "AQUA_DEPLOY_DIR is not set");
        for (size_t i = 0; i < ARRAY_SIZE(files); i++) {
                char path[PATH_MAX];
                _cleanup_free_ char *text = NULL;

                snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
                text = read_file(path);
                n = names_in(text, names, n, ARRAY_SIZE(names));
        }
        cr_assert_gt(n, 20, "only %zu families named", n);
        cycle(NULL);
        m = scrape();
        for (size_t i = 0; i < n; i++) {
                char family[128], type[160];
                size_t len = strlen(names[i]);

                /* aqua_reclaim_seconds_bucket is of the histogram aqua_reclaim_seconds. */
                snprintf(family, sizeof(family), "%s", names[i]);
                if (len > 7 && !strcmp(names[i] + len - 7, "_bucket"))
                        family[len - 7] = '\0';
                else if (len > 4 && (!strcmp(names[i] + len - 4, "_sum")))
                        family[len - 4] = '\0';
                else if (len > 6 && !strcmp(names[i] + len - 6, "_count"))
                        family[len - 6] = '\0';
                /* A domain's leader serves these (tests/domain/run scrapes them there). */
                if (!strncmp(family, "aqua_domain_", 12) || !strncmp(family, "aqua_etcd_", 10))
                        continue;
                snprintf(type, sizeof(type), "# TYPE %s ", family);
                if (!strstr(m, type))
                        snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing),
                                 " %s", names[i]);
        }
        cr_assert_str_empty(missing, "named in deploy/ but not served:%s", missing);
}

/* ------------------------------------------------------------------ remote.endpoint */

#define FLOOD 256

/* The value of a sample line "name value" in the exposition, or -1. */
static long long sample(const char *text, const char *name)
{
        char want[128];
        const char *at;

        snprintf(want, sizeof(want), "\n%s ", name);
        at = strstr(text, want);
        return at ? strtoll(at + strlen(want), NULL, 10) : -1;
}

static size_t count_lines_with(const char *path, const char *words)
{
        FILE *f = fopen(path, "r");
        char line[4096];
        size_t n = 0;

        cr_assert_not_null(f, "%s: %m", path);
        while (fgets(line, sizeof(line), f))
                n += strstr(line, words) != NULL;
        fclose(f);
        return n;
}

/* A folder with aquad's key pair and one listed client's, and aquad on remote.endpoint. */
struct remote_keys {
        char dir[64], ep[64];
        char server_file[300], admin_file[300], server_pub_file[320];
        char server_pub[CURVE_KEY_TEXT + 1], admin_pub[CURVE_KEY_TEXT + 1];
        unsigned port;
};

static void remote_cycle(struct remote_keys *k)
{
        struct passwd *pw = getpwuid(getuid());
        char extra[1024], err[256];

        snprintf(k->dir, sizeof(k->dir), "/tmp/test-ops-keys-XXXXXX");
        cr_assert_not_null(mkdtemp(k->dir));
        cr_assert_not_null(pw);
        snprintf(k->server_file, sizeof(k->server_file), "%s/server.key", k->dir);
        snprintf(k->server_pub_file, sizeof(k->server_pub_file), "%s.pub", k->server_file);
        snprintf(k->admin_file, sizeof(k->admin_file), "%s/admin.key", k->dir);
        cr_assert_eq(curve_keyfile_write(k->server_file, k->server_pub, err, sizeof(err)), 0, "%s",
                     err);
        cr_assert_eq(curve_keyfile_write(k->admin_file, k->admin_pub, err, sizeof(err)), 0, "%s",
                     err);
        k->port = free_port();
        snprintf(k->ep, sizeof(k->ep), "tcp://127.0.0.1:%u", k->port);
        snprintf(extra, sizeof(extra),
                 "remote:\n  endpoint: %s\n  key-file: %s\n  clients:\n    - user: %s\n"
                 "      keys: [\"%s\"]\n",
                 k->ep, k->server_file, pw->pw_name, k->admin_pub);
        cycle_logged(extra, true);
}

static void remote_keys_remove(struct remote_keys *k)
{
        char cmd[128];

        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", k->dir);
        cr_assert_eq(system(cmd), 0);
}

/*
 * FLOOD clients with keys nobody listed connect to remote.endpoint at once, while aquad may hold
 * fewer descriptors than there are connections: accept() runs out for ZeroMQ and for the
 * metrics endpoint alike. Every client is refused and counted, the log gets at most a line a
 * second for the refusals and for the metrics endpoint's failed accepts, the metrics endpoint
 * answers again once descriptors are back, and aquad serves on: local aquactl, a new local
 * client, the listed remote key; the lease it held is untouched, and it stops cleanly.
 */
Test(ops, a_flood_of_unknown_curve_keys_is_refused_counted_and_served_through)
{
        struct rlimit low = {.rlim_cur = 160, .rlim_max = 160};
        void *zctx = zmq_ctx_new(), *flood[FLOOD];
        long long refused = 0;
        uint64_t start, deadline;
        struct raw late = {0};
        struct remote_keys k;
        struct run r;

        remote_cycle(&k);
        /* Fewer descriptors than the flood has connections (aquad holds about 30 itself). */
        cr_assert_eq(prlimit(aquad_pid(daemon_), RLIMIT_NOFILE, &low, NULL), 0, "prlimit: %m");

        for (int i = 0; i < FLOOD; i++) {
                char pub[CURVE_KEY_TEXT + 1], sec[CURVE_KEY_TEXT + 1];
                int zero = 0;

                cr_assert_eq(zmq_curve_keypair(pub, sec), 0);
                flood[i] = zmq_socket(zctx, ZMQ_DEALER);
                cr_assert_not_null(flood[i], "socket %d: %s", i, zmq_strerror(errno));
                zmq_setsockopt(flood[i], ZMQ_LINGER, &zero, sizeof(zero));
                zmq_setsockopt(flood[i], ZMQ_CURVE_SERVERKEY, k.server_pub, CURVE_KEY_TEXT);
                zmq_setsockopt(flood[i], ZMQ_CURVE_PUBLICKEY, pub, CURVE_KEY_TEXT);
                zmq_setsockopt(flood[i], ZMQ_CURVE_SECRETKEY, sec, CURVE_KEY_TEXT);
                cr_assert_eq(zmq_connect(flood[i], k.ep), 0);
                zmq_send(flood[i], "x", 1, ZMQ_DONTWAIT);
        }
        start = now_mono_ns();
        deadline = start + 60 * NSEC_PER_SEC;
        while (refused < FLOOD && now_mono_ns() < deadline) {
                /* While the flood holds aquad's descriptors a scrape may find no room. */
                _cleanup_free_ char *m = scrape_try();

                if (m)
                        refused = sample(m, "aqua_remote_refused_total");
                usleep(100 * 1000);
        }
        /* Each at least once: past limits.unregistered waiting handshakes aquad stops the
         * endpoint for a moment, and clients cut off before theirs try again. */
        cr_assert_geq(refused, FLOOD, "%lld handshakes refused", refused);

        /* Served with the flood's sockets still open. */
        AQUACTL(&r, "leases");
        cr_assert_eq(r.code, 0, "aquactl leases: %s", r.err);
        cr_assert_not_null(strstr(r.out, "vllm"), "the lease is gone:\n%s", r.out);
        AQUACTL(&r, "-e", k.ep, "--server-key", k.server_pub_file, "--key-file", k.admin_file, "-t",
                "10s", "status");
        cr_assert_eq(r.code, 0, "remote aquactl status: %s", r.err);
        hello(&late, AQUA__ROLE__ROLE_NEUTRAL, "GPU-L", 2, "late", "GPU-P");
        raw_close(&late);

        for (int i = 0; i < FLOOD; i++)
                zmq_close(flood[i]);
        zmq_ctx_term(zctx);
        /* At most one line a second, each with the count of those it left out. */
        cr_assert_leq(count_lines_with(aquad_log_path(daemon_), "Refused a tcp client"),
                      (now_mono_ns() - start) / NSEC_PER_SEC + 2);
        cr_assert_leq(count_lines_with(aquad_log_path(daemon_), "metrics endpoint:"),
                      (now_mono_ns() - start) / NSEC_PER_SEC + 2);
        remote_keys_remove(&k);
}

#define IDLE_TCP 380

/*
 * Custody by identity, item 5: IDLE_TCP plain tcp connections to remote.endpoint that never
 * start a handshake, more than aquad has descriptors. aquad stops the tcp endpoint while they
 * hold it (saying so), local aquactl is served throughout, and the endpoint serves the listed
 * key again once they are gone.
 */
Test(ops, idle_unauthenticated_tcp_connections_never_lock_local_clients_out, .timeout = 120)
{
        struct rlimit low = {.rlim_cur = 256, .rlim_max = 256};
        struct sockaddr_in sa = {.sin_family = AF_INET};
        int idle[IDLE_TCP], n_idle = 0;
        struct remote_keys k;
        struct run r;

        remote_cycle(&k);
        cr_assert_eq(prlimit(aquad_pid(daemon_), RLIMIT_NOFILE, &low, NULL), 0, "prlimit: %m");

        sa.sin_port = htons((uint16_t)k.port);
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        for (int i = 0; i < IDLE_TCP; i++) {
                int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

                cr_assert_geq(fd, 0);
                /* Refused or queued: the listener may be down while aquad holds too many. */
                (void)connect(fd, (struct sockaddr *)&sa, sizeof(sa));
                idle[n_idle++] = fd;
                if (i % 50 == 49)
                        usleep(50 * 1000);
        }
        usleep(500 * 1000);
        cr_assert_eq(kill(aquad_pid(daemon_), 0), 0, "aquad is gone");
        /* Local aquactl is served with the connections still open. */
        AQUACTL(&r, "status");
        cr_assert_eq(r.code, 0, "local aquactl status: %s", r.err);
        cr_assert_geq(count_lines_with(aquad_log_path(daemon_), "Stopping tcp://"), 1,
                      "aquad never stopped its tcp endpoint");

        for (int i = 0; i < n_idle; i++)
                close(idle[i]);
        /* The endpoint is back within a few seconds; the listed key gets status there. */
        for (int i = 0; i < 20; i++) {
                AQUACTL(&r, "-e", k.ep, "--server-key", k.server_pub_file, "--key-file",
                        k.admin_file, "-t", "2s", "status");
                if (r.code == 0)
                        break;
                usleep(500 * 1000);
        }
        cr_assert_eq(r.code, 0, "remote aquactl status after the flood: %s", r.err);
        cr_assert_geq(count_lines_with(aquad_log_path(daemon_), "Serving tcp://"), 1);
        remote_keys_remove(&k);
}

/* ------------------------------------------------------------------ sd_notify */

/* Read datagrams from fd until one contains want; returns false after timeout_ms. */
static bool notified(int fd, const char *want, char *last, size_t len)
{
        uint64_t deadline = now_mono_ns() + 10 * NSEC_PER_SEC;

        for (;;) {
                struct pollfd p = {.fd = fd, .events = POLLIN};
                ssize_t n;

                if (poll(&p, 1, ms_until(deadline)) <= 0)
                        return false;
                n = recv(fd, last, len - 1, 0);
                if (n < 0)
                        return false;
                last[n] = '\0';
                if (strstr(last, want))
                        return true;
        }
}

Test(ops, systemd_hears_ready_status_and_stopping)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        char dir[] = "/tmp/test-ops-notify-XXXXXX", msg[1024] = "";
        int fd;

        cr_assert_not_null(mkdtemp(dir));
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/notify", dir);
        fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
        /* aquad inherits the environment: it believes systemd is listening here. */
        setenv("NOTIFY_SOCKET", sa.sun_path, 1);

        cr_assert_eq(aquad_start(NULL, &daemon_), 0);
        cr_assert(notified(fd, "READY=1", msg, sizeof(msg)), "last: %s", msg);
        cr_assert(strstr(msg, "STATUS=0 clients, 0 GPUs, 0 leases"), "%s", msg);
        hello(&producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", 1, "whisper", "GPU-C");
        cr_assert(notified(fd, "STATUS=1 clients, 1 GPUs", msg, sizeof(msg)), "last: %s", msg);
        raw_close(&producer);
        cr_assert_eq(aquad_stop(daemon_), 0);
        daemon_ = NULL;
        cr_assert(notified(fd, "STOPPING=1", msg, sizeof(msg)), "last: %s", msg);
        cr_assert(strstr(msg, "STATUS=Stopping (SIGTERM)"), "%s", msg);

        unsetenv("NOTIFY_SOCKET");
        close(fd);
        unlink(sa.sun_path);
        rmdir(dir);
}
