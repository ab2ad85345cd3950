/* aquactl's requests: queries of the daemon's state, and the operations that change it. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "server.h"
#include "time-util.h"
#include "translate.h"

#define ECODE(name) AQUA__ERROR_CODE__ERROR_CODE_##name

/* Arrays an AdminReply points into; strings point into the pool, valid until the reply is sent. */
struct reply_mem {
        Aqua__GpuInfo *gpus;
        Aqua__PairInfo *pairs;
        Aqua__LeaseInfo *leases;
        Aqua__ChunkInfo *chunks;
        Aqua__EventInfo *events;
        void **ptrs;
};

static void reply_mem_free(struct reply_mem *m)
{
        free(m->gpus);
        free(m->pairs);
        free(m->leases);
        free(m->chunks);
        free(m->events);
        free(m->ptrs);
}

static void fill_status(struct server *s, Aqua__StatusInfo *st)
{
        static char degraded[192]; /* lives until the reply is sent: one loop, one reply */
        struct broker *p = s->broker;
        size_t pairs = 0;

        for (struct list_node *n = p->gpus.next; n != &p->gpus; n = n->next) {
                struct gpu *g = list_entry(n, struct gpu, node);
                pairs += g->paired && g->role == GPU_ROLE_PRODUCER;
        }
        st->daemon_version = AQUA_PROTOCOL_VERSION;
        st->uptime_ms = (now_mono_ns() - s->start_ns) / NSEC_PER_MSEC;
        st->clients = (uint32_t)s->n_clients;
        st->gpus = (uint32_t)p->n_gpus;
        st->pairs = (uint32_t)pairs;
        st->leases = (uint32_t)p->n_leases;
        st->pool_bytes = p->pool_bytes;
        st->lent_bytes = p->lent_bytes;
        st->dram_budget = p->settings.dram_budget;
        st->dram_granted = p->dram_granted;
        st->deadline_misses = p->stats.deadline_misses;
        st->leases_lost = p->stats.leases_lost;
        st->compaction_failures = p->stats.compaction_failures;
        st->degraded = (char *)(broker_degraded(p, degraded, sizeof(degraded)) ?: "");
}

static size_t fill_gpus(struct broker *p, struct reply_mem *m, size_t max)
{
        size_t n = 0;

        m->gpus = calloc(MAX(p->n_gpus, 1), sizeof(*m->gpus));
        if (!m->gpus)
                return 0;
        for (struct list_node *x = p->gpus.next; x != &p->gpus && n < max; x = x->next, n++) {
                struct gpu *g = list_entry(x, struct gpu, node);
                struct client *c = g->owner;
                Aqua__GpuInfo *i = &m->gpus[n];

                aqua__gpu_info__init(i);
                i->uuid = g->uuid;
                i->ordinal = g->ordinal;
                i->ordinal_unknown = !g->ordinal_known;
                i->role = translate_role_to_wire(g->role);
                i->capacity = g->capacity;
                i->client_id = c ? c->id : 0;
                i->client_name = g->client_name ? g->client_name : "";
                i->host = g->host ? g->host : "";
                i->pid = (uint32_t)g->pid;
                i->load = g->load;
                i->offered_bytes = g->offered_bytes;
                i->lent_bytes = g->lent_bytes;
                i->borrowed_bytes = g->borrowed_bytes;
                i->dram_bytes = g->dram_bytes;
                i->paired_with = g->paired ? g->paired->uuid : "";
                i->barred = g->barred;
                i->draining = g->draining;
                i->silent = g->held_alive;
        }
        return n;
}

static size_t fill_pairs(struct broker *p, struct reply_mem *m, size_t max)
{
        size_t n = 0;

        m->pairs = calloc(MAX(p->n_gpus, 1), sizeof(*m->pairs));
        if (!m->pairs)
                return 0;
        for (struct list_node *x = p->gpus.next; x != &p->gpus && n < max; x = x->next) {
                struct gpu *g = list_entry(x, struct gpu, node);
                Aqua__PairInfo *i = &m->pairs[n];

                if (!g->paired || g->role != GPU_ROLE_PRODUCER)
                        continue;
                aqua__pair_info__init(i);
                i->producer_uuid = g->uuid;
                i->consumer_uuid = g->paired->uuid;
                i->source = (char *)(g->pair_source ? g->pair_source : "auto");
                i->bandwidth_gbps = g->pair_bandwidth;
                n++;
        }
        return n;
}

static size_t fill_leases(struct broker *p, struct reply_mem *m, size_t max)
{
        uint64_t now = now_mono_ns();
        size_t n = 0;

        m->leases = calloc(MAX(p->n_leases, 1), sizeof(*m->leases));
        if (!m->leases)
                return 0;
        for (struct list_node *x = p->leases.next; x != &p->leases && n < max; x = x->next, n++) {
                struct lease *l = list_entry(x, struct lease, broker_node);
                Aqua__LeaseInfo *i = &m->leases[n];
                uint64_t deadline = 0;
                bool pending = false;

                for (struct list_node *k = l->chunks.next; k != &l->chunks; k = k->next) {
                        struct chunk *c = list_entry(k, struct chunk, lease_node);
                        if (c->deadline_ns && (!deadline || c->deadline_ns < deadline))
                                deadline = c->deadline_ns;
                        pending |= c->state == CHUNK_RECLAIMING && c->deadline_pending;
                }
                aqua__lease_info__init(i);
                i->lease_id = l->id;
                i->producer_uuid = l->producer->uuid;
                i->consumer_uuid = l->consumer->uuid;
                i->state = (char *)lease_state_to_string(l->state);
                i->bytes = l->bytes;
                i->chunks = (uint32_t)l->n_chunks;
                i->age_ms = (now - l->created_ns) / NSEC_PER_MSEC;
                i->deadline_ms = deadline > now ? (deadline - now) / NSEC_PER_MSEC : 0;
                i->notice_pending = pending && !deadline;
                i->overdue = l->overdue || (deadline && deadline <= now);
        }
        return n;
}

static size_t fill_chunks(struct broker *p, struct reply_mem *m, size_t max)
{
        size_t n = 0;

        m->chunks = calloc(MAX(p->n_chunks, 1), sizeof(*m->chunks));
        if (!m->chunks)
                return 0;
        for (struct list_node *x = p->gpus.next; x != &p->gpus; x = x->next) {
                struct gpu *g = list_entry(x, struct gpu, node);
                for (struct list_node *k = g->chunks.next; k != &g->chunks && n < max;
                     k = k->next, n++) {
                        struct chunk *c = list_entry(k, struct chunk, producer_node);
                        Aqua__ChunkInfo *i = &m->chunks[n];

                        aqua__chunk_info__init(i);
                        i->chunk_id = c->id;
                        i->producer_uuid = g->uuid;
                        i->size = c->size;
                        i->state = c->state != CHUNK_FREE ? (char *)chunk_state_to_string(c->state)
                                   : c->quarantined       ? "quarantined"
                                   : c->scrubbing         ? "scrubbing"
                                   : c->dirty             ? "dirty"
                                                          : "free";
                        i->lease_id = c->lease ? c->lease->id : 0;
                }
        }
        return n;
}

static size_t fill_events(struct broker *p, struct reply_mem *m, size_t max)
{
        const struct events *ev = &p->events;
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
        size_t max = s->limits.max_repeated, n = 0, total = 0, filled, i;
        void **ptrs;

        fill_status(s, &st);
        ar.status = &st;
        switch (e->admin_query->what) {
        case AQUA__ADMIN_QUERY__WHAT__WHAT_GPUS:
                total = s->broker->n_gpus;
                n = fill_gpus(s->broker, &m, max);
                break;
        case AQUA__ADMIN_QUERY__WHAT__WHAT_PAIRS:
                total = n = fill_pairs(s->broker, &m, SIZE_MAX);
                n = MIN(n, max);
                break;
        case AQUA__ADMIN_QUERY__WHAT__WHAT_LEASES:
                total = s->broker->n_leases;
                n = fill_leases(s->broker, &m, max);
                break;
        case AQUA__ADMIN_QUERY__WHAT__WHAT_CHUNKS:
                total = s->broker->n_chunks;
                n = fill_chunks(s->broker, &m, max);
                break;
        case AQUA__ADMIN_QUERY__WHAT__WHAT_EVENTS:
                total = s->broker->events.count;
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

static void ack(struct server *s, struct client *c, uint64_t request_id, const char *text)
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
        events_add(&s->broker->events, "admin", "%s by uid %u", wire_body_name(e), c->cred.uid);
        ack(s, c, e->request_id, text);
}
