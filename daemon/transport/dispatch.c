/*
 * Requests from clients: decoding, role checks, calling the broker core and the replies
 * (descriptors.c pairs requests with the descriptors that travel on the side channel). Every bad
 * message gets an Error naming the problem; a registered client is never dropped for what it sends
 * (closing its side channel would make the daemon believe it dead while it still maps memory).
 */
#include <inttypes.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "parse-util.h"
#include "server.h"
#include "time-util.h"
#include "translate.h"

#define E(name) AQUA__ERROR_CODE__ERROR_CODE_##name

static const char *role_name(Aqua__Role r)
{
        switch (r) {
        case AQUA__ROLE__ROLE_PRODUCER:
                return "producer";
        case AQUA__ROLE__ROLE_CONSUMER:
                return "consumer";
        case AQUA__ROLE__ROLE_NEUTRAL:
                return "neutral";
        case AQUA__ROLE__ROLE_ADMIN:
                return "admin";
        default:
                return "unspecified";
        }
}

/* A request the core (or the transport) refused: code is a wire code or a negative errno. */
static int reply_failure(struct server *s, struct client *c, uint64_t request_id, int code,
                         const char *what, const char *err)
{
        if (code < 0)
                return client_queue_error(s, c, request_id, E(INTERNAL), what, "out of memory");
        return client_queue_error(s, c, request_id, code, NULL, err);
}

static void reply(struct server *s, struct client *c, uint64_t request_id, Aqua__Envelope *e)
{
        e->request_id = request_id;
        server_queue(s, c, e);
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
        char why[160];

        if (!s->broker->journal_error)
                return false;
        client_queue_error(s, c, request_id, E(JOURNAL), what,
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
        reply(s, c, request_id, &e);
}

/*
 * A client may send limits.request-burst requests at once and limits.request-rate per second
 * after that (a token bucket); one that sends more gets ERROR_CODE_THROTTLED for the excess,
 * which costs the daemon no more than the decoding. A client that waits for each reply stays
 * far below any sensible rate.
 */
static bool take_credit(struct server *s, struct client *c, uint64_t request_id)
{
        const struct config_limits *l = &s->config->limits;
        uint64_t now;

        if (l->request_rate <= 0)
                return true;
        now = now_mono_ns();
        if (!c->credit_ns)
                c->credit = (double)l->request_burst;
        else
                c->credit =
                    MIN((double)l->request_burst,
                        c->credit + (double)(now - c->credit_ns) * (double)l->request_rate / 1e9);
        c->credit_ns = now;
        if (c->credit >= 1.0) {
                c->credit -= 1.0;
                return true;
        }
        s->stats.throttled++;
        server_queue_error(s, c->routing_id, c->routing_id_len, request_id, E(THROTTLED),
                           "over %" PRId64 " requests per second (bursts of %" PRId64
                           "); retry in %.0f ms",
                           l->request_rate, l->request_burst,
                           ceil((1.0 - c->credit) * 1e3 / (double)l->request_rate));
        return false;
}

/* ------------------------------------------------------------------------------ hello */

/*
 * A fabric handle's length where one may come: exactly BROKER_FABRIC_HANDLE_SIZE from a client
 * that passes fabric handles, none from one whose handles are descriptors. The bytes themselves
 * are the driver's business: aquad passes them on and never reads them.
 */
static int fabric_handle_check(size_t len, bool fabric, const char *what, size_t i, char *err)
{
        if (fabric && len != BROKER_FABRIC_HANDLE_SIZE)
                return broker_fail(err, E(INVALID),
                                   "%s %zu: a fabric handle of %zu bytes; a CUmemFabricHandle has "
                                   "%d",
                                   what, i, len, BROKER_FABRIC_HANDLE_SIZE);
        if (!fabric && len)
                return broker_fail(err, E(INVALID),
                                   "%s %zu: a fabric handle from a client that passes "
                                   "descriptors on the side channel",
                                   what, i);
        return 0;
}

/*
 * What a re-registering client holds: the HelloHeld parts that came first, then the Hello's own,
 * in the pool's terms.
 */
static int held_all(struct client *c, const Aqua__Hello *h, struct broker_held **ret_all,
                    size_t *ret_n)
{
        size_t n = c->n_held + h->n_held;
        struct broker_held *all = calloc(n + 1, sizeof(*all));

        if (!all)
                return -ENOMEM;
        for (size_t i = 0; i < c->n_held; i++) {
                all[i] = c->held[i].held;
                all[i].fabric = c->held[i].has_fabric ? c->held[i].fabric : NULL;
        }
        for (size_t i = 0; i < h->n_held; i++) {
                const ProtobufCBinaryData *f = &h->held[i]->fabric_handle;

                all[c->n_held + i] = (struct broker_held){
                    .chunk_id = h->held[i]->chunk_id,
                    .size = h->held[i]->size,
                    .lease_id = h->held[i]->lease_id,
                    .fabric = f->len == BROKER_FABRIC_HANDLE_SIZE ? f->data : NULL};
        }
        *ret_all = all;
        *ret_n = n;
        return 0;
}

/* The links a GPU reports, in the pool's terms (strings point into h). */
static struct broker_link *links_of(const Aqua__Hello *h)
{
        struct broker_link *links = calloc(h->n_links + 1, sizeof(*links));

        if (!links)
                return NULL;
        for (size_t i = 0; i < h->n_links; i++)
                links[i] = (struct broker_link){.uuid = h->links[i]->gpu_uuid,
                                                .bandwidth = h->links[i]->bandwidth_gbps};
        return links;
}

/* Welcome a registered client; gpu NULL for an admin; secret NULL: none new to give. */
static void reply_welcome(struct server *s, struct client *c, uint64_t request_id,
                          const struct gpu *gpu, uint64_t *lost_leases, size_t n_lost_leases,
                          uint8_t *secret)
{
        Aqua__Envelope r = AQUA__ENVELOPE__INIT;
        Aqua__Welcome w = AQUA__WELCOME__INIT;

        w.client_id = c->id;
        w.daemon_version = AQUA_PROTOCOL_VERSION;
        if (gpu) {
                w.paired_with = gpu->paired ? gpu->paired->device : "";
                w.dram_budget = gpu->dram_bytes;
        }
        w.reclaim_deadline_ms = s->broker->settings.reclaim_deadline_ns / NSEC_PER_MSEC;
        /* Three a grace: one lost on the way does not end the registration. */
        if (c->remote && s->config->remote.grace_ns)
                w.keepalive_ms = MAX(s->config->remote.grace_ns / 3 / NSEC_PER_MSEC, 1);
        w.lost_leases = lost_leases;
        w.n_lost_leases = n_lost_leases;
        if (secret)
                w.custody_secret = (ProtobufCBinaryData){.len = BROKER_SECRET_LEN, .data = secret};
        r.body_case = AQUA__ENVELOPE__BODY_WELCOME;
        r.welcome = &w;
        reply(s, c, request_id, &r);
}

static void finish_hello(struct server *s, struct client *c, Aqua__Envelope *e, int *fds,
                         size_t n_fds)
{
        const Aqua__Hello *h = e->hello;
        _cleanup_free_ struct broker_held *all = NULL;
        _cleanup_free_ struct broker_link *links = links_of(h);
        size_t n_all = 0;
        struct broker_welcome pw = {0};
        char err[BROKER_ERR_MAX];
        struct broker_identity who = {.remote = c->remote, .uid = c->cred.uid};
        struct broker_hello ph = {
            .who = &who,
            .secret = h->custody_secret.len == BROKER_SECRET_LEN ? h->custody_secret.data : NULL,
            .uuid = h->gpu_uuid,
            .role = translate_role_from_wire(h->role),
            .ordinal = h->gpu_ordinal,
            .capacity = h->gpu_capacity,
            .granularity = h->granularity,
            .client_name = h->client_name,
            .host = h->host,
            .pid = c->cred.pid,
            .process = c->process.pid ? &c->process : NULL,
            .links = links,
            .n_links = h->n_links,
            .held_fds = fds,
            .fabric = c->remote,
        };
        int code;

        if (c->remote)
                snprintf(who.key, sizeof(who.key), "%s", c->remote_key);
        else
                who.process = c->process;
        code = links ? held_all(c, h, &all, &n_all) : -ENOMEM;
        if (code == 0 && h->custody_secret.len && h->custody_secret.len != BROKER_SECRET_LEN)
                code = broker_fail(err, E(INVALID),
                                   "hello: a custody secret of %zu bytes; Welcome gives %d",
                                   h->custody_secret.len, BROKER_SECRET_LEN);
        /* A remote producer passes its handles again; a consumer holds what it maps. */
        for (size_t i = 0; code == 0 && i < h->n_held; i++)
                code = fabric_handle_check(h->held[i]->fabric_handle.len,
                                           c->remote && h->role == AQUA__ROLE__ROLE_PRODUCER,
                                           "hello: held chunk", i, err);
        if (code == 0 && h->held_total && h->held_total != n_all)
                code = broker_fail(err, E(INVALID),
                                   "hello: held_total %" PRIu32 ", but %zu held chunks arrived",
                                   h->held_total, n_all);
        if (code == 0 && fds && n_fds != n_all)
                code = broker_fail(err, E(SIDE_CHANNEL),
                                   "hello: %zu descriptors for %zu held chunks", n_fds, n_all);
        ph.held = all;
        ph.n_held = n_all;
        /* A role the pool has no name for; the core checks the uuid first, and so here. */
        if (code == 0 && ph.role == _GPU_ROLE_MAX && h->gpu_uuid && h->gpu_uuid[0])
                code = broker_fail(err, E(INVALID),
                                   "hello: role %d is not producer, consumer or neutral", h->role);
        if (code == 0)
                code = translate_outcome(broker_register(s->broker, &ph, c, &pw, err));
        /* Whatever the outcome, the parts are spent: a new attempt sends them again. */
        client_free_held(s, c);
        side_close_fds(fds, n_fds); /* those the pool did not take */
        if (code < 0) {
                log_error_errno(code, "Failed to register GPU %s: %m", h->gpu_uuid);
                client_queue_error(s, c, e->request_id, E(INTERNAL), "hello", strerror(-code));
                return;
        }
        if (code > 0) {
                client_queue_error(s, c, e->request_id, code, NULL, err);
                return;
        }
        c->registered = true;
        c->role = h->role;
        c->gpu = pw.gpu;
        if (pw.replaced) {
                /* Its holder's earlier connection: forgotten, the GPU left as this Hello made it.
                 */
                pw.replaced->gpu = NULL;
                server_drop_client(s, pw.replaced);
        }
        if (c->remote)
                log_info("Remote client %" PRIu64 " (%s at %s) registered GPU %s as %s with fabric "
                         "handles%s",
                         c->id, c->remote_user, c->remote_addr, pw.gpu->uuid, role_name(h->role),
                         pw.n_lost_leases ? " (with lost leases)" : "");
        else
                log_info("Client %" PRIu64 " (pid %d uid %u) registered GPU %s as %s%s", c->id,
                         (int)c->cred.pid, c->cred.uid, pw.gpu->uuid, role_name(h->role),
                         pw.n_lost_leases ? " (with lost leases)" : "");
        reply_welcome(s, c, e->request_id, pw.gpu, pw.lost_leases, pw.n_lost_leases,
                      pw.new_secret ? pw.secret : NULL);
        sodium_memzero(pw.secret, sizeof(pw.secret));
        free(pw.lost_leases);
}

/* Takes e. */
/*
 * The unregistered client whose side channel gave out token, for a Hello or a HelloHeld that
 * carries it; NULL after an error naming why was sent. The token is a secret of the side
 * channel's process; it is not enough when the kernel can say that the message comes from
 * another (pid 0: it cannot say).
 */
static struct client *token_owner(struct server *s, const void *rid, size_t rlen,
                                  const Aqua__Envelope *e, const ProtobufCBinaryData *token)
{
        struct client *c = server_find_by_token(s, token->data, token->len);
        struct side_cred peer;

        if (!c) {
                server_queue_error(s, rid, rlen, e->request_id, E(PERMISSION),
                                   "%s: unknown token; connect the side channel at %s and send "
                                   "the token it gives",
                                   wire_body_name(e), s->config->side_socket);
                return NULL;
        }
        if (server_request_peer(s, &peer) == 0 && peer.pid > 0 && peer.pid != c->cred.pid) {
                s->stats.hijacks++;
                log_notice("%s from pid %d with the token of pid %d's side channel; refused",
                           wire_body_name(e), (int)peer.pid, (int)c->cred.pid);
                server_queue_error(s, rid, rlen, e->request_id, E(PERMISSION),
                                   "%s: the token belongs to another process's side channel",
                                   wire_body_name(e));
                return NULL;
        }
        return c;
}

/*
 * A Hello over tcp:// without a token: a client on another host, its identity the CURVE key ZAP
 * accepted. It registers as an admin (status, listings, and the operator requests the admin
 * lists allow its user), or, when it passes its chunk handles as fabric handles in the messages
 * (Hello.fabric_handles), as a producer or consumer: descriptors only the local side channel
 * carries. Its process is one aquad cannot watch, so what it holds outlives its silence.
 */
static void handle_remote_hello(struct server *s, const void *rid, size_t rlen, Aqua__Envelope *e)
{
        const Aqua__Hello *h = e->hello;
        struct client *c;

        if (h->role != AQUA__ROLE__ROLE_ADMIN && !h->fabric_handles) {
                server_queue_error(s, rid, rlen, e->request_id, E(SIDE_CHANNEL),
                                   "hello: as %s over tcp://: a client on another host may only "
                                   "register as admin (the control path) unless it passes fabric "
                                   "handles (Hello.fabric_handles); descriptors need the local "
                                   "side channel",
                                   role_name(h->role));
                return;
        }
        /* Its HelloHeld parts came first on this connection: the same client. */
        c = server_find_by_routing(s, rid, rlen);
        if (c && (!c->remote || c->registered || !s->request_key ||
                  strcmp(c->remote_key, s->request_key) != 0)) {
                server_queue_error(s, rid, rlen, e->request_id, E(PERMISSION),
                                   "hello: this routing id belongs to another client");
                return;
        }
        if (!c)
                c = server_add_remote(s, rid, rlen, e->request_id);
        if (!c)
                return;
        if (h->role == AQUA__ROLE__ROLE_ADMIN) {
                c->registered = true;
                c->role = h->role;
                log_info("Remote client %" PRIu64 " (%s at %s, uid %u) registered as admin%s%s",
                         c->id, c->remote_user, c->remote_addr, c->cred.uid,
                         h->client_name ? ": " : "", h->client_name ? h->client_name : "");
                reply_welcome(s, c, e->request_id, NULL, NULL, 0, NULL);
                return;
        }
        /* An earlier connection of its own (the same key, with the custody secret) is replaced
         * by the core; any other identity is refused while the GPU holds state. */
        finish_hello(s, c, e, NULL, 0);
        if (!c->registered)
                server_drop_client(s, c);
}

static void handle_hello(struct server *s, const void *rid, size_t rlen, Aqua__Envelope *e)
{
        const Aqua__Hello *h = e->hello;
        struct client *c = server_find_by_routing(s, rid, rlen);
        struct pending *p;
        size_t need;

        if (c && c->registered) {
                if (!take_credit(s, c, e->request_id))
                        goto done;
                server_queue_error(s, rid, rlen, e->request_id, E(INVALID),
                                   "hello: already registered as client %" PRIu64, c->id);
                goto done;
        }
        if (s->request_remote && h->token.len == 0) {
                handle_remote_hello(s, rid, rlen, e);
                goto done;
        }
        c = token_owner(s, rid, rlen, e, &h->token);
        if (!c)
                goto done;
        memcpy(c->routing_id, rid, rlen);
        c->routing_id_len = rlen;

        if (h->role == AQUA__ROLE__ROLE_ADMIN) {
                c->registered = true;
                c->role = h->role;
                reply_welcome(s, c, e->request_id, NULL, NULL, 0, NULL);
                goto done;
        }
        need = h->role == AQUA__ROLE__ROLE_PRODUCER ? pending_fds_needed(e) : 0;
        if (need == 0) {
                finish_hello(s, c, e, NULL, 0);
                goto done;
        }
        /* A producer re-registering: its handles come as REREGISTER_FDS frames. */
        p = pending_find(c, e->request_id);
        if (p && !p->env && p->n_fds == need) {
                int *fds = TAKE_PTR(p->fds);
                size_t n = p->n_fds;
                p->n_fds = 0;
                client_free_pending(c, p);
                finish_hello(s, c, e, fds, n);
                side_close_fds(fds, n);
                free(fds);
                goto done;
        }
        if (p && (p->env || p->n_fds > need)) {
                client_queue_error(s, c, e->request_id, E(SIDE_CHANNEL), "hello",
                                   p->env ? "request id already waiting"
                                          : "more descriptors than held chunks");
                client_free_pending(c, p);
                goto done;
        }
        if (!p && !(p = pending_add(s, c, e->request_id))) {
                client_queue_error(s, c, e->request_id, E(THROTTLED), "hello",
                                   "too many requests waiting for descriptors");
                goto done;
        }
        p->env = TAKE_PTR(e);
done:
        if (e)
                aqua__envelope__free_unpacked(e, NULL);
}

/*
 * The unregistered remote client a HelloHeld over tcp:// without a token belongs to: the one its
 * routing id made with an earlier part (under the same CURVE key), or a new one that must say
 * Hello within request-timeout. NULL after an error was sent.
 */
static struct client *remote_part_owner(struct server *s, const void *rid, size_t rlen,
                                        const Aqua__Envelope *e)
{
        struct client *c = server_find_by_routing(s, rid, rlen);

        if (c && (!c->remote || c->registered || !s->request_key ||
                  strcmp(c->remote_key, s->request_key) != 0)) {
                server_queue_error(s, rid, rlen, e->request_id, E(PERMISSION),
                                   "hello_held: this routing id belongs to another client");
                return NULL;
        }
        if (c)
                return c;
        c = server_add_remote(s, rid, rlen, e->request_id);
        if (c)
                c->hello_deadline_ns = now_mono_ns() + s->config->request_timeout_ns;
        return c;
}

/*
 * A part of what a re-registering client holds, before its Hello: from a local client, kept by
 * the side channel whose token it carries; from a remote one (no token), by its connection.
 * Bounded: each client within what the pool could hold at all, all of them within twice that (a
 * producer and its consumers list the same chunks), and at its request rate. No reply unless
 * refused.
 */
static void handle_hello_held(struct server *s, const void *rid, size_t rlen,
                              const Aqua__Envelope *e)
{
        const Aqua__HelloHeld *hh = e->hello_held;
        uint64_t max = s->broker->settings.max_chunks;
        struct client *c;
        struct held_part *a;
        char err[BROKER_ERR_MAX];

        if (s->request_remote && hh->token.len == 0)
                c = remote_part_owner(s, rid, rlen, e);
        else
                c = token_owner(s, rid, rlen, e, &hh->token);
        if (!c)
                return;
        if (!c->routing_id_len) {
                memcpy(c->routing_id, rid, rlen);
                c->routing_id_len = rlen;
        }
        if (!take_credit(s, c, e->request_id))
                return;
        if (c->n_held + hh->n_held > max || s->n_held_parts + hh->n_held > 2 * max) {
                server_queue_error(s, rid, rlen, e->request_id, E(LIMIT),
                                   c->n_held + hh->n_held > max
                                       ? "hello_held: more than the pool's %" PRIu64 " chunks"
                                       : "hello_held: clients re-registering now hold more than "
                                         "twice the pool's %" PRIu64 " chunks; try again",
                                   max);
                client_free_held(s, c);
                return;
        }
        for (size_t i = 0; i < hh->n_held; i++)
                if (fabric_handle_check(hh->held[i]->fabric_handle.len,
                                        c->remote && hh->held[i]->fabric_handle.len,
                                        "hello_held: held chunk", i, err) != 0) {
                        server_queue_error(s, rid, rlen, e->request_id, E(INVALID), "%s", err);
                        client_free_held(s, c);
                        return;
                }
        a = reallocarray(c->held, c->n_held + hh->n_held + 1, sizeof(*a));
        if (!a) {
                server_queue_error(s, rid, rlen, e->request_id, E(INTERNAL), "out of memory");
                return;
        }
        c->held = a;
        s->n_held_parts += hh->n_held;
        for (size_t i = 0; i < hh->n_held; i++) {
                const ProtobufCBinaryData *f = &hh->held[i]->fabric_handle;
                struct held_part *part = &a[c->n_held++];

                *part = (struct held_part){.held = {.chunk_id = hh->held[i]->chunk_id,
                                                    .size = hh->held[i]->size,
                                                    .lease_id = hh->held[i]->lease_id}};
                if (f->len == BROKER_FABRIC_HANDLE_SIZE) {
                        part->has_fabric = true;
                        memcpy(part->fabric, f->data, BROKER_FABRIC_HANDLE_SIZE);
                }
        }
}

/* ------------------------------------------------------------------------------ goodbye */

/*
 * The client says it maps nothing any more: its registration ends as at its death (a remote
 * client's only way to say so). Only its own connection can say it (dispatch_envelope checked the
 * routing id and, over tcp, the key).
 */
static void handle_goodbye(struct server *s, struct client *c, const Aqua__Envelope *e)
{
        Aqua__Envelope r = AQUA__ENVELOPE__INIT;
        Aqua__Ack a = AQUA__ACK__INIT;

        if (c->gpu) {
                log_info("Client %" PRIu64 " says goodbye; releasing GPU %s", c->id, c->gpu->uuid);
                broker_gpu_gone(s->broker, c->gpu);
                c->gpu = NULL;
        }
        r.body_case = AQUA__ENVELOPE__BODY_ACK;
        r.ack = &a;
        reply(s, c, e->request_id, &r);
        /* Forgotten: a further request from it is NOT_REGISTERED, a Hello starts afresh. */
        server_drop_client(s, c);
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
                client_queue_error(s, c, e->request_id, E(INTERNAL), "offer", "out of memory");
                return;
        }
        for (size_t i = 0; i < n && code == 0; i++) {
                const ProtobufCBinaryData *f = &e->offer->chunks[i]->fabric_handle;

                sizes[i] = e->offer->chunks[i]->size;
                refs[i] = e->offer->chunks[i]->client_ref;
                code = fabric_handle_check(f->len, c->remote, "offer: chunk", i, err);
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
        log_debug("GPU %s offered %zu chunks", c->gpu->uuid, n);
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
                client_queue_error(s, c, e->request_id, E(INTERNAL), "offer", "out of memory");
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
                finish_hello(s, c, e, fds, n);
        }
        side_close_fds(fds, n);
        free(fds);
        aqua__envelope__free_unpacked(e, NULL);
}

/* Takes e. */
static void handle_offer(struct server *s, struct client *c, Aqua__Envelope *e)
{
        struct pending *p = pending_find(c, e->request_id);
        size_t need = e->offer->n_chunks;

        if (need == 0) {
                client_queue_error(s, c, e->request_id, E(INVALID), "offer", "no chunks");
                goto done;
        }
        /* Fabric handles came in the message: nothing to wait for. */
        if (c->remote) {
                finish_offer(s, c, e, NULL, need);
                goto done;
        }
        if (p && p->env) {
                client_queue_error(s, c, e->request_id, E(INVALID), "offer",
                                   "a request with this id is already waiting for descriptors");
                goto done;
        }
        if (p && p->n_fds > need) {
                char msg[96];
                snprintf(msg, sizeof(msg), "%zu descriptors for %zu chunks", p->n_fds, need);
                client_queue_error(s, c, e->request_id, E(SIDE_CHANNEL), "offer", msg);
                client_free_pending(c, p);
                goto done;
        }
        if (!p && !(p = pending_add(s, c, e->request_id))) {
                client_queue_error(s, c, e->request_id, E(THROTTLED), "offer",
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
        _cleanup_free_ Aqua__GrantedChunk *chunks = NULL;
        _cleanup_free_ Aqua__GrantedChunk **ptrs = NULL;
        _cleanup_free_ struct turn_change *k = calloc(1, sizeof(*k));
        struct broker_grant pg;
        char err[BROKER_ERR_MAX];
        size_t i = 0;
        int code;

        if (!k) {
                client_queue_error(s, c, e->request_id, E(INTERNAL), "borrow", "out of memory");
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
        if (pg.lease) {
                chunks = calloc(pg.lease->n_chunks, sizeof(*chunks));
                ptrs = calloc(pg.lease->n_chunks, sizeof(*ptrs));
                if (!chunks || !ptrs) {
                        broker_undo_grant(s->broker, c->gpu, &pg);
                        client_queue_error(s, c, e->request_id, E(INTERNAL), "borrow",
                                           "out of memory");
                        return;
                }
                for (struct list_node *n = pg.lease->chunks.next; n != &pg.lease->chunks;
                     n = n->next, i++) {
                        struct chunk *ch = list_entry(n, struct chunk, lease_node);
                        aqua__granted_chunk__init(&chunks[i]);
                        chunks[i].chunk_id = ch->id;
                        chunks[i].size = ch->size;
                        chunks[i].producer_uuid = ch->producer->uuid;
                        if (c->remote && ch->fabric)
                                chunks[i].fabric_handle = (ProtobufCBinaryData){
                                    .len = BROKER_FABRIC_HANDLE_SIZE, .data = ch->fabric};
                        ptrs[i] = &chunks[i];
                }
                g.lease_id = pg.lease->id;
                g.chunks = ptrs;
                g.n_chunks = i;
        }
        g.dram_bytes = pg.dram_bytes;
        g.partial = pg.partial;
        r.body_case = AQUA__ENVELOPE__BODY_GRANT;
        r.grant = &g;
        r.request_id = e->request_id;
        /* Its descriptors leave on the side channel just before it, after the turn's commit. */
        k->kind = CUSTODY_GRANT;
        k->grant = pg;
        if (server_queue_custody(s, c, &r, k) < 0) {
                broker_undo_grant(s->broker, c->gpu, &pg);
                client_queue_error(s, c, e->request_id, E(INTERNAL), "borrow", "out of memory");
                return;
        }
        k = NULL;
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
        reply(s, c, e->request_id, &r);
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
        reply(s, c, e->request_id, &r);
}

static void handle_load(struct server *s, struct client *c, const Aqua__Envelope *e)
{
        const Aqua__LoadReport *l = e->load;
        struct gpu *g = c->gpu;

        g->load = l->load;
        g->used_bytes = l->used_bytes;
        g->free_bytes = l->free_bytes;
        g->migrations = l->migrations;
        g->bytes_moved = l->bytes_moved;
        g->dram_in_use = l->dram_bytes;
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
        log_debug("GPU %s scrubbed %" PRIu32 " chunks (%zu failed)", c->gpu->uuid, done,
                  d->n_failed_chunk_ids);
        reply_ack(s, c, e->request_id);
}

/* Which role a request needs; ROLE_UNSPECIFIED: any registered GPU client. */
static bool role_allows(const struct client *c, Aqua__Envelope__BodyCase body, const char **need)
{
        Aqua__Role want;

        switch (body) {
        case AQUA__ENVELOPE__BODY_OFFER:
        case AQUA__ENVELOPE__BODY_RECLAIM_REQUEST:
        case AQUA__ENVELOPE__BODY_SCRUB_DONE:
                want = AQUA__ROLE__ROLE_PRODUCER;
                break;
        case AQUA__ENVELOPE__BODY_BORROW:
        case AQUA__ENVELOPE__BODY_RETURN:
                want = AQUA__ROLE__ROLE_CONSUMER;
                break;
        case AQUA__ENVELOPE__BODY_LOAD:
                *need = "a GPU client";
                return c->gpu != NULL;
        default:
                return true;
        }
        *need = role_name(want);
        return c->role == want;
}

void dispatch_envelope(struct server *s, const void *rid, size_t rlen, const void *data,
                       size_t size)
{
        Aqua__Envelope *e = NULL;
        struct client *c;
        const char *need = NULL;
        char err[512];
        int r;

        r = wire_decode(data, size, &s->limits, &e, err, sizeof(err));
        if (r != 0) {
                server_queue_error(s, rid, rlen, 0, r < 0 ? E(INTERNAL) : wire_error_code(r), "%s",
                                   r < 0 ? "out of memory decoding" : err);
                return;
        }
        /* Only what cannot touch them may join a turn that holds custody changes (turn.c):
         * more of them, and the return of a lease granted before this turn. */
        switch (e->body_case) {
        case AQUA__ENVELOPE__BODY_OFFER:
        case AQUA__ENVELOPE__BODY_BORROW:
        case AQUA__ENVELOPE__BODY_LOAD:
        case AQUA__ENVELOPE__BODY_KEEPALIVE:
        case AQUA__ENVELOPE__BODY_HELLO_HELD:
                break;
        case AQUA__ENVELOPE__BODY_RETURN:
                if (server_turn_granted(s, e->return_->lease_id))
                        server_turn_barrier(s);
                break;
        default:
                server_turn_barrier(s);
                break;
        }
        if (e->body_case == AQUA__ENVELOPE__BODY_HELLO) {
                handle_hello(s, rid, rlen, e);
                return;
        }
        if (e->body_case == AQUA__ENVELOPE__BODY_HELLO_HELD) {
                handle_hello_held(s, rid, rlen, e);
                goto done;
        }
        c = server_find_by_routing(s, rid, rlen);
        if (!c || !c->registered) {
                server_queue_error(s, rid, rlen, e->request_id, E(NOT_REGISTERED),
                                   "%s before a successful Hello", wire_body_name(e));
                goto done;
        }
        /* A routing id is the peer's to choose: a remote client's is only its own while the
         * same CURVE identity sends it. */
        if (c->remote &&
            (!s->request_remote || !s->request_key || strcmp(s->request_key, c->remote_key) != 0)) {
                server_queue_error(s, rid, rlen, e->request_id, E(PERMISSION),
                                   "%s: this routing id belongs to another client",
                                   wire_body_name(e));
                goto done;
        }
        if (c->remote)
                c->last_seen_ns = now_mono_ns();
        if (!take_credit(s, c, e->request_id))
                goto done;
        if (!role_allows(c, e->body_case, &need)) {
                server_queue_error(s, rid, rlen, e->request_id, E(WRONG_ROLE),
                                   "%s: needs a %s, this client registered as %s",
                                   wire_body_name(e), need, role_name(c->role));
                goto done;
        }
        switch (e->body_case) {
        case AQUA__ENVELOPE__BODY_OFFER:
                handle_offer(s, c, TAKE_PTR(e));
                break;
        case AQUA__ENVELOPE__BODY_BORROW:
                handle_borrow(s, c, e);
                break;
        case AQUA__ENVELOPE__BODY_RETURN:
                handle_return(s, c, e);
                break;
        case AQUA__ENVELOPE__BODY_RECLAIM_REQUEST:
                handle_reclaim(s, c, e);
                break;
        case AQUA__ENVELOPE__BODY_LOAD:
                handle_load(s, c, e);
                break;
        case AQUA__ENVELOPE__BODY_SCRUB_DONE:
                handle_scrub_done(s, c, e);
                break;
        case AQUA__ENVELOPE__BODY_KEEPALIVE:
                /* Its arrival is all it says (last_seen_ns, above). */
                break;
        case AQUA__ENVELOPE__BODY_GOODBYE:
                handle_goodbye(s, c, e);
                break;
        case AQUA__ENVELOPE__BODY_ADMIN_QUERY:
        case AQUA__ENVELOPE__BODY_ADMIN_RECLAIM:
        case AQUA__ENVELOPE__BODY_ADMIN_DRAIN:
        case AQUA__ENVELOPE__BODY_ADMIN_PAIR:
        case AQUA__ENVELOPE__BODY_ADMIN_UNPAIR:
        case AQUA__ENVELOPE__BODY_ADMIN_RELEASE:
        case AQUA__ENVELOPE__BODY_ADMIN_RELOAD:
        case AQUA__ENVELOPE__BODY_ADMIN_UNDRAIN:
                admin_handle(s, c, e);
                break;
        default:
                server_queue_error(s, rid, rlen, e->request_id, E(INVALID),
                                   "%s is not a request a client sends", wire_body_name(e));
                break;
        }
done:
        if (e)
                aqua__envelope__free_unpacked(e, NULL);
}
