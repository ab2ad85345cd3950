/*
 * The HTTP target against a small OpenAI-style streaming server (libmicrohttpd)
 * started inside the test, with configurable delays before and between tokens.
 * Latency checks are lower bounds the delays guarantee and upper bounds far
 * above them, so a busy machine cannot make them fail.
 */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <microhttpd.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "search.h"
#include "target-http.h"
#include "time-util.h"
#include "util.h"

/* How the test server streams: as vLLM does, or one of the ways other servers differ. */
enum mode {
        MODE_VLLM,        /* a token per event, usage at the end, [DONE] */
        MODE_LLAMA_CPP,   /* no usage; an empty-text chunk with finish_reason; LF framing */
        MODE_INTERRUPTED, /* [DONE] after 2 tokens, no finish reason */
        MODE_DROPPED,     /* the body ends cleanly after 2 tokens: no [DONE], no finish */
        MODE_BROKEN,      /* the connection breaks after 2 tokens */
        MODE_ERROR_EVENT, /* "event: error" after 1 token */
        MODE_BAD_EVENT,   /* a payload that is not JSON */
        MODE_STOP_EARLY,  /* finish_reason "stop" after 2 tokens */
        MODE_MERGED,      /* two tokens per event; usage counts them all */
        MODE_CR_FRAMING,  /* CR line ends, no blank lines, a data field split over two lines */
        MODE_JSON,        /* a plain JSON answer, not a stream */
};

static struct {
        unsigned ttft_ms, tbt_ms;
        unsigned status;
        enum mode mode;
        bool no_metrics;
        int64_t last_max_tokens;
        bool last_stream, last_chat;
        struct MHD_Daemon *daemon;
        uint16_t port;
} server;

struct upload {
        char *data;
        size_t len;
};

struct stream {
        int n, emitted;
        enum mode mode;
        bool chat, done;
        unsigned ttft_ms, tbt_ms;
        char pending[256];
        size_t len, off;
};

/* The next piece of an odd stream; false when mode has nothing special to say now. */
static bool odd_piece(struct stream *s, ssize_t *ret_end)
{
        const char *text = s->chat ? "{\"choices\":[{\"delta\":{\"content\":\"t\"},%s}]}"
                                   : "{\"choices\":[{\"text\":\"t\",%s}]}";
        char chunk[160];

        *ret_end = 0;
        switch (s->mode) {
        case MODE_LLAMA_CPP:
                if (s->emitted < s->n)
                        return false;
                if (s->done)
                        return *ret_end = MHD_CONTENT_READER_END_OF_STREAM, true;
                s->len = (size_t)snprintf(s->pending, sizeof(s->pending),
                                          "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":"
                                          "\"length\"}]}\n\ndata: [DONE]\n\n");
                s->done = true;
                return true;
        case MODE_INTERRUPTED:
        case MODE_DROPPED:
        case MODE_BROKEN:
        case MODE_STOP_EARLY:
                if (s->emitted < 2)
                        return false;
                if (s->done || s->mode == MODE_DROPPED)
                        return *ret_end = MHD_CONTENT_READER_END_OF_STREAM, true;
                if (s->mode == MODE_BROKEN)
                        return *ret_end = MHD_CONTENT_READER_END_WITH_ERROR, true;
                snprintf(chunk, sizeof(chunk), text, "\"finish_reason\":\"stop\"");
                s->len = s->mode == MODE_INTERRUPTED
                             ? (size_t)snprintf(s->pending, sizeof(s->pending), "data: [DONE]\n\n")
                             : (size_t)snprintf(s->pending, sizeof(s->pending),
                                                "data: %s\n\ndata: [DONE]\n\n", chunk);
                s->done = true;
                return true;
        case MODE_ERROR_EVENT:
        case MODE_BAD_EVENT:
                if (s->emitted < 1)
                        return false;
                if (s->done)
                        return *ret_end = MHD_CONTENT_READER_END_OF_STREAM, true;
                s->len = (size_t)snprintf(
                    s->pending, sizeof(s->pending), "%s",
                    s->mode == MODE_ERROR_EVENT
                        ? "event: error\ndata: {\"message\": \"KV cache full\"}\n\n"
                        : "data: <html>Bad Gateway</html>\n\ndata: [DONE]\n\n");
                s->done = true;
                return true;
        case MODE_MERGED:
                if (s->done)
                        return *ret_end = MHD_CONTENT_READER_END_OF_STREAM, true;
                if (s->emitted < s->n) {
                        s->len = (size_t)snprintf(s->pending, sizeof(s->pending),
                                                  "data: {\"choices\":[{\"text\":\"ab\"}]}\n\n");
                        s->emitted += 2;
                        return true;
                }
                s->len = (size_t)snprintf(s->pending, sizeof(s->pending),
                                          "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":"
                                          "\"length\"}],\"usage\":{\"prompt_tokens\":9,"
                                          "\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n",
                                          s->emitted);
                s->done = true;
                return true;
        case MODE_CR_FRAMING:
                if (s->done)
                        return *ret_end = MHD_CONTENT_READER_END_OF_STREAM, true;
                if (s->emitted < s->n) {
                        /* One event's data over two lines, then the next event, no blank line. */
                        s->len = (size_t)snprintf(s->pending, sizeof(s->pending),
                                                  "data: {\"choices\":\rdata: [{\"text\":\"t\"}]}\r"
                                                  ": ping\r");
                        s->emitted++;
                        return true;
                }
                s->len = (size_t)snprintf(s->pending, sizeof(s->pending),
                                          "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":"
                                          "\"length\"}],\"usage\":{\"prompt_tokens\":5}}\r"
                                          "data: [DONE]");
                s->done = true;
                return true;
        default:
                return false;
        }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
        struct stream *s = cls;
        ssize_t end;
        size_t n;

        if (s->off == s->len) {
                s->off = s->len = 0;
                if (odd_piece(s, &end)) {
                        if (end)
                                return end;
                } else if (s->emitted < s->n) {
                        usleep((s->emitted == 0 ? s->ttft_ms : s->tbt_ms) * 1000);
                        s->len = (size_t)snprintf(
                                s->pending, sizeof(s->pending),
                                s->chat ? "data: {\"choices\":[{\"delta\":{\"content\":\"t%d\"}}]}\n\n"
                                        : "data: {\"choices\":[{\"text\":\"t%d\"}]}\n\n",
                                s->emitted);
                        s->emitted++;
                } else if (!s->done) {
                        s->len = (size_t)snprintf(s->pending, sizeof(s->pending),
                                                  "data: {\"choices\":[],\"usage\":"
                                                  "{\"prompt_tokens\":42}}\n\ndata: [DONE]\n\n");
                        s->done = true;
                } else
                        return MHD_CONTENT_READER_END_OF_STREAM;
        }
        n = MIN(max, s->len - s->off);
        memcpy(buf, s->pending + s->off, n);
        s->off += n;
        return (ssize_t)n;
}

static enum MHD_Result respond_text(struct MHD_Connection *c, unsigned status, const char *text)
{
        struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text,
                                                                 MHD_RESPMEM_MUST_COPY);
        enum MHD_Result ret = MHD_queue_response(c, status, r);

        MHD_destroy_response(r);
        return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_data_size, void **con_cls)
{
        struct upload *up = *con_cls;
        struct stream *s;
        struct MHD_Response *resp;
        json_object *body, *v;
        enum MHD_Result ret;

        if (strcmp(url, "/metrics") == 0)
                return server.no_metrics
                           ? respond_text(c, 404, "{\"detail\":\"Not Found\"}")
                           : respond_text(c, 200,
                                          "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage.\n"
                                          "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.25\n"
                                          "vllm:num_requests_running{model_name=\"m\"} 3.0\n");
        if (!up) {
                *con_cls = calloc(1, sizeof(struct upload));
                return *con_cls ? MHD_YES : MHD_NO;
        }
        if (*upload_data_size > 0) {
                char *d = realloc(up->data, up->len + *upload_data_size + 1);
                if (!d)
                        return MHD_NO;
                memcpy(d + up->len, upload_data, *upload_data_size);
                up->data = d;
                up->len += *upload_data_size;
                up->data[up->len] = 0;
                *upload_data_size = 0;
                return MHD_YES;
        }
        if (server.status != 200)
                return respond_text(c, server.status, "{\"error\": \"overloaded\"}");
        if (server.mode == MODE_JSON)
                return respond_text(c, 200, "{\"choices\":[{\"text\":\"t t t\"}]}");

        body = json_tokener_parse(up->data ? up->data : "");
        cr_assert_not_null(body, "the target sends JSON");
        s = calloc(1, sizeof(*s));
        s->n = json_object_object_get_ex(body, "max_tokens", &v) ? json_object_get_int(v) : 1;
        s->chat = json_object_object_get_ex(body, "messages", NULL);
        s->mode = server.mode;
        s->ttft_ms = server.ttft_ms;
        s->tbt_ms = server.tbt_ms;
        server.last_max_tokens = s->n;
        server.last_chat = s->chat;
        server.last_stream = json_object_object_get_ex(body, "stream", &v) &&
                             json_object_get_boolean(v);
        json_object_put(body);

        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 1024, stream_read, s, free);
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return ret;
}

static void request_done(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
        struct upload *up = *con_cls;

        if (up) {
                free(up->data);
                free(up);
        }
}

static void server_start(void)
{
        server.status = 200;
        server.mode = MODE_VLLM;
        server.no_metrics = false;
        server.daemon = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION |
                                                 MHD_USE_INTERNAL_POLLING_THREAD,
                                         0, NULL, NULL, handle, NULL,
                                         MHD_OPTION_NOTIFY_COMPLETED, request_done, NULL,
                                         MHD_OPTION_END);
        cr_assert_not_null(server.daemon);
        server.port = MHD_get_daemon_info(server.daemon, MHD_DAEMON_INFO_BIND_PORT)->port;
}

static void server_stop(void)
{
        MHD_stop_daemon(server.daemon);
}

TestSuite(target_http, .init = server_start, .fini = server_stop);

static struct target *new_target(const char *path, int api, const char *metrics_path)
{
        char url[128], murl[128];
        struct http_params p = {
                .url = url,
                .api = api,
                .model = "m",
                .timeout = 30 * NSEC_PER_SEC,
                .drain = 30 * NSEC_PER_SEC,
                .metrics_url = metrics_path ? murl : NULL,
                .kv_bytes_per_token = 1,
                .kv_capacity = 1000000,
        };
        struct target *t = NULL;

        snprintf(url, sizeof(url), "http://127.0.0.1:%u%s", server.port, path);
        snprintf(murl, sizeof(murl), "http://127.0.0.1:%u%s", server.port,
                 metrics_path ? metrics_path : "");
        cr_assert_eq(http_target_new(&p, &t), 0);
        return t;
}

static void run_requests(struct target *t, size_t n, double gap, uint32_t tokens, struct run *run)
{
        struct request req = {.prompt = NULL, .prompt_tokens = 8, .output_tokens = tokens};
        const struct request *reqs[8];
        double arrival[8];
        struct load load = {.arrival = arrival, .request = reqs, .n = n, .duration = n * gap};

        for (size_t i = 0; i < n; i++) {
                reqs[i] = &req;
                arrival[i] = (double)i * gap;
        }
        cr_assert_eq(target_run(t, &load, NULL, run), 0);
}

Test(target_http, measures_ttft_and_tbt_of_a_streaming_server)
{
        _cleanup_(target_freep) struct target *t = new_target("/v1/completions", HTTP_API_COMPLETIONS,
                                                              NULL);
        struct run run;
        struct run_summary s;

        server.ttft_ms = 200;
        server.tbt_ms = 50;
        run_requests(t, 3, 0.1, 5, &run);
        cr_assert_eq(server.last_max_tokens, 5);
        cr_assert(server.last_stream);
        for (size_t i = 0; i < 3; i++) {
                cr_assert_eq(run.samples[i].error, 0);
                cr_assert_eq(run.samples[i].n_tokens, 5);
                cr_assert_eq(run.samples[i].prompt_tokens, 42, "usage overrides the estimate");
                cr_assert(run.samples[i].finish >= run.samples[i].token_times[4]);
        }
        cr_assert_eq(run_summarize(&run, 0, 99, 99, 1, &s), 0);
        cr_assert(s.ttft_p50 >= 0.19 && s.ttft_p50 < 3.0, "TTFT p50 %.3f s", s.ttft_p50);
        cr_assert(s.tbt_p50 >= 0.04 && s.tbt_p50 < 1.0, "TBT p50 %.3f s", s.tbt_p50);
        cr_assert_eq(s.n_failed, 0);
        run_done(&run);
}

Test(target_http, chat_endpoints_stream_delta_content)
{
        _cleanup_(target_freep) struct target *t = new_target("/v1/chat/completions",
                                                              HTTP_API_CHAT, NULL);
        struct run run;

        server.ttft_ms = 0;
        server.tbt_ms = 0;
        run_requests(t, 1, 0.01, 3, &run);
        cr_assert(server.last_chat);
        cr_assert_eq(run.samples[0].error, 0);
        cr_assert_eq(run.samples[0].n_tokens, 3);
        run_done(&run);
}

Test(target_http, an_error_status_fails_the_request_and_says_so)
{
        _cleanup_(target_freep) struct target *t = new_target("/v1/completions", HTTP_API_COMPLETIONS,
                                                              NULL);
        struct run run;

        server.status = 503;
        run_requests(t, 2, 0.01, 3, &run);
        cr_assert_neq(run.samples[0].error, 0);
        cr_assert_neq(run.samples[1].error, 0);
        cr_assert(strstr(run.first_error, "answered HTTP 503"), "%s", run.first_error);
        run_done(&run);
}

Test(target_http, the_metrics_gauge_is_sampled_while_running)
{
        _cleanup_(target_freep) struct target *t = new_target("/v1/completions", HTTP_API_COMPLETIONS,
                                                              "/metrics");
        struct run run;

        server.ttft_ms = 100;
        server.tbt_ms = 100;
        run_requests(t, 1, 0.01, 3, &run);
        cr_assert_float_eq(run.kv_usage_peak, 0.25, 1e-12);
        run_done(&run);
}

Test(target_http, an_unreachable_endpoint_stops_the_search_with_a_clear_error)
{
        struct http_params p = {
                .url = "http://127.0.0.1:1/v1/completions",
                .timeout = 5 * NSEC_PER_SEC,
                .kv_bytes_per_token = 1,
                .kv_capacity = 1000,
        };
        struct length_spec len = {LENGTH_FIXED, 4, 1, 10};
        _cleanup_(request_pool_done) struct request_pool pool = {0};
        _cleanup_(target_freep) struct target *t = NULL;
        struct search_params sp = {
                .sla = {.ttft = 1, .ttft_percentile = 99, .tbt = 0.1, .tbt_percentile = 99},
                .start_rate = 1, .min_rate = 0.1, .max_rate = 10, .tolerance = 0.1,
                .max_steps = 5, .duration = 10, .min_requests = 1,
        };
        struct search st = {0};

        cr_assert_eq(http_target_new(&p, &t), 0);
        cr_assert_eq(request_pool_synthetic(&len, &len, 1, 1, &pool), 0);
        cr_assert_eq(search_run(t, &pool, &sp, NULL, NULL, NULL, &st), SEARCH_E_TARGET);
        cr_assert(strstr(st.error, "a single request failed: http://127.0.0.1:1/v1/completions:"),
                  "%s", st.error);
        cr_assert_eq(st.n_points, 0, "nothing was run at a rate");
        search_done(&st);
}

/* One request against the server in mode; the run is left for the caller to check. */
static void run_mode(enum mode mode, uint32_t tokens, struct run *run)
{
        _cleanup_(target_freep) struct target *t =
            new_target("/v1/completions", HTTP_API_COMPLETIONS, NULL);

        server.mode = mode;
        server.ttft_ms = 0;
        server.tbt_ms = 0;
        run_requests(t, 1, 0.01, tokens, run);
}

Test(target_http, llama_cpp_streams_without_usage_and_ends_with_an_empty_chunk)
{
        struct run run;

        run_mode(MODE_LLAMA_CPP, 4, &run);
        cr_assert_eq(run.samples[0].error, 0, "%s", run.first_error);
        cr_assert_eq(run.samples[0].n_tokens, 4, "the empty finishing chunk is not a token");
        cr_assert_eq(run.samples[0].prompt_tokens, 8, "without usage the estimate stands");
        cr_assert_eq(run.notes.no_usage, 1);
        cr_assert(!run_notes_any(&(struct run_notes){.no_usage = 0}));
        run_done(&run);
}

/* Each odd stream fails its request, is counted under its own note and named in the message. */
Test(target_http, odd_streams_fail_with_their_reason)
{
        static const struct {
                enum mode mode;
                size_t note; /* offset in struct run_notes */
                const char *says;
        } cases[] = {
            {MODE_INTERRUPTED, offsetof(struct run_notes, cut_short),
             "after 2 of 6 tokens with [DONE] and no finish reason"},
            {MODE_DROPPED, offsetof(struct run_notes, dropped),
             "after 2 of 6 tokens without [DONE]"},
            {MODE_ERROR_EVENT, offsetof(struct run_notes, error_event),
             "error event: {\"message\": \"KV cache full\"}"},
            {MODE_BAD_EVENT, offsetof(struct run_notes, bad_event), "unparseable event"},
            {MODE_JSON, offsetof(struct run_notes, no_tokens), "streamed no tokens (content type "},
        };

        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                struct run run;

                run_mode(cases[i].mode, 6, &run);
                cr_assert_neq(run.samples[0].error, 0, "mode %d", cases[i].mode);
                cr_assert_eq(*(const size_t *)((const char *)&run.notes + cases[i].note), 1,
                             "mode %d: %s", cases[i].mode, run.first_error);
                cr_assert(strstr(run.first_error, cases[i].says), "%s", run.first_error);
                run_done(&run);
        }
}

Test(target_http, a_connection_broken_mid_stream_fails_in_transport)
{
        struct run run;

        run_mode(MODE_BROKEN, 6, &run);
        cr_assert_neq(run.samples[0].error, 0);
        cr_assert_eq(run.notes.transport + run.notes.dropped, 1, "%s", run.first_error);
        cr_assert(strstr(run.first_error, "2 of 6 tokens"), "%s", run.first_error);
        cr_assert_eq(run.samples[0].n_tokens, 2, "what arrived is kept");
        run_done(&run);
}

Test(target_http, an_early_stop_completes_and_is_counted)
{
        struct run run;

        run_mode(MODE_STOP_EARLY, 6, &run);
        cr_assert_eq(run.samples[0].error, 0, "%s", run.first_error);
        cr_assert_eq(run.samples[0].n_tokens, 3, "the finishing chunk carries text");
        cr_assert_eq(run.notes.ended_early, 1);
        run_done(&run);
}

Test(target_http, usage_counts_tokens_that_events_merged)
{
        struct run run;
        struct run_summary s;

        run_mode(MODE_MERGED, 6, &run);
        cr_assert_eq(run.samples[0].error, 0, "%s", run.first_error);
        cr_assert_eq(run.samples[0].n_tokens, 3, "three events");
        cr_assert_eq(run.samples[0].output_tokens, 6, "six tokens by the server's count");
        cr_assert_eq(run.samples[0].prompt_tokens, 9);
        cr_assert_eq(run_summarize(&run, 0, 99, 99, 1, &s), 0);
        cr_assert_eq(s.peak_kv_demand, 9 + 6, "the KV demand counts every token");
        run_done(&run);
}

Test(target_http, cr_line_ends_split_data_and_missing_blank_lines_are_read)
{
        struct run run;

        run_mode(MODE_CR_FRAMING, 3, &run);
        cr_assert_eq(run.samples[0].error, 0, "%s", run.first_error);
        cr_assert_eq(run.samples[0].n_tokens, 3);
        cr_assert_eq(run.samples[0].prompt_tokens, 5, "the last event, left without its end");
        run_done(&run);
}

Test(target_http, a_503_counts_as_overload_with_what_the_server_said)
{
        _cleanup_(target_freep) struct target *t =
            new_target("/v1/completions", HTTP_API_COMPLETIONS, NULL);
        struct run run;

        server.status = 503;
        run_requests(t, 3, 0.01, 3, &run);
        cr_assert_eq(run.notes.overloaded, 3);
        cr_assert_eq(run.notes.http_status, 0);
        cr_assert(strstr(run.first_error, "answered HTTP 503: {\"error\": \"overloaded\"}"), "%s",
                  run.first_error);
        run_done(&run);
        server.status = 400;
        run_requests(t, 1, 0.01, 3, &run);
        cr_assert_eq(run.notes.http_status, 1);
        run_done(&run);
}

Test(target_http, a_missing_metrics_endpoint_is_reported_not_fatal)
{
        _cleanup_(target_freep) struct target *t =
            new_target("/v1/completions", HTTP_API_COMPLETIONS, "/metrics");
        struct run run;

        server.no_metrics = true;
        server.ttft_ms = 100;
        server.tbt_ms = 100;
        run_requests(t, 1, 0.01, 3, &run);
        cr_assert_eq(run.samples[0].error, 0);
        cr_assert(run.kv_usage_peak < 0);
        cr_assert(strstr(run.metrics_error, "/metrics answered HTTP 404"), "%s", run.metrics_error);
        run_done(&run);
}
