/*
 * Registration of a client's GPU and reconciliation of what it says it holds with the journal
 * after a restart; the pairs it may change are pairs.c's.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker-private.h"
#include "broker.h"
#include "log.h"
#include "time-util.h"

#define E(name) BROKER_E_##name

static int lost_add(struct broker_welcome *w, uint64_t id)
{
        uint64_t *a;

        for (size_t i = 0; i < w->n_lost_leases; i++)
                if (w->lost_leases[i] == id)
                        return 0;
        a = reallocarray(w->lost_leases, w->n_lost_leases + 1, sizeof(*a));
        if (!a)
                return -ENOMEM;
        a[w->n_lost_leases++] = id;
        w->lost_leases = a;
        return 0;
}

static int set_links(struct gpu *g, const struct broker_link *links, size_t n)
{
        struct gpu_link *a = calloc(n ? n : 1, sizeof(*a));

        if (!a)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                a[i].uuid = strdup(links[i].uuid ? links[i].uuid : "");
                a[i].bandwidth = links[i].bandwidth;
                if (!a[i].uuid) {
                        while (i-- > 0)
                                free(a[i].uuid);
                        free(a);
                        return -ENOMEM;
                }
        }
        for (size_t i = 0; i < g->n_links; i++)
                free(g->links[i].uuid);
        free(g->links);
        g->links = a;
        g->n_links = n;
        return 0;
}

/*
 * The producer lists the chunks it still holds, with their handles. Known ones get their handle
 * back; unknown ones are handed back to it (Reclaimed); journaled ones it no longer has are
 * dropped, or, if a consumer maps them, treated as if their producer were gone.
 */
static int reconcile_producer(struct broker *broker, struct gpu *g, const struct broker_hello *h,
                              struct broker_welcome *w)
{
        _cleanup_free_ uint64_t *unknown = NULL;
        struct list_node *pos, *tmp;
        size_t n_unknown = 0;
        int r;

        unknown = calloc(h->n_held ? h->n_held : 1, sizeof(*unknown));
        if (!unknown)
                return -ENOMEM;
        for (size_t i = 0; i < h->n_held; i++) {
                const struct broker_held *hc = &h->held[i];
                struct chunk *c = broker_find_chunk(broker, hc->chunk_id);

                if (c && c->producer == g && !c->orphan && c->size == hc->size &&
                    !chunk_has_handle(c) &&
                    (h->fabric ? hc->fabric != NULL : h->held_fds != NULL)) {
                        if (h->fabric) {
                                c->fabric = malloc(BROKER_FABRIC_HANDLE_SIZE);
                                if (!c->fabric)
                                        return -ENOMEM;
                                memcpy(c->fabric, hc->fabric, BROKER_FABRIC_HANDLE_SIZE);
                        } else {
                                c->fd = h->held_fds[i];
                                h->held_fds[i] = -1;
                        }
                        chunk_set_free_listed(c);
                        continue;
                }
                unknown[n_unknown++] = hc->chunk_id;
                if (hc->lease_id && (r = lost_add(w, hc->lease_id)) < 0)
                        return r;
        }
        list_for_each(pos, tmp, &g->chunks)
        {
                struct chunk *c = list_entry(pos, struct chunk, producer_node);
                if (chunk_has_handle(c) || c->orphan)
                        continue;
                if (c->state == CHUNK_FREE) {
                        chunk_drop(broker, c);
                        continue;
                }
                log_warning("Producer %s no longer lists chunk %" PRIu64 " that lease %" PRIu64
                            " maps; its consumer is asked to move off",
                            g->uuid, c->id, c->lease->id);
                c->orphan = true;
                c->state = CHUNK_LEASED;
                journal_chunk(broker, c);
        }
        if (n_unknown) {
                log_warning("Producer %s holds %zu chunks this daemon does not know; handing them "
                            "back",
                            g->uuid, n_unknown);
                notice_queue(broker, NOTICE_RECLAIMED, g, 0, unknown, n_unknown, 0, NULL);
        }
        /* Orphaned leases: ask their consumers to move off, as when a producer dies. */
        list_for_each(pos, tmp, &broker->leases)
        {
                struct lease *l = list_entry(pos, struct lease, broker_node);
                _cleanup_free_ uint64_t *ids = NULL;
                size_t n = 0;

                if (l->producer != g)
                        continue;
                for (struct list_node *k = l->chunks.next; k != &l->chunks; k = k->next) {
                        struct chunk *c = list_entry(k, struct chunk, lease_node);
                        if (!c->orphan || c->state != CHUNK_LEASED)
                                continue;
                        uint64_t *a = reallocarray(ids, n + 1, sizeof(*a));
                        if (!a)
                                return -ENOMEM;
                        ids = a;
                        ids[n++] = c->id;
                        c->state = CHUNK_RECLAIMING;
                        journal_chunk(broker, c);
                }
                if (n) {
                        lease_update_state(l);
                        notice_queue(broker, NOTICE_RECLAIM, l->consumer, l->id, ids, n, 0,
                                     "producer gone");
                }
        }
        return 0;
}

/*
 * Reclaims asked while the consumer was away (or that it may have lost track of across the
 * restart) are asked again, with the time that is left.
 */
static int renotice(struct broker *broker, struct gpu *g)
{
        uint64_t now = now_mono_ns();

        for (struct list_node *n = g->leases.next; n != &g->leases; n = n->next) {
                struct lease *l = list_entry(n, struct lease, consumer_node);
                _cleanup_free_ uint64_t *ids = calloc(l->n_chunks + 1, sizeof(uint64_t));
                uint64_t deadline = 0;
                size_t k = 0;

                if (!ids)
                        return -ENOMEM;
                for (struct list_node *x = l->chunks.next; x != &l->chunks; x = x->next) {
                        struct chunk *c = list_entry(x, struct chunk, lease_node);
                        if (c->state != CHUNK_RECLAIMING)
                                continue;
                        ids[k++] = c->id;
                        /* Never delivered: the whole deadline, from the coming delivery. */
                        uint64_t d = c->deadline_pending
                                         ? now + broker->settings.reclaim_deadline_ns
                                         : c->deadline_ns;
                        if (d && (!deadline || d < deadline))
                                deadline = d;
                }
                if (k == 0)
                        continue;
                /* A passed deadline is sent as 1 ms: "now", not "no deadline". */
                notice_queue(broker, NOTICE_RECLAIM, g, l->id, ids, k,
                             !deadline        ? 0
                             : deadline > now ? (deadline - now) / NSEC_PER_MSEC
                                              : 1,
                             l->reason ? l->reason : "reclaim");
        }
        return 0;
}

/*
 * The consumer lists the chunks it maps, by lease. Leases the journal has for it are kept (and
 * chunks of them it no longer lists go back to the pool); leases the daemon does not know, or
 * knows for another GPU, are lost: the consumer keeps the mappings it has and moves off them.
 */
static int reconcile_consumer(struct broker *broker, struct gpu *g, const struct broker_hello *h,
                              struct broker_welcome *w)
{
        struct list_node *pos, *tmp;
        int r;

        list_for_each(pos, tmp, &g->leases)
        {
                list_entry(pos, struct lease, consumer_node)->confirmed = false;
        }
        for (size_t i = 0; i < h->n_held; i++) {
                const struct broker_held *hc = &h->held[i];
                struct lease *l = hc->lease_id ? broker_find_lease(broker, hc->lease_id) : NULL;

                if (!hc->lease_id)
                        continue;
                if (!l || l->consumer != g) {
                        if ((r = lost_add(w, hc->lease_id)) < 0)
                                return r;
                        continue;
                }
                l->confirmed = true;
        }
        list_for_each(pos, tmp, &g->leases)
        {
                struct lease *l = list_entry(pos, struct lease, consumer_node);
                _cleanup_free_ uint64_t *back = calloc(l->n_chunks + 1, sizeof(uint64_t));
                struct gpu *producer = l->producer;
                struct list_node *k, *ktmp;
                size_t n_back = 0;

                if (!back)
                        return -ENOMEM;
                if (!l->confirmed && lease_was_returned(l)) {
                        /* Every chunk of it was being taken back: it finished while aquad was
                         * away, which is a completed reclaim, not a loss. */
                        events_add(&broker->events, "lease",
                                   "lease %" PRIu64 " returned by %s while aquad was away", l->id,
                                   g->uuid);
                } else if (!l->confirmed) {
                        log_notice("Consumer %s did not re-register lease %" PRIu64
                                   "; its chunks go back to the pool",
                                   g->uuid, l->id);
                        broker->stats.leases_lost++;
                        events_add(&broker->events, "lease",
                                   "lease %" PRIu64 " lost: %s did not re-register it", l->id,
                                   g->uuid);
                }
                list_for_each(k, ktmp, &l->chunks)
                {
                        struct chunk *c = list_entry(k, struct chunk, lease_node);
                        bool listed = false;

                        for (size_t i = 0; l->confirmed && i < h->n_held && !listed; i++)
                                listed =
                                    h->held[i].chunk_id == c->id && h->held[i].lease_id == l->id;
                        if (listed)
                                continue;
                        if (c->orphan || c->state == CHUNK_RECLAIMING) {
                                /* A reclaim it completed while aquad was away: the producer
                                 * waits for these (if it is not back yet, it lists them and
                                 * gets them back as unknown). */
                                if (!c->orphan)
                                        back[n_back++] = c->id;
                                chunk_drop(broker, c);
                        } else {
                                chunk_release(broker, c);
                                chunk_dirty(broker, c, g);
                                journal_chunk(broker, c);
                        }
                }
                if (n_back)
                        notice_queue(broker, NOTICE_RECLAIMED, producer, 0, back, n_back, 0, NULL);
                if (l->n_chunks == 0)
                        lease_free(broker, l);
        }
        return renotice(broker, g);
}

enum admission {
        ADMIT_NEW,      /* nothing of anyone's to take up */
        ADMIT_HOLDER,   /* its holder, taking up what it holds */
        ADMIT_RELEASED, /* a newcomer, once what the gone holder held is released */
};

/*
 * Custody (no changes made here): whether h may register g (NULL: a GPU aquad does not know). Its
 * holder, presenting its secret, takes up what it holds, replacing an earlier connection of its
 * own. Anyone else gets the GPU only with nothing of the holder's in it: at once where it holds
 * nothing or its process is provably gone (what it held is then released as at its death, to be
 * scrubbed before anyone gets it), never while the holder may still map its memory.
 */
static int admit(struct broker *broker, const struct gpu *g, const struct broker_hello *h,
                 enum admission *ret, char err[BROKER_ERR_MAX])
{
        char who[192];

        *ret = ADMIT_NEW;
        if (!g)
                return 0;
        /* State journaled before custody existed has no holder: whoever lists it takes it up
         * (only a producer's chunks, which nobody maps without the handles it passes again). */
        if (custody_matches(&g->custody, h->who, h->secret) ||
            (!g->owner && !g->custody.held && gpu_holds_state(g))) {
                *ret = ADMIT_HOLDER;
                return 0;
        }
        if (g->owner) {
                broker->stats.custody_refused++;
                return broker_fail(err, E(BUSY), "hello: GPU %s is already registered by %s",
                                   g->uuid, gpu_holder(g, who, sizeof(who)));
        }
        if (gpu_holds_state(g) && custody_liveness(broker, g) != PROC_GONE) {
                broker->stats.custody_refused++;
                events_add(&broker->events, "custody", "%s refused to %s: held by %s", g->uuid,
                           h->client_name && h->client_name[0] ? h->client_name : "a client",
                           gpu_holder(g, who, sizeof(who)));
                return broker_fail(err, E(BUSY),
                                   "hello: GPU %s holds memory of %s, which may still map it; only "
                                   "that %s, with the custody secret aquad gave it, can register "
                                   "it again (or an operator: aquactl release)",
                                   g->uuid, gpu_holder(g, who, sizeof(who)),
                                   g->custody.who.remote ? "CURVE identity" : "process");
        }
        if (g->restored || g->custody.held)
                *ret = ADMIT_RELEASED;
        return 0;
}

static const char *identity_text(const struct broker_identity *w, char *buf, size_t size)
{
        if (w->remote)
                snprintf(buf, size, "CURVE key %.8s...", w->key);
        else
                snprintf(buf, size, "uid %u, pid %d", (unsigned)w->uid, (int)w->process.pid);
        return buf;
}

int broker_register(struct broker *broker, const struct broker_hello *h, struct client *owner,
                    struct broker_welcome *ret, char err[BROKER_ERR_MAX])
{
        struct broker_welcome w = {0};
        struct gpu *g = NULL;
        enum admission how;
        char who[192];
        bool producer = h->role == GPU_ROLE_PRODUCER;
        bool consumer = h->role == GPU_ROLE_CONSUMER;
        size_t chunks = 0;
        char name[256];
        int r;

        if (!h->uuid || !h->uuid[0])
                return broker_fail(err, E(INVALID), "hello: gpu_uuid is empty");
        if (!producer && !consumer && h->role != GPU_ROLE_NEUTRAL)
                return broker_fail(err, E(INVALID),
                                   "hello: role %d is not producer, consumer or "
                                   "neutral",
                                   h->role);
        if (h->n_held && !producer && !consumer)
                return broker_fail(err, E(INVALID), "hello: a neutral GPU holds no chunks");
        if (broker->settings.colocate && (producer || consumer)) {
                /* One device, a registration per role: the two may lend to each other. */
                snprintf(name, sizeof(name), "%s/%s", h->uuid, producer ? "producer" : "consumer");
                if (strchr(h->uuid, '/') || strlen(name) >= sizeof(name) - 1)
                        return broker_fail(err, E(INVALID), "hello: gpu_uuid \"%s\" is not a uuid",
                                           h->uuid);
        } else
                snprintf(name, sizeof(name), "%s", h->uuid);
        if (!h->who)
                return broker_fail(err, E(INVALID), "hello: no identity");
        /* A name is not a proof: a GPU of this host is registered only by a process the host
         * lets use it, whatever it holds or whoever held it. */
        if (h->evidence == BROKER_EVIDENCE_MISSING)
                return broker_fail(err, E(PERMISSION),
                                   "hello: GPU %s is a GPU of this host, and this process "
                                   "(%s) shows no evidence that it may use it: %s",
                                   h->uuid, identity_text(h->who, who, sizeof(who)),
                                   h->evidence_why ? h->evidence_why : "none given");
        g = gpu_find(broker, name);
        r = admit(broker, g, h, &how, err);
        if (r != 0)
                return r;
        if (how == ADMIT_HOLDER) {
                for (struct list_node *n = g->chunks.next; n != &g->chunks; n = n->next)
                        chunks += !list_entry(n, struct chunk, producer_node)->orphan;
                if (chunks && !producer)
                        return broker_fail(err, E(INVALID),
                                           "hello: GPU %s still lends %zu chunks as a producer",
                                           g->uuid, chunks);
                if (!list_empty(&g->leases) && !consumer)
                        return broker_fail(err, E(INVALID),
                                           "hello: GPU %s still borrows as a consumer", g->uuid);
        }
        if (producer && h->n_held + broker->n_chunks > broker->settings.max_chunks + chunks)
                return broker_fail(err, E(LIMIT), "hello: %zu held chunks exceed the pool limit",
                                   h->n_held);

        if (how == ADMIT_HOLDER && g->owner) {
                /* Its own new connection (ZeroMQ reconnected, a link came back): the old one
                 * ends without touching what it holds, which this Hello reconciles. */
                log_notice("GPU %s is registered again by its holder %s from a new connection; "
                           "the old connection ends",
                           g->uuid, gpu_holder(g, who, sizeof(who)));
                w.replaced = g->owner;
                broker_gpu_detach(broker, g);
        } else if (how == ADMIT_RELEASED) {
                if (gpu_holds_state(g))
                        log_notice("GPU %s: its holder %s is gone; what it held is released "
                                   "before another client registers it",
                                   g->uuid, gpu_holder(g, who, sizeof(who)));
                broker_gpu_gone(broker, g);
                g = gpu_find(broker, name);
        }
        if (!g && !(g = gpu_ensure(broker, name)))
                return -ENOMEM;
        r = set_links(g, h->links, h->n_links);
        if (r < 0)
                goto fail;
        free(g->client_name);
        g->client_name = h->client_name && h->client_name[0] ? strdup(h->client_name) : NULL;
        free(g->host);
        g->host = h->host && h->host[0] ? strndup(h->host, 255) : NULL;
        g->ordinal = h->ordinal;
        g->ordinal_known = true;
        g->capacity = h->capacity;
        g->granularity = h->granularity;
        g->role = h->role;
        g->pid = h->pid;
        g->fabric = h->fabric;
        g->owner = owner;
        g->serial = ++broker->next_serial;
        g->silent = false;
        g->detached_until_ns = 0;
        /* Journaled: after a restart, whose process may still map what this GPU holds, and who
         * may register it again. A holder presenting a secret of an older kind gets a new one. */
        g->process = h->process ? *h->process : (struct proc_id){0};
        if (how != ADMIT_HOLDER || !g->custody.has_secret) {
                custody_issue(g, h->who, w.secret);
                w.new_secret = true;
        } else {
                /* Its tenant as the config says now (it may have changed across a restart). */
                memcpy(g->custody.who.tenant, h->who->tenant, sizeof(g->custody.who.tenant));
                g->custody.who.lends_to_all = h->who->lends_to_all;
        }
        journal_gpu(broker, g);

        if (producer)
                r = reconcile_producer(broker, g, h, &w);
        else if (consumer)
                r = reconcile_consumer(broker, g, h, &w);
        if (r < 0)
                goto fail;
        g->restored = false;
        for (struct list_node *n = g->chunks.next; n != &g->chunks; n = n->next)
                chunk_set_free_listed(list_entry(n, struct chunk, producer_node));
        events_add(&broker->events, "client", "GPU %s (%s, pid %d) registered as %s%s", g->uuid,
                   g->client_name ? g->client_name : "?", (int)g->pid,
                   producer   ? "producer"
                   : consumer ? "consumer"
                              : "neutral",
                   h->n_held ? ", re-registering what it holds" : "");
        r = broker_recompute_pairs(broker);
        if (r < 0)
                goto fail;
        w.gpu = g;
        *ret = w;
        return 0;
fail:
        free(w.lost_leases);
        g->owner = NULL;
        return r;
}
