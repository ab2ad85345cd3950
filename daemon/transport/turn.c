/*
 * One turn of the loop: what aquad says while handling the requests it read waits here, the
 * journal is committed once (one write, one fdatasync) for all of them, and only then do the
 * replies, the descriptors of grants and the notices leave. Nothing leaves before the state it
 * acknowledges is durable.
 *
 * A change that hands out custody (an offer taken, a grant) is recorded with its reply; if the
 * commit is refused, every such change of the turn is undone, newest first, and its reply
 * becomes the journal's error. For the newest-first undo to restore the state exactly, a turn
 * that holds such a change ends before anything else that may touch the same state is handled
 * (server_turn_barrier: dispatch calls it before any request but another offer, borrow, load
 * report or the return of a lease granted before the turn, and before a client or a GPU goes).
 * A return releases chunks no change of the turn holds: undoing those changes stays exact
 * whether it came or not. The send path never touches the disk.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "domain.h"
#include "log.h"
#include "outbox.h"
#include "state.h"
#include "time-util.h"
#include "turn.h"

#define ECODE(name) AQUA__ERROR_CODE__ERROR_CODE_##name

/* Degraded aquad tries its journal this often, whatever the traffic. */
#define JOURNAL_PROBE_NS NSEC_PER_SEC
/* What the turn's sends themselves journal (a notice's delivery starts its deadline, a grant
 * that could not be sent is taken back) rides with the next turn's commit, or waits this long. */
#define COMMIT_LINGER_NS (5 * NSEC_PER_MSEC)

/* A message waiting for the end of its turn, already encoded. */
struct queued {
        struct list_node node;
        uint8_t rid[CLIENT_MAX_ROUTING];
        size_t rlen;
        void *buf;
        size_t len;
        const char *body; /* its kind, for the log */
        struct turn_change *change;
};

static const char *error_code_name(int code)
{
        const ProtobufCEnumValue *v =
            protobuf_c_enum_descriptor_get_value(&aqua__error_code__descriptor, code);

        return v ? v->name : "an unknown code";
}

/*
 * Every error reply is findable in the log, with whom it went to, what it answered and why, so
 * that each error counter of the metrics has lines that explain it (at most s->error_log's
 * budget; the lines held back are counted in the next one).
 */
static void log_error_reply(struct server *s, const void *rid, size_t len, const char *what,
                            uint64_t request_id, int code, const char *msg)
{
        char who[160], more[80] = "";
        uint64_t held = 0;

        if (!ratelimit_take(&s->error_log, now_mono_ns(), &held))
                return;
        if (held)
                snprintf(more, sizeof(more), " (%" PRIu64 " error replies before it not logged)",
                         held);
        log_notice("Error %s to %s, answering its %s (request %" PRIu64 "): %s%s",
                   error_code_name(code), outbox_peer_text(s, rid, len, who, sizeof(who)),
                   what ? what : "message", request_id, msg, more);
}

static void queued_free(struct queued *q)
{
        list_unlink(&q->node);
        free(q->buf);
        free(q);
}

static int queue_encoded(struct server *s, const void *rid, size_t rlen, Aqua__Envelope *e,
                         struct queued **ret)
{
        struct queued *q;
        int r;

        if (rlen > CLIENT_MAX_ROUTING)
                return -EINVAL;
        q = calloc(1, sizeof(*q));
        if (!q)
                return -ENOMEM;
        r = wire_encode(e, &q->buf, &q->len);
        if (r < 0) {
                free(q);
                return r;
        }
        memcpy(q->rid, rid, rlen);
        q->rlen = rlen;
        q->body = wire_body_name(e);
        list_append(&s->turn_out, &q->node);
        if (ret)
                *ret = q;
        return 0;
}

int server_queue_to(struct server *s, const void *routing_id, size_t len, Aqua__Envelope *e)
{
        int r = queue_encoded(s, routing_id, len, e, NULL);

        if (r < 0) {
                s->stats.send_dropped++;
                outbox_log_dropped(s, routing_id, len, wire_body_name(e),
                                   r == -ENOMEM ? "out of memory encoding it" : strerror(-r));
        }
        return r;
}

int server_queue(struct server *s, struct client *c, Aqua__Envelope *e)
{
        if (!c || !c->routing_id_len)
                return -ENOTCONN;
        return server_queue_to(s, c->routing_id, c->routing_id_len, e);
}

void server_reply(struct server *s, struct client *c, uint64_t request_id, Aqua__Envelope *e)
{
        e->request_id = request_id;
        server_queue(s, c, e);
}

/* An Error envelope's parts, counted as sent. */
struct error_env {
        Aqua__Envelope e;
        Aqua__Error err;
};

static void error_env_init(struct server *s, struct error_env *x, uint64_t request_id, int code,
                           char *msg)
{
        s->stats.errors++;
        if (code >= 0 && (size_t)code < ARRAY_SIZE(s->stats.errors_by_code))
                s->stats.errors_by_code[code]++;
        x->e = (Aqua__Envelope)AQUA__ENVELOPE__INIT;
        x->err = (Aqua__Error)AQUA__ERROR__INIT;
        x->err.code = code;
        x->err.message = msg;
        x->e.request_id = request_id;
        x->e.body_case = AQUA__ENVELOPE__BODY_ERROR;
        x->e.error = &x->err;
}

int server_queue_error(struct server *s, const void *routing_id, size_t len, uint64_t request_id,
                       int code, const char *fmt, ...)
{
        struct error_env x;
        char msg[512];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        error_env_init(s, &x, request_id, code, msg);
        log_error_reply(s, routing_id, len, s->request, request_id, code, msg);
        return server_queue_to(s, routing_id, len, &x.e);
}

int client_queue_error(struct server *s, struct client *c, uint64_t request_id, int code,
                       const char *what, const char *err)
{
        return server_queue_error(s, c->routing_id, c->routing_id_len, request_id, code, "%s%s%s",
                                  what ? what : "", what ? ": " : "", err);
}

/* ------------------------------------------------------------------------------ custody */

int server_queue_custody(struct server *s, struct client *c, Aqua__Envelope *e,
                         struct turn_change *k)
{
        struct queued *q;
        int r;

        if (!c->routing_id_len)
                return -ENOTCONN;
        r = queue_encoded(s, c->routing_id, c->routing_id_len, e, &q);
        if (r < 0)
                return r;
        k->client = c;
        k->request_id = e->request_id;
        k->reply = q;
        q->change = k;
        list_append(&s->turn_custody, &k->node);
        return 0;
}

void turn_change_free(struct turn_change *k)
{
        if (!k)
                return;
        if (k->node.next)
                list_unlink(&k->node);
        if (k->reply)
                k->reply->change = NULL;
        free(k->ids);
        free(k->granted);
        free(k);
}

static void custody_undo(struct server *s, struct turn_change *k)
{
        if (k->kind == CUSTODY_GRANT)
                broker_undo_grant(s->broker, k->client->gpu, &k->grant);
        else
                broker_undo_offer(s->broker, k->ids, k->n);
}

/* Make k's reply the error code with "what: msg" instead, and forget what k handed out. */
static void custody_refuse(struct server *s, struct turn_change *k, int code, const char *msg)
{
        struct queued *q = k->reply;
        struct error_env x;
        char text[512];
        void *buf;
        size_t len;

        custody_undo(s, k);
        snprintf(text, sizeof(text), "%s: %s", k->kind == CUSTODY_GRANT ? "borrow" : "offer", msg);
        error_env_init(s, &x, k->request_id, code, text);
        log_error_reply(s, q->rid, q->rlen, k->kind == CUSTODY_GRANT ? "borrow" : "offer",
                        k->request_id, code, text);
        if (wire_encode(&x.e, &buf, &len) == 0) {
                free(q->buf);
                q->buf = buf;
                q->len = len;
                q->body = "Error";
        } else {
                /* Out of memory: no reply at all rather than one that says what is undone. */
                queued_free(q);
                k->reply = NULL;
        }
        turn_change_free(k);
}

/* The commit was refused: every custody change of the turn is undone, newest first. */
static void refuse_turn(struct server *s)
{
        char why[160];
        const char *msg =
            broker_degraded(s->broker, why, sizeof(why)) ?: "the journal cannot be written";

        while (!list_empty(&s->turn_custody))
                custody_refuse(s, list_entry(s->turn_custody.prev, struct turn_change, node),
                               ECODE(JOURNAL), msg);
}

/* A grant's descriptors, SIDE_MAX_FDS to a frame, on its consumer's side channel: the chunks
 * its request described (the turn's barrier keeps them as they were). */
static int send_grant_fds(struct client *c, const struct turn_change *k)
{
        uint64_t ids[SIDE_MAX_FDS];
        int fds[SIDE_MAX_FDS];
        size_t n;

        for (size_t at = 0; at < k->n_granted; at += n) {
                Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
                int r;

                n = MIN(k->n_granted - at, (size_t)SIDE_MAX_FDS);
                for (size_t i = 0; i < n; i++) {
                        ids[i] = k->granted[at + i].id;
                        fds[i] = k->granted[at + i].fd;
                }
                f.kind = AQUA__SIDE_FRAME__KIND__KIND_GRANT_FDS;
                f.lease_id = broker_grant_lease_id(&k->grant);
                f.chunk_ids = ids;
                f.n_chunk_ids = n;
                r = side_send(c->side_fd, &f, fds, n);
                if (r < 0)
                        return r;
        }
        return 0;
}

static void send_queued(struct server *s, struct queued *q)
{
        struct turn_change *k = q->change;
        int r;

        if (k && k->kind == CUSTODY_GRANT && k->n_granted && !k->client->remote) {
                r = send_grant_fds(k->client, k);
                if (r < 0) {
                        char msg[160];
                        snprintf(msg, sizeof(msg),
                                 "could not pass the descriptors of lease %" PRIu64 ": %s",
                                 broker_grant_lease_id(&k->grant), strerror(-r));
                        custody_refuse(s, k, r == -EAGAIN ? ECODE(THROTTLED) : ECODE(SIDE_CHANNEL),
                                       msg);
                        k = NULL;
                }
        }
        /* Notices and replies deferred for this client go first: a reply must not overtake
         * them, nor a grant the notices that may follow it. */
        r = k && !list_empty(&k->client->deferred)
                ? -EAGAIN
                : outbox_router_send(s, q->rid, q->rlen, q->buf, q->len, q->body);
        if (r == -EAGAIN && k && server_defer_reply(s, k->client, q->buf, q->len, q->body) == 0) {
                /* The client's queue is full (ZeroMQ's high-water mark) but it is there: what the
                 * reply hands over is its, and the reply waits in its outbox. */
                q->buf = NULL;
                log_debug("Client %" PRIu64 ": the reply to its %s waits for its queue to drain",
                          k->client->id, k->kind == CUSTODY_GRANT ? "borrow" : "offer");
                turn_change_free(k);
                return;
        }
        if (r == -EAGAIN) {
                s->stats.send_dropped++;
                outbox_log_dropped(s, q->rid, q->rlen, q->body,
                                   "its queue is full (ZeroMQ's high-water mark)");
        }
        if (r < 0 && k) {
                /* A grant or an offer its client never hears of would be custody nobody knows
                 * it has: taken back (the client's request times out). */
                s->stats.custody_undelivered++;
                log_notice("Client %" PRIu64 ": the reply to its %s could not be sent (%s); "
                           "what it would have handed over is taken back",
                           k->client->id, k->kind == CUSTODY_GRANT ? "borrow" : "offer",
                           zmq_strerror(-r));
                custody_undo(s, k);
        }
        turn_change_free(k);
}

/* ------------------------------------------------------------------------------ the turn */

bool server_turn_granted(const struct server *s, uint64_t lease_id)
{
        for (struct list_node *n = s->turn_custody.next; n != &s->turn_custody; n = n->next) {
                const struct turn_change *k = list_entry(n, struct turn_change, node);
                if (k->kind == CUSTODY_GRANT && lease_id && broker_grant_lease_id(&k->grant) == lease_id)
                        return true;
        }
        return false;
}

void server_turn_barrier(struct server *s)
{
        if (!list_empty(&s->turn_custody))
                server_end_turn(s);
}

void server_end_turn(struct server *s)
{
        uint64_t now = now_mono_ns();
        struct broker_counts n;
        int r = 0;

        server_stage_notices(s);
        broker_counts(s->broker, &n);
        if (!n.journal_error || now >= s->journal_probe_ns) {
                r = broker_commit(s->broker);
                if (s->domain && (n.uncommitted || n.journal_error))
                        domain_count_commit(s->domain, now_mono_ns() - now);
                if (r == -ESTALE)
                        s->deposed = true;
                /* A turn too large for one commit is refused on its own: the next commit, its
                 * undo, need not wait, nor the turns after it. */
                if (r < 0 && r != -E2BIG)
                        s->journal_probe_ns = now + JOURNAL_PROBE_NS;
        } else
                r = n.journal_error;
        if (r < 0)
                refuse_turn(s);
        if (r == -E2BIG && broker_commit(s->broker) < 0)
                s->journal_probe_ns = now + JOURNAL_PROBE_NS;
        while (!list_empty(&s->turn_out)) {
                struct queued *q = list_entry(s->turn_out.next, struct queued, node);
                send_queued(s, q);
                queued_free(q);
        }
        server_flush_outboxes(s);
}

uint64_t server_turn_deadline(const struct server *s)
{
        struct broker_counts n;

        broker_counts(s->broker, &n);
        if (n.journal_error)
                return s->journal_probe_ns;
        if (n.uncommitted)
                return now_mono_ns() + COMMIT_LINGER_NS;
        return 0;
}

void server_turn_clear(struct server *s)
{
        while (!list_empty(&s->turn_custody))
                turn_change_free(list_entry(s->turn_custody.next, struct turn_change, node));
        while (!list_empty(&s->turn_out))
                queued_free(list_entry(s->turn_out.next, struct queued, node));
}
