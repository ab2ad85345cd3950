/*
 * Each client's outbox. Notices are state, not datagrams: the outbox holds them until the ROUTER
 * takes them (past ZeroMQ's high-water mark a send fails, and a dropped ReclaimNotice would bar
 * a consumer for a deadline it never saw). Notices that a newer one supersedes are coalesced,
 * so an outbox holds at most one entry per lease and kind: bounded by what the client holds.
 * In front of them wait the replies that hand over custody (a Grant, an OfferReply) the ROUTER
 * could not take at the end of their turn: the client holds what they say, so they are kept,
 * not dropped, and go before any notice that may name what they hand over. They are bounded by
 * the client's leases and chunks.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "clients.h"
#include "log.h"
#include "outbox.h"
#include "state.h"
#include "time-util.h"
#include "util.h"

static bool ids_have(const uint64_t *ids, size_t n, uint64_t id)
{
        for (size_t i = 0; i < n; i++)
                if (ids[i] == id)
                        return true;
        return false;
}

/* Fold m's chunk ids into into's; false when out of memory (m is kept apart then). */
static bool merge_ids(struct notice *into, const struct notice *m)
{
        uint64_t *a =
            reallocarray(into->chunk_ids, into->n_chunk_ids + m->n_chunk_ids + 1, sizeof(*a));

        if (!a)
                return false;
        into->chunk_ids = a;
        for (size_t i = 0; i < m->n_chunk_ids; i++)
                if (!ids_have(a, into->n_chunk_ids, m->chunk_ids[i]))
                        a[into->n_chunk_ids++] = m->chunk_ids[i];
        return true;
}

static void outbox_put(struct server *s, struct client *c, struct notice *m)
{
        m->gpu = NULL; /* the client is the recipient now; the GPU may go */
        for (struct list_node *n = c->outbox.next; n != &c->outbox; n = n->next) {
                struct notice *o = list_entry(n, struct notice, node);

                if (o->kind != m->kind)
                        continue;
                if (m->kind == NOTICE_PAIR_CHANGED) {
                        /* Only the latest pair matters. */
                        free(o->text);
                        o->text = TAKE_PTR(m->text);
                        notice_free(m);
                        return;
                }
                if (m->kind == NOTICE_RECLAIM && o->lease_id != m->lease_id)
                        continue;
                if (!merge_ids(o, m))
                        break;
                if (m->kind == NOTICE_RECLAIM) {
                        if (m->deadline_ms && (!o->deadline_ms || m->deadline_ms < o->deadline_ms))
                                o->deadline_ms = m->deadline_ms;
                        free(o->text);
                        o->text = TAKE_PTR(m->text);
                }
                notice_free(m);
                return;
        }
        list_append(&c->outbox, &m->node);
        c->n_outbox++;
        s->n_outbox++;
}

/* Send what m says; false when the ROUTER cannot take all of it now (m keeps the rest). */
static bool send_notice(struct server *s, struct client *c, struct notice *m)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__ReclaimNotice rn = AQUA__RECLAIM_NOTICE__INIT;
        Aqua__Reclaimed rd = AQUA__RECLAIMED__INIT;
        Aqua__PairChanged pc = AQUA__PAIR_CHANGED__INIT;
        Aqua__ScrubRequest sr = AQUA__SCRUB_REQUEST__INIT;
        size_t max = s->limits.max_repeated;
        uint64_t **ids = NULL;
        size_t *n_ids = NULL;

        switch (m->kind) {
        case NOTICE_RECLAIM:
                rn.lease_id = m->lease_id;
                rn.deadline_ms = m->deadline_ms;
                rn.reason = m->text ? m->text : "";
                e.body_case = AQUA__ENVELOPE__BODY_RECLAIM_NOTICE;
                e.reclaim_notice = &rn;
                ids = &rn.chunk_ids;
                n_ids = &rn.n_chunk_ids;
                break;
        case NOTICE_RECLAIMED:
                e.body_case = AQUA__ENVELOPE__BODY_RECLAIMED;
                e.reclaimed = &rd;
                ids = &rd.chunk_ids;
                n_ids = &rd.n_chunk_ids;
                break;
        case NOTICE_SCRUB:
                e.body_case = AQUA__ENVELOPE__BODY_SCRUB_REQUEST;
                e.scrub_request = &sr;
                ids = &sr.chunk_ids;
                n_ids = &sr.n_chunk_ids;
                break;
        case NOTICE_PAIR_CHANGED:
                pc.paired_with = m->text ? m->text : "";
                e.body_case = AQUA__ENVELOPE__BODY_PAIR_CHANGED;
                e.pair_changed = &pc;
                return server_send_now(s, c, &e) == 0;
        default:
                return true;
        }
        /* Split long lists so no message exceeds what the peer accepts; what was sent leaves. */
        while (m->n_chunk_ids > 0) {
                size_t k = MIN(max, m->n_chunk_ids);
                int r;

                *ids = m->chunk_ids;
                *n_ids = k;
                r = server_send_now(s, c, &e);
                if (r < 0)
                        return false;
                if (m->kind == NOTICE_RECLAIM)
                        broker_reclaim_delivered(s->broker, m->lease_id, m->chunk_ids, k,
                                                 m->deadline_ms);
                memmove(m->chunk_ids, m->chunk_ids + k, (m->n_chunk_ids - k) * sizeof(uint64_t));
                m->n_chunk_ids -= k;
        }
        return true;
}

struct deferred_reply {
        struct list_node node;
        void *buf;
        size_t len;
        const char *body;
};

static void deferred_free(struct deferred_reply *d)
{
        list_unlink(&d->node);
        free(d->buf);
        free(d);
}

int server_defer_reply(struct server *s, struct client *c, void *buf, size_t len,
                       const char *body)
{
        struct deferred_reply *d = calloc(1, sizeof(*d));

        if (!d)
                return -ENOMEM;
        d->buf = buf;
        d->len = len;
        d->body = body;
        list_append(&c->deferred, &d->node);
        c->n_outbox++;
        s->n_outbox++;
        s->stats.replies_deferred++;
        return 0;
}

/* Send what the ROUTER takes now, oldest first; the rest waits for the next turn of the loop. */
static void outbox_flush(struct server *s, struct client *c)
{
        while (!list_empty(&c->deferred)) {
                struct deferred_reply *d = list_entry(c->deferred.next, struct deferred_reply, node);

                if (server_send_encoded(s, c, d->buf, d->len, d->body) < 0) {
                        s->stats.notices_deferred += !list_empty(&c->outbox);
                        return;
                }
                deferred_free(d);
                c->n_outbox--;
                s->n_outbox--;
        }
        while (!list_empty(&c->outbox)) {
                struct notice *m = list_entry(c->outbox.next, struct notice, node);

                if (!send_notice(s, c, m)) {
                        s->stats.notices_deferred++;
                        return;
                }
                notice_free(m);
                c->n_outbox--;
                s->n_outbox--;
        }
}

void server_outbox_clear(struct server *s, struct client *c)
{
        while (!list_empty(&c->deferred))
                deferred_free(list_entry(c->deferred.next, struct deferred_reply, node));
        while (!list_empty(&c->outbox))
                notice_free(list_entry(c->outbox.next, struct notice, node));
        s->n_outbox -= c->n_outbox;
        c->n_outbox = 0;
}

void server_stage_notices(struct server *s)
{
        struct list_node list = LIST_HEAD_INIT(list), *pos, *tmp;

        broker_take_notices(s->broker, &list);
        list_for_each(pos, tmp, &list)
        {
                struct notice *m = list_entry(pos, struct notice, node);
                struct client *c = broker_gpu_owner(m->gpu);

                list_unlink(&m->node);
                if (c)
                        outbox_put(s, c, m);
                else
                        notice_free(m);
        }
}

void server_flush_outboxes(struct server *s)
{
        /* Most of the time every outbox is empty: no need to look at each client. */
        for (struct list_node *n = s->clients.next; s->n_outbox && n != &s->clients; n = n->next) {
                struct client *c = list_entry(n, struct client, node);
                if (c->n_outbox)
                        outbox_flush(s, c);
        }
}

/* ------------------------------------------------------------------------------ sending */

/* Who a routing id names, for the log. */
const char *outbox_peer_text(struct server *s, const void *rid, size_t len, char *buf, size_t size)
{
        struct client *c = server_find_by_routing(s, rid, len);
        const char *gpu = c && c->gpu ? broker_gpu_uuid(c->gpu) : NULL;

        if (!c)
                snprintf(buf, size, "a connection without a Hello");
        else if (c->remote)
                snprintf(buf, size, "client %" PRIu64 " (CURVE key %.8s...%s%s)", c->id,
                         c->remote_key, gpu ? ", GPU " : "", gpu ? gpu : "");
        else
                snprintf(buf, size, "client %" PRIu64 " (pid %d uid %u%s%s)", c->id,
                         (int)c->cred.pid, (unsigned)c->cred.uid, gpu ? ", GPU " : "",
                         gpu ? gpu : "");
        return buf;
}

/* Likewise every send aquad drops: to whom, what and why. */
void outbox_log_dropped(struct server *s, const void *rid, size_t len, const char *body,
                        const char *why)
{
        char who[160], more[80] = "";
        uint64_t held = 0;

        if (!ratelimit_take(&s->drop_log, now_mono_ns(), &held))
                return;
        if (held)
                snprintf(more, sizeof(more), " (%" PRIu64 " dropped sends before it not logged)",
                         held);
        log_notice("Dropped a %s to %s: %s%s", body,
                   outbox_peer_text(s, rid, len, who, sizeof(who)), why, more);
}

int outbox_router_send(struct server *s, const void *rid, size_t rlen, const void *buf, size_t len,
                       const char *body)
{
        int r = 0;

        if (s->sink)
                r = s->sink(s, rid, rlen, buf, len);
        else if (!s->router)
                r = -ENOTCONN;
        else if (zmq_send(s->router, rid, rlen, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
                 zmq_send(s->router, buf, len, ZMQ_DONTWAIT) < 0)
                r = -errno;
        /* A full queue is retried by those who can (outboxes); for the others it is a drop. */
        if (r < 0 && r != -EAGAIN) {
                s->stats.send_dropped++;
                outbox_log_dropped(s, rid, rlen, body, zmq_strerror(-r));
        }
        return r;
}

int server_send_encoded(struct server *s, struct client *c, const void *buf, size_t len,
                        const char *body)
{
        if (!c || !c->routing_id_len)
                return -ENOTCONN;
        return outbox_router_send(s, c->routing_id, c->routing_id_len, buf, len, body);
}

int server_send_now(struct server *s, struct client *c, Aqua__Envelope *e)
{
        _cleanup_free_ void *buf = NULL;
        size_t n;
        int r;

        if (!c || !c->routing_id_len)
                return -ENOTCONN;
        r = wire_encode(e, &buf, &n);
        if (r < 0)
                return r;
        return outbox_router_send(s, c->routing_id, c->routing_id_len, buf, n, wire_body_name(e));
}
