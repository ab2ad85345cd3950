/* HTTP target: concurrent streaming requests on one libcurl multi handle, parsed as server-sent events. */
#include "target-http.h"

#include <curl/curl.h>
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "sse.h"
#include "time-util.h"
#include "util.h"

const char *const http_api_names[] = {"completions", "chat", NULL};

#define HTTP_MAX_METRICS  (16u << 20)
#define HTTP_MAX_ERRBODY  512 /* bytes of a non-200 answer kept for the message */
#define HTTP_POLL_MS      50
#define HTTP_METRICS_GAP  0.5 /* seconds between samples of the metrics endpoint */

struct http_target {
        struct target base;
        char *url, *model, *metrics_url, *metric;
        int api;
        uint64_t timeout, drain;
};

struct buf {
        char *data;
        size_t len, cap;
};

static int buf_append(struct buf *b, const char *p, size_t n, size_t limit)
{
        if (b->len + n + 1 > limit)
                return -E2BIG;
        if (b->len + n + 1 > b->cap) {
                size_t cap = MAX(b->cap * 2, b->len + n + 1);
                char *d = realloc(b->data, cap);
                if (!d)
                        return -ENOMEM;
                b->data = d;
                b->cap = cap;
        }
        memcpy(b->data + b->len, p, n);
        b->len += n;
        b->data[b->len] = 0;
        return 0;
}

struct xfer {
        CURL *easy;
        struct http_target *t;
        struct run *run;
        struct sample *s;
        uint64_t start_ns;
        char *body;
        uint32_t requested; /* max_tokens */
        struct sse sse;
        long status;        /* once the first bytes of the body came: the response code */
        struct buf errbody; /* the start of a non-200 answer */
        bool done;          /* [DONE] seen */
        int finish;         /* enum sse_finish: the last finish_reason seen */
        bool usage;         /* a usage object seen */
        size_t *note;       /* the run_notes count this request's failure goes to */
        char *error;        /* what went wrong inside the stream, if anything */
        char errbuf[CURL_ERROR_SIZE];
};

/* The first failure of a request counts, under note (a field of the run's notes). */
static void xfer_fail(struct xfer *x, size_t *note, const char *fmt, ...) _printf_(3, 4);
static void xfer_fail(struct xfer *x, size_t *note, const char *fmt, ...)
{
        va_list ap;

        if (x->error || x->note)
                return;
        x->note = note;
        va_start(ap, fmt);
        if (vasprintf(&x->error, fmt, ap) < 0)
                x->error = NULL;
        va_end(ap);
}

static double elapsed(uint64_t start_ns)
{
        return (double)(now_mono_ns() - start_ns) / (double)NSEC_PER_SEC;
}

/* One event: a JSON chunk, or [DONE]. */
static int xfer_on_event(const char *type, const char *payload, void *userdata)
{
        struct xfer *x = userdata;
        struct run_notes *notes = &x->run->notes;
        struct sse_event ev;

        if (x->done)
                return 0; /* nothing after [DONE] counts */
        if (strcmp(type, "error") == 0) {
                xfer_fail(x, &notes->error_event, "%s sent an error event: %.200s", x->t->url,
                          payload);
                return 0;
        }
        if (sse_event_parse(payload, x->t->api == HTTP_API_CHAT ? SSE_API_CHAT
                                                                : SSE_API_COMPLETIONS,
                            &ev) < 0) {
                xfer_fail(x, &notes->bad_event, "unparseable event from %s: %.80s", x->t->url,
                          payload);
                return 0;
        }
        if (ev.error) {
                xfer_fail(x, &notes->error_event, "%s returned an error: %.200s", x->t->url,
                          ev.error);
                free(ev.error);
                return 0;
        }
        x->done = ev.done;
        if (ev.finish != SSE_FINISH_NONE)
                x->finish = ev.finish;
        /* The server's own counts beat our estimate and our count of events. */
        x->usage |= ev.usage;
        if (ev.prompt_tokens > 0)
                x->s->prompt_tokens = (uint32_t)MIN(ev.prompt_tokens, UINT32_MAX);
        if (ev.completion_tokens > 0)
                x->s->output_tokens = (uint32_t)MIN(ev.completion_tokens, UINT32_MAX);
        if (ev.token && sample_add_token(x->s, elapsed(x->start_ns)) < 0)
                return -ENOMEM;
        return 0;
}

static size_t xfer_write(char *ptr, size_t size, size_t nmemb, void *userdata)
{
        struct xfer *x = userdata;
        size_t n = size * nmemb;
        int r;

        if (x->status == 0)
                curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
        if (x->status != 200) {
                /* Not a stream: keep the start of what it says for the message. */
                size_t room = HTTP_MAX_ERRBODY - MIN(x->errbody.len, HTTP_MAX_ERRBODY);
                if (room > 1 &&
                    buf_append(&x->errbody, ptr, MIN(n, room - 1), HTTP_MAX_ERRBODY) < 0)
                        return 0;
                return n;
        }
        r = sse_feed(&x->sse, ptr, n, xfer_on_event, x);
        if (r == -E2BIG)
                xfer_fail(x, &x->run->notes.bad_event, "an event from %s is over %u bytes",
                          x->t->url, SSE_MAX_LINE);
        else if (r < 0)
                xfer_fail(x, &x->run->notes.transport, "out of memory");
        return r < 0 ? 0 : n; /* a short count aborts the transfer */
}

static char *make_body(const struct http_target *t, const struct request *q)
{
        _cleanup_free_ char *synthetic = NULL;
        json_object *root = json_object_new_object(), *opts;
        const char *prompt = q->prompt;
        char *body;

        if (!root)
                return NULL;
        if (!prompt) {
                /* A synthetic prompt: one short word per token, near enough for any tokenizer. */
                size_t n = q->prompt_tokens;
                synthetic = malloc(n * 3 + 1);
                if (!synthetic) {
                        json_object_put(root);
                        return NULL;
                }
                for (size_t i = 0; i < n; i++)
                        memcpy(synthetic + 3 * i, "hi ", 3);
                synthetic[n * 3] = 0;
                prompt = synthetic;
        }
        if (t->model)
                json_object_object_add(root, "model", json_object_new_string(t->model));
        if (t->api == HTTP_API_CHAT) {
                json_object *msgs = json_object_new_array(), *m = json_object_new_object();
                json_object_object_add(m, "role", json_object_new_string("user"));
                json_object_object_add(m, "content", json_object_new_string(prompt));
                json_object_array_add(msgs, m);
                json_object_object_add(root, "messages", msgs);
        } else
                json_object_object_add(root, "prompt", json_object_new_string(prompt));
        json_object_object_add(root, "max_tokens", json_object_new_int64(q->output_tokens));
        /* vLLM: produce exactly max_tokens, so the load is the one the dataset describes. */
        json_object_object_add(root, "ignore_eos", json_object_new_boolean(1));
        json_object_object_add(root, "stream", json_object_new_boolean(1));
        opts = json_object_new_object();
        json_object_object_add(opts, "include_usage", json_object_new_boolean(1));
        json_object_object_add(root, "stream_options", opts);
        body = strdup(json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN));
        json_object_put(root);
        return body;
}

static void xfer_free(struct xfer *x)
{
        if (!x)
                return;
        if (x->easy)
                curl_easy_cleanup(x->easy);
        free(x->body);
        free(x->errbody.data);
        sse_done(&x->sse);
        free(x->error);
        free(x);
}

static int xfer_start(struct http_target *t, CURLM *multi, struct curl_slist *hdrs,
                      struct run *run, size_t i, const struct request *q, uint64_t start_ns,
                      struct xfer **ret)
{
        struct xfer *x = calloc(1, sizeof(*x));

        if (!x)
                return -ENOMEM;
        x->t = t;
        x->run = run;
        x->s = &run->samples[i];
        x->start_ns = start_ns;
        x->requested = q->output_tokens;
        x->body = make_body(t, q);
        x->easy = curl_easy_init();
        if (!x->body || !x->easy) {
                xfer_free(x);
                return -ENOMEM;
        }
        curl_easy_setopt(x->easy, CURLOPT_URL, t->url);
        curl_easy_setopt(x->easy, CURLOPT_POSTFIELDS, x->body);
        curl_easy_setopt(x->easy, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(x->easy, CURLOPT_WRITEFUNCTION, xfer_write);
        curl_easy_setopt(x->easy, CURLOPT_WRITEDATA, x);
        curl_easy_setopt(x->easy, CURLOPT_PRIVATE, x);
        curl_easy_setopt(x->easy, CURLOPT_ERRORBUFFER, x->errbuf);
        curl_easy_setopt(x->easy, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(x->easy, CURLOPT_TCP_NODELAY, 1L);
        curl_easy_setopt(x->easy, CURLOPT_TIMEOUT_MS, (long)(t->timeout / NSEC_PER_MSEC));
        curl_easy_setopt(x->easy, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
        if (curl_multi_add_handle(multi, x->easy) != CURLM_OK) {
                xfer_free(x);
                return -ENOMEM;
        }
        *ret = x;
        return 0;
}

/* Printable: control characters and newlines of an error body as spaces. */
static const char *errbody_text(struct buf *b)
{
        if (!b->data)
                return "";
        for (size_t i = 0; i < b->len; i++)
                if ((unsigned char)b->data[i] < 0x20)
                        b->data[i] = ' ';
        return b->data;
}

static void xfer_finish(struct xfer *x, CURLcode code)
{
        struct run_notes *notes = &x->run->notes;
        const char *type = NULL;
        long status = 0;

        curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_getinfo(x->easy, CURLINFO_CONTENT_TYPE, &type);
        /* An event the stream left without its blank line still counts. */
        if (status == 200 && code == CURLE_OK && sse_finish(&x->sse, xfer_on_event, x) == -ENOMEM)
                xfer_fail(x, &notes->transport, "out of memory");
        if (x->done && x->finish == SSE_FINISH_NONE && x->s->n_tokens < x->requested &&
            x->s->output_tokens < x->requested)
                /* [DONE] early, and perhaps the connection closed on it unfinished. */
                xfer_fail(
                    x, &notes->cut_short,
                    "%s ended the stream after %u of %u tokens with [DONE] and no finish "
                    "reason%s%s (interrupted: llama.cpp's Python server does that to a "
                    "stream when another request arrives, unless started with "
                    "--interrupt_requests false)",
                    x->t->url, x->s->n_tokens, x->requested, code != CURLE_OK ? ", then " : "",
                    code != CURLE_OK ? (x->errbuf[0] ? x->errbuf : curl_easy_strerror(code)) : "");
        else if (code != CURLE_OK)
                /* Refused, timed out, or the connection broke mid-stream. */
                xfer_fail(x, &notes->transport, "%s: %s (after %u of %u tokens)", x->t->url,
                          x->errbuf[0] ? x->errbuf : curl_easy_strerror(code), x->s->n_tokens,
                          x->requested);
        else if (status != 200)
                xfer_fail(x,
                          status == 429 || status == 503 ? &notes->overloaded : &notes->http_status,
                          "%s answered HTTP %ld%s%s", x->t->url, status, x->errbody.len ? ": " : "",
                          errbody_text(&x->errbody));
        else if (x->s->n_tokens == 0 && (!type || !strstr(type, "text/event-stream")))
                xfer_fail(x, &notes->no_tokens,
                          "%s streamed no tokens (content type %s; is it an "
                          "OpenAI-compatible streaming endpoint?)",
                          x->t->url, type ? type : "none");
        else if (!x->done && x->finish == SSE_FINISH_NONE)
                xfer_fail(x, &notes->dropped,
                          "%s ended the stream after %u of %u tokens without [DONE] or a "
                          "finish reason",
                          x->t->url, x->s->n_tokens, x->requested);
        else if (x->s->n_tokens == 0)
                xfer_fail(x, &notes->no_tokens, "%s streamed no tokens", x->t->url);
        x->s->finish = elapsed(x->start_ns);
        if (x->error || x->note) {
                x->s->error = -EPROTO;
                if (x->note)
                        (*x->note)++;
                run_note_error(x->run, x->error);
                return;
        }
        if (!x->usage)
                notes->no_usage++;
        if (x->finish == SSE_FINISH_STOP && MAX(x->s->n_tokens, x->s->output_tokens) < x->requested)
                notes->ended_early++;
}

/* The metrics endpoint: the largest value of the gauge in one Prometheus text scrape. */
struct scrape {
        CURL *easy;
        struct buf body;
};

static void metrics_fail(const struct http_target *t, struct run *run, const char *fmt, ...)
    _printf_(3, 4);
static void metrics_fail(const struct http_target *t, struct run *run, const char *fmt, ...)
{
        va_list ap;

        if (run->metrics_error)
                return;
        va_start(ap, fmt);
        if (vasprintf(&run->metrics_error, fmt, ap) < 0)
                run->metrics_error = NULL;
        va_end(ap);
}

static void scrape_take(const struct http_target *t, struct scrape *sc, struct run *run)
{
        size_t mlen = strlen(t->metric);
        char *save = NULL;
        bool found = false;

        if (!sc->body.data) {
                metrics_fail(t, run, "%s answered nothing", t->metrics_url);
                return;
        }
        for (char *l = strtok_r(sc->body.data, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
                char *sp, *end;
                double v;

                if (strncmp(l, t->metric, mlen) != 0 || (l[mlen] != '{' && l[mlen] != ' '))
                        continue;
                sp = strrchr(l, ' ');
                if (!sp)
                        continue;
                v = strtod(sp + 1, &end);
                if (end != sp + 1 && isfinite(v)) {
                        run->kv_usage_peak = MAX(run->kv_usage_peak, v);
                        found = true;
                }
        }
        if (!found)
                metrics_fail(t, run, "%s exports no %s gauge", t->metrics_url, t->metric);
        sc->body.len = 0;
}

static size_t scrape_write(char *ptr, size_t size, size_t nmemb, void *userdata)
{
        struct scrape *sc = userdata;

        return buf_append(&sc->body, ptr, size * nmemb, HTTP_MAX_METRICS) < 0 ? 0 : size * nmemb;
}

static int http_run(struct target *base, const struct load *load,
                    const volatile sig_atomic_t *cancel, struct run *run)
{
        struct http_target *t = (struct http_target *)base;
        struct curl_slist *hdrs = NULL;
        struct xfer **xfers = NULL; /* in flight, by request index */
        struct scrape sc = {0};
        bool scraping = false;
        double next_scrape = 0, cutoff = load->duration + (double)t->drain / NSEC_PER_SEC;
        size_t next = 0;
        int active = 0, r;
        uint64_t start;
        CURLM *multi;

        r = run_init(run, load->n, load->duration);
        if (r < 0)
                return r;
        for (size_t i = 0; i < load->n; i++) {
                run->samples[i].arrival = load->arrival[i];
                run->samples[i].prompt_tokens = load->request[i]->prompt_tokens;
        }
        multi = curl_multi_init();
        hdrs = curl_slist_append(NULL, "Content-Type: application/json");
        xfers = calloc(load->n ? load->n : 1, sizeof(*xfers));
        if (!multi || !hdrs || !xfers) {
                r = -ENOMEM;
                goto finish;
        }
        if (t->metrics_url) {
                sc.easy = curl_easy_init();
                if (!sc.easy) {
                        r = -ENOMEM;
                        goto finish;
                }
                curl_easy_setopt(sc.easy, CURLOPT_URL, t->metrics_url);
                curl_easy_setopt(sc.easy, CURLOPT_WRITEFUNCTION, scrape_write);
                curl_easy_setopt(sc.easy, CURLOPT_WRITEDATA, &sc);
                curl_easy_setopt(sc.easy, CURLOPT_NOSIGNAL, 1L);
                curl_easy_setopt(sc.easy, CURLOPT_TIMEOUT_MS, 5000L);
        }

        start = now_mono_ns();
        r = 0;
        for (;;) {
                double now = elapsed(start);
                double wait = HTTP_POLL_MS / 1000.0;
                struct CURLMsg *msg;
                int left;

                if (cancel && *cancel) {
                        r = TARGET_E_CANCELLED;
                        break;
                }
                while (next < load->n && load->arrival[next] <= now) {
                        r = xfer_start(t, multi, hdrs, run, next, load->request[next], start,
                                       &xfers[next]);
                        if (r < 0)
                                goto finish;
                        next++;
                }
                if (sc.easy && !scraping && now >= next_scrape) {
                        if (curl_multi_add_handle(multi, sc.easy) == CURLM_OK)
                                scraping = true;
                        next_scrape = now + HTTP_METRICS_GAP;
                }
                curl_multi_perform(multi, &active);
                while ((msg = curl_multi_info_read(multi, &left))) {
                        struct xfer *x = NULL;

                        if (msg->msg != CURLMSG_DONE)
                                continue;
                        if (msg->easy_handle == sc.easy) {
                                long status = 0;

                                curl_easy_getinfo(sc.easy, CURLINFO_RESPONSE_CODE, &status);
                                if (msg->data.result != CURLE_OK)
                                        metrics_fail(t, run, "%s: %s", t->metrics_url,
                                                     curl_easy_strerror(msg->data.result));
                                else if (status != 200)
                                        metrics_fail(t, run, "%s answered HTTP %ld", t->metrics_url,
                                                     status);
                                else
                                        scrape_take(t, &sc, run);
                                sc.body.len = 0;
                                curl_multi_remove_handle(multi, sc.easy);
                                scraping = false;
                                continue;
                        }
                        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&x);
                        xfer_finish(x, msg->data.result);
                        curl_multi_remove_handle(multi, x->easy);
                        xfers[x->s - run->samples] = NULL;
                        xfer_free(x);
                }
                if (next == load->n && active <= (scraping ? 1 : 0))
                        break;
                if (now >= cutoff)
                        break;
                if (next < load->n)
                        wait = MIN(wait, load->arrival[next] - now);
                curl_multi_poll(multi, NULL, 0, (int)MAX(0, ceil(wait * 1000)), NULL);
        }
        run->end = elapsed(start);

finish:
        /* Whatever is still in flight was cut off: it keeps what it saw, unfinished. */
        for (size_t i = 0; xfers && i < load->n; i++)
                if (xfers[i]) {
                        curl_multi_remove_handle(multi, xfers[i]->easy);
                        xfer_free(xfers[i]);
                }
        free(xfers);
        if (sc.easy) {
                if (scraping)
                        curl_multi_remove_handle(multi, sc.easy);
                curl_easy_cleanup(sc.easy);
        }
        if (multi)
                curl_multi_cleanup(multi);
        free(sc.body.data);
        curl_slist_free_all(hdrs);
        return r;
}

static void http_free(struct target *base)
{
        struct http_target *t = (struct http_target *)base;

        free(t->url);
        free(t->model);
        free(t->metrics_url);
        free(t->metric);
        free(t);
}

static const struct target_ops http_ops = {
        .name = "http",
        .run = http_run,
        .free = http_free,
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_setup(void)
{
        curl_global_init(CURL_GLOBAL_DEFAULT);
}

static int strdup_opt(const char *s, char **ret)
{
        *ret = NULL;
        if (!s)
                return 0;
        *ret = strdup(s);
        return *ret ? 0 : -ENOMEM;
}

int http_target_new(const struct http_params *p, struct target **ret)
{
        struct http_target *t;

        if (!p->url || p->api < 0 || p->api >= _HTTP_API_MAX || p->kv_bytes_per_token == 0)
                return -EINVAL;
        pthread_once(&curl_once, curl_setup);
        t = calloc(1, sizeof(*t));
        if (!t)
                return -ENOMEM;
        t->base.ops = &http_ops;
        t->base.kv_bytes_per_token = p->kv_bytes_per_token;
        t->base.kv_capacity = p->kv_capacity;
        t->api = p->api;
        t->timeout = p->timeout ? p->timeout : 300 * NSEC_PER_SEC;
        t->drain = p->drain;
        if (strdup_opt(p->url, &t->url) < 0 || strdup_opt(p->model, &t->model) < 0 ||
            strdup_opt(p->metrics_url, &t->metrics_url) < 0 ||
            strdup_opt(p->metrics_url ? (p->metric ? p->metric : "vllm:gpu_cache_usage_perc")
                                      : NULL,
                       &t->metric) < 0) {
                http_free(&t->base);
                return -ENOMEM;
        }
        *ret = &t->base;
        return 0;
}
