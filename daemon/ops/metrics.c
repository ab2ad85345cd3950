/* aquad's metrics: families rendered from the pool and what the transport shows of itself
 * (struct metrics_view), served from the poll loop. */
#include "metrics.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "aqua.pb-c.h"
#include "broker.h"
#include "log.h"
#include "prometheus.h"
#include "time-util.h"

/* Reclaim latency buckets, seconds: from a consumer that returns at once to one near a deadline. */
static const double reclaim_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                        0.25,  0.5,    1,     2.5,  5,     10,   30};

struct metrics {
        struct broker *broker;
        metrics_view_fn view;
        void *view_userdata;
        struct prom_server *http;
        struct prom_histogram reclaim;
};

/* The pool tells us each time a reclaimed chunk is back from its consumer. */
static void observe_reclaim(void *userdata, uint64_t latency_ns)
{
        struct metrics *m = userdata;

        prom_histogram_observe(&m->reclaim, (double)latency_ns / 1e9);
}

static void gauge(struct prom_text *t, const char *name, const char *help, uint64_t v)
{
        prom_family(t, name, "gauge", help);
        prom_sample_u64(t, name, NULL, 0, v);
}

static void counter(struct prom_text *t, const char *name, const char *help, uint64_t v)
{
        prom_family(t, name, "counter", help);
        prom_sample_u64(t, name, NULL, 0, v);
}

/* One family with a sample per value of a single label. */
static void by_label(struct prom_text *t, const char *name, const char *type, const char *help,
                     const char *label, const char *const *values, const uint64_t *counts, size_t n)
{
        prom_family(t, name, type, help);
        for (size_t i = 0; i < n; i++)
                prom_sample_u64(t, name, &(struct prom_label){label, values[i]}, 1, counts[i]);
}

static void render_clients(struct prom_text *t, const struct metrics_view *v)
{
        static const char *const roles[] = {"unregistered", "producer", "consumer", "neutral",
                                            "admin"};

        by_label(t, "aqua_clients", "gauge", "Connected clients by the role they registered.",
                 "role", roles, v->clients_by_role, ARRAY_SIZE(roles));
}

/* A domain's leader: its term and what its etcd commits cost (only the leader serves these). */
static void render_domain(struct prom_text *t, const struct domain_view *d)
{
        struct prom_label name = {"domain", d->name};

        prom_family(t, "aqua_domain_leader", "gauge", "1 while this aquad leads its domain.");
        prom_sample_u64(t, "aqua_domain_leader", &name, 1, d->leader);
        prom_family(t, "aqua_domain_term", "gauge",
                    "The term this aquad leads in: the etcd revision that created the election "
                    "key; a new value is a new leader.");
        prom_sample_u64(t, "aqua_domain_term", &name, 1, (uint64_t)d->term);
        prom_family(t, "aqua_etcd_commit_seconds", "summary",
                    "Journal commits through etcd (one fenced transaction per turn) and their "
                    "time.");
        prom_sample_double(t, "aqua_etcd_commit_seconds_sum", &name, 1, d->commit_seconds);
        prom_sample_u64(t, "aqua_etcd_commit_seconds_count", &name, 1, d->commits);
}

static void render_pool(struct prom_text *t, const struct broker_totals *p)
{
        static const char *const roles[] = {"producer", "consumer", "neutral"};
        static const char *const chunk_states[_CHUNK_STATE_MAX] = {"free", "leased", "reclaiming"};
        static const char *const lease_states[_LEASE_STATE_MAX] = {"granted", "reclaiming",
                                                                   "returned", "lost"};

        by_label(t, "aqua_gpus", "gauge", "GPUs aquad knows, by role.", "role", roles,
                 &p->gpus_by_role[GPU_ROLE_PRODUCER], ARRAY_SIZE(roles));
        by_label(t, "aqua_chunks", "gauge", "Chunks in the lending pool, by state.", "state",
                 chunk_states, p->chunks_by_state, _CHUNK_STATE_MAX);
        by_label(t, "aqua_chunk_bytes", "gauge", "Bytes of the chunks in the pool, by state.",
                 "state", chunk_states, p->chunk_bytes_by_state, _CHUNK_STATE_MAX);
        by_label(t, "aqua_leases", "gauge", "Leases, by state.", "state", lease_states,
                 p->leases_by_state, _LEASE_STATE_MAX);
        gauge(t, "aqua_pool_bytes", "Bytes producers have offered (leased or not).", p->pool_bytes);
        gauge(t, "aqua_lent_bytes", "Bytes leased out to consumers.", p->lent_bytes);
        gauge(t, "aqua_dram_budget_bytes", "Host memory consumers may pin as fallback.",
              p->dram_budget);
        gauge(t, "aqua_dram_granted_bytes", "DRAM fallback budget granted to consumers.",
              p->dram_granted);
        counter(t, "aqua_chunks_offered_total", "Chunks producers have offered.",
                p->stats.chunks_offered);
        counter(t, "aqua_leases_granted_total", "Leases granted.", p->stats.leases_granted);
        counter(t, "aqua_deadline_misses_total",
                "Reclaimed chunks a consumer still held at the deadline.",
                p->stats.deadline_misses);
        counter(t, "aqua_leases_lost_total", "Leases that could not be reconciled after a restart.",
                p->stats.leases_lost);
        counter(t, "aqua_reclaim_returned_chunks_total",
                "Chunks consumers returned in answer to reclaims: moved off peer memory.",
                p->stats.reclaim_returned_chunks);
        counter(t, "aqua_reclaim_returned_bytes_total",
                "Bytes of the chunks consumers returned in answer to reclaims.",
                p->stats.reclaim_returned_bytes);
        counter(t, "aqua_journal_errors_total", "Failed journal writes.", p->stats.journal_errors);
        counter(t, "aqua_journal_commits_total",
                "Journal records written (one write and one fdatasync each; one per turn of "
                "aquad's loop that changed state).",
                p->stats.journal_commits);
        counter(t, "aqua_journal_compaction_failures_total", "Failed journal compactions.",
                p->stats.compaction_failures);
        gauge(t, "aqua_degraded",
              "1 while the journal cannot be written (offers and grants are refused) or compacted.",
              p->degraded);
        counter(t, "aqua_scrubs_requested_total",
                "Chunks producers were asked to zero before another consumer gets them.",
                p->stats.scrubs_requested);
        counter(t, "aqua_chunks_scrubbed_total", "Chunks producers zeroed and verified.",
                p->stats.chunks_scrubbed);
        counter(t, "aqua_scrub_failures_total", "Chunks that failed their scrub (dropped).",
                p->stats.scrub_failures);
        counter(t, "aqua_chunks_unusable_total", "Chunks a consumer could not import (dropped).",
                p->stats.chunks_unusable);
        counter(t, "aqua_custody_refused_total",
                "Hellos refused because another identity holds the GPU's memory.",
                p->stats.custody_refused);
        gauge(t, "aqua_gpus_silent",
              "GPUs whose holder did not re-register after a restart (or went unheard) while its "
              "process may still map their memory: leases kept, granted to nobody.",
              p->gpus_silent);
        gauge(t, "aqua_chunks_quarantined",
              "Chunks an operator released from a holder whose process still runs.",
              p->chunks_quarantined);
}

/* Per-GPU families: one pass per family keeps each family's samples together, as required. */
enum gpu_field {
        GPU_OFFERED,
        GPU_LENT,
        GPU_BORROWED,
        GPU_DRAM,
        GPU_DRAM_IN_USE,
        GPU_MIGRATIONS,
        GPU_MOVED,
        GPU_RECLAIM_RETURNED,
        GPU_RECLAIM_RETURNED_BYTES,
        GPU_BARRED,
        _GPU_FIELD_MAX,
};

static const struct {
        const char *name, *type, *help;
} gpu_families[_GPU_FIELD_MAX] = {
    [GPU_OFFERED] = {"aqua_gpu_offered_bytes", "gauge",
                     "Bytes this producer has in the pool, leased or not."},
    [GPU_LENT] = {"aqua_gpu_lent_bytes", "gauge", "Bytes of this producer leased out."},
    [GPU_BORROWED] = {"aqua_gpu_borrowed_bytes", "gauge", "Bytes this consumer holds in leases."},
    [GPU_DRAM] = {"aqua_gpu_dram_fallback_bytes", "gauge",
                  "DRAM fallback budget granted to this consumer."},
    [GPU_DRAM_IN_USE] = {"aqua_gpu_dram_in_use_bytes", "gauge",
                         "Bytes this consumer keeps in DRAM fallback, as it reports."},
    [GPU_MIGRATIONS] = {"aqua_gpu_reported_migrations_total", "counter",
                        "Chunk migrations, as the client reports them in its load reports "
                        "(aquad's own count: aqua_gpu_reclaim_returned_chunks_total)."},
    [GPU_MOVED] = {"aqua_gpu_reported_moved_bytes_total", "counter",
                   "Bytes migrated, as the client reports them in its load reports."},
    [GPU_RECLAIM_RETURNED] =
        {"aqua_gpu_reclaim_returned_chunks_total", "counter",
         "Chunks this consumer returned in answer to reclaims: moved off peer memory (aquad's "
         "count, from when aquad last came to know the GPU)."},
    [GPU_RECLAIM_RETURNED_BYTES] = {"aqua_gpu_reclaim_returned_bytes_total", "counter",
                                    "Bytes of the chunks this consumer returned in answer to "
                                    "reclaims (aquad's count)."},
    [GPU_BARRED] = {"aqua_gpu_barred", "gauge",
                    "1 when the consumer missed a reclaim deadline and gets no new leases."},
};

static uint64_t gpu_value(const struct broker_gpu_view *g, enum gpu_field f)
{
        switch (f) {
        case GPU_OFFERED:
                return g->offered_bytes;
        case GPU_LENT:
                return g->lent_bytes;
        case GPU_BORROWED:
                return g->borrowed_bytes;
        case GPU_DRAM:
                return g->dram_bytes;
        case GPU_DRAM_IN_USE:
                return g->reported.dram_bytes;
        case GPU_MIGRATIONS:
                return g->reported.migrations;
        case GPU_MOVED:
                return g->reported.bytes_moved;
        case GPU_RECLAIM_RETURNED:
                return g->reclaim_returned_chunks;
        case GPU_RECLAIM_RETURNED_BYTES:
                return g->reclaim_returned_bytes;
        case GPU_BARRED:
                return g->barred;
        default:
                return 0;
        }
}

/* The labels naming g, {gpu, uuid}, into l[0..1]; ordinal holds the number's text. */
static void gpu_labels(const struct broker_gpu_view *g, char ordinal[16], struct prom_label *l)
{
        snprintf(ordinal, 16, "%" PRIu32, g->ordinal);
        l[0] = (struct prom_label){"gpu", ordinal};
        l[1] = (struct prom_label){"uuid", g->uuid};
}

/*
 * What a GPU is, as values rather than labels where it changes (Prometheus' naming and
 * instrumentation guides): a label that changes starts a new series, so role is a state set
 * (one series per role, 1 on the current one) and connected a 0/1 gauge. The client's name and
 * the pair stay labels of info series, for joins: they change when another program registers
 * the GPU or an operator pairs it, not as it runs.
 */
static void render_gpu_state(struct prom_text *t, const struct broker_gpu_view *v, size_t n)
{
        char ordinal[16];
        struct prom_label l[3];

        prom_family(t, "aqua_gpu_info", "gauge",
                    "1 per GPU aquad knows; client names the program that registered it last.");
        for (size_t i = 0; i < n; i++) {
                gpu_labels(&v[i], ordinal, l);
                l[2] = (struct prom_label){"client", v[i].client_name};
                prom_sample_u64(t, "aqua_gpu_info", l, 3, 1);
        }
        prom_family(t, "aqua_gpu_role", "gauge",
                    "1 for the role the GPU was registered in, 0 for the others.");
        for (size_t i = 0; i < n; i++) {
                gpu_labels(&v[i], ordinal, l);
                for (int r = 0; r < _GPU_ROLE_MAX; r++) {
                        l[2] = (struct prom_label){"role", gpu_role_to_string(r)};
                        prom_sample_u64(t, "aqua_gpu_role", l, 3, v[i].role == (enum gpu_role)r);
                }
        }
        prom_family(t, "aqua_gpu_connected", "gauge", "1 while the GPU's client is connected.");
        for (size_t i = 0; i < n; i++) {
                gpu_labels(&v[i], ordinal, l);
                prom_sample_u64(t, "aqua_gpu_connected", l, 2, v[i].owner != NULL);
        }
        prom_family(t, "aqua_gpu_pair_info", "gauge",
                    "1 per paired GPU; paired_with is the uuid of the GPU it is paired with.");
        for (size_t i = 0; i < n; i++) {
                if (!v[i].paired_with[0])
                        continue;
                gpu_labels(&v[i], ordinal, l);
                l[2] = (struct prom_label){"paired_with", v[i].paired_with};
                prom_sample_u64(t, "aqua_gpu_pair_info", l, 3, 1);
        }
        prom_family(t, "aqua_gpu_load_ratio", "gauge",
                    "Engine load (0 to 1), as the client reports it.");
        for (size_t i = 0; i < n; i++) {
                gpu_labels(&v[i], ordinal, l);
                prom_sample_double(t, "aqua_gpu_load_ratio", l, 2, v[i].reported.load);
        }
}

static void render_gpus(struct prom_text *t, const struct broker_gpu_view *v, size_t n)
{
        char ordinal[16];
        struct prom_label labels[2];

        render_gpu_state(t, v, n);
        for (int f = 0; f < _GPU_FIELD_MAX; f++) {
                prom_family(t, gpu_families[f].name, gpu_families[f].type, gpu_families[f].help);
                for (size_t i = 0; i < n; i++) {
                        const struct broker_gpu_view *g = &v[i];
                        bool producer = g->role == GPU_ROLE_PRODUCER;

                        /* A series only where it can mean something: lending for producers,
                         * borrowing for consumers, client reports for both. */
                        if (((f == GPU_OFFERED || f == GPU_LENT) && !producer) ||
                            ((f == GPU_BORROWED || f == GPU_DRAM || f == GPU_DRAM_IN_USE ||
                              f == GPU_RECLAIM_RETURNED || f == GPU_RECLAIM_RETURNED_BYTES ||
                              f == GPU_BARRED) &&
                             g->role != GPU_ROLE_CONSUMER))
                                continue;
                        gpu_labels(g, ordinal, labels);
                        prom_sample_u64(t, gpu_families[f].name, labels, 2, gpu_value(g, f));
                }
        }
}

static void render_server(struct prom_text *t, const struct metrics_view *v)
{
        const struct server_stats *st = v->stats;
        char code[48];
        uint64_t protocol = 0;

        prom_family(t, "aqua_uptime_seconds", "gauge", "Seconds since aquad started.");
        prom_sample_double(t, "aqua_uptime_seconds", NULL, 0,
                           (double)(now_mono_ns() - v->start_ns) / 1e9);
        counter(t, "aqua_requests_total", "Requests received.", st->requests);
        prom_family(t, "aqua_error_replies_total", "counter",
                    "Error replies sent, by the protocol's ErrorCode.");
        for (size_t i = 1; i < ARRAY_SIZE(st->errors_by_code); i++) {
                const ProtobufCEnumValue *v =
                    protobuf_c_enum_descriptor_get_value(&aqua__error_code__descriptor, (int)i);
                size_t k = 0;

                if (!v)
                        continue;
                /* ERROR_CODE_TOO_LARGE -> too_large */
                for (const char *c = v->name + strlen("ERROR_CODE_"); *c && k + 1 < sizeof(code);
                     c++)
                        code[k++] = (char)(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
                code[k] = '\0';
                prom_sample_u64(t, "aqua_error_replies_total", &(struct prom_label){"code", code},
                                1, st->errors_by_code[i]);
        }
        /* Messages aquad could not take at all, as opposed to requests it refused. */
        protocol = st->errors_by_code[AQUA__ERROR_CODE__ERROR_CODE_MALFORMED] +
                   st->errors_by_code[AQUA__ERROR_CODE__ERROR_CODE_TOO_LARGE] +
                   st->errors_by_code[AQUA__ERROR_CODE__ERROR_CODE_VERSION] +
                   st->errors_by_code[AQUA__ERROR_CODE__ERROR_CODE_NOT_REGISTERED] +
                   st->errors_by_code[AQUA__ERROR_CODE__ERROR_CODE_SIDE_CHANNEL];
        counter(t, "aqua_protocol_errors_total",
                "Malformed, oversized, wrong-version, unregistered and side-channel errors.",
                protocol);
        counter(t, "aqua_side_refused_total", "Side channel connections refused (credentials).",
                st->refused);
        counter(t, "aqua_send_dropped_total",
                "Replies the ROUTER could not queue (notices and custody replies wait instead).",
                st->send_dropped);
        counter(t, "aqua_replies_deferred_total",
                "Grants and offer replies that waited in the client's outbox for its full queue "
                "to drain.",
                st->replies_deferred);
        counter(t, "aqua_custody_undelivered_total",
                "Grants and offers taken back because their reply could not be sent.",
                st->custody_undelivered);
        counter(t, "aqua_side_channels_evicted_total",
                "Side channels closed before their Hello to make room for new ones.", st->evicted);
        counter(t, "aqua_share_refused_total",
                "Connections refused because their user holds its share (limits.clients-per-user): "
                "side channels, and ipc:// connections closed as they were accepted.",
                st->share_refused + st->ipc_share_refused);
        counter(t, "aqua_fd_exhausted_total",
                "Times aquad ran out of descriptors accepting a connection (it pauses).",
                st->fd_exhausted);
        counter(t, "aqua_remote_refused_total",
                "tcp peers refused: an unknown CURVE key, or a failed CURVE handshake.",
                st->remote_refused);
        counter(t, "aqua_fds_refused_total",
                "Descriptors refused over a connection's budget or aquad's headroom.",
                st->fds_refused);
        counter(t, "aqua_notices_deferred_total",
                "Times notices waited in a client's outbox for its queue to drain.",
                st->notices_deferred);
        counter(t, "aqua_requests_throttled_total",
                "Requests refused over a client's request rate.", st->throttled);
        counter(t, "aqua_hello_foreign_token_total",
                "Hellos refused for a token given to another process.", st->hijacks);
        counter(t, "aqua_side_frames_malformed_total",
                "Side channel frames that did not decode (ignored).", st->side_malformed);
}

static int render(struct prom_text *t, void *userdata)
{
        struct metrics *m = userdata;
        struct metrics_view v = {0};
        struct broker_totals totals;
        _cleanup_free_ struct broker_gpu_view *gpus = NULL;
        size_t n;

        broker_totals(m->broker, &totals);
        gpus = calloc(MAX(totals.gpus, 1), sizeof(*gpus));
        if (!gpus)
                return -ENOMEM;
        n = broker_view_gpus(m->broker, gpus, totals.gpus);
        m->view(m->view_userdata, &v);
        render_server(t, &v);
        render_clients(t, &v);
        if (v.in_domain)
                render_domain(t, &v.domain);
        render_pool(t, &totals);
        render_gpus(t, gpus, n);
        prom_histogram_write(t, "aqua_reclaim_seconds",
                             "Time from a reclaim notice to the consumer's return, per chunk.",
                             &m->reclaim);
        return 0;
}

int metrics_new(struct broker *broker, const char *address, metrics_view_fn view, void *userdata,
                struct metrics **ret)
{
        _cleanup_(metrics_freep) struct metrics *m = NULL;
        char err[256];
        int r;

        m = calloc(1, sizeof(*m));
        if (!m)
                return log_error_errno(-ENOMEM, "Failed to set up metrics: %m");
        m->broker = broker;
        m->view = view;
        m->view_userdata = userdata;
        prom_histogram_init(&m->reclaim, reclaim_bounds, ARRAY_SIZE(reclaim_bounds));
        r = prom_server_new(address, render, m, &m->http, err, sizeof(err));
        if (r < 0)
                return log_error_errno(r, "Failed to serve metrics: %s", err);
        broker_observe_reclaims(broker, observe_reclaim, m);
        log_info("Serving metrics on http://%s/metrics", address);
        *ret = TAKE_PTR(m);
        return 0;
}

struct metrics *metrics_free(struct metrics *m)
{
        if (!m)
                return NULL;
        if (m->broker)
                broker_unobserve_reclaims(m->broker, m);
        prom_server_free(m->http);
        free(m);
        return NULL;
}

int metrics_fd(const struct metrics *m)
{
        return prom_server_fd(m->http);
}

int metrics_timeout_ms(const struct metrics *m)
{
        return prom_server_timeout_ms(m->http);
}

void metrics_dispatch(struct metrics *m)
{
        if (prom_server_dispatch(m->http) < 0)
                log_warning("Metrics endpoint failed to run");
}
