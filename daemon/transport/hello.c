/*
 * Registration: Hello (local, with the side channel's token; remote, with its CURVE identity),
 * the HelloHeld parts a re-registering client sends first, the Welcome, and Goodbye.
 */
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "clients.h"
#include "descriptors.h"
#include "drop.h"
#include "gpunode.h"
#include "hello.h"
#include "log.h"
#include "remote.h"
#include "state.h"
#include "throttle.h"
#include "time-util.h"
#include "translate.h"
#include "turn.h"

#define ECODE(name) AQUA__ERROR_CODE__ERROR_CODE_##name

/*
 * A fabric handle's length where one may come: exactly BROKER_FABRIC_HANDLE_SIZE from a client
 * that passes fabric handles, none from one whose handles are descriptors. The bytes themselves
 * are the driver's business: aquad passes them on and never reads them.
 */
int hello_fabric_check(size_t len, bool fabric, const char *what, size_t i, char *err)
{
        if (fabric && len != BROKER_FABRIC_HANDLE_SIZE)
                return broker_fail(err, ECODE(INVALID),
                                   "%s %zu: a fabric handle of %zu bytes; a CUmemFabricHandle has "
                                   "%d",
                                   what, i, len, BROKER_FABRIC_HANDLE_SIZE);
        if (!fabric && len)
                return broker_fail(err, ECODE(INVALID),
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
                w.paired_with = (char *)broker_gpu_paired_device(gpu);
                w.dram_budget = broker_gpu_dram_bytes(gpu);
        }
        w.reclaim_deadline_ms =
            broker_settings_in_force(s->broker)->reclaim_deadline_ns / NSEC_PER_MSEC;
        /* Three a grace: one lost on the way does not end the registration. */
        if (c->remote && s->config->remote.grace_ns)
                w.keepalive_ms = MAX(s->config->remote.grace_ns / 3 / NSEC_PER_MSEC, 1);
        w.lost_leases = lost_leases;
        w.n_lost_leases = n_lost_leases;
        if (secret)
                w.custody_secret = (ProtobufCBinaryData){.len = BROKER_SECRET_LEN, .data = secret};
        r.body_case = AQUA__ENVELOPE__BODY_WELCOME;
        r.welcome = &w;
        server_reply(s, c, request_id, &r);
}

/*
 * The tenant of c's registration, from the config's `tenants:` (daemon/README.md, "Who may hold
 * what"): by its key, cgroup, user or groups; none named: its own. Root and aquad's own user on
 * this host lend to every tenant: they can read any process's memory already.
 */
void hello_identify_tenant(const struct server *s, const struct client *c,
                           struct broker_identity *who)
{
        char cgroup[1024];
        struct config_peer peer = {.remote = c->remote,
                                   .uid = c->cred.uid,
                                   .gid = c->cred.gid,
                                   .groups = c->groups,
                                   .n_groups = c->n_groups,
                                   .key = c->remote ? c->remote_key : NULL};
        const char *name;

        if (!c->remote && c->cred.pid > 0 && proc_cgroup(c->cred.pid, cgroup, sizeof(cgroup)) == 0)
                peer.cgroup = cgroup;
        name = config_tenant_of(s->config, &peer);
        snprintf(who->tenant, sizeof(who->tenant), "%s", name ? name : "");
        who->lends_to_all = !c->remote && (c->cred.uid == 0 || c->cred.uid == geteuid());
}

/*
 * Whether the host shows that c may use the GPU its Hello names (daemon/README.md, "Who may
 * hold what"): for a GPU of this host, the device node the process passed (device_fd, -1: none)
 * must be that GPU's; a client on another host registers no GPU of this one, and only GPUs (or
 * hosts) its remote.clients entry binds its key to, where the entry names any.
 */
static enum broker_evidence evidence_of(const struct server *s, const struct client *c,
                                        const Aqua__Hello *h, int device_fd, char *why,
                                        size_t size)
{
        const char *root = s->config->driver_root;
        const struct config_remote_client *rc;
        char uuid[GPUNODE_UUID_LEN];
        bool here;

        if (!s->config->gpu_evidence || !h->gpu_uuid || !h->gpu_uuid[0])
                return BROKER_EVIDENCE_NOT_ASKED;
        here = gpunode_find(root, h->gpu_uuid, NULL) == 0;
        if (c->remote) {
                if (here) {
                        snprintf(why, size, "a client on another host registers only GPUs of its "
                                            "own host");
                        return BROKER_EVIDENCE_MISSING;
                }
                rc = config_remote_find_text(s->config, c->remote_key);
                if (!rc || (!rc->n_gpus && !rc->n_hosts))
                        return BROKER_EVIDENCE_NOT_ASKED;
                if (config_remote_may_register(rc, h->gpu_uuid, h->host))
                        return BROKER_EVIDENCE_SHOWN;
                snprintf(why, size,
                         "remote.clients binds the key of %s to its gpus and hosts, and neither "
                         "names GPU %s on host %s",
                         rc->user, h->gpu_uuid, h->host && h->host[0] ? h->host : "(untold)");
                return BROKER_EVIDENCE_MISSING;
        }
        if (!here)
                return BROKER_EVIDENCE_NOT_ASKED;
        if (device_fd < 0)
                snprintf(why, size,
                         "it passed no device node (it may not open the GPU's node, or its "
                         "libaqua predates the check)");
        else if (gpunode_uuid_of_fd(root, device_fd, uuid) < 0)
                snprintf(why, size, "the descriptor it passed is no GPU's device node");
        else if (strcasecmp(uuid, h->gpu_uuid) != 0)
                snprintf(why, size, "the device node it passed is GPU %s's", uuid);
        else
                return BROKER_EVIDENCE_SHOWN;
        return BROKER_EVIDENCE_MISSING;
}

void hello_finish(struct server *s, struct client *c, Aqua__Envelope *e, int *fds, size_t n_fds)
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

        char why[256] = "";
        int device_fd = -1;

        if (c->remote)
                snprintf(who.key, sizeof(who.key), "%s", c->remote_key);
        else
                who.process = c->process;
        hello_identify_tenant(s, c, &who);
        /* The device node comes first, the producer's handles after it. */
        if (h->device_node && fds && n_fds > 0) {
                device_fd = fds[0];
                fds[0] = -1;
                fds++;
                n_fds--;
                ph.held_fds = fds;
        }
        ph.evidence = evidence_of(s, c, h, device_fd, why, sizeof(why));
        ph.evidence_why = why;
        if (device_fd >= 0)
                close(device_fd);
        code = links ? held_all(c, h, &all, &n_all) : -ENOMEM;
        if (code == 0 && h->custody_secret.len && h->custody_secret.len != BROKER_SECRET_LEN)
                code = broker_fail(err, ECODE(INVALID),
                                   "hello: a custody secret of %zu bytes; Welcome gives %d",
                                   h->custody_secret.len, BROKER_SECRET_LEN);
        /* A remote producer passes its handles again; a consumer holds what it maps. */
        for (size_t i = 0; code == 0 && i < h->n_held; i++)
                code = hello_fabric_check(h->held[i]->fabric_handle.len,
                                          c->remote && h->role == AQUA__ROLE__ROLE_PRODUCER,
                                          "hello: held chunk", i, err);
        if (code == 0 && h->held_total && h->held_total != n_all)
                code = broker_fail(err, ECODE(INVALID),
                                   "hello: held_total %" PRIu32 ", but %zu held chunks arrived",
                                   h->held_total, n_all);
        if (code == 0 && fds && n_fds != n_all)
                code = broker_fail(err, ECODE(SIDE_CHANNEL),
                                   "hello: %zu descriptors for %zu held chunks", n_fds, n_all);
        ph.held = all;
        ph.n_held = n_all;
        /* A role the pool has no name for; the core checks the uuid first, and so here. */
        if (code == 0 && ph.role == _GPU_ROLE_MAX && h->gpu_uuid && h->gpu_uuid[0])
                code = broker_fail(err, ECODE(INVALID),
                                   "hello: role %d is not producer, consumer or neutral", h->role);
        if (code == 0)
                code = translate_outcome(broker_register(s->broker, &ph, c, &pw, err));
        /* Whatever the outcome, the parts are spent: a new attempt sends them again. */
        client_free_held(s, c);
        side_close_fds(fds, n_fds); /* those the pool did not take */
        if (code < 0) {
                log_error_errno(code, "Failed to register GPU %s: %m", h->gpu_uuid);
                client_queue_error(s, c, e->request_id, ECODE(INTERNAL), "hello", strerror(-code));
                return;
        }
        if (code > 0) {
                client_queue_error(s, c, e->request_id, code, NULL, err);
                return;
        }
        c->registered = true;
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
                         c->id, c->remote_user, c->remote_addr, broker_gpu_uuid(pw.gpu),
                         translate_role_name(h->role),
                         pw.n_lost_leases ? " (with lost leases)" : "");
        else
                log_info("Client %" PRIu64 " (pid %d uid %u) registered GPU %s as %s%s", c->id,
                         (int)c->cred.pid, c->cred.uid, broker_gpu_uuid(pw.gpu),
                         translate_role_name(h->role),
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
static struct client *token_owner(struct server *s, const struct origin *o, const Aqua__Envelope *e,
                                  const ProtobufCBinaryData *token)
{
        struct client *c = server_find_by_token(s, token->data, token->len);
        struct side_cred peer;

        if (!c) {
                server_queue_error(s, o->rid, o->rlen, e->request_id, ECODE(PERMISSION),
                                   "%s: unknown token; connect the side channel at %s and send "
                                   "the token it gives",
                                   wire_body_name(e), s->config->side_socket);
                return NULL;
        }
        if (origin_peer(o, &peer) == 0 && peer.pid > 0 && peer.pid != c->cred.pid) {
                s->stats.hijacks++;
                log_notice("%s from pid %d with the token of pid %d's side channel; refused",
                           wire_body_name(e), (int)peer.pid, (int)c->cred.pid);
                server_queue_error(s, o->rid, o->rlen, e->request_id, ECODE(PERMISSION),
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
static void handle_remote_hello(struct server *s, const struct origin *o, Aqua__Envelope *e)
{
        const Aqua__Hello *h = e->hello;
        struct client *c;

        if (h->role != AQUA__ROLE__ROLE_ADMIN && !h->fabric_handles) {
                server_queue_error(s, o->rid, o->rlen, e->request_id, ECODE(SIDE_CHANNEL),
                                   "hello: as %s over tcp://: a client on another host may only "
                                   "register as admin (the control path) unless it passes fabric "
                                   "handles (Hello.fabric_handles); descriptors need the local "
                                   "side channel",
                                   translate_role_name(h->role));
                return;
        }
        /* Its HelloHeld parts came first on this connection: the same client. */
        c = server_find_by_routing(s, o->rid, o->rlen);
        if (c && (!c->remote || c->registered || !o->key || strcmp(c->remote_key, o->key) != 0)) {
                server_queue_error(s, o->rid, o->rlen, e->request_id, ECODE(PERMISSION),
                                   "hello: this routing id belongs to another client");
                return;
        }
        if (!c)
                c = server_add_remote(s, o, e->request_id);
        if (!c)
                return;
        if (h->role == AQUA__ROLE__ROLE_ADMIN) {
                c->registered = true;
                log_info("Remote client %" PRIu64 " (%s at %s, uid %u) registered as admin%s%s",
                         c->id, c->remote_user, c->remote_addr, c->cred.uid,
                         h->client_name ? ": " : "", h->client_name ? h->client_name : "");
                reply_welcome(s, c, e->request_id, NULL, NULL, 0, NULL);
                return;
        }
        /* An earlier connection of its own (the same key, with the custody secret) is replaced
         * by the core; any other identity is refused while the GPU holds state. */
        hello_finish(s, c, e, NULL, 0);
        if (!c->registered)
                server_drop_client(s, c);
}

void hello_handle(struct server *s, const struct origin *o, Aqua__Envelope *e)
{
        const Aqua__Hello *h = e->hello;
        struct client *c = server_find_by_routing(s, o->rid, o->rlen);
        struct pending *p;
        size_t need;

        if (c && c->registered) {
                if (!throttle_take(s, c, e->request_id))
                        goto done;
                server_queue_error(s, o->rid, o->rlen, e->request_id, ECODE(INVALID),
                                   "hello: already registered as client %" PRIu64, c->id);
                goto done;
        }
        if (o->remote && h->token.len == 0) {
                handle_remote_hello(s, o, e);
                goto done;
        }
        c = token_owner(s, o, e, &h->token);
        if (!c)
                goto done;
        memcpy(c->routing_id, o->rid, o->rlen);
        c->routing_id_len = o->rlen;

        if (h->role == AQUA__ROLE__ROLE_ADMIN) {
                c->registered = true;
                reply_welcome(s, c, e->request_id, NULL, NULL, 0, NULL);
                goto done;
        }
        need = pending_fds_needed(e);
        if (need == 0) {
                hello_finish(s, c, e, NULL, 0);
                goto done;
        }
        /* Its device node (a DEVICE_FD frame) and a producer's handles (REREGISTER_FDS). */
        p = pending_find(c, e->request_id);
        if (p && !p->env && p->n_fds == need) {
                int *fds = TAKE_PTR(p->fds);
                size_t n = p->n_fds;
                p->n_fds = 0;
                client_free_pending(c, p);
                hello_finish(s, c, e, fds, n);
                side_close_fds(fds, n);
                free(fds);
                goto done;
        }
        if (p && (p->env || p->n_fds > need)) {
                client_queue_error(s, c, e->request_id, ECODE(SIDE_CHANNEL), "hello",
                                   p->env ? "request id already waiting"
                                          : "more descriptors than the Hello names");
                client_free_pending(c, p);
                goto done;
        }
        if (!p && !(p = pending_add(s, c, e->request_id))) {
                client_queue_error(s, c, e->request_id, ECODE(THROTTLED), "hello",
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
static struct client *remote_part_owner(struct server *s, const struct origin *o,
                                        const Aqua__Envelope *e)
{
        struct client *c = server_find_by_routing(s, o->rid, o->rlen);

        if (c && (!c->remote || c->registered || !o->key || strcmp(c->remote_key, o->key) != 0)) {
                server_queue_error(s, o->rid, o->rlen, e->request_id, ECODE(PERMISSION),
                                   "hello_held: this routing id belongs to another client");
                return NULL;
        }
        if (c)
                return c;
        c = server_add_remote(s, o, e->request_id);
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
void hello_handle_held(struct server *s, const struct origin *o, const Aqua__Envelope *e)
{
        const Aqua__HelloHeld *hh = e->hello_held;
        uint64_t max = broker_settings_in_force(s->broker)->max_chunks;
        struct client *c;
        struct held_part *a;
        char err[BROKER_ERR_MAX];

        if (o->remote && hh->token.len == 0)
                c = remote_part_owner(s, o, e);
        else
                c = token_owner(s, o, e, &hh->token);
        if (!c)
                return;
        if (!c->routing_id_len) {
                memcpy(c->routing_id, o->rid, o->rlen);
                c->routing_id_len = o->rlen;
        }
        if (!throttle_take(s, c, e->request_id))
                return;
        if (c->n_held + hh->n_held > max || s->n_held_parts + hh->n_held > 2 * max) {
                server_queue_error(s, o->rid, o->rlen, e->request_id, ECODE(LIMIT),
                                   c->n_held + hh->n_held > max
                                       ? "hello_held: more than the pool's %" PRIu64 " chunks"
                                       : "hello_held: clients re-registering now hold more than "
                                         "twice the pool's %" PRIu64 " chunks; try again",
                                   max);
                client_free_held(s, c);
                return;
        }
        for (size_t i = 0; i < hh->n_held; i++)
                if (hello_fabric_check(hh->held[i]->fabric_handle.len,
                                       c->remote && hh->held[i]->fabric_handle.len,
                                       "hello_held: held chunk", i, err) != 0) {
                        server_queue_error(s, o->rid, o->rlen, e->request_id, ECODE(INVALID), "%s",
                                           err);
                        client_free_held(s, c);
                        return;
                }
        a = reallocarray(c->held, c->n_held + hh->n_held + 1, sizeof(*a));
        if (!a) {
                server_queue_error(s, o->rid, o->rlen, e->request_id, ECODE(INTERNAL),
                                   "out of memory");
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
void hello_goodbye(struct server *s, struct client *c, const Aqua__Envelope *e)
{
        Aqua__Envelope r = AQUA__ENVELOPE__INIT;
        Aqua__Ack a = AQUA__ACK__INIT;

        if (c->gpu) {
                log_info("Client %" PRIu64 " says goodbye; releasing GPU %s", c->id,
                         broker_gpu_uuid(c->gpu));
                broker_gpu_gone(s->broker, c->gpu);
                c->gpu = NULL;
        }
        r.body_case = AQUA__ENVELOPE__BODY_ACK;
        r.ack = &a;
        server_reply(s, c, e->request_id, &r);
        /* Forgotten: a further request from it is NOT_REGISTERED, a Hello starts afresh. */
        server_drop_client(s, c);
}
