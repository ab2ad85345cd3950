/* Maximum bipartite matching (Kuhn's augmenting paths) seeded with pinned and current pairs. */
#include "pairing.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define NONE SIZE_MAX

struct matcher {
        size_t n;
        const struct pairing_link *links;
        size_t n_links;
        size_t *order; /* link indexes, same-host first, then by bandwidth, fastest first */
        size_t *mate;  /* node -> node it is paired with, or NONE */
        bool *pinned;  /* node is in a pinned pair: never re-paired */
        bool *visited; /* consumers seen in the current augmenting search */
        const enum pairing_role *roles;
};

static int by_preference(const void *a, const void *b, void *userdata)
{
        const struct pairing_link *links = userdata;
        const struct pairing_link *la = &links[*(const size_t *)a],
                                  *lb = &links[*(const size_t *)b];
        double x = la->bandwidth, y = lb->bandwidth;

        /* A pair within a host needs no fabric handles and shares the host's fate. */
        if (la->cross_host != lb->cross_host)
                return la->cross_host ? 1 : -1;
        if (x != y)
                return x > y ? -1 : 1;
        /* Stable for equal bandwidths: earlier links first, so results do not depend on qsort. */
        return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

/* The other end of link l when one end is node p and the other is a consumer, else NONE. */
static size_t consumer_of(const struct matcher *m, const struct pairing_link *l, size_t p)
{
        size_t o = l->a == p ? l->b : l->b == p ? l->a : NONE;

        if (o == NONE || o == p || m->roles[o] != PAIRING_CONSUMER || m->pinned[o])
                return NONE;
        return o;
}

/* Find an augmenting path from producer p; the recursion depth is bounded by the node count. */
static bool augment(struct matcher *m, size_t p)
{
        for (size_t k = 0; k < m->n_links; k++) {
                size_t c = consumer_of(m, &m->links[m->order[k]], p);

                if (c == NONE || m->visited[c])
                        continue;
                m->visited[c] = true;
                if (m->mate[c] == NONE || augment(m, m->mate[c])) {
                        m->mate[p] = c;
                        m->mate[c] = p;
                        return true;
                }
        }
        return false;
}

static bool linked(const struct matcher *m, size_t p, size_t c)
{
        for (size_t k = 0; k < m->n_links; k++)
                if ((m->links[k].a == p && m->links[k].b == c) ||
                    (m->links[k].a == c && m->links[k].b == p))
                        return true;
        return false;
}

static bool valid_pair(const enum pairing_role *roles, size_t n, const struct pairing_pair *q)
{
        return q->producer < n && q->consumer < n && roles[q->producer] == PAIRING_PRODUCER &&
               roles[q->consumer] == PAIRING_CONSUMER;
}

int pairing_compute(const enum pairing_role *roles, size_t n_nodes,
                    const struct pairing_link *links, size_t n_links,
                    const struct pairing_pair *pinned, size_t n_pinned,
                    const struct pairing_pair *current, size_t n_current, struct pairing_pair **ret,
                    size_t *ret_n)
{
        _cleanup_free_ size_t *order = NULL, *mate = NULL;
        _cleanup_free_ bool *pin = NULL, *visited = NULL;
        _cleanup_free_ struct pairing_pair *out = NULL;
        struct matcher m;
        size_t n_out = 0;

        for (size_t k = 0; k < n_links; k++)
                if (links[k].a >= n_nodes || links[k].b >= n_nodes)
                        return -EINVAL;
        for (size_t i = 0; i < n_pinned; i++)
                if (!valid_pair(roles, n_nodes, &pinned[i]))
                        return -EINVAL;

        order = calloc(n_links ? n_links : 1, sizeof(*order));
        mate = calloc(n_nodes ? n_nodes : 1, sizeof(*mate));
        pin = calloc(n_nodes ? n_nodes : 1, sizeof(*pin));
        visited = calloc(n_nodes ? n_nodes : 1, sizeof(*visited));
        out = calloc(n_nodes ? n_nodes : 1, sizeof(*out));
        if (!order || !mate || !pin || !visited || !out)
                return -ENOMEM;
        for (size_t i = 0; i < n_nodes; i++)
                mate[i] = NONE;
        for (size_t k = 0; k < n_links; k++)
                order[k] = k;
        qsort_r(order, n_links, sizeof(*order), by_preference, (void *)links);
        m = (struct matcher){.n = n_nodes,
                             .links = links,
                             .n_links = n_links,
                             .order = order,
                             .mate = mate,
                             .pinned = pin,
                             .visited = visited,
                             .roles = roles};

        for (size_t i = 0; i < n_pinned; i++) {
                size_t p = pinned[i].producer, c = pinned[i].consumer;
                if (mate[p] != NONE || mate[c] != NONE)
                        return -EINVAL; /* a GPU in two pinned pairs */
                mate[p] = c;
                mate[c] = p;
                pin[p] = pin[c] = true;
        }
        for (size_t i = 0; i < n_current; i++) {
                size_t p = current[i].producer, c = current[i].consumer;
                if (!valid_pair(roles, n_nodes, &current[i]) || mate[p] != NONE ||
                    mate[c] != NONE || !linked(&m, p, c))
                        continue;
                mate[p] = c;
                mate[c] = p;
        }
        /* Same-host links first, fastest first, then augmenting paths for producers still alone. */
        for (size_t k = 0; k < n_links; k++) {
                const struct pairing_link *l = &links[order[k]];
                size_t p = roles[l->a] == PAIRING_PRODUCER ? l->a : l->b;
                size_t c = consumer_of(&m, l, p);
                if (roles[p] != PAIRING_PRODUCER || c == NONE || mate[p] != NONE || mate[c] != NONE)
                        continue;
                mate[p] = c;
                mate[c] = p;
        }
        for (size_t p = 0; p < n_nodes; p++) {
                if (roles[p] != PAIRING_PRODUCER || mate[p] != NONE)
                        continue;
                memset(visited, 0, n_nodes * sizeof(*visited));
                augment(&m, p);
        }

        for (size_t p = 0; p < n_nodes; p++)
                if (roles[p] == PAIRING_PRODUCER && mate[p] != NONE)
                        out[n_out++] = (struct pairing_pair){.producer = p, .consumer = mate[p]};
        *ret = n_out ? TAKE_PTR(out) : NULL;
        *ret_n = n_out;
        return 0;
}
