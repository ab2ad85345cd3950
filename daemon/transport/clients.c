/* The table of connected clients: finding one by its routing id or side-channel token, what it
 * is (role, admin), what it waits for and holds, and how many descriptors it may make aquad hold.
 * Below the loop, the turn and the outboxes, which use it. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "clients.h"
#include "log.h"
#include "state.h"
#include "time-util.h"
#include "translate.h"

/* Descriptors kept free for ZeroMQ, the journal, the metrics endpoint and new connections. */
#define FD_RESERVE 128

struct client *server_find_by_routing(struct server *s, const void *routing_id, size_t len)
{
        for (struct list_node *n = s->clients.next; n != &s->clients; n = n->next) {
                struct client *c = list_entry(n, struct client, node);
                if (c->routing_id_len == len && memcmp(c->routing_id, routing_id, len) == 0)
                        return c;
        }
        return NULL;
}

struct client *server_find_by_token(struct server *s, const void *token, size_t len)
{
        if (len != SIDE_TOKEN_LEN)
                return NULL;
        for (struct list_node *n = s->clients.next; n != &s->clients; n = n->next) {
                struct client *c = list_entry(n, struct client, node);
                if (!c->registered && memcmp(c->token, token, len) == 0)
                        return c;
        }
        return NULL;
}

int origin_peer(const struct origin *o, struct side_cred *ret)
{
        if (o->fd < 0)
                return -ENOENT;
        /* Fails for TCP, where the kernel knows no peer process. */
        return side_peer_cred(o->fd, ret);
}

Aqua__Role client_role(const struct client *c)
{
        if (!c->registered)
                return AQUA__ROLE__ROLE_UNSPECIFIED;
        /* Every registration but an admin's is a GPU's, whose role the core keeps. */
        return c->gpu ? translate_role_to_wire(broker_gpu_role(c->gpu)) : AQUA__ROLE__ROLE_ADMIN;
}

bool client_is_admin(const struct server *s, const struct client *c)
{
        return config_access_allows(&s->config->admin, c->cred.uid, c->cred.gid, c->groups,
                                    c->n_groups);
}

void client_free_pending(struct client *c, struct pending *p)
{
        list_unlink(&p->node);
        c->n_pending--;
        side_close_fds(p->fds, p->n_fds);
        free(p->fds);
        if (p->env)
                aqua__envelope__free_unpacked(p->env, NULL);
        free(p);
}

void client_free_held(struct server *s, struct client *c)
{
        s->n_held_parts -= MIN(c->n_held, s->n_held_parts);
        free(c->held);
        c->held = NULL;
        c->n_held = 0;
}

static size_t fds_held(const struct server *s)
{
        struct broker_counts counts;

        broker_counts(s->broker, &counts);
        size_t n = counts.chunks + s->n_clients;

        for (struct list_node *x = s->clients.next; x != &s->clients; x = x->next) {
                struct client *c = list_entry(x, struct client, node);
                for (struct list_node *k = c->pending.next; k != &c->pending; k = k->next)
                        n += list_entry(k, struct pending, node)->n_fds;
        }
        return n;
}

/*
 * Whether c may make aquad hold n more descriptors: within RLIMIT_NOFILE less FD_RESERVE, and,
 * before its Hello, within what the pool could still take (a re-registering producer's handles;
 * an unregistered connection is owed nothing more).
 */
bool server_may_take_fds(struct server *s, const struct client *c, size_t n)
{
        size_t mine = 0;

        for (struct list_node *k = c->pending.next; k != &c->pending; k = k->next)
                mine += list_entry(k, struct pending, node)->n_fds;
        struct broker_counts counts;
        uint64_t max = broker_settings_in_force(s->broker)->max_chunks;

        broker_counts(s->broker, &counts);
        if (!c->registered && max >= counts.chunks && mine + n > max - counts.chunks)
                return false;
        if (s->fd_limit && fds_held(s) + n + FD_RESERVE > s->fd_limit)
                return false;
        return true;
}
