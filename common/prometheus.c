/* Prometheus text exposition, histograms, and libmicrohttpd serving them in external-select (epoll)
 * mode. */
#include "prometheus.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <string.h>
#include <sys/socket.h>

#include "log.h"
#include "time-util.h"

/* A scraper holds at most this many connections, each for at most this long. */
#define PROM_MAX_CONNECTIONS      8
#define PROM_CONNECTION_TIMEOUT_S 10
/* Out of descriptors, the endpoint rests this long before it tries to accept again. */
#define PROM_PAUSE_NS (100 * NSEC_PER_MSEC)
/* libmicrohttpd's messages (one per failed accept) are logged at most this often. */
#define PROM_LOG_NS NSEC_PER_SEC
/*
 * In external mode libmicrohttpd stops watching its listening socket when accept() runs out of
 * descriptors with a connection open, and looks again only when it is run: it is run at least
 * this often, or the endpoint would stay deaf after the shortage.
 */
#define PROM_MAX_IDLE_MS 1000

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

struct prom_text {
        FILE *f;
};

struct prom_server {
        struct MHD_Daemon *mhd;
        prom_render_fn render;
        void *userdata;
        uint16_t port;
        uint64_t scrapes;
        uint64_t paused_until_ns; /* out of descriptors: not polled until then */
        uint64_t logged_ns, unlogged;
};

/* ------------------------------------------------------------------ exposition text */

/* Label values escape backslash, double quote and newline; HELP text only the first and last. */
static void write_escaped(FILE *f, const char *s, bool quote)
{
        for (; *s; s++) {
                if (*s == '\\')
                        fputs("\\\\", f);
                else if (*s == '\n')
                        fputs("\\n", f);
                else if (quote && *s == '"')
                        fputs("\\\"", f);
                else
                        fputc(*s, f);
        }
}

void prom_family(struct prom_text *t, const char *name, const char *type, const char *help)
{
        fprintf(t->f, "# HELP %s ", name);
        write_escaped(t->f, help, false);
        fprintf(t->f, "\n# TYPE %s %s\n", name, type);
}

static void write_name(struct prom_text *t, const char *name, const struct prom_label *labels,
                       size_t n_labels)
{
        fputs(name, t->f);
        if (n_labels == 0)
                return;
        fputc('{', t->f);
        for (size_t i = 0; i < n_labels; i++) {
                fprintf(t->f, "%s%s=\"", i ? "," : "", labels[i].name);
                write_escaped(t->f, labels[i].value ? labels[i].value : "", true);
                fputc('"', t->f);
        }
        fputc('}', t->f);
}

void prom_sample_u64(struct prom_text *t, const char *name, const struct prom_label *labels,
                     size_t n_labels, uint64_t value)
{
        write_name(t, name, labels, n_labels);
        fprintf(t->f, " %" PRIu64 "\n", value);
}

static void write_double(FILE *f, double v)
{
        if (isnan(v))
                fputs("NaN", f);
        else if (isinf(v))
                fputs(v > 0 ? "+Inf" : "-Inf", f);
        else
                fprintf(f, "%.17g", v);
}

void prom_sample_double(struct prom_text *t, const char *name, const struct prom_label *labels,
                        size_t n_labels, double value)
{
        write_name(t, name, labels, n_labels);
        fputc(' ', t->f);
        write_double(t->f, value);
        fputc('\n', t->f);
}

int prom_render_string(prom_render_fn render, void *userdata, char **ret, size_t *ret_len)
{
        struct prom_text t;
        char *buf = NULL;
        size_t len = 0;
        int r;

        t.f = open_memstream(&buf, &len);
        if (!t.f)
                return -ENOMEM;
        r = render(&t, userdata);
        if (ferror(t.f) && r == 0)
                r = -ENOMEM;
        if (fclose(t.f) != 0 && r == 0)
                r = -ENOMEM;
        if (r < 0) {
                free(buf);
                return r;
        }
        *ret = buf;
        *ret_len = len;
        return 0;
}

/* ------------------------------------------------------------------ histograms */

void prom_histogram_init(struct prom_histogram *h, const double *bounds, size_t n_bounds)
{
        *h = (struct prom_histogram){
            .bounds = bounds,
            .n_bounds = MIN(n_bounds, (size_t)PROM_HISTOGRAM_MAX_BUCKETS),
        };
}

void prom_histogram_observe(struct prom_histogram *h, double value)
{
        size_t i = 0;

        /* Prometheus buckets are upper-inclusive: le="0.1" counts 0.1 itself. */
        while (i < h->n_bounds && value > h->bounds[i])
                i++;
        h->counts[i]++;
        h->count++;
        h->sum += value;
}

void prom_histogram_write(struct prom_text *t, const char *name, const char *help,
                          const struct prom_histogram *h)
{
        char bucket[128], le[32];
        uint64_t cumulative = 0;

        prom_family(t, name, "histogram", help);
        snprintf(bucket, sizeof(bucket), "%s_bucket", name);
        for (size_t i = 0; i <= h->n_bounds; i++) {
                cumulative += h->counts[i];
                if (i < h->n_bounds)
                        snprintf(le, sizeof(le), "%g", h->bounds[i]);
                else
                        snprintf(le, sizeof(le), "+Inf");
                prom_sample_u64(t, bucket, &(struct prom_label){"le", le}, 1, cumulative);
        }
        snprintf(bucket, sizeof(bucket), "%s_sum", name);
        prom_sample_double(t, bucket, NULL, 0, h->sum);
        snprintf(bucket, sizeof(bucket), "%s_count", name);
        prom_sample_u64(t, bucket, NULL, 0, h->count);
}

/* ------------------------------------------------------------------ HTTP */

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status, char *body, size_t len,
                               const char *content_type)
{
        struct MHD_Response *resp;
        enum MHD_Result ret;

        resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
                free(body);
                return MHD_NO;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
        ret = MHD_queue_response(conn, status, resp);
        MHD_destroy_response(resp);
        return ret;
}

static enum MHD_Result respond_text(struct MHD_Connection *conn, unsigned status, const char *text)
{
        char *body = strdup(text);

        if (!body)
                return MHD_NO;
        return respond(conn, status, body, strlen(body), "text/plain; charset=utf-8");
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_data_size, void **req_cls)
{
        struct prom_server *m = cls;
        char *body;
        size_t len;
        int r;

        /* MHD calls twice per request: first with headers only; answer on the second call. */
        if (!*req_cls) {
                *req_cls = m;
                return MHD_YES;
        }
        if (*upload_data_size) {
                *upload_data_size = 0; /* a body is never wanted: discard it */
                return MHD_YES;
        }
        if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
                return respond_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "GET /metrics only\n");
        if (strcmp(url, "/metrics") != 0)
                return respond_text(conn, MHD_HTTP_NOT_FOUND, "aquad serves /metrics\n");

        r = prom_render_string(m->render, m->userdata, &body, &len);
        if (r < 0) {
                log_warning_errno(r, "Failed to render metrics: %m");
                return respond_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR,
                                    "aquad could not render its metrics\n");
        }
        m->scrapes++;
        return respond(conn, MHD_HTTP_OK, body, len, CONTENT_TYPE);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
        struct prom_server *m = cls;
        uint64_t now = now_mono_ns();
        char msg[512];

        vsnprintf(msg, sizeof(msg), fmt, ap);
        msg[strcspn(msg, "\n")] = '\0';
        /* accept() failed for want of descriptors ("Too many open files", "resource limit"). */
        if (strstr(msg, "resource limit") || strstr(msg, strerror(EMFILE)) ||
            strstr(msg, strerror(ENFILE)))
                m->paused_until_ns = now + PROM_PAUSE_NS;
        if (m->logged_ns && now - m->logged_ns < PROM_LOG_NS) {
                m->unlogged++;
                return;
        }
        m->logged_ns = now;
        if (m->unlogged)
                log_warning("metrics endpoint: %s (and %" PRIu64 " more since the last such "
                            "message)",
                            msg, m->unlogged);
        else
                log_warning("metrics endpoint: %s", msg);
        m->unlogged = 0;
}

/* Split "host:port" or "[v6]:port" and resolve it to one socket address. */
static int resolve(const char *address, struct sockaddr_storage *ret, socklen_t *ret_len, char *err,
                   size_t err_len)
{
        _cleanup_free_ char *host = NULL;
        const char *port;
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
        struct addrinfo *ai = NULL;
        int r;

        if (address[0] == '[') {
                const char *close = strchr(address, ']');

                if (!close || close[1] != ':')
                        goto bad;
                host = strndup(address + 1, (size_t)(close - address - 1));
                port = close + 2;
        } else {
                const char *colon = strrchr(address, ':');

                if (!colon || strchr(address, ':') != colon)
                        goto bad;
                host = strndup(address, (size_t)(colon - address));
                port = colon + 1;
        }
        if (!host)
                return -ENOMEM;
        if (!*host || !*port || strspn(port, "0123456789") != strlen(port) || atol(port) > 65535)
                goto bad;
        r = getaddrinfo(host, port, &hints, &ai);
        if (r != 0) {
                snprintf(err, err_len, "metrics address %s: %s", address, gai_strerror(r));
                return -EADDRNOTAVAIL;
        }
        memcpy(ret, ai->ai_addr, ai->ai_addrlen);
        *ret_len = ai->ai_addrlen;
        freeaddrinfo(ai);
        return 0;
bad:
        snprintf(err, err_len, "metrics address \"%s\" is not HOST:PORT or [IPV6]:PORT", address);
        return -EINVAL;
}

int prom_server_new(const char *address, prom_render_fn render, void *userdata,
                    struct prom_server **ret, char *err, size_t err_len)
{
        _cleanup_(prom_server_freep) struct prom_server *m = NULL;
        struct sockaddr_storage sa;
        socklen_t sa_len;
        const union MHD_DaemonInfo *info;
        unsigned flags = MHD_USE_EPOLL | MHD_USE_ERROR_LOG;
        int r;

        r = resolve(address, &sa, &sa_len, err, err_len);
        if (r < 0)
                return r;
        if (sa.ss_family == AF_INET6)
                flags |= MHD_USE_IPv6;
        m = calloc(1, sizeof(*m));
        if (!m)
                return -ENOMEM;
        m->render = render;
        m->userdata = userdata;
        /* No MHD_USE_INTERNAL_POLLING_THREAD: aquad's loop drives it through prom_server_fd(). */
        /* The logger goes first so that MHD reports problems with later options through it. */
        m->mhd = MHD_start_daemon(
            flags, 0, NULL, NULL, handle, m, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, m,
            MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_CONNECTION_LIMIT, (unsigned)PROM_MAX_CONNECTIONS,
            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)PROM_CONNECTION_TIMEOUT_S, MHD_OPTION_END);
        if (!m->mhd) {
                snprintf(err, err_len, "cannot serve metrics on %s (address in use, or not local)",
                         address);
                return -EADDRINUSE;
        }
        info = MHD_get_daemon_info(m->mhd, MHD_DAEMON_INFO_BIND_PORT);
        m->port = info ? info->port : 0;
        *ret = TAKE_PTR(m);
        return 0;
}

struct prom_server *prom_server_free(struct prom_server *m)
{
        if (!m)
                return NULL;
        if (m->mhd)
                MHD_stop_daemon(m->mhd);
        free(m);
        return NULL;
}

static bool paused(const struct prom_server *m)
{
        return m->paused_until_ns && now_mono_ns() < m->paused_until_ns;
}

int prom_server_fd(const struct prom_server *m)
{
        const union MHD_DaemonInfo *info;

        if (paused(m))
                return -1;
        info = MHD_get_daemon_info(m->mhd, MHD_DAEMON_INFO_EPOLL_FD);
        return info ? info->epoll_fd : -1;
}

int prom_server_timeout_ms(const struct prom_server *m)
{
        MHD_UNSIGNED_LONG_LONG ms;

        if (paused(m))
                return (int)((m->paused_until_ns - now_mono_ns()) / NSEC_PER_MSEC) + 1;
        if (MHD_get_timeout(m->mhd, &ms) != MHD_YES || ms > PROM_MAX_IDLE_MS)
                return PROM_MAX_IDLE_MS;
        return (int)ms;
}

int prom_server_dispatch(struct prom_server *m)
{
        if (paused(m))
                return 0;
        m->paused_until_ns = 0;
        return MHD_run(m->mhd) == MHD_YES ? 0 : -EIO;
}

uint16_t prom_server_port(const struct prom_server *m)
{
        return m->port;
}

uint64_t prom_server_scrapes(const struct prom_server *m)
{
        return m->scrapes;
}
