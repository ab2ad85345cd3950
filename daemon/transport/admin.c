/* aquactl's requests: queries of the daemon's state, and the operations that change it. */
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>

#include "admin.h"
#include "clients.h"
#include "domain.h"
#include "log.h"
#include "reload.h"
#include "state.h"
#include "time-util.h"
#include "translate.h"
#include "turn.h"

#define ECODE(name) AQUA__ERROR_CODE__ERROR_CODE_##name

/* Arrays an AdminReply points into; strings point into the pool, valid until the reply is sent. */
struct reply_mem {
        Aqua__GpuInfo *gpus;
        Aqua__PairInfo *pairs;
        Aqua__LeaseInfo *leases;
        Aqua__ChunkInfo *chunks;
        Aqua__EventInfo *events;
        void *view; /* the core's view the entries are made from */
        void **ptrs;
        char (*users)[80]; /* GpuInfo.user */
        struct broker_refused_pin *refused;
};

static void reply_mem_free(struct reply_mem *m)
{
        free(m->gpus);
        free(m->pairs);
        free(m->leases);
        free(m->chunks);
        free(m->events);
        free(m->view);
        free(m->ptrs);
        free(m->users);
        free(m->refused);
}

/* Who holds the GPU of view v, as an operator knows them: a user name, or a key's user. */
static void holder_name(const struct server *s, const struct broker_gpu_view *v, char *buf,
                        size_t size)
{
        const struct config_remote_client *rc;
        struct passwd pw, *found = NULL;
        char scratch[1024];

        if (!v->held)
                snprintf(buf, size, "%s", "");
        else if (v->remote && (rc = config_remote_find_text(s->config, v->key)))
                snprintf(buf, size, "%s", rc->user);
        else if (v->remote)
                snprintf(buf, size, "key %.8s...", v->key);
        else if (getpwuid_r(v->uid, &pw, scratch, sizeof(scratch), &found) == 0 && found)
                snprintf(buf, size, "%s", found->pw_name);
        else
                snprintf(buf, size, "%u", (unsigned)v->uid);
}

static void fill_status(struct server *s, const struct broker_totals *t, Aqua__StatusInfo *st)
{
        static char degraded[192]; /* lives until the reply is sent: one loop, one reply */

        st->daemon_version = AQUA_PROTOCOL_VERSION;
        st->uptime_ms = (now_mono_ns() - s->start_ns) / NSEC_PER_MSEC;
        st->clients = (uint32_t)s->n_clients;
        st->gpus = (uint32_t)t->gpus;
        st->pairs = (uint32_t)t->pairs;
        st->leases = (uint32_t)t->leases;
        st->pool_bytes = t->pool_bytes;
        st->lent_bytes = t->lent_bytes;
        st->dram_budget = t->dram_budget;
        st->dram_granted = t->dram_granted;
        st->deadline_misses = t->stats.deadline_misses;
        st->leases_lost = t->stats.leases_lost;
        st->compaction_failures = t->stats.compaction_failures;
        st->degraded = (char *)(broker_degraded(s->broker, degraded, sizeof(degraded)) ?: "");
        if (s->domain) {
                struct domain_view d;

                domain_view(s->domain, &d);
                st->domain = (char *)d.name;
                st->domain_leader = (char *)d.advertise;
                st->domain_term = (uint64_t)d.term;
                st->etcd = (char *)(d.etcd_error[0] ? d.etcd_error : "healthy");
                st->etcd_commits = d.commits;
                st->etcd_commit_mean_ms =
                    d.commits ? d.commit_seconds * 1e3 / (double)d.commits : 0;
        }
}

/* The pool's GPUs as views (m->view): how many. */
static size_t view_gpus(struct broker *broker, const struct broker_totals *t, struct reply_mem *m)
{
        struct broker_gpu_view *v = calloc(MAX(t->gpus, 1), sizeof(*v));

        m->view = v;
        return v ? broker_view_gpus(broker, v, t->gpus) : 0;
}

static size_t fill_gpus(const struct server *s, const struct broker_totals *t,
                        struct reply_mem *m, size_t max)
{
        struct broker *broker = s->broker;
        size_t all = view_gpus(broker, t, m), n = MIN(all, max); /* MIN evaluates twice */
        const struct broker_gpu_view *v = m->view;

        m->gpus = calloc(MAX(n, 1), sizeof(*m->gpus));
        m->users = calloc(MAX(n, 1), sizeof(*m->users));
        if (!m->gpus || !m->users)
                return 0;
        for (size_t k = 0; k < n; k++) {
                const struct client *c = v[k].owner;
                Aqua__GpuInfo *i = &m->gpus[k];

                aqua__gpu_info__init(i);
                i->uuid = (char *)v[k].uuid;
                i->ordinal = v[k].ordinal;
                i->ordinal_unknown = !v[k].ordinal_known;
                i->role = translate_role_to_wire(v[k].role);
                i->capacity = v[k].capacity;
                i->client_id = c ? c->id : 0;
                i->client_name = (char *)v[k].client_name;
                i->host = (char *)v[k].host;
                i->pid = (uint32_t)v[k].pid;
                i->load = v[k].reported.load;
                i->offered_bytes = v[k].offered_bytes;
                i->lent_bytes = v[k].lent_bytes;
                i->borrowed_bytes = v[k].borrowed_bytes;
                i->dram_bytes = v[k].dram_bytes;
                i->paired_with = (char *)v[k].paired_with;
                i->barred = v[k].barred;
                i->draining = v[k].draining;
                i->silent = v[k].silent;
                holder_name(s, &v[k], m->users[k], sizeof(m->users[k]));
                i->user = m->users[k];
                i->tenant = (char *)v[k].tenant;
                i->lends_to_all = v[k].lends_to_all;
        }
        return n;
}

/* Every pair (a producer's side of it), then every pin refused; the caller cuts to its limit. */
static size_t fill_pairs(struct broker *broker, const struct broker_totals *t, struct reply_mem *m)
{
        size_t total = view_gpus(broker, t, m), n = 0, n_refused;
        const struct broker_gpu_view *v = m->view;

        m->pairs = calloc(total + t->pins + 1, sizeof(*m->pairs));
        m->refused = calloc(t->pins + 1, sizeof(*m->refused));
        if (!m->pairs || !m->refused)
                return 0;
        n_refused = broker_view_refused_pins(broker, m->refused, t->pins);
        for (size_t k = 0; k < n_refused; k++) {
                Aqua__PairInfo *i = &m->pairs[total + k];

                aqua__pair_info__init(i);
                i->producer_uuid = (char *)m->refused[k].producer;
                i->consumer_uuid = (char *)m->refused[k].consumer;
                i->source = (char *)m->refused[k].source;
                i->refused = (char *)m->refused[k].why;
        }
        for (size_t k = 0; k < total; k++) {
                Aqua__PairInfo *i = &m->pairs[n];

                if (!v[k].paired_with[0] || v[k].role != GPU_ROLE_PRODUCER)
                        continue;
                aqua__pair_info__init(i);
                i->producer_uuid = (char *)v[k].uuid;
                i->consumer_uuid = (char *)v[k].paired_with;
                i->source = (char *)v[k].pair_source;
                i->bandwidth_gbps = v[k].pair_bandwidth;
                n++;
        }
        memmove(&m->pairs[n], &m->pairs[total], n_refused * sizeof(*m->pairs));
        return n + n_refused;
}

static size_t fill_leases(struct broker *broker, const struct broker_totals *t, struct reply_mem *m,
                          size_t max)
{
        size_t want = MIN(t->leases, max), n;
        struct broker_lease_view *v = m->view = calloc(MAX(want, 1), sizeof(*v));

        m->leases = calloc(MAX(want, 1), sizeof(*m->leases));
        if (!v || !m->leases)
                return 0;
        n = broker_view_leases(broker, now_mono_ns(), v, want);
        for (size_t k = 0; k < n; k++) {
                Aqua__LeaseInfo *i = &m->leases[k];

                aqua__lease_info__init(i);
                i->lease_id = v[k].id;
                i->producer_uuid = (char *)v[k].producer_uuid;
                i->consumer_uuid = (char *)v[k].consumer_uuid;
                i->state = (char *)lease_state_to_string(v[k].state);
                i->bytes = v[k].bytes;
                i->chunks = (uint32_t)v[k].chunks;
                i->age_ms = v[k].age_ms;
                i->deadline_ms = v[k].deadline_ms;
                i->notice_pending = v[k].notice_pending;
                i->overdue = v[k].overdue;
        }
        return n;
}

static size_t fill_chunks(struct broker *broker, const struct broker_totals *t, struct reply_mem *m,
                          size_t max)
{
        size_t want = MIN(t->chunks, max), n;
        struct broker_chunk_view *v = m->view = calloc(MAX(want, 1), sizeof(*v));

        m->chunks = calloc(MAX(want, 1), sizeof(*m->chunks));
        if (!v || !m->chunks)
                return 0;
        n = broker_view_chunks(broker, v, want);
        for (size_t k = 0; k < n; k++) {
                Aqua__ChunkInfo *i = &m->chunks[k];

                aqua__chunk_info__init(i);
                i->chunk_id = v[k].id;
                i->producer_uuid = (char *)v[k].producer_uuid;
                i->size = v[k].size;
                i->state = (char *)v[k].condition;
                i->lease_id = v[k].lease_id;
        }
        return n;
}

static size_t fill_events(struct broker *broker, struct reply_mem *m, size_t max)
{
        const struct events *ev = broker_events(broker);
        size_t n = 0, first = ev->count > max ? ev->count - max : 0;

        m->events = calloc(MAX(ev->count, 1), sizeof(*m->events));
        if (!m->events)
                return 0;
        /* The newest ones when cut. */
        for (size_t k = first; k < ev->count; k++, n++) {
                const struct event *e = events_get(ev, k);
                aqua__event_info__init(&m->events[n]);
                m->events[n].time_ms = e->time_ms;
                m->events[n].kind = (char *)e->kind;
                m->events[n].text = (char *)e->text;
        }
        return n;
}

static void query(struct server *s, struct client *c, const Aqua__Envelope *e)
{
        Aqua__Envelope r = AQUA__ENVELOPE__INIT;
        Aqua__AdminReply ar = AQUA__ADMIN_REPLY__INIT;
        Aqua__StatusInfo st = AQUA__STATUS_INFO__INIT;
        struct reply_mem m = {0};
        struct broker_totals t;
        size_t max = s->limits.max_repeated, n = 0, total = 0, filled, i;
        void **ptrs;

        broker_totals(s->broker, &t);
        fill_status(s, &t, &st);
        ar.status = &st;
        switch (e->admin_query->what) {
        case AQUA__ADMIN_QUERY__WHAT__WHAT_GPUS:
                total = t.gpus;
                n = fill_gpus(s, &t, &m, max);
                break;
        case AQUA__ADMIN_QUERY__WHAT__WHAT_PAIRS:
                total = n = fill_pairs(s->broker, &t, &m);
                n = MIN(n, max);
                break;
        case AQUA__ADMIN_QUERY__WHAT__WHAT_LEASES:
                total = t.leases;
                n = fill_leases(s->broker, &t, &m, max);
                break;
        case AQUA__ADMIN_QUERY__WHAT__WHAT_CHUNKS:
                total = t.chunks;
                n = fill_chunks(s->broker, &t, &m, max);
                break;
        case AQUA__ADMIN_QUERY__WHAT__WHAT_EVENTS:
                total = broker_events(s->broker)->count;
                n = fill_events(s->broker, &m, max);
                break;
        default:
                break;
        }
        filled = n;
        ptrs = m.ptrs = calloc(MAX(n, 1), sizeof(void *));
        if (!ptrs) {
                reply_mem_free(&m);
                server_queue_error(s, c->routing_id, c->routing_id_len, e->request_id,
                                   ECODE(INTERNAL), "admin-query: out of memory");
                return;
        }
        ar.truncated = n < total;
        r.body_case = AQUA__ENVELOPE__BODY_ADMIN_REPLY;
        r.admin_reply = &ar;
        r.request_id = e->request_id;
        /* Cut further until the reply fits the message size limit the peers use. */
        for (;;) {
                for (i = 0; i < n; i++)
                        ptrs[i] = m.gpus     ? (void *)&m.gpus[i]
                                  : m.pairs  ? (void *)&m.pairs[i]
                                  : m.leases ? (void *)&m.leases[i]
                                  : m.chunks ? (void *)&m.chunks[i]
                                             : (void *)&m.events[filled - n + i];
                ar.n_gpus = m.gpus ? n : 0;
                ar.gpus = (Aqua__GpuInfo **)ptrs;
                ar.n_pairs = m.pairs ? n : 0;
                ar.pairs = (Aqua__PairInfo **)ptrs;
                ar.n_leases = m.leases ? n : 0;
                ar.leases = (Aqua__LeaseInfo **)ptrs;
                ar.n_chunks = m.chunks ? n : 0;
                ar.chunks = (Aqua__ChunkInfo **)ptrs;
                ar.n_events = m.events ? n : 0;
                ar.events = (Aqua__EventInfo **)ptrs;
                if (n == 0 || aqua__envelope__get_packed_size(&r) <= s->limits.max_message)
                        break;
                n /= 2;
                ar.truncated = true;
        }
        server_queue(s, c, &r);
        reply_mem_free(&m);
}

static void admin_ack(struct server *s, struct client *c, uint64_t request_id, const char *text)
{
        Aqua__Envelope r = AQUA__ENVELOPE__INIT;
        Aqua__Ack a = AQUA__ACK__INIT;

        a.text = (char *)(text ? text : "");
        r.body_case = AQUA__ENVELOPE__BODY_ACK;
        r.ack = &a;
        r.request_id = request_id;
        server_queue(s, c, &r);
}

void admin_handle(struct server *s, struct client *c, const Aqua__Envelope *e)
{
        _cleanup_(broker_reclaim_clear) struct broker_reclaim res = {0};
        char err[BROKER_ERR_MAX], text[256] = "";
        size_t quarantined = 0;
        int code = 0;

        if (e->body_case == AQUA__ENVELOPE__BODY_ADMIN_QUERY) {
                query(s, c, e);
                return;
        }
        if (!client_is_admin(s, c)) {
                server_queue_error(s, c->routing_id, c->routing_id_len, e->request_id,
                                   ECODE(PERMISSION),
                                   "%s: uid %u gid %u is not in the admin allow list",
                                   wire_body_name(e), c->cred.uid, c->cred.gid);
                return;
        }
        switch (e->body_case) {
        case AQUA__ENVELOPE__BODY_ADMIN_RECLAIM:
                code = translate_outcome(broker_admin_reclaim(s->broker, e->admin_reclaim->gpu,
                                                              e->admin_reclaim->bytes, &res, err));
                break;
        case AQUA__ENVELOPE__BODY_ADMIN_DRAIN:
                code = translate_outcome(
                    broker_admin_drain(s->broker, e->admin_drain->gpu, &res, err));
                break;
        case AQUA__ENVELOPE__BODY_ADMIN_PAIR:
                code = translate_outcome(
                    broker_pin(s->broker, e->admin_pair->producer, e->admin_pair->consumer, err));
                break;
        case AQUA__ENVELOPE__BODY_ADMIN_UNPAIR:
                code = translate_outcome(broker_unpin(s->broker, e->admin_unpair->gpu, err));
                break;
        case AQUA__ENVELOPE__BODY_ADMIN_UNDRAIN:
                code =
                    translate_outcome(broker_admin_undrain(s->broker, e->admin_undrain->gpu, err));
                break;
        case AQUA__ENVELOPE__BODY_ADMIN_RELEASE:
                code = translate_outcome(broker_admin_release(
                    s->broker, e->admin_release->gpu, e->admin_release->force, &quarantined, err));
                if (code == 0 && !quarantined)
                        snprintf(text, sizeof(text),
                                 "its chunks are scrubbed before they are lent again");
                else if (code == 0)
                        snprintf(text, sizeof(text),
                                 "its leases ended; %zu chunks are quarantined (granted, "
                                 "scrubbed and handed back to nobody) until its process is "
                                 "gone; their producers are not told, a reclaim of them waits",
                                 quarantined);
                break;
        case AQUA__ENVELOPE__BODY_ADMIN_RELOAD: {
                char why[BROKER_ERR_MAX - 64], kept[sizeof(text) - 64];

                if (server_reload(s, why, sizeof(why), kept, sizeof(kept)) < 0)
                        code = broker_fail(err, ECODE(INVALID),
                                           "reload: %s is refused, the running configuration is "
                                           "kept: %s",
                                           s->config_path, why);
                else if (kept[0])
                        snprintf(text, sizeof(text), "not changed until aquad restarts: %s", kept);
                break;
        }
        default:
                code = broker_fail(err, ECODE(INVALID), "%s is not an admin request",
                                   wire_body_name(e));
                break;
        }
        if (code != 0) {
                server_queue_error(s, c->routing_id, c->routing_id_len, e->request_id,
                                   code < 0 ? ECODE(INTERNAL) : code, "%s",
                                   code < 0 ? "out of memory" : err);
                return;
        }
        log_notice("Admin request %s from uid %u (pid %d) done", wire_body_name(e), c->cred.uid,
                   (int)c->cred.pid);
        events_add(broker_events(s->broker), "admin", "%s by uid %u", wire_body_name(e),
                   c->cred.uid);
        admin_ack(s, c, e->request_id, text);
}
