/*
 * Requests from clients: decoding, role checks, calling the broker core and the replies
 * (hello.c registers clients; descriptors.c pairs requests with the descriptors that travel on
 * the side channel). Every bad
 * message gets an Error naming the problem; a registered client is never dropped for what it sends
 * (closing its side channel would make the daemon believe it dead while it still maps memory).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "admin.h"
#include "clients.h"
#include "descriptors.h"
#include "dispatch.h"
#include "hello.h"
#include "log.h"
#include "parse-util.h"
#include "state.h"
#include "throttle.h"
#include "time-util.h"
#include "translate.h"
#include "turn.h"

#define ECODE(name) AQUA__ERROR_CODE__ERROR_CODE_##name

/* A request the core (or the transport) refused: code is a wire code or a negative errno. */
static int reply_failure(struct server *s, struct client *c, uint64_t request_id, int code,
                         const char *what, const char *err)
{
        if (code < 0)
                return client_queue_error(s, c, request_id, ECODE(INTERNAL), what, "out of memory");
        return client_queue_error(s, c, request_id, code, NULL, err);
}

/*
 * Acknowledged means durable: a change that hands out custody (an offer taken, a grant) is
 * recorded with its reply and undone if the turn's commit is refused (turn.c). While the
 * journal cannot be written such changes are refused at once; returns whether that is so (the
 * client has had its error then).
 */
static bool refused_degraded(struct server *s, struct client *c, uint64_t request_id,
                             const char *what)
{
        struct broker_counts n;
        char why[160];

        broker_counts(s->broker, &n);
        if (!n.journal_error)
                return false;
        client_queue_error(s, c, request_id, ECODE(JOURNAL), what,
                           broker_degraded(s->broker, why, sizeof(why))
                               ?: "the journal cannot be written");
        return true;
}

static void reply_ack(struct server *s, struct client *c, uint64_t request_id)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Ack ack = AQUA__ACK__INIT;

        e.body_case = AQUA__ENVELOPE__BODY_ACK;
        e.ack = &ack;
        server_reply(s, c, request_id, &e);
}

/* ------------------------------------------------------------------------------ offer */

static void finish_offer(struct server *s, struct client *c, const Aqua__Envelope *e, int *fds,
                         size_t n)
{
        Aqua__Envelope r = AQUA__ENVELOPE__INIT;
        Aqua__OfferReply o = AQUA__OFFER_REPLY__INIT;
        _cleanup_free_ uint64_t *sizes = calloc(n + 1, sizeof(uint64_t));
        _cleanup_free_ uint64_t *refs = calloc(n + 1, sizeof(uint64_t));
        _cleanup_free_ uint64_t *ids = calloc(n + 1, sizeof(uint64_t));
        _cleanup_free_ uint8_t *fabrics =
            c->remote ? calloc(n + 1, BROKER_FABRIC_HANDLE_SIZE) : NULL;
        char err[BROKER_ERR_MAX];
        _cleanup_free_ struct turn_change *k = calloc(1, sizeof(*k));
        int code = 0;

        if (!sizes || !refs || !ids || (c->remote && !fabrics) || !k) {
                client_queue_error(s, c, e->request_id, ECODE(INTERNAL), "offer", "out of memory");
                return;
        }
        for (size_t i = 0; i < n && code == 0; i++) {
                const ProtobufCBinaryData *f = &e->offer->chunks[i]->fabric_handle;

                sizes[i] = e->offer->chunks[i]->size;
                refs[i] = e->offer->chunks[i]->client_ref;
                code = hello_fabric_check(f->len, c->remote, "offer: chunk", i, err);
                if (code == 0 && fabrics)
                        memcpy(fabrics + i * BROKER_FABRIC_HANDLE_SIZE, f->data, f->len);
        }
        if (code == 0)
                code = translate_outcome(
                    broker_offer(s->broker, c->gpu, sizes, refs, fds, fabrics, n, ids, err));
        if (code != 0) {
                reply_failure(s, c, e->request_id, code, "offer", err);
                return;
        }
        if (refused_degraded(s, c, e->request_id, "offer")) {
                broker_undo_offer(s->broker, ids, n);
                return;
        }
        log_debug("GPU %s offered %zu chunks", broker_gpu_uuid(c->gpu), n);
        o.chunk_ids = ids;
        o.n_chunk_ids = n;
        r.body_case = AQUA__ENVELOPE__BODY_OFFER_REPLY;
        r.offer_reply = &o;
        r.request_id = e->request_id;
        k->kind = CUSTODY_OFFER;
        k->ids = ids;
        k->n = n;
        if (server_queue_custody(s, c, &r, k) < 0) {
                broker_undo_offer(s->broker, ids, n);
                client_queue_error(s, c, e->request_id, ECODE(INTERNAL), "offer", "out of memory");
                return;
        }
        /* The turn has them now. */
        ids = NULL;
        k = NULL;
        /* A consumer may have been waiting for exactly this memory: nothing to do, it asks. */
}

void dispatch_complete(struct server *s, struct client *c, struct pending *p)
{
        Aqua__Envelope *e = TAKE_PTR(p->env);
        int *fds = TAKE_PTR(p->fds);
        size_t n = p->n_fds;

        p->n_fds = 0;
        client_free_pending(c, p);
        if (e->body_case == AQUA__ENVELOPE__BODY_OFFER)
                finish_offer(s, c, e, fds, n);
        else {
                server_turn_barrier(s);
                hello_finish(s, c, e, fds, n);
        }
        side_close_fds(fds, n);
        free(fds);
        aqua__envelope__free_unpacked(e, NULL);
}

void dispatch_side_frame(struct server *s, struct client *c, Aqua__SideFrame *f, int *fds,
                         size_t n_fds)
{
        struct pending *p = pending_take_fds(s, c, f, fds, n_fds);

        if (p)
                dispatch_complete(s, c, p);
}

/* Takes e. */
static void handle_offer(struct server *s, struct client *c, Aqua__Envelope *e)
{
        struct pending *p = pending_find(c, e->request_id);
        size_t need = e->offer->n_chunks;

        if (need == 0) {
                client_queue_error(s, c, e->request_id, ECODE(INVALID), "offer", "no chunks");
                goto done;
        }
        /* Fabric handles came in the message: nothing to wait for. */
        if (c->remote) {
                finish_offer(s, c, e, NULL, need);
                goto done;
        }
        if (p && p->env) {
                client_queue_error(s, c, e->request_id, ECODE(INVALID), "offer",
                                   "a request with this id is already waiting for descriptors");
                goto done;
        }
        if (p && p->n_fds > need) {
                char msg[96];
                snprintf(msg, sizeof(msg), "%zu descriptors for %zu chunks", p->n_fds, need);
                client_queue_error(s, c, e->request_id, ECODE(SIDE_CHANNEL), "offer", msg);
                client_free_pending(c, p);
                goto done;
        }
        if (!p && !(p = pending_add(s, c, e->request_id))) {
                client_queue_error(s, c, e->request_id, ECODE(THROTTLED), "offer",
                                   "too many requests waiting for descriptors");
                goto done;
        }
        p->env = TAKE_PTR(e);
        if (p->n_fds == need)
                dispatch_complete(s, c, p);
done:
        if (e)
                aqua__envelope__free_unpacked(e, NULL);
}

/* ------------------------------------------------------------------------------ borrow */

static void handle_borrow(struct server *s, struct client *c, const Aqua__Envelope *e)
{
        const Aqua__Borrow *b = e->borrow;
        Aqua__Envelope r = AQUA__ENVELOPE__INIT;
        Aqua__Grant g = AQUA__GRANT__INIT;
        _cleanup_free_ struct broker_granted_chunk *view = NULL;
        _cleanup_free_ Aqua__GrantedChunk *chunks = NULL;
        _cleanup_free_ Aqua__GrantedChunk **ptrs = NULL;
        _cleanup_free_ struct turn_change *k = calloc(1, sizeof(*k));
        struct broker_grant pg;
        char err[BROKER_ERR_MAX];
        int code;

        if (!k) {
                client_queue_error(s, c, e->request_id, ECODE(INTERNAL), "borrow", "out of memory");
                return;
        }
        code = translate_outcome(
            broker_borrow(s->broker, c->gpu, b->bytes, b->min_bytes, b->allow_dram, &pg, err));
        if (code != 0) {
                reply_failure(s, c, e->request_id, code, "borrow", err);
                return;
        }
        if (refused_degraded(s, c, e->request_id, "borrow")) {
                broker_undo_grant(s->broker, c->gpu, &pg);
                return;
        }
        if (broker_grant_size(&pg)) {
                size_t n = broker_grant_size(&pg);

                view = calloc(n, sizeof(*view));
                chunks = calloc(n, sizeof(*chunks));
                ptrs = calloc(n, sizeof(*ptrs));
                if (!view || !chunks || !ptrs) {
                        broker_undo_grant(s->broker, c->gpu, &pg);
                        client_queue_error(s, c, e->request_id, ECODE(INTERNAL), "borrow",
                                           "out of memory");
                        return;
                }
                n = broker_grant_chunks(&pg, view, n);
                for (size_t i = 0; i < n; i++) {
                        aqua__granted_chunk__init(&chunks[i]);
                        chunks[i].chunk_id = view[i].id;
                        chunks[i].size = view[i].size;
                        chunks[i].producer_uuid = (char *)view[i].producer_uuid;
                        if (c->remote && view[i].fabric)
                                chunks[i].fabric_handle = (ProtobufCBinaryData){
                                    .len = BROKER_FABRIC_HANDLE_SIZE,
                                    .data = (uint8_t *)view[i].fabric};
                        ptrs[i] = &chunks[i];
                }
                g.lease_id = broker_grant_lease_id(&pg);
                g.chunks = ptrs;
                g.n_chunks = n;
        }
        g.dram_bytes = pg.dram_bytes;
        g.partial = pg.partial;
        r.body_case = AQUA__ENVELOPE__BODY_GRANT;
        r.grant = &g;
        r.request_id = e->request_id;
        /* Its descriptors leave on the side channel just before it, after the turn's commit. */
        k->kind = CUSTODY_GRANT;
        k->grant = pg;
        k->granted = view;
        k->n_granted = g.n_chunks;
        if (server_queue_custody(s, c, &r, k) < 0) {
                broker_undo_grant(s->broker, c->gpu, &pg);
                client_queue_error(s, c, e->request_id, ECODE(INTERNAL), "borrow", "out of memory");
                return;
        }
        k = NULL;
        view = NULL; /* the turn's change holds it */
}

/* ------------------------------------------------------------------------------ the rest */

static void handle_return(struct server *s, struct client *c, const Aqua__Envelope *e)
{
        const Aqua__Return *rt = e->return_;
        Aqua__Envelope r = AQUA__ENVELOPE__INIT;
        Aqua__ReturnReply rr = AQUA__RETURN_REPLY__INIT;
        char err[BROKER_ERR_MAX];
        uint32_t returned = 0;
        int code;

        /* Unusable chunks first: they must not go back to the pool with the rest. */
        code = rt->n_unusable_chunk_ids
                   ? broker_return_unusable(s->broker, c->gpu, rt->lease_id, rt->unusable_chunk_ids,
                                            rt->n_unusable_chunk_ids, err)
                   : 0;
        if (code == 0)
                code = broker_return(s->broker, c->gpu, rt->lease_id, rt->chunk_ids,
                                     rt->n_chunk_ids, rt->dram_bytes, &returned, err);
        code = translate_outcome(code);
        if (code != 0) {
                reply_failure(s, c, e->request_id, code, "return", err);
                return;
        }
        rr.lease_id = rt->lease_id;
        rr.returned = returned;
        r.body_case = AQUA__ENVELOPE__BODY_RETURN_REPLY;
        r.return_reply = &rr;
        server_reply(s, c, e->request_id, &r);
}

static void handle_reclaim(struct server *s, struct client *c, const Aqua__Envelope *e)
{
        const Aqua__ReclaimRequest *rq = e->reclaim_request;
        Aqua__Envelope r = AQUA__ENVELOPE__INIT;
        Aqua__ReclaimReply rr = AQUA__RECLAIM_REPLY__INIT;
        _cleanup_(broker_reclaim_clear) struct broker_reclaim res = {0};
        char err[BROKER_ERR_MAX];
        int code;

        code = translate_outcome(broker_reclaim(s->broker, c->gpu, rq->bytes, rq->all, false,
                                                "producer load", &res, err));
        if (code != 0) {
                reply_failure(s, c, e->request_id, code, "reclaim", err);
                return;
        }
        rr.chunk_ids = res.free_ids;
        rr.n_chunk_ids = res.n_free;
        rr.pending_chunk_ids = res.pending_ids;
        rr.n_pending_chunk_ids = res.n_pending;
        rr.deadline_ms = res.deadline_ms;
        r.body_case = AQUA__ENVELOPE__BODY_RECLAIM_REPLY;
        r.reclaim_reply = &rr;
        server_reply(s, c, e->request_id, &r);
}

static void handle_load(struct server *s, struct client *c, const Aqua__Envelope *e)
{
        const Aqua__LoadReport *l = e->load;

        broker_report_load(s->broker, c->gpu,
                           &(struct broker_load){.load = l->load,
                                                 .used_bytes = l->used_bytes,
                                                 .free_bytes = l->free_bytes,
                                                 .migrations = l->migrations,
                                                 .bytes_moved = l->bytes_moved,
                                                 .dram_bytes = l->dram_bytes});
        reply_ack(s, c, e->request_id);
}

static void handle_scrub_done(struct server *s, struct client *c, const Aqua__Envelope *e)
{
        const Aqua__ScrubDone *d = e->scrub_done;
        char err[BROKER_ERR_MAX];
        uint32_t done = 0;
        int code;

        code = translate_outcome(broker_scrub_done(s->broker, c->gpu, d->chunk_ids, d->n_chunk_ids,
                                                   d->failed_chunk_ids, d->n_failed_chunk_ids,
                                                   &done, err));
        if (code != 0) {
                reply_failure(s, c, e->request_id, code, "scrub_done", err);
                return;
        }
        log_debug("GPU %s scrubbed %" PRIu32 " chunks (%zu failed)", broker_gpu_uuid(c->gpu), done,
                  d->n_failed_chunk_ids);
        reply_ack(s, c, e->request_id);
}

static void handle_keepalive(struct server *s, struct client *c, const Aqua__Envelope *e)
{
        /* Its arrival is all it says (last_seen_ns, set for every request of a remote client). */
}

/* How a request may share a turn with the custody changes of the requests before it (turn.c). */
enum turn_rule {
        TURN_BARRIER, /* it may touch them: the turn's changes are committed and sent first */
        TURN_JOINS,   /* it cannot touch them */
        TURN_RETURN,  /* a return: a barrier only for a lease granted in this very turn */
};

/* Every request a client sends, by its body: what it needs of the client and who runs it. */
static const struct request {
        /* Runs it, reading e; or taking e (the envelope is then the handler's to free). */
        void (*read)(struct server *s, struct client *c, const Aqua__Envelope *e);
        void (*take)(struct server *s, struct client *c, Aqua__Envelope *e);
        Aqua__Role role; /* the role it needs; ROLE_UNSPECIFIED: none */
        bool gpu;        /* a GPU client of either role (not an operator) */
        enum turn_rule turn;
} requests[] = {
#define BODY(name) [AQUA__ENVELOPE__BODY_##name]
#define ROLE(name) AQUA__ROLE__ROLE_##name
    BODY(OFFER) = {.take = handle_offer, .role = ROLE(PRODUCER), .turn = TURN_JOINS},
    BODY(RECLAIM_REQUEST) = {.read = handle_reclaim, .role = ROLE(PRODUCER)},
    BODY(SCRUB_DONE) = {.read = handle_scrub_done, .role = ROLE(PRODUCER)},
    BODY(BORROW) = {.read = handle_borrow, .role = ROLE(CONSUMER), .turn = TURN_JOINS},
    BODY(RETURN) = {.read = handle_return, .role = ROLE(CONSUMER), .turn = TURN_RETURN},
    BODY(LOAD) = {.read = handle_load, .gpu = true, .turn = TURN_JOINS},
    BODY(KEEPALIVE) = {.read = handle_keepalive, .turn = TURN_JOINS},
    BODY(GOODBYE) = {.read = hello_goodbye},
    BODY(ADMIN_QUERY) = {.read = admin_handle},
    BODY(ADMIN_RECLAIM) = {.read = admin_handle},
    BODY(ADMIN_DRAIN) = {.read = admin_handle},
    BODY(ADMIN_PAIR) = {.read = admin_handle},
    BODY(ADMIN_UNPAIR) = {.read = admin_handle},
    BODY(ADMIN_RELEASE) = {.read = admin_handle},
    BODY(ADMIN_RELOAD) = {.read = admin_handle},
    BODY(ADMIN_UNDRAIN) = {.read = admin_handle},
    /* Before a registration: hello.c runs them, from the message's origin. */
    BODY(HELLO_HELD) = {.turn = TURN_JOINS},
#undef ROLE
#undef BODY
};

static const struct request *request_of(Aqua__Envelope__BodyCase body)
{
        return (size_t)body < ARRAY_SIZE(requests) ? &requests[body] : NULL;
}

/* Whether c may send r; if not, *need names what it needed. */
static bool request_allowed(const struct client *c, const struct request *r, const char **need)
{
        if (r->gpu) {
                *need = "a GPU client";
                return c->gpu != NULL;
        }
        if (r->role == AQUA__ROLE__ROLE_UNSPECIFIED)
                return true;
        *need = translate_role_name(r->role);
        return client_role(c) == r->role;
}

void dispatch_envelope(struct server *s, const struct origin *o, const void *data, size_t size)
{
        Aqua__Envelope *e = NULL;
        const struct request *req;
        struct client *c;
        const char *need = NULL;
        char err[512];
        int r;

        r = wire_decode(data, size, &s->limits, &e, err, sizeof(err));
        if (r != 0) {
                s->request = "message that did not decode";
                server_queue_error(s, o->rid, o->rlen, 0,
                                   r < 0 ? ECODE(INTERNAL) : wire_error_code(r), "%s",
                                   r < 0 ? "out of memory decoding" : err);
                s->request = NULL;
                return;
        }
        /* What an error reply answers, for the log. */
        s->request = wire_body_name(e);
        req = request_of(e->body_case);
        /* Only what cannot touch them may join a turn that holds custody changes. */
        if (!req || req->turn == TURN_BARRIER ||
            (req->turn == TURN_RETURN && server_turn_granted(s, e->return_->lease_id)))
                server_turn_barrier(s);
        if (e->body_case == AQUA__ENVELOPE__BODY_HELLO) {
                hello_handle(s, o, e);
                s->request = NULL;
                return;
        }
        if (e->body_case == AQUA__ENVELOPE__BODY_HELLO_HELD) {
                hello_handle_held(s, o, e);
                goto done;
        }
        c = server_find_by_routing(s, o->rid, o->rlen);
        if (!c || !c->registered) {
                server_queue_error(s, o->rid, o->rlen, e->request_id, ECODE(NOT_REGISTERED),
                                   "%s before a successful Hello", wire_body_name(e));
                goto done;
        }
        /* A routing id is the peer's to choose: a remote client's is only its own while the
         * same CURVE identity sends it. */
        if (c->remote && (!o->remote || !o->key || strcmp(o->key, c->remote_key) != 0)) {
                server_queue_error(s, o->rid, o->rlen, e->request_id, ECODE(PERMISSION),
                                   "%s: this routing id belongs to another client",
                                   wire_body_name(e));
                goto done;
        }
        if (c->remote)
                c->last_seen_ns = now_mono_ns();
        if (!throttle_take(s, c, e->request_id))
                goto done;
        if (!req || (!req->read && !req->take)) {
                server_queue_error(s, o->rid, o->rlen, e->request_id, ECODE(INVALID),
                                   "%s is not a request a client sends", wire_body_name(e));
                goto done;
        }
        if (!request_allowed(c, req, &need)) {
                server_queue_error(s, o->rid, o->rlen, e->request_id, ECODE(WRONG_ROLE),
                                   "%s: needs a %s, this client registered as %s",
                                   wire_body_name(e), need, translate_role_name(client_role(c)));
                goto done;
        }
        if (req->take)
                req->take(s, c, TAKE_PTR(e));
        else
                req->read(s, c, e);
done:
        s->request = NULL;
        if (e)
                aqua__envelope__free_unpacked(e, NULL);
}
