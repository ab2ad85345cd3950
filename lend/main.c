/*
 * aqua-lend: lends what a workload nobody modified leaves idle on its GPU, and takes it back
 * before the workload needs it. It registers as the GPU's producer, watches the device's free
 * memory (cuMemGetInfo through libaqua, device-wide) and follows policy.h. lend/README.md.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aqua/aqua.h"
#include "conf.h"
#include "log.h"
#include "parse-util.h"
#include "policy.h"
#include "prometheus.h"
#include "time-util.h"
#include "util.h"

/* What the config file and the command line set; UNSET for a size: derived (lend/README.md). */
#define UNSET UINT64_MAX
/* Chunks are whole allocations: multiples of the driver's granularity, 2 MiB on every GPU. */
#define GRANULARITY (UINT64_C(2) << 20)
/* How often free memory may be read: the config's floor, for the command line too. */
#define INTERVAL_MIN NSEC_PER_MSEC
struct settings {
        char *endpoint;
        uint64_t headroom, lend_above, settle_ns, max_lend, chunk, lend_rate, reclaim_rate;
        uint64_t interval_ns, drain_retry_ns;
        char *metrics;
        char *profile;
        char *record;
        char *log_level;
};

#define SIZE_MAX_CONF ((int64_t)1 << 56)
static const struct conf_field settings_fields[] = {
    CONF_FIELD_STRING(struct settings, endpoint, "endpoint", 0),
    CONF_FIELD_SIZE(struct settings, headroom, "headroom", 0, SIZE_MAX_CONF, 0),
    CONF_FIELD_SIZE(struct settings, lend_above, "lend-above", 0, SIZE_MAX_CONF, 0),
    CONF_FIELD_DURATION(struct settings, settle_ns, "settle", 0, 3600 * NSEC_PER_SEC, 0),
    CONF_FIELD_SIZE(struct settings, max_lend, "max-lend", 0, SIZE_MAX_CONF, 0),
    CONF_FIELD_SIZE(struct settings, chunk, "chunk", 0, (int64_t)1 << 40, 0),
    CONF_FIELD_SIZE(struct settings, lend_rate, "lend-rate", 0, SIZE_MAX_CONF, 0),
    CONF_FIELD_SIZE(struct settings, reclaim_rate, "reclaim-rate", 0, SIZE_MAX_CONF, 0),
    CONF_FIELD_DURATION(struct settings, interval_ns, "interval", INTERVAL_MIN,
                        10 * NSEC_PER_SEC, 0),
    CONF_FIELD_STRING(struct settings, metrics, "metrics", 0),
    CONF_FIELD_STRING(struct settings, profile, "profile", 0),
    CONF_FIELD_STRING(struct settings, log_level, "log-level", 0),
    CONF_FIELD_END,
};
static const struct conf_schema settings_schema = {"aqua-lend", settings_fields};

/* What aqua-profile's MODEL.profile.yaml says of the workload (profiler/README.md). */
struct profile {
        char *name;
        int role;
        uint64_t memory; /* a producer: HBM free at its SLA rate, whole model */
        int64_t tp;
        uint64_t gpu_memory;
};
static const char *const profile_roles[] = {"producer", "consumer", NULL};
static const struct conf_field profile_fields[] = {
    CONF_FIELD_STRING(struct profile, name, "name", 0),
    CONF_FIELD_ENUM(struct profile, role, "role", profile_roles, CONF_REQUIRED),
    CONF_FIELD_SIZE(struct profile, memory, "memory", 0, SIZE_MAX_CONF, CONF_REQUIRED),
    CONF_FIELD_INT(struct profile, tp, "tp", 1, 1024, 0),
    CONF_FIELD_SIZE(struct profile, gpu_memory, "gpu-memory", 0, SIZE_MAX_CONF, 0),
    CONF_FIELD_END,
};
static const struct conf_schema profile_schema = {"profile", profile_fields};

/* The lender's running state and its figures. */
struct lender {
        const struct settings *set;
        struct lend_policy pol;
        struct lend_books books;
        aqua_ctx *ctx;
        struct aqua_info info;
        int device;
        uint64_t total, free;
        uint64_t offered_total, reclaimed_total, reclaim_asked_total, breaches;
        uint64_t reclaim_since_ns; /* when something last went on its way back, or came */
        uint64_t drained_until_ns; /* offers rest until then after AQUA_DRAINING */
        bool drained;
        uint64_t shortfall, short_of_lent; /* now; a breach's shortfall lending cannot cover */
        bool short_warned;
        struct prom_histogram breach_seconds;
        FILE *record;
        uint64_t start_ns;
};

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig)
{
        stop_signal = sig;
}

static void aqua_log(enum aqua_log_level level, const char *message, void *userdata)
{
        log_internal(level == AQUA_LOG_ERROR     ? LOG_LEVEL_ERROR
                     : level == AQUA_LOG_WARNING ? LOG_LEVEL_WARNING
                     : level == AQUA_LOG_NOTICE  ? LOG_LEVEL_NOTICE
                                                 : LOG_LEVEL_DEBUG,
                     0, "libaqua: %s", message);
}

static void help(void)
{
        printf("Usage: aqua-lend --device N [OPTIONS]\n"
               "\n"
               "Lends what a workload leaves idle on GPU N to aquad's pool, and takes it back\n"
               "before the workload needs it: keeps HEADROOM free for the workload at all times,\n"
               "lends in whole chunks what is free beyond HEADROOM + LEND-ABOVE once that has\n"
               "held for SETTLE, and reclaims as soon as free memory falls below HEADROOM.\n"
               "Free memory is the device's, as its driver reports it (every process counted).\n"
               "\n"
               "  -d, --device N          the GPU (CUDA ordinal) to lend from\n"
               "  -c, --config FILE       YAML with the keys below (the options win over it)\n"
               "  -e, --endpoint ADDR     aquad ($AQUA_ENDPOINT, else libaqua's default)\n"
               "      --headroom SIZE     kept free for the workload (10%% of the device)\n"
               "      --lend-above SIZE   lend only what is free beyond headroom + this (5%%)\n"
               "      --settle DUR        ...once it has held this long (5s)\n"
               "      --max-lend SIZE     never more lent than this (no limit)\n"
               "      --chunk SIZE        the unit of lending and reclaiming (32MiB)\n"
               "      --lend-rate SIZE    bytes offered per second at most (0: no limit)\n"
               "      --reclaim-rate SIZE bytes asked back per second at most (0: no limit)\n"
               "      --interval DUR      how often free memory is read (50ms)\n"
               "      --profile FILE      aqua-profile's MODEL.profile.yaml of the workload: max-lend\n"
               "                          defaults to its free memory at its SLA rate per GPU\n"
               "      --metrics ADDR      serve Prometheus metrics on ADDR (host:port)\n"
               "      --record FILE       a CSV line per decision (monotonic ms, free, lent, ...)\n"
               "      --log-level LEVEL   error, warning, notice (default), info, debug\n"
               "      --check-config      load the config and the options, say what they set, exit\n"
               "  -h, --help              show this help\n"
               "      --version           print the version\n");
}

enum {
        ARG_HEADROOM = 0x100,
        ARG_LEND_ABOVE,
        ARG_SETTLE,
        ARG_MAX_LEND,
        ARG_CHUNK,
        ARG_LEND_RATE,
        ARG_RECLAIM_RATE,
        ARG_INTERVAL,
        ARG_METRICS,
        ARG_PROFILE,
        ARG_RECORD,
        ARG_LOG_LEVEL,
        ARG_CHECK_CONFIG,
};

static const struct option options[] = {
    {"device", required_argument, NULL, 'd'},
    {"config", required_argument, NULL, 'c'},
    {"endpoint", required_argument, NULL, 'e'},
    {"headroom", required_argument, NULL, ARG_HEADROOM},
    {"lend-above", required_argument, NULL, ARG_LEND_ABOVE},
    {"settle", required_argument, NULL, ARG_SETTLE},
    {"max-lend", required_argument, NULL, ARG_MAX_LEND},
    {"chunk", required_argument, NULL, ARG_CHUNK},
    {"lend-rate", required_argument, NULL, ARG_LEND_RATE},
    {"reclaim-rate", required_argument, NULL, ARG_RECLAIM_RATE},
    {"interval", required_argument, NULL, ARG_INTERVAL},
    {"metrics", required_argument, NULL, ARG_METRICS},
    {"profile", required_argument, NULL, ARG_PROFILE},
    {"record", required_argument, NULL, ARG_RECORD},
    {"log-level", required_argument, NULL, ARG_LOG_LEVEL},
    {"check-config", no_argument, NULL, ARG_CHECK_CONFIG},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {},
};

static void replace(char **dst, const char *src)
{
        free(*dst);
        *dst = strdup(src);
        if (!*dst) {
                fprintf(stderr, "aqua-lend: out of memory\n");
                exit(EXIT_FAILURE);
        }
}

static int bad_value(const char *opt, const char *value)
{
        fprintf(stderr, "aqua-lend: --%s: '%s' is not valid\n", opt, value);
        return -EINVAL;
}

/* A second pass over argv after the config file, so that options win over it. */
static bool check_config;

static int parse_options(int argc, char **argv, bool config_pass, int *device, char **config,
                         struct settings *s)
{
        int c;

        optind = 1;
        opterr = config_pass;
        while ((c = getopt_long(argc, argv, "d:c:e:h", options, NULL)) >= 0) {
                const char *name = NULL;
                uint64_t *size = NULL, *dur = NULL;
                int64_t n;

                if (c == '?')
                        return -EINVAL;
                if (config_pass) {
                        if (c == 'h') {
                                help();
                                exit(EXIT_SUCCESS);
                        }
                        if (c == 'V') {
                                printf("aqua-lend %s\n", AQUA_PACKAGE_VERSION);
                                exit(EXIT_SUCCESS);
                        }
                        if (c == 'c')
                                replace(config, optarg);
                        if (c == ARG_CHECK_CONFIG)
                                check_config = true;
                        if (c == 'd') {
                                if (parse_int64(optarg, 10, &n) < 0 || n < 0 || n > 1023)
                                        return bad_value("device", optarg);
                                *device = (int)n;
                        }
                        continue;
                }
                switch (c) {
                case 'e':
                        replace(&s->endpoint, optarg);
                        break;
                case ARG_METRICS:
                        replace(&s->metrics, optarg);
                        break;
                case ARG_RECORD:
                        replace(&s->record, optarg);
                        break;
                case ARG_PROFILE:
                        replace(&s->profile, optarg);
                        break;
                case ARG_LOG_LEVEL:
                        replace(&s->log_level, optarg);
                        break;
                case ARG_HEADROOM:
                        size = &s->headroom, name = "headroom";
                        break;
                case ARG_LEND_ABOVE:
                        size = &s->lend_above, name = "lend-above";
                        break;
                case ARG_MAX_LEND:
                        size = &s->max_lend, name = "max-lend";
                        break;
                case ARG_CHUNK:
                        size = &s->chunk, name = "chunk";
                        break;
                case ARG_LEND_RATE:
                        size = &s->lend_rate, name = "lend-rate";
                        break;
                case ARG_RECLAIM_RATE:
                        size = &s->reclaim_rate, name = "reclaim-rate";
                        break;
                case ARG_SETTLE:
                        dur = &s->settle_ns, name = "settle";
                        break;
                case ARG_INTERVAL:
                        dur = &s->interval_ns, name = "interval";
                        break;
                }
                if (size && parse_size(optarg, size) < 0)
                        return bad_value(name, optarg);
                if (dur && parse_duration(optarg, dur) < 0)
                        return bad_value(name, optarg);
        }
        if (optind < argc) {
                fprintf(stderr, "aqua-lend: unexpected argument '%s'\n", argv[optind]);
                return -EINVAL;
        }
        return 0;
}

/* ---------------------------------------------------------------------------------- figures */

static const double breach_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                       0.5,   1,    2.5,   5,    10,  30};

static int render(struct prom_text *t, void *userdata)
{
        const struct lender *l = userdata;
        char dev[16];
        const struct prom_label labels[] = {{"device", dev}, {"gpu", l->info.gpu_uuid}};

        snprintf(dev, sizeof(dev), "%d", l->device);
#define GAUGE(name, help, value)                                                                   \
        do {                                                                                       \
                prom_family(t, name, "gauge", help);                                               \
                prom_sample_u64(t, name, labels, 2, value);                                        \
        } while (0)
#define COUNTER(name, help, value)                                                                 \
        do {                                                                                       \
                prom_family(t, name, "counter", help);                                             \
                prom_sample_u64(t, name, labels, 2, value);                                        \
        } while (0)
        GAUGE("aqua_lend_device_bytes", "Memory of the device.", l->total);
        GAUGE("aqua_lend_free_bytes", "Free memory of the device at the last reading.", l->free);
        GAUGE("aqua_lend_headroom_bytes", "Memory kept free for the workload.", l->pol.headroom);
        GAUGE("aqua_lend_lent_bytes", "Memory allocated for lending and not yet freed.",
              l->books.lent);
        GAUGE("aqua_lend_reclaiming_bytes", "Memory asked back and not yet freed.",
              l->books.reclaiming);
        GAUGE("aqua_lend_shortfall_bytes", "How far free memory is below the headroom now.",
              l->shortfall);
        GAUGE("aqua_lend_connected", "1 while aqua-lend is registered with aquad.",
              l->info.connected ? 1 : 0);
        COUNTER("aqua_lend_offered_bytes_total", "Memory offered to aquad's pool.",
                l->offered_total);
        COUNTER("aqua_lend_reclaimed_bytes_total", "Lent memory taken back and freed.",
                l->reclaimed_total);
        COUNTER("aqua_lend_breaches_total", "Times free memory fell below the headroom.",
                l->breaches);
#undef GAUGE
#undef COUNTER
        prom_histogram_write(t, "aqua_lend_breach_seconds",
                             "From free memory falling below the headroom to it being back.",
                             &l->breach_seconds);
        return 0;
}

/* --------------------------------------------------------------------------------- the loop */

static char *sz(char *buf, uint64_t bytes)
{
        return format_size(buf, 32, bytes);
}

static void handle_events(struct lender *l, uint64_t now)
{
        struct aqua_event ev[32];
        size_t n;

        do {
                int r = aqua_poll(l->ctx, ev, ARRAY_SIZE(ev), &n);
                if (r < 0) {
                        log_warning_errno(r, "aqua_poll: %m");
                        return;
                }
                for (size_t i = 0; i < n; i++) {
                        switch (ev[i].type) {
                        case AQUA_EVENT_RECLAIMED:
                                lend_note_freed(&l->books, ev[i].bytes);
                                l->reclaimed_total += ev[i].bytes;
                                l->reclaim_since_ns = now;
                                break;
                        case AQUA_EVENT_DISCONNECTED:
                                log_warning("lost aquad: lent memory stays lent; reconnecting");
                                break;
                        case AQUA_EVENT_RECONNECTED:
                                log_notice("registered with aquad again");
                                break;
                        case AQUA_EVENT_DAEMON_STOPPING:
                                log_notice("aquad is stopping");
                                break;
                        default:
                                break;
                        }
                }
        } while (n == ARRAY_SIZE(ev));
}

static void offer(struct lender *l, const struct lend_decision *d, uint64_t free, uint64_t now)
{
        char a[32], b[32], c[32], e[32];
        uint64_t offered = 0;
        int r;

        if (l->drained && now < l->drained_until_ns)
                return;
        r = aqua_offer(l->ctx, d->bytes, &offered);
        if (r == AQUA_DRAINING) {
                if (!l->drained)
                        log_notice("GPU %d is drained by an operator: nothing is offered until "
                                   "`aquactl undrain`",
                                   l->device);
                l->drained = true;
                l->drained_until_ns = now + l->set->drain_retry_ns;
                return;
        }
        if (l->drained)
                log_notice("GPU %d is no longer drained", l->device);
        l->drained = false;
        if (r != 0 && offered == 0) {
                log_warning("offer of %s failed: %s", sz(a, d->bytes), aqua_strerror(r));
                return;
        }
        lend_note_offered(&l->books, offered);
        l->offered_total += offered;
        log_notice("offer %s: free %s beyond headroom %s + lend-above %s for %s; lent %s%s",
                   sz(a, offered), sz(b, free), sz(c, l->pol.headroom), sz(e, l->pol.lend_above),
                   format_duration((char[32]){0}, 32, l->pol.settle_ns),
                   sz((char[32]){0}, l->books.lent),
                   offered < d->bytes ? " (less than decided: the device ran out)" : "");
}

static void reclaim(struct lender *l, const struct lend_decision *d, uint64_t free, uint64_t now)
{
        char a[32], b[32], c[32], e[32];
        uint64_t on_way = l->books.reclaiming;
        int r = aqua_reclaim_async(l->ctx, d->bytes);

        if (r < 0) {
                log_warning("reclaim of %s failed: %s", sz(a, d->bytes), aqua_strerror(r));
                return;
        }
        lend_note_reclaiming(&l->books, d->bytes);
        l->reclaim_asked_total += d->bytes;
        l->reclaim_since_ns = now;
        log_notice("reclaim %s: free %s below headroom %s (short %s), %s already on its way, "
                   "lent %s%s",
                   sz(a, d->bytes), sz(b, free), sz(c, l->pol.headroom), sz(e, d->shortfall),
                   sz((char[32]){0}, on_way), sz((char[32]){0}, l->books.lent),
                   d->bytes < d->want ? " (reclaim-rate holds back the rest)" : "");
}

static void breach(struct lender *l, const struct lend_decision *d, uint64_t free)
{
        char a[32], b[32], c[32];

        l->shortfall = d->shortfall;
        if (d->breach_began) {
                l->breaches++;
                l->short_warned = false;
                log_notice("free memory %s fell below the headroom %s", sz(a, free),
                           sz(b, l->pol.headroom));
        }
        /* Reclaiming everything lent will not give the workload its headroom back. */
        if (d->shortfall > 0 && d->shortfall > l->books.lent && !l->short_warned) {
                l->short_warned = true;
                log_warning("the workload grew beyond what lending can give back: free %s, %s "
                            "short of the headroom with only %s lent",
                            sz(a, free), sz(b, d->shortfall), sz(c, l->books.lent));
        }
        if (d->breach_ended) {
                prom_histogram_observe(&l->breach_seconds, (double)d->breach_ns / NSEC_PER_SEC);
                log_notice("free memory back at the headroom after %s; it was %s short at most",
                           format_duration(a, sizeof(a), d->breach_ns), sz(b, d->breach_peak));
        }
}

static void step(struct lender *l, uint64_t now)
{
        struct lend_decision d;
        uint64_t free, total, deadline_ns;
        int r;

        r = aqua_device_memory(l->ctx, &free, &total);
        if (r < 0) {
                log_warning_errno(r, "reading the device's free memory: %m");
                return;
        }
        aqua_get_info(l->ctx, &l->info);
        l->free = free;
        l->total = total;
        lend_note_lent(&l->books, l->info.offered_bytes);
        /* A reclaim aquad refused, or that never completed, is asked for again. */
        deadline_ns = (MAX(l->info.reclaim_deadline_ms, 1000) * 2) * NSEC_PER_MSEC;
        if (l->books.reclaiming > 0 && now - l->reclaim_since_ns > deadline_ns) {
                log_warning("%s asked back did not come back within %" PRIu64
                            " ms: asking again",
                            sz((char[32]){0}, l->books.reclaiming), deadline_ns / NSEC_PER_MSEC);
                lend_forget_reclaiming(&l->books);
        }

        lend_policy_decide(&l->pol, &l->books, now, free, &d);
        breach(l, &d, free);
        if (d.verb == LEND_OFFER && l->info.connected)
                offer(l, &d, free, now);
        else if (d.verb == LEND_RECLAIM && l->info.connected)
                reclaim(l, &d, free, now);
        if (l->record)
                fprintf(l->record, "%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%s,%" PRIu64
                                   "\n",
                        now / NSEC_PER_MSEC, free, l->books.lent, l->books.reclaiming,
                        lend_verb_to_string(d.verb), d.verb == LEND_HOLD ? 0 : d.bytes);
}

static int run(struct lender *l, struct prom_server *http)
{
        uint64_t next = now_mono_ns();
        int fd, r;

        r = aqua_fd(l->ctx, &fd);
        if (r < 0)
                return log_error_errno(r, "aqua_fd: %m");
        while (!stop_signal) {
                struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = -1, .events = POLLIN}};
                uint64_t now = now_mono_ns();
                int timeout;

                if (now >= next) {
                        handle_events(l, now);
                        step(l, now);
                        next = MAX(next + l->set->interval_ns, now);
                        if (l->record)
                                fflush(l->record);
                }
                timeout = ms_until(next);
                if (http) {
                        p[1].fd = prom_server_fd(http);
                        timeout = MIN(timeout, prom_server_timeout_ms(http));
                }
                r = poll(p, 2, MAX(timeout, 1));
                if (r < 0 && errno != EINTR)
                        return log_error_errno(-errno, "poll: %m");
                if (p[0].revents)
                        handle_events(l, now_mono_ns());
                if (http)
                        prom_server_dispatch(http);
        }
        return 0;
}

/*
 * The workload's profile: what it leaves free at its SLA rate, per GPU of its tensor-parallel
 * group (*ret_per_gpu, may be NULL). A consumer's profile has nothing to lend.
 */
static int profile_load(const char *path, struct profile *pr)
{
        _cleanup_free_ char *error = NULL;

        *pr = (struct profile){.role = -1, .tp = 1};
        if (conf_load(&profile_schema, path, pr, &error) < 0) {
                log_error("profile: %s", error ? error : path);
                return -EINVAL;
        }
        if (pr->role != 0) {
                log_error("profile %s: %s is a consumer at its SLA rate: it has nothing to lend",
                          path, pr->name ? pr->name : "the model");
                return -EINVAL;
        }
        return 0;
}

static int profile_check(const char *path)
{
        struct profile pr;
        int r = profile_load(path, &pr);

        conf_free(&profile_schema, &pr);
        return r;
}

/* max-lend from the profile, for the device l opened. */
static int profile_max_lend(const struct lender *l, const char *path, uint64_t *ret)
{
        struct profile pr;
        char a[32], b[32];
        int r = profile_load(path, &pr);

        if (r == 0) {
                *ret = pr.memory / (uint64_t)pr.tp;
                if (pr.gpu_memory && pr.gpu_memory != l->info.capacity)
                        log_warning("profile %s was measured on a GPU of %s, GPU %d has %s: its "
                                    "free memory may differ here",
                                    path, sz(a, pr.gpu_memory), l->device,
                                    sz(b, l->info.capacity));
                log_notice("max-lend %s: %s's free memory at its SLA rate (%s, tp %" PRId64 ")",
                           sz(a, *ret), pr.name ? pr.name : "the model", path, pr.tp);
        }
        conf_free(&profile_schema, &pr);
        return r;
}

static char *rate(char *buf, uint64_t bytes_per_s)
{
        if (!bytes_per_s)
                return strcpy(buf, "unlimited");
        format_size(buf, 24, bytes_per_s);
        strcat(buf, "/s");
        return buf;
}

/* What the settings say, for --check-config: sizes left to derive from the device say so. */
static void describe(const struct settings *s)
{
        char a[32], b[32], c[32];

        printf("headroom %s, lend-above %s, settle %s, max-lend %s, chunk %s, lend-rate %s, "
               "reclaim-rate %s, interval %s, metrics %s%s%s\n",
               s->headroom != UNSET ? sz(a, s->headroom) : "10% of the device",
               s->lend_above != UNSET ? sz(b, s->lend_above) : "5% of the device",
               format_duration(c, sizeof(c), s->settle_ns),
               s->max_lend  ? sz((char[32]){0}, s->max_lend)
               : s->profile ? "from the profile"
                            : "no limit",
               s->chunk != UNSET ? sz((char[32]){0}, s->chunk) : "libaqua's (32 MiB)",
               rate((char[32]){0}, s->lend_rate), rate((char[32]){0}, s->reclaim_rate),
               format_duration((char[32]){0}, 32, s->interval_ns),
               s->metrics ? s->metrics : "off", s->profile ? ", profile " : "",
               s->profile ? s->profile : "");
}

/* What can be told of the settings before a device is seen (also for --check-config). */
static int validate(const struct settings *s)
{
        char a[32];

        if (s->chunk != UNSET && (s->chunk == 0 || s->chunk % GRANULARITY != 0)) {
                fprintf(stderr,
                        "aqua-lend: chunk: %s is not a positive multiple of the allocation "
                        "granularity (2 MiB)\n",
                        sz(a, s->chunk));
                return -EINVAL;
        }
        if (s->interval_ns < INTERVAL_MIN) {
                fprintf(stderr, "aqua-lend: interval: %s is shorter than 1ms\n",
                        format_duration(a, sizeof(a), s->interval_ns));
                return -EINVAL;
        }
        return 0;
}

/* Resolve what was left to derive from the device, and check the result. */
static int make_policy(struct lender *l)
{
        const struct settings *s = l->set;
        uint64_t chunk = l->info.chunk_bytes, cap = l->info.capacity, max_lend = s->max_lend;
        const char *what;
        char a[32], b[32], c[32];

        if (s->profile && !max_lend && profile_max_lend(l, s->profile, &max_lend) < 0)
                return -EINVAL;

        l->pol = (struct lend_policy){
            .headroom =
                s->headroom != UNSET ? s->headroom : MAX(cap / 10 / chunk * chunk, 2 * chunk),
            .lend_above = s->lend_above != UNSET ? s->lend_above : cap / 20 / chunk * chunk,
            .settle_ns = s->settle_ns,
            .max_lend = max_lend ? max_lend : UINT64_MAX,
            .chunk = chunk,
            .lend_rate = s->lend_rate,
            .reclaim_rate = s->reclaim_rate,
        };
        if (l->pol.headroom > cap) {
                log_error("GPU %d has %s: a headroom of %s is more than the whole device", l->device,
                          sz(a, cap), sz(b, l->pol.headroom));
                return -EINVAL;
        }
        if (lend_policy_check(&l->pol, &what) < 0) {
                log_error("GPU %d (%s, chunks of %s): %s", l->device, sz(a, cap), sz(b, chunk),
                          what);
                return -EINVAL;
        }
        log_notice("lending from GPU %d (%s, %s): headroom %s, lend-above %s, settle %s, "
                   "chunks of %s%s%s",
                   l->device, l->info.gpu_uuid, sz(a, cap), sz(b, l->pol.headroom),
                   sz(c, l->pol.lend_above), format_duration((char[32]){0}, 32, l->pol.settle_ns),
                   sz((char[32]){0}, chunk), l->pol.max_lend == UINT64_MAX ? "" : ", max-lend ",
                   l->pol.max_lend == UINT64_MAX ? "" : sz((char[32]){0}, l->pol.max_lend));
        return 0;
}

/* Take back everything lent before leaving, so that nothing is freed under a consumer. */
static void take_back(struct lender *l)
{
        uint64_t freed = 0;
        int r;

        aqua_get_info(l->ctx, &l->info);
        if (l->info.offered_bytes == 0 || !l->info.connected)
                return;
        r = aqua_reclaim(l->ctx, AQUA_ALL, (int)MIN(l->info.reclaim_deadline_ms * 2, 60000),
                         &freed);
        l->reclaimed_total += freed;
        log_notice("stopping: took back %s of %s lent (%s)", sz((char[32]){0}, freed),
                   sz((char[32]){0}, l->info.offered_bytes), aqua_strerror(r));
}

int main(int argc, char **argv)
{
        struct settings set = {
            .headroom = UNSET,
            .lend_above = UNSET,
            .chunk = UNSET,
            .settle_ns = 5 * NSEC_PER_SEC,
            .interval_ns = 50 * NSEC_PER_MSEC,
            .drain_retry_ns = 30 * NSEC_PER_SEC,
        };
        _cleanup_free_ char *config = NULL, *conf_error = NULL;
        struct aqua_options opts = AQUA_OPTIONS_INIT;
        struct lender l = {.set = &set, .device = -1};
        struct prom_server *http = NULL;
        struct sigaction sa = {.sa_handler = on_signal};
        enum log_level level = LOG_LEVEL_NOTICE;
        int r, rc = EXIT_FAILURE;

        log_setup("aqua-lend", LOG_LEVEL_NOTICE);
        if (parse_options(argc, argv, true, &l.device, &config, &set) < 0)
                return 2;
        if (config && conf_load(&settings_schema, config, &set, &conf_error) < 0) {
                fprintf(stderr, "aqua-lend: %s\n", conf_error);
                goto out;
        }
        if (parse_options(argc, argv, false, &l.device, &config, &set) < 0) {
                rc = 2;
                goto out;
        }
        if (set.log_level) {
                level = log_level_from_string(set.log_level);
                if ((int)level < 0) {
                        fprintf(stderr, "aqua-lend: log-level: '%s' is not one of error, warning, "
                                        "notice, info, debug\n",
                                set.log_level);
                        goto out;
                }
                log_set_max_level(level);
        }
        if (validate(&set) < 0)
                goto out;
        if (check_config) {
                if (set.profile && profile_check(set.profile) < 0)
                        goto out;
                describe(&set);
                rc = EXIT_SUCCESS;
                goto out;
        }
        if (l.device < 0) {
                fprintf(stderr, "aqua-lend: --device is required (aqua-lend --help)\n");
                rc = 2;
                goto out;
        }
        aqua_set_log(aqua_log, NULL, level >= LOG_LEVEL_DEBUG ? AQUA_LOG_DEBUG : AQUA_LOG_NOTICE);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        signal(SIGPIPE, SIG_IGN);

        opts.endpoint = set.endpoint;
        opts.chunk_bytes = set.chunk != UNSET ? set.chunk : 0;
        opts.client_name = "aqua-lend";
        r = aqua_open(l.device, AQUA_ROLE_PRODUCER, &opts, &l.ctx);
        if (r < 0) {
                log_error("cannot register GPU %d as a producer with aquad at %s: %s", l.device,
                          set.endpoint ? set.endpoint
                          : getenv("AQUA_ENDPOINT") ? getenv("AQUA_ENDPOINT")
                                                    : AQUA_DEFAULT_ENDPOINT,
                          aqua_strerror(r));
                goto out;
        }
        aqua_get_info(l.ctx, &l.info);
        if (make_policy(&l) < 0)
                goto out;
        prom_histogram_init(&l.breach_seconds, breach_bounds, ARRAY_SIZE(breach_bounds));
        if (set.metrics) {
                char err[256];
                if (prom_server_new(set.metrics, render, &l, &http, err, sizeof(err)) < 0) {
                        log_error("metrics: %s", err);
                        goto out;
                }
                log_notice("metrics on http://%s/metrics (port %u)", set.metrics,
                           prom_server_port(http));
        }
        if (set.record) {
                l.record = fopen(set.record, "we");
                if (!l.record) {
                        log_error_errno(-errno, "--record %s: %m", set.record);
                        goto out;
                }
                fprintf(l.record, "t_ms,free,lent,reclaiming,verb,bytes\n");
        }
        lend_books_init(&l.books);
        l.start_ns = now_mono_ns();
        if (run(&l, http) == 0)
                rc = EXIT_SUCCESS;
        take_back(&l);
        log_notice("offered %s in all, took back %s; %" PRIu64 " headroom breaches",
                   sz((char[32]){0}, l.offered_total), sz((char[32]){0}, l.reclaimed_total),
                   l.breaches);
out:
        if (l.record)
                fclose(l.record);
        prom_server_free(http);
        aqua_close(l.ctx);
        conf_free(&settings_schema, &set);
        free(set.record);
        return rc;
}
