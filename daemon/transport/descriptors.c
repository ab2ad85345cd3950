/*
 * Matching side-channel descriptors to their requests: an Offer (or a re-registering Hello)
 * waits here for its OFFER_FDS (REREGISTER_FDS) frames, or the frames for their request, within
 * the client's pending limit, its descriptor budget and request-timeout.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "clients.h"
#include "descriptors.h"
#include "log.h"
#include "state.h"
#include "time-util.h"
#include "turn.h"

#define ECODE(name) AQUA__ERROR_CODE__ERROR_CODE_##name

/* How many descriptors a waiting request needs. */
size_t pending_fds_needed(const Aqua__Envelope *e)
{
        if (e->body_case == AQUA__ENVELOPE__BODY_OFFER)
                return e->offer->n_chunks;
        if (e->body_case == AQUA__ENVELOPE__BODY_HELLO)
                /* A producer's handles, after its device node where it sends one. */
                return (e->hello->role == AQUA__ROLE__ROLE_PRODUCER
                            ? (e->hello->held_total ? e->hello->held_total : e->hello->n_held)
                            : 0) +
                       e->hello->device_node;
        return 0;
}

struct pending *pending_find(struct client *c, uint64_t request_id)
{
        for (struct list_node *n = c->pending.next; n != &c->pending; n = n->next) {
                struct pending *p = list_entry(n, struct pending, node);
                if (p->request_id == request_id)
                        return p;
        }
        return NULL;
}

struct pending *pending_add(struct server *s, struct client *c, uint64_t request_id)
{
        struct pending *p;

        /* Before its Hello a client has one thing to wait for: the Hello's own handles. */
        if ((int64_t)c->n_pending >= s->config->limits.pending_requests ||
            (!c->registered && c->n_pending >= 1))
                return NULL;
        p = calloc(1, sizeof(*p));
        if (!p)
                return NULL;
        p->request_id = request_id;
        p->deadline_ns = now_mono_ns() + s->config->request_timeout_ns;
        list_append(&c->pending, &p->node);
        c->n_pending++;
        return p;
}

struct pending *pending_take_fds(struct server *s, struct client *c, Aqua__SideFrame *f, int *fds,
                                 size_t n_fds)
{
        struct pending *p;
        /* Before its Hello, a re-registering producer may pass a handle per chunk it holds. */
        size_t need, cap = c->registered ? s->limits.max_repeated
                                         : (size_t)broker_settings_in_force(s->broker)->max_chunks;
        int *a;

        if (f->kind != AQUA__SIDE_FRAME__KIND__KIND_OFFER_FDS &&
            f->kind != AQUA__SIDE_FRAME__KIND__KIND_REREGISTER_FDS &&
            f->kind != AQUA__SIDE_FRAME__KIND__KIND_DEVICE_FD) {
                log_debug("Client %" PRIu64 " sent a side frame of kind %d; ignored", c->id,
                          f->kind);
                side_close_fds(fds, n_fds);
                return NULL;
        }
        p = pending_find(c, f->request_id);
        if (!p && !(p = pending_add(s, c, f->request_id))) {
                log_notice("Client %" PRIu64 " sent descriptors for request %" PRIu64
                           " beyond its pending limit; closed",
                           c->id, f->request_id);
                side_close_fds(fds, n_fds);
                return NULL;
        }
        need = p->env ? pending_fds_needed(p->env) : cap;
        if (!server_may_take_fds(s, c, n_fds)) {
                s->stats.fds_refused += n_fds;
                side_close_fds(fds, n_fds);
                if (p->env && c->routing_id_len)
                        client_queue_error(s, c, p->request_id, ECODE(LIMIT),
                                           wire_body_name(p->env),
                                           "more descriptors than aquad may hold now");
                else
                        log_debug("Client %" PRIu64 ": descriptors refused over its budget", c->id);
                client_free_pending(c, p);
                return NULL;
        }
        if (p->n_fds + n_fds > need) {
                char msg[128];
                snprintf(msg, sizeof(msg), "%zu descriptors for %zu chunks", p->n_fds + n_fds,
                         need);
                side_close_fds(fds, n_fds);
                if (p->env && c->routing_id_len)
                        client_queue_error(s, c, p->request_id, ECODE(SIDE_CHANNEL),
                                           wire_body_name(p->env), msg);
                else
                        log_notice("Client %" PRIu64 ": %s", c->id, msg);
                client_free_pending(c, p);
                return NULL;
        }
        a = reallocarray(p->fds, p->n_fds + n_fds + 1, sizeof(int));
        if (!a) {
                side_close_fds(fds, n_fds);
                return NULL;
        }
        p->fds = a;
        memcpy(p->fds + p->n_fds, fds, n_fds * sizeof(int));
        p->n_fds += n_fds;
        return p->env && p->n_fds == need ? p : NULL;
}

void pending_expire(struct server *s, struct client *c, uint64_t now_ns)
{
        struct list_node *pos, *tmp;

        list_for_each(pos, tmp, &c->pending)
        {
                struct pending *p = list_entry(pos, struct pending, node);
                char msg[160];

                if (now_ns < p->deadline_ns)
                        continue;
                if (p->env && c->routing_id_len) {
                        snprintf(msg, sizeof(msg),
                                 "%zu of %zu descriptors arrived on the side channel in time",
                                 p->n_fds, pending_fds_needed(p->env));
                        client_queue_error(s, c, p->request_id, ECODE(SIDE_CHANNEL),
                                           wire_body_name(p->env), msg);
                } else
                        log_notice("Client %" PRIu64 ": descriptors for request %" PRIu64
                                   " came without a request; closed",
                                   c->id, p->request_id);
                client_free_pending(c, p);
        }
}
