/*
 * The lease state machine: offer, borrow, return, reclaim, drain and the deadlines they start
 * (departure.c: the death of either side, a release, the tick). A chunk goes free -> leased ->
 * reclaiming -> (dropped, producer told); a lease lives while it has chunks. A producer never gets
 * back a chunk a live consumer still maps.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "broker-private.h"
#include "broker.h"
#include "log.h"
#include "parse-util.h"
#include "time-util.h"

#define E(name) BROKER_E_##name

static const char *fmt_size(char *buf, uint64_t bytes)
{
        return format_size(buf, 32, bytes);
}

int broker_offer(struct broker *broker, struct gpu *producer, const uint64_t *sizes,
                 const uint64_t *client_refs, int *fds, const uint8_t *fabrics, size_t n,
                 uint64_t *ret_ids, char err[BROKER_ERR_MAX])
{
        size_t made = 0;

        if (producer->draining) {
                /* Said once per drain: a producer may keep trying. */
                if (!producer->drain_refusal_logged) {
                        producer->drain_refusal_logged = true;
                        log_notice("Refused an offer for GPU %s: an operator drained it; "
                                   "'aquactl undrain %s' ends the drain",
                                   producer->uuid, producer->uuid);
                        events_add(&broker->events, "drain", "offer for drained GPU %s refused",
                                   producer->uuid);
                }
                return broker_fail(err, E(DRAINING),
                                   "offer: GPU %s is drained by an operator; no offers until "
                                   "'aquactl undrain %s'",
                                   producer->uuid, producer->uuid);
        }
        if (n == 0)
                return broker_fail(err, E(INVALID), "offer: no chunks");
        if (broker->n_chunks + n > broker->settings.max_chunks)
                return broker_fail(err, E(LIMIT),
                                   "offer: %zu more chunks would exceed the pool limit of %" PRIu64,
                                   n, broker->settings.max_chunks);
        for (size_t i = 0; i < n; i++) {
                if (sizes[i] == 0)
                        return broker_fail(err, E(INVALID), "offer: chunk %zu has size 0", i);
                if (producer->granularity && sizes[i] % producer->granularity)
                        return broker_fail(err, E(INVALID),
                                           "offer: chunk %zu of %" PRIu64
                                           " bytes is not a multiple of the granularity %" PRIu64,
                                           i, sizes[i], producer->granularity);
        }
        for (; made < n; made++) {
                struct chunk *c = chunk_new(broker, producer, broker->next_chunk_id, sizes[made],
                                            client_refs[made], fds ? fds[made] : -1);
                if (!c)
                        goto oom;
                ret_ids[made] = c->id;
                if (fabrics) {
                        c->fabric = malloc(BROKER_FABRIC_HANDLE_SIZE);
                        if (!c->fabric) {
                                made++;
                                goto oom;
                        }
                        memcpy(c->fabric, fabrics + made * BROKER_FABRIC_HANDLE_SIZE,
                               BROKER_FABRIC_HANDLE_SIZE);
                        chunk_set_free_listed(c);
                }
        }
        for (size_t i = 0; i < n; i++) {
                journal_chunk(broker, broker_find_chunk(broker, ret_ids[i]));
                if (fds)
                        fds[i] = -1;
        }
        broker->stats.chunks_offered += n;
        return 0;
oom:
        /* Undo without closing: the caller still owns the descriptors on failure. */
        while (made-- > 0) {
                struct chunk *c = broker_find_chunk(broker, ret_ids[made]);
                c->fd = -1;
                chunk_drop(broker, c);
        }
        return -ENOMEM;
}

int broker_borrow(struct broker *broker, struct gpu *consumer, uint64_t bytes, uint64_t min_bytes,
                  bool allow_dram, struct broker_grant *ret, char err[BROKER_ERR_MAX])
{
        struct gpu *producer = consumer->paired;
        struct list_node *pos, *tmp;
        struct lease *l = NULL;
        uint64_t got = 0, dram = 0, avail;
        size_t n = 0;
        bool lease_limit = broker->n_leases >= broker->settings.max_leases;
        char a[32], b[32], c[32];

        if (bytes == 0)
                return broker_fail(err, E(INVALID), "borrow: bytes is 0");
        if (min_bytes > bytes)
                return broker_fail(err, E(INVALID), "borrow: min_bytes %s > bytes %s",
                                   fmt_size(a, min_bytes), fmt_size(b, bytes));
        if (consumer->barred)
                return broker_fail(
                    err, E(BARRED),
                    "borrow: GPU %s missed a reclaim deadline and gets no new leases",
                    consumer->uuid);

        /* Count what the paired producer can give before changing anything. Pairing never joins
         * two tenants; asked again here, so that no path to a grant can. */
        if (producer && producer->owner && !producer->draining && !lease_limit &&
            custody_may_lend(producer, consumer, NULL, 0))
                list_for_each(pos, tmp, &producer->free_chunks)
                {
                        struct chunk *ch = list_entry(pos, struct chunk, free_node);
                        if (got >= bytes || n >= broker->settings.max_grant_chunks)
                                break;
                        if (!chunk_grantable_to(ch, consumer))
                                continue;
                        got += ch->size;
                        n++;
                }
        if (got < bytes && allow_dram) {
                avail = broker->settings.dram_budget > broker->dram_granted
                            ? broker->settings.dram_budget - broker->dram_granted
                            : 0;
                dram = MIN(bytes - got, avail);
        }
        if (got + dram == 0 || got + dram < min_bytes) {
                if (lease_limit && !dram)
                        return broker_fail(err, E(LIMIT),
                                           "borrow: the limit of %" PRIu64 " leases is reached",
                                           broker->settings.max_leases);
                return broker_fail(err, E(NO_MEMORY),
                                   "borrow: %s from %s and %s of DRAM budget available, less than "
                                   "the %s asked for",
                                   fmt_size(a, got),
                                   producer ? producer->uuid : "no paired producer",
                                   fmt_size(b, dram), fmt_size(c, min_bytes ? min_bytes : bytes));
        }

        if (n > 0) {
                l = lease_new(broker, broker->next_lease_id, consumer, producer);
                if (!l)
                        return -ENOMEM;
                journal_lease(broker, l);
                list_for_each(pos, tmp, &producer->free_chunks)
                {
                        struct chunk *ch = list_entry(pos, struct chunk, free_node);
                        if (n == 0)
                                break;
                        if (!chunk_grantable_to(ch, consumer))
                                continue;
                        chunk_lease(broker, ch, l);
                        journal_chunk(broker, ch);
                        n--;
                }
                broker->stats.leases_granted++;
                events_add(&broker->events, "lease", "lease %" PRIu64 ": %s of %s to %s", l->id,
                           fmt_size(a, l->bytes), producer->uuid, consumer->uuid);
        }
        if (dram) {
                consumer->dram_bytes += dram;
                broker->dram_granted += dram;
                journal_gpu(broker, consumer);
        }
        *ret = (struct broker_grant){.lease = l, .dram_bytes = dram, .partial = got + dram < bytes};
        return 0;
}

void broker_undo_grant(struct broker *broker, struct gpu *consumer, const struct broker_grant *g)
{
        if (g->lease) {
                struct lease *l = g->lease;
                while (!list_empty(&l->chunks)) {
                        struct chunk *c = list_entry(l->chunks.next, struct chunk, lease_node);
                        chunk_release(broker, c);
                        journal_chunk(broker, c);
                }
                events_add(&broker->events, "lease", "lease %" PRIu64 " taken back: not delivered",
                           l->id);
                lease_free(broker, l);
        }
        if (g->dram_bytes) {
                consumer->dram_bytes -= MIN(g->dram_bytes, consumer->dram_bytes);
                broker->dram_granted -= MIN(g->dram_bytes, broker->dram_granted);
                journal_gpu(broker, consumer);
        }
}

void broker_undo_offer(struct broker *broker, const uint64_t *ids, size_t n)
{
        for (size_t i = 0; i < n; i++) {
                struct chunk *c = broker_find_chunk(broker, ids[i]);
                if (c && c->state == CHUNK_FREE)
                        chunk_drop(broker, c);
        }
        broker->stats.chunks_offered -= MIN(n, broker->stats.chunks_offered);
}

static void reclaimed_add(struct reclaimed *r, uint64_t id)
{
        if (r->n == r->alloc) {
                size_t n = r->alloc ? r->alloc * 2 : 16;
                uint64_t *ids = reallocarray(r->ids, n, sizeof(*ids));
                if (!ids) {
                        log_error("Out of memory: chunk %" PRIu64 " not reported as reclaimed", id);
                        return;
                }
                r->ids = ids;
                r->alloc = n;
        }
        r->ids[r->n++] = id;
}

void reclaimed_flush(struct broker *broker, struct reclaimed *r)
{
        if (r->n > 0 && r->producer)
                notice_queue(broker, NOTICE_RECLAIMED, r->producer, 0, r->ids, r->n, 0, NULL);
        free(r->ids);
        *r = (struct reclaimed){0};
}

/*
 * A consumer no longer maps c (it returned it or died). Where it goes depends on why it was
 * leased: orphans are dropped, reclaimed chunks go back to their producer, others to the pool.
 */
void chunk_unmapped(struct broker *broker, struct chunk *c, struct reclaimed *back)
{
        if (c->orphan) {
                chunk_drop(broker, c);
        } else if (c->state == CHUNK_RECLAIMING || c->producer->draining) {
                if (c->state == CHUNK_RECLAIMING && c->reclaim_start_ns && broker->on_reclaimed)
                        broker->on_reclaimed(broker->on_reclaimed_userdata,
                                             now_mono_ns() - c->reclaim_start_ns);
                if (back->producer == c->producer)
                        reclaimed_add(back, c->id);
                chunk_drop(broker, c);
        } else {
                struct gpu *consumer = c->lease->consumer;

                chunk_release(broker, c);
                chunk_dirty(broker, c, consumer);
                journal_chunk(broker, c);
        }
}

/* A chunk its consumer returns: one asked back by a reclaim is counted on the consumer. */
static void returned_by(struct broker *broker, struct gpu *consumer, struct chunk *c,
                        struct reclaimed *back)
{
        if (c->state == CHUNK_RECLAIMING) {
                consumer->reclaim_returned_chunks++;
                consumer->reclaim_returned_bytes += c->size;
                broker->stats.reclaim_returned_chunks++;
                broker->stats.reclaim_returned_bytes += c->size;
        }
        chunk_unmapped(broker, c, back);
}

/* The lease lease_id of consumer, or a positive error code (what names it in err). */
static int consumer_lease(struct broker *broker, struct gpu *consumer, uint64_t lease_id,
                          char err[BROKER_ERR_MAX], struct lease **ret)
{
        struct lease *l = broker_find_lease(broker, lease_id);

        if (!l || l->consumer != consumer)
                return broker_fail(err, E(UNKNOWN_LEASE),
                                   "return: lease %" PRIu64 " is not held by GPU %s", lease_id,
                                   consumer->uuid);
        *ret = l;
        return 0;
}

int broker_return_unusable(struct broker *broker, struct gpu *consumer, uint64_t lease_id,
                           const uint64_t *chunk_ids, size_t n, char err[BROKER_ERR_MAX])
{
        struct reclaimed back = {0};
        struct lease *l = NULL;
        int r;

        r = consumer_lease(broker, consumer, lease_id, err, &l);
        if (r != 0)
                return r;
        back.producer = l->producer;
        for (size_t i = 0; i < n; i++) {
                /* Looked up each time: a duplicate id was already dropped. */
                struct chunk *c = broker_find_chunk(broker, chunk_ids[i]);

                if (!c || c->lease != l)
                        continue;
                /* Granting it again would fail the same way: it leaves the pool, and its
                 * producer learns so as of any chunk it does not get back as it lent it. */
                if (!c->orphan)
                        reclaimed_add(&back, c->id);
                chunk_drop(broker, c);
        }
        if (back.n > 0) {
                log_warning("GPU %s could not import %zu chunks of GPU %s (lease %" PRIu64
                            "); they leave the pool",
                            consumer->uuid, back.n, l->producer->uuid, l->id);
                events_add(&broker->events, "unusable",
                           "%s could not import %zu chunks of %s; dropped", consumer->uuid, back.n,
                           l->producer->uuid);
                broker->stats.chunks_unusable += back.n;
        }
        reclaimed_flush(broker, &back);
        return 0;
}

int broker_return(struct broker *broker, struct gpu *consumer, uint64_t lease_id,
                  const uint64_t *chunk_ids, size_t n, uint64_t dram_bytes, uint32_t *ret_returned,
                  char err[BROKER_ERR_MAX])
{
        struct reclaimed back = {0};
        struct lease *l = NULL;
        uint32_t returned = 0;
        char a[32], b[32];

        if (lease_id == 0 && dram_bytes == 0)
                return broker_fail(err, E(INVALID), "return: neither a lease nor DRAM bytes");
        /* A lease aquad already ended (its producer died and the consumer moved off, or it
         * returned it twice) is returned already: done, as a second close of nothing. Only a
         * lease that is held, by another consumer, is refused. */
        if (lease_id && lease_id < broker->next_lease_id && !broker_find_lease(broker, lease_id)) {
                lease_id = 0;
                n = 0;
                if (dram_bytes == 0) {
                        if (ret_returned)
                                *ret_returned = 0;
                        return 0;
                }
        }
        if (lease_id) {
                int r = consumer_lease(broker, consumer, lease_id, err, &l);
                if (r != 0)
                        return r;
        } else if (n > 0)
                return broker_fail(err, E(INVALID), "return: chunk ids without a lease");
        /* Ids no longer in the lease are skipped, not refused: a consumer that moved off a
         * producer that died returns again what it may have returned already (ids are never
         * reused, so a stale one names nobody else's chunk). None in it at all is an error. */
        if (n > 0) {
                size_t in_lease = 0;
                for (size_t i = 0; i < n; i++) {
                        struct chunk *c = broker_find_chunk(broker, chunk_ids[i]);
                        in_lease += c && c->lease == l;
                }
                if (in_lease == 0)
                        return broker_fail(err, E(UNKNOWN_CHUNK),
                                           "return: chunk %" PRIu64 " is not in lease %" PRIu64,
                                           chunk_ids[0], lease_id);
        }
        if (dram_bytes > consumer->dram_bytes)
                return broker_fail(err, E(INVALID), "return: %s of DRAM, but GPU %s holds %s",
                                   fmt_size(a, dram_bytes), consumer->uuid,
                                   fmt_size(b, consumer->dram_bytes));

        if (l) {
                back.producer = l->producer;
                if (n == 0) {
                        while (!list_empty(&l->chunks)) {
                                returned_by(broker, consumer,
                                            list_entry(l->chunks.next, struct chunk, lease_node),
                                            &back);
                                returned++;
                        }
                } else
                        for (size_t i = 0; i < n; i++) {
                                /* Looked up again: a duplicate id was already handled. */
                                struct chunk *c = broker_find_chunk(broker, chunk_ids[i]);
                                if (!c || c->lease != l)
                                        continue;
                                returned_by(broker, consumer, c, &back);
                                returned++;
                        }
                struct gpu *producer = l->producer;
                if (l->n_chunks == 0) {
                        events_add(&broker->events, "lease", "lease %" PRIu64 " returned by %s",
                                   l->id, consumer->uuid);
                        lease_free(broker, l);
                }
                reclaimed_flush(broker, &back);
                /* Paired with another consumer meanwhile: that one must not see this data. */
                if (producer->paired != consumer)
                        scrub_check(broker, producer);
        }
        if (dram_bytes) {
                consumer->dram_bytes -= dram_bytes;
                broker->dram_granted -= MIN(dram_bytes, broker->dram_granted);
                journal_gpu(broker, consumer);
        }
        if (ret_returned)
                *ret_returned = returned;
        return 0;
}

void broker_reclaim_clear(struct broker_reclaim *r)
{
        free(r->free_ids);
        free(r->pending_ids);
        *r = (struct broker_reclaim){0};
}

static int ids_push(uint64_t **ids, size_t *n, uint64_t id)
{
        uint64_t *a = reallocarray(*ids, *n + 1, sizeof(*a));

        if (!a)
                return -ENOMEM;
        a[(*n)++] = id;
        *ids = a;
        return 0;
}

/* Mark chunks of l reclaiming (all of them, or until *got reaches want); one notice. */
int reclaim_lease(struct broker *broker, struct lease *l, uint64_t want, uint64_t *got,
                  const char *reason, uint64_t deadline_ns, struct broker_reclaim *ret)
{
        struct list_node *pos, *tmp;
        size_t first = ret->n_pending;
        uint64_t deadline_ms =
            deadline_ns ? broker->settings.reclaim_deadline_ns / NSEC_PER_MSEC : 0;
        int r;

        list_for_each(pos, tmp, &l->chunks)
        {
                struct chunk *c = list_entry(pos, struct chunk, lease_node);
                if (*got >= want ||
                    (deadline_ns && ret->n_pending >= broker->settings.max_grant_chunks))
                        break;
                if (c->state != CHUNK_LEASED || (c->orphan && deadline_ns))
                        continue;
                r = ids_push(&ret->pending_ids, &ret->n_pending, c->id);
                if (r < 0)
                        return r;
                c->state = CHUNK_RECLAIMING;
                c->reclaim_start_ns = now_mono_ns();
                /* The deadline runs from the notice's delivery (broker_reclaim_delivered). */
                c->deadline_ns = 0;
                c->deadline_wall_ms = 0;
                c->deadline_pending = deadline_ns != 0;
                *got += c->size;
                journal_chunk(broker, c);
        }
        if (ret->n_pending == first)
                return 0;
        free(l->reason);
        l->reason = strdup(reason);
        l->overdue = false;
        lease_update_state(l);
        journal_lease(broker, l);
        notice_queue(broker, NOTICE_RECLAIM, l->consumer, l->id, ret->pending_ids + first,
                     ret->n_pending - first, deadline_ms, reason);
        return 0;
}

int broker_reclaim(struct broker *broker, struct gpu *producer, uint64_t bytes, bool all,
                   bool leased_only, const char *reason, struct broker_reclaim *ret,
                   char err[BROKER_ERR_MAX])
{
        _cleanup_(broker_reclaim_clear) struct broker_reclaim res = {0};
        struct list_node *pos, *tmp;
        uint64_t want = all ? UINT64_MAX : bytes, got = 0;
        uint64_t deadline_ns = now_mono_ns() + broker->settings.reclaim_deadline_ns;
        int r;

        if (want == 0)
                return broker_fail(err, E(INVALID), "reclaim: bytes is 0 and all is not set");
        if (!leased_only)
                list_for_each(pos, tmp, &producer->chunks)
                {
                        struct chunk *c = list_entry(pos, struct chunk, producer_node);
                        if (got >= want || res.n_free >= broker->settings.max_grant_chunks)
                                break;
                        if (c->state != CHUNK_FREE || c->orphan)
                                continue;
                        if (c->quarantined) {
                                /* A process may still map it: it comes back when that is gone. */
                                if (c->quarantine_back)
                                        continue;
                                r = ids_push(&res.pending_ids, &res.n_pending, c->id);
                                if (r < 0)
                                        return r;
                                c->quarantine_back = true;
                                got += c->size;
                                journal_chunk(broker, c);
                                continue;
                        }
                        r = ids_push(&res.free_ids, &res.n_free, c->id);
                        if (r < 0)
                                return r;
                        got += c->size;
                        chunk_drop(broker, c);
                }
        list_for_each(pos, tmp, &broker->leases)
        {
                struct lease *l = list_entry(pos, struct lease, broker_node);
                if (got >= want || res.n_pending >= broker->settings.max_grant_chunks)
                        break;
                if (l->producer != producer)
                        continue;
                r = reclaim_lease(broker, l, want, &got, reason, deadline_ns, &res);
                if (r < 0)
                        return r;
        }
        res.deadline_ms = res.n_pending ? broker->settings.reclaim_deadline_ns / NSEC_PER_MSEC : 0;
        if (res.n_free || res.n_pending)
                events_add(&broker->events, "reclaim",
                           "%s: %zu chunks free at once, %zu asked back from consumers (%s)",
                           producer->uuid, res.n_free, res.n_pending, reason);
        *ret = res;
        res = (struct broker_reclaim){0};
        return 0;
}

int broker_drain(struct broker *broker, struct gpu *producer, struct broker_reclaim *ret,
                 char err[BROKER_ERR_MAX])
{
        int r;

        if (producer->role != GPU_ROLE_PRODUCER)
                return broker_fail(err, E(WRONG_ROLE), "drain: GPU %s is not a producer",
                                   producer->uuid);
        if (!producer->draining) {
                producer->draining = true;
                producer->drain_refusal_logged = false;
                journal_gpu(broker, producer);
                /* Nothing of it is grantable any more. */
                for (struct list_node *n = producer->chunks.next; n != &producer->chunks;
                     n = n->next)
                        chunk_set_free_listed(list_entry(n, struct chunk, producer_node));
        }
        r = broker_reclaim(broker, producer, 0, true, false, "drain", ret, err);
        if (r != 0)
                return r;
        /* The producer did not ask: tell it what is free already. */
        notice_queue(broker, NOTICE_RECLAIMED, producer, 0, ret->free_ids, ret->n_free, 0, NULL);
        return 0;
}

int broker_undrain(struct broker *broker, struct gpu *producer, char err[BROKER_ERR_MAX])
{
        if (!producer->draining)
                return broker_fail(err, E(INVALID), "undrain: GPU %s is not draining",
                                   producer->uuid);
        producer->draining = false;
        journal_gpu(broker, producer);
        /* What it still has in the pool is grantable again. */
        for (struct list_node *n = producer->chunks.next; n != &producer->chunks; n = n->next)
                chunk_set_free_listed(list_entry(n, struct chunk, producer_node));
        events_add(&broker->events, "drain", "drain of GPU %s ended", producer->uuid);
        log_notice("The drain of GPU %s ended: it may offer again", producer->uuid);
        /* Not collected here even without a client: callers may still hold it. Its next
         * registration, or aquad's restart, finds it as any known GPU. */
        return 0;
}

void broker_reclaim_delivered(struct broker *broker, uint64_t lease_id, const uint64_t *ids,
                              size_t n, uint64_t deadline_ms)
{
        struct lease *l = broker_find_lease(broker, lease_id);
        uint64_t now = now_mono_ns(), wall = now_real_ns() / NSEC_PER_MSEC;

        if (!l || !deadline_ms)
                return;
        for (size_t i = 0; i < n; i++) {
                struct chunk *c = broker_find_chunk(broker, ids[i]);
                if (!c || c->lease != l || c->state != CHUNK_RECLAIMING || !c->deadline_pending)
                        continue;
                c->deadline_pending = false;
                c->deadline_ns = now + deadline_ms * NSEC_PER_MSEC;
                c->deadline_wall_ms = wall + deadline_ms;
                journal_chunk(broker, c);
                broker_note_deadline(broker, c->deadline_ns);
        }
}

/* A holder's tenant changed (a reload): leases its tenants may no longer share are reclaimed. */
bool broker_set_tenant(struct broker *broker, struct gpu *g, const char *tenant, bool lends_to_all)
{
        struct broker_identity *w = &g->custody.who;
        struct list_node *pos, *tmp;

        if (!g->custody.held || (strcmp(w->tenant, tenant) == 0 && w->lends_to_all == lends_to_all))
                return false;
        snprintf(w->tenant, sizeof(w->tenant), "%s", tenant);
        w->lends_to_all = lends_to_all && !w->remote;
        journal_gpu(broker, g);
        list_for_each(pos, tmp, &broker->leases)
        {
                struct lease *l = list_entry(pos, struct lease, broker_node);
                struct broker_reclaim r = {0};
                uint64_t got = 0;

                if ((l->consumer != g && l->producer != g) ||
                    custody_may_lend(l->producer, l->consumer, NULL, 0))
                        continue;
                /* Out of memory here leaves the lease as it is: the next reload tries again. */
                (void)reclaim_lease(broker, l, UINT64_MAX, &got, "tenants changed",
                                    now_mono_ns() + broker->settings.reclaim_deadline_ns, &r);
                broker_reclaim_clear(&r);
        }
        return true;
}
