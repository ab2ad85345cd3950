/* The lease state machine: grants, partial grants, reclaim with deadlines, death, restart. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "broker-private.h"
#include "time-util.h"
#include "topology.h"

#define MiB     (UINT64_C(1) << 20)
#define E(name) BROKER_E_##name

static struct broker *broker;
static struct gpu *producer, *consumer;
/* The pool never looks inside the transport's clients: any object stands in for one. */
struct client {
        int unused;
};
static struct client producer_client, consumer_client;
static char err[BROKER_ERR_MAX];
static char dir[64], journal_path[128];

static const struct broker_settings settings = {
    .dram_budget = 8 * MiB,
    .reclaim_deadline_ns = 100 * NSEC_PER_MSEC,
    .reconcile_timeout_ns = NSEC_PER_SEC,
    .max_chunks = 64,
    .max_leases = 4,
    .max_grant_chunks = 32,
    .auto_pairing = true,
};

/* The custody secret each GPU's holder was given, presented when it registers again. */
static struct {
        char uuid[32];
        uint8_t secret[BROKER_SECRET_LEN];
} secrets[8];
static const struct broker_identity tenant = {.uid = 1000};

static uint8_t *secret_of(const char *uuid, bool add)
{
        for (size_t i = 0; i < 8; i++)
                if (strcmp(secrets[i].uuid, uuid) == 0 || (add && !secrets[i].uuid[0])) {
                        snprintf(secrets[i].uuid, sizeof(secrets[i].uuid), "%s", uuid);
                        return secrets[i].secret;
                }
        return NULL;
}

static struct gpu *hello(const char *uuid, enum gpu_role role, const char *peer,
                         struct client *owner, const struct broker_held *held, size_t n_held,
                         int *fds, struct broker_welcome *ret)
{
        struct broker_link links[] = {{.uuid = peer, .bandwidth = 400}};
        struct broker_hello h = {.who = &tenant,
                                 .secret = secret_of(uuid, false),
                                 .uuid = uuid,
                                 .role = role,
                                 .granularity = 2 * MiB,
                                 .links = links,
                                 .n_links = 1,
                                 .held = held,
                                 .n_held = n_held,
                                 .held_fds = fds,
                                 .client_name = uuid};
        struct broker_welcome w = {0};

        cr_assert_eq(broker_register(broker, &h, owner, &w, err), 0, "%s", err);
        if (w.new_secret)
                memcpy(secret_of(uuid, true), w.secret, BROKER_SECRET_LEN);
        if (ret)
                *ret = w;
        else
                free(w.lost_leases);
        return w.gpu;
}

static void setup(void)
{
        memset(secrets, 0, sizeof(secrets));
        cr_assert_eq(broker_new(&settings, &broker), 0);
        producer =
            hello("GPU-P", GPU_ROLE_PRODUCER, "GPU-C", &producer_client, NULL, 0, NULL, NULL);
        consumer =
            hello("GPU-C", GPU_ROLE_CONSUMER, "GPU-P", &consumer_client, NULL, 0, NULL, NULL);
        cr_assert_eq(consumer->paired, producer);
        dir[0] = '\0';
}

static void drain_notices(void);

static void teardown(void)
{
        drain_notices();
        broker = broker_free(broker);
        if (dir[0]) {
                char cmd[128];
                snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
                cr_assert_eq(system(cmd), 0);
        }
}

TestSuite(lease, .init = setup, .fini = teardown);

static void offer(size_t n, uint64_t *ret_ids)
{
        uint64_t sizes[16], refs[16], ids[16];
        int fds[16];

        for (size_t i = 0; i < n; i++) {
                sizes[i] = 2 * MiB;
                refs[i] = 100 + i;
                fds[i] = memfd_create("chunk", MFD_CLOEXEC);
                cr_assert_geq(fds[i], 0);
        }
        cr_assert_eq(
            broker_offer(broker, producer, sizes, refs, fds, NULL, n, ret_ids ? ret_ids : ids, err),
            0, "%s", err);
        for (size_t i = 0; i < n; i++)
                cr_assert_eq(fds[i], -1, "the pool takes the descriptors");
}

/* Take queued notices, delivered as the transport would (a reclaim's deadline starts); count
 * those of kind for gpu (and copy the first one's ids). */
static size_t notices(enum notice_kind kind, struct gpu *to, uint64_t *ids, size_t *n_ids,
                      char *text, size_t text_len)
{
        struct list_node list = LIST_HEAD_INIT(list), *pos, *tmp;
        size_t count = 0;

        broker_take_notices(broker, &list);
        list_for_each(pos, tmp, &list)
        {
                struct notice *m = list_entry(pos, struct notice, node);
                if (m->kind == NOTICE_RECLAIM)
                        broker_reclaim_delivered(broker, m->lease_id, m->chunk_ids, m->n_chunk_ids,
                                                 m->deadline_ms);
                if (m->kind == kind && m->gpu == to) {
                        if (count == 0 && ids) {
                                memcpy(ids, m->chunk_ids, m->n_chunk_ids * sizeof(*ids));
                                *n_ids = m->n_chunk_ids;
                        }
                        if (count == 0 && text)
                                snprintf(text, text_len, "%s", m->text ? m->text : "");
                        count++;
                }
                notice_free(m);
        }
        return count;
}

static void drain_notices(void)
{
        if (broker)
                notices(_NOTICE_KIND_MAX, NULL, NULL, NULL, NULL, 0);
}

static struct lease *borrow(uint64_t bytes, uint64_t min, bool dram, struct broker_grant *g)
{
        cr_assert_eq(broker_borrow(broker, consumer, bytes, min, dram, g, err), 0, "%s", err);
        return g->lease;
}

Test(lease, borrow_grants_chunks_of_the_paired_producer)
{
        struct broker_grant g;
        struct lease *l;

        offer(4, NULL);
        l = borrow(6 * MiB, 6 * MiB, false, &g);
        cr_assert_not_null(l);
        cr_assert_eq(l->n_chunks, 3);
        cr_assert_eq(l->bytes, 6 * MiB);
        cr_assert_eq(l->state, LEASE_GRANTED);
        cr_assert_eq(l->producer, producer);
        cr_assert_not(g.partial);
        cr_assert_eq(g.dram_bytes, 0);
        cr_assert_eq(producer->lent_bytes, 6 * MiB);
        cr_assert_eq(consumer->borrowed_bytes, 6 * MiB);
        cr_assert_eq(list_length(&producer->free_chunks), 1);
}

/* What the transport and the metrics read (view.c) is what the books say, cut where asked. */
Test(lease, the_views_agree_with_the_books)
{
        struct broker_gpu_view gv[4];
        struct broker_lease_view lv[2];
        struct broker_chunk_view cv[8];
        struct broker_granted_chunk gc[8];
        struct broker_totals t;
        struct broker_grant g;
        uint64_t ids[4], sum = 0;
        size_t n, leased = 0;

        offer(4, ids);
        borrow(6 * MiB, 6 * MiB, true, &g);
        broker_totals(broker, &t);
        cr_assert_eq(t.gpus, 2);
        cr_assert_eq(t.pairs, 1);
        cr_assert_eq(t.leases, 1);
        cr_assert_eq(t.chunks, 4);
        cr_assert_eq(t.pool_bytes, 8 * MiB);
        cr_assert_eq(t.lent_bytes, 6 * MiB);
        cr_assert_eq(t.chunks_by_state[CHUNK_LEASED], 3);
        cr_assert_eq(t.chunk_bytes_by_state[CHUNK_FREE], 2 * MiB);
        cr_assert_eq(t.leases_by_state[LEASE_GRANTED], 1);
        cr_assert_eq(t.gpus_by_role[GPU_ROLE_PRODUCER], 1);

        cr_assert_eq(broker_view_gpus(broker, gv, 4), 2);
        cr_assert_eq(broker_view_gpus(broker, gv, 1), 1, "cut at max");
        n = broker_view_gpus(broker, gv, 4);
        for (size_t i = 0; i < n; i++) {
                bool prod = gv[i].role == GPU_ROLE_PRODUCER;
                cr_assert_str_eq(gv[i].paired_with, prod ? consumer->uuid : producer->uuid);
                cr_assert_eq(prod ? gv[i].lent_bytes : gv[i].borrowed_bytes, 6 * MiB);
                cr_assert_eq(gv[i].owner, prod ? &producer_client : &consumer_client);
        }

        cr_assert_eq(broker_view_leases(broker, now_mono_ns(), lv, 2), 1);
        cr_assert_eq(lv[0].id, g.lease->id);
        cr_assert_eq(lv[0].chunks, 3);
        cr_assert_str_eq(lv[0].consumer_uuid, consumer->uuid);

        n = broker_view_chunks(broker, cv, 8);
        cr_assert_eq(n, 4);
        for (size_t i = 0; i < n; i++)
                leased += cv[i].lease_id == g.lease->id && !strcmp(cv[i].condition, "leased");
        cr_assert_eq(leased, 3);
        cr_assert_eq(broker_view_chunks(broker, cv, 2), 2, "cut at max");

        cr_assert_eq(broker_grant_size(&g), 3);
        cr_assert_eq(broker_grant_lease_id(&g), g.lease->id);
        n = broker_grant_chunks(&g, gc, 8);
        cr_assert_eq(n, 3);
        for (size_t i = 0; i < n; i++) {
                cr_assert_geq(gc[i].fd, 0, "the daemon's handle to pass on");
                cr_assert_str_eq(gc[i].producer_uuid, producer->uuid);
                sum += gc[i].size;
        }
        cr_assert_eq(sum, g.lease->bytes);

        broker_report_load(broker, consumer, &(struct broker_load){.load = 0.25, .migrations = 7});
        n = broker_view_gpus(broker, gv, 4);
        for (size_t i = 0; i < n; i++)
                if (gv[i].role == GPU_ROLE_CONSUMER)
                        cr_assert_eq(gv[i].reported.migrations, 7);
}

Test(lease, a_return_naming_chunks_returned_already_returns_the_rest)
{
        struct broker_grant g;
        struct lease *l;
        uint64_t ids[3], first, stale[2];
        uint64_t lease_id;
        uint32_t n = 0;

        offer(3, NULL);
        l = borrow(6 * MiB, 6 * MiB, false, &g);
        lease_id = l->id;
        for (size_t i = 0; i < 3; i++) {
                struct list_node *k = l->chunks.next;
                for (size_t j = 0; j < i; j++)
                        k = k->next;
                ids[i] = list_entry(k, struct chunk, lease_node)->id;
        }
        first = ids[0];
        cr_assert_eq(broker_return(broker, consumer, lease_id, &first, 1, 0, &n, err), 0, "%s",
                     err);
        cr_assert_eq(n, 1);
        /* The first again, with the second: the second goes back, the first is skipped. */
        stale[0] = ids[0];
        stale[1] = ids[1];
        cr_assert_eq(broker_return(broker, consumer, lease_id, stale, 2, 0, &n, err), 0, "%s", err);
        cr_assert_eq(n, 1);
        cr_assert_eq(l->n_chunks, 1);
        /* Only stale ids: refused, nothing changes. */
        cr_assert_eq(broker_return(broker, consumer, lease_id, stale, 2, 0, &n, err),
                     E(UNKNOWN_CHUNK));
        cr_assert_eq(l->n_chunks, 1);
}

Test(lease, borrow_makes_up_the_rest_with_dram_budget)
{
        struct broker_grant g;

        offer(1, NULL);
        borrow(6 * MiB, 4 * MiB, true, &g);
        cr_assert_eq(g.lease->bytes, 2 * MiB);
        cr_assert_eq(g.dram_bytes, 4 * MiB);
        cr_assert_not(g.partial);
        cr_assert_eq(consumer->dram_bytes, 4 * MiB);
        cr_assert_eq(broker->dram_granted, 4 * MiB);
}

Test(lease, borrow_grants_partially_when_min_bytes_is_met)
{
        struct broker_grant g;

        offer(2, NULL);
        borrow(32 * MiB, 2 * MiB, false, &g);
        cr_assert(g.partial);
        cr_assert_eq(g.lease->bytes, 4 * MiB);
}

Test(lease, borrow_grants_nothing_below_min_bytes)
{
        struct broker_grant g;

        offer(1, NULL);
        cr_assert_eq(broker_borrow(broker, consumer, 8 * MiB, 4 * MiB, false, &g, err),
                     E(NO_MEMORY));
        cr_assert(strstr(err, "GPU-P"), "%s", err);
        cr_assert_eq(broker->n_leases, 0);
        cr_assert_eq(list_length(&producer->free_chunks), 1);
}

Test(lease, borrow_stops_at_the_lease_limit)
{
        struct broker_grant g;

        offer(8, NULL);
        for (int i = 0; i < 4; i++)
                borrow(2 * MiB, 2 * MiB, false, &g);
        cr_assert_eq(broker_borrow(broker, consumer, 2 * MiB, 2 * MiB, false, &g, err), E(LIMIT));
}

Test(lease, offer_refuses_more_chunks_than_the_pool_limit)
{
        uint64_t sizes[65] = {0}, refs[65] = {0};
        int fds[65];
        uint64_t ids[65];

        for (size_t i = 0; i < 65; i++) {
                sizes[i] = 2 * MiB;
                fds[i] = -1;
        }
        cr_assert_eq(broker_offer(broker, producer, sizes, refs, fds, NULL, 65, ids, err),
                     E(LIMIT));
        sizes[0] = 3 * MiB;
        cr_assert_eq(broker_offer(broker, producer, sizes, refs, fds, NULL, 1, ids, err),
                     E(INVALID));
        cr_assert(strstr(err, "granularity"), "%s", err);
}

Test(lease, reclaim_frees_unleased_chunks_at_once)
{
        struct broker_reclaim r;
        struct broker_grant g;

        offer(4, NULL);
        borrow(2 * MiB, 2 * MiB, false, &g);
        cr_assert_eq(
            broker_reclaim(broker, producer, 4 * MiB, false, false, "producer load", &r, err), 0);
        cr_assert_eq(r.n_free, 2);
        cr_assert_eq(r.n_pending, 0);
        cr_assert_eq(broker->n_chunks, 2);
        cr_assert_eq(notices(NOTICE_RECLAIM, consumer, NULL, NULL, NULL, 0), 0);
        broker_reclaim_clear(&r);
}

Test(lease, reclaim_waits_for_the_consumer_to_return_leased_chunks)
{
        uint64_t ids[16];
        size_t n = 0;
        char reason[64];
        struct broker_reclaim r;
        struct broker_grant g;
        struct lease *l;
        uint32_t returned;

        offer(2, NULL);
        l = borrow(4 * MiB, 4 * MiB, false, &g);
        cr_assert_eq(
            broker_reclaim(broker, producer, 2 * MiB, false, false, "producer load", &r, err), 0);
        cr_assert_eq(r.n_free, 0);
        cr_assert_eq(r.n_pending, 1);
        cr_assert_eq(r.deadline_ms, 100);
        cr_assert_eq(l->state, LEASE_RECLAIMING);
        cr_assert_eq(notices(NOTICE_RECLAIM, consumer, ids, &n, reason, sizeof(reason)), 1);
        cr_assert_eq(n, 1);
        cr_assert_eq(ids[0], r.pending_ids[0]);
        cr_assert_str_eq(reason, "producer load");

        /* Nothing goes back to the producer while the consumer maps it. */
        cr_assert_eq(notices(NOTICE_RECLAIMED, producer, NULL, NULL, NULL, 0), 0);
        cr_assert_eq(broker_return(broker, consumer, l->id, ids, 1, 0, &returned, err), 0, "%s",
                     err);
        cr_assert_eq(returned, 1);
        n = 0;
        cr_assert_eq(notices(NOTICE_RECLAIMED, producer, ids, &n, NULL, 0), 1);
        cr_assert_eq(ids[0], r.pending_ids[0]);
        cr_assert_eq(l->state, LEASE_GRANTED);
        cr_assert_eq(l->n_chunks, 1);
        cr_assert_eq(broker->n_chunks, 1);
        broker_reclaim_clear(&r);
}

Test(lease, a_missed_deadline_bars_the_consumer_and_keeps_its_chunks_from_the_producer)
{
        struct broker_reclaim r;
        struct broker_grant g;
        struct lease *l;
        uint64_t lease_id;

        offer(2, NULL);
        l = borrow(4 * MiB, 4 * MiB, false, &g);
        lease_id = l->id;
        cr_assert_eq(broker_reclaim(broker, producer, 0, true, false, "producer load", &r, err), 0);
        drain_notices();
        broker_tick(broker, now_mono_ns() + 10 * NSEC_PER_SEC);
        cr_assert(consumer->barred);
        cr_assert(l->overdue);
        cr_assert_eq(broker->stats.deadline_misses, 1);
        cr_assert_eq(l->n_chunks, 2, "overdue chunks stay with the consumer");
        cr_assert_eq(notices(NOTICE_RECLAIMED, producer, NULL, NULL, NULL, 0), 0);
        offer(1, NULL);
        cr_assert_eq(broker_borrow(broker, consumer, 2 * MiB, 0, true, &g, err), E(BARRED));

        /* Late, but returned: only now does the producer get them. */
        cr_assert_eq(broker_return(broker, consumer, lease_id, NULL, 0, 0, NULL, err), 0, "%s",
                     err);
        cr_assert_null(broker_find_lease(broker, lease_id));
        cr_assert_eq(notices(NOTICE_RECLAIMED, producer, NULL, NULL, NULL, 0), 1);
        broker_reclaim_clear(&r);
}

Test(lease, return_refuses_a_chunk_of_another_lease)
{
        struct broker_grant a, b;
        uint64_t other;

        offer(2, NULL);
        borrow(2 * MiB, 2 * MiB, false, &a);
        borrow(2 * MiB, 2 * MiB, false, &b);
        other = list_entry(b.lease->chunks.next, struct chunk, lease_node)->id;
        cr_assert_eq(broker_return(broker, consumer, a.lease->id, &other, 1, 0, NULL, err),
                     E(UNKNOWN_CHUNK));
        cr_assert_eq(broker_return(broker, consumer, 999, NULL, 0, 0, NULL, err), E(UNKNOWN_LEASE));
        cr_assert_eq(broker_return(broker, consumer, 0, NULL, 0, MiB, NULL, err), E(INVALID));
}

Test(lease, a_voluntary_return_puts_chunks_back_in_the_pool)
{
        struct broker_grant g;

        offer(2, NULL);
        borrow(4 * MiB, 4 * MiB, true, &g);
        cr_assert_eq(broker_return(broker, consumer, g.lease->id, NULL, 0, 0, NULL, err), 0);
        cr_assert_eq(list_length(&producer->free_chunks), 2);
        cr_assert_eq(broker->n_leases, 0);
        cr_assert_eq(notices(NOTICE_RECLAIMED, producer, NULL, NULL, NULL, 0), 0);
}

/* A lease aquad already ended (returned, or its producer died and it moved off) is returned
 * again as done; another consumer's live lease is still refused. */
Test(lease, returning_a_lease_aquad_already_ended_is_done)
{
        struct broker_grant g;
        uint64_t id;
        uint32_t returned = 7;

        offer(2, NULL);
        borrow(4 * MiB, 4 * MiB, true, &g);
        id = g.lease->id;
        cr_assert_eq(broker_return(broker, consumer, id, NULL, 0, 0, NULL, err), 0);
        cr_assert_eq(broker_return(broker, consumer, id, NULL, 0, 0, &returned, err), 0, "%s", err);
        cr_assert_eq(returned, 0);
        cr_assert_eq(broker_return(broker, consumer, id + 1000, NULL, 0, 0, NULL, err),
                     E(UNKNOWN_LEASE), "a lease never granted");
        cr_assert_eq(list_length(&producer->free_chunks), 2);
}

Test(lease, consumer_death_returns_its_chunks_and_dram_to_the_pool)
{
        struct broker_reclaim r;
        struct broker_grant g;

        offer(3, NULL);
        borrow(8 * MiB, 2 * MiB, true, &g);
        cr_assert_eq(broker_reclaim(broker, producer, 2 * MiB, false, false, "x", &r, err), 0);
        cr_assert_eq(r.n_pending, 1);
        drain_notices();
        broker_gpu_gone(broker, consumer);
        cr_assert_eq(broker->n_leases, 0);
        cr_assert_eq(broker->dram_granted, 0);
        cr_assert_eq(list_length(&producer->free_chunks), 2);
        /* The chunk it was asked to return goes to the producer now that nothing maps it. */
        cr_assert_eq(notices(NOTICE_RECLAIMED, producer, NULL, NULL, NULL, 0), 1);
        broker_reclaim_clear(&r);
}

Test(lease, producer_death_keeps_leased_chunks_and_asks_consumers_to_move_off)
{
        struct broker_grant g;
        char reason[64];
        uint64_t ids[16];
        size_t n = 0;
        struct lease *l;

        offer(3, NULL);
        l = borrow(4 * MiB, 4 * MiB, false, &g);
        broker_gpu_gone(broker, producer);
        cr_assert_eq(broker->n_chunks, 2, "the free chunk is dropped, the leased ones stay");
        cr_assert_eq(l->state, LEASE_RECLAIMING);
        cr_assert_eq(notices(NOTICE_RECLAIM, consumer, ids, &n, reason, sizeof(reason)), 1);
        cr_assert_eq(n, 2);
        cr_assert_str_eq(reason, "producer gone");
        broker_tick(broker, now_mono_ns() + 100 * NSEC_PER_SEC);
        cr_assert_not(consumer->barred, "no deadline when the producer is gone");
        cr_assert_eq(broker_return(broker, consumer, l->id, NULL, 0, 0, NULL, err), 0);
        cr_assert_eq(broker->n_chunks, 0);
        cr_assert_eq(broker->n_leases, 0);
}

/* Found by fuzz-core: a lease whose chunks all came back unusable still names its producer. */
Test(lease, a_producer_gone_under_a_lease_emptied_by_unusable_chunks_outlives_it)
{
        struct broker_grant g;
        uint64_t ids[2];
        struct lease *l;
        struct gpu *p;

        offer(2, NULL);
        l = borrow(4 * MiB, 4 * MiB, false, &g);
        for (size_t i = 0; i < 2; i++)
                ids[i] =
                    list_entry(i ? l->chunks.next->next : l->chunks.next, struct chunk, lease_node)
                        ->id;
        cr_assert_eq(broker_return_unusable(broker, consumer, l->id, ids, 2, err), 0, "%s", err);
        cr_assert_eq(l->n_chunks, 0, "the lease stays, empty, for the consumer's Return");
        drain_notices(); /* the producer heard of them: nothing else holds it */
        broker_gpu_gone(broker, producer);
        p = broker_find_gpu(broker, "GPU-P");
        cr_assert_not_null(p, "the lease still names its producer");
        cr_assert_eq(l->producer, p);
        cr_assert_eq(broker_return(broker, consumer, l->id, NULL, 0, 0, NULL, err), 0, "%s", err);
        cr_assert_eq(broker->n_leases, 0);
        cr_assert_eq(broker_check(broker, err), 0, "%s", err);
}

Test(lease, drain_takes_everything_back_and_stops_grants)
{
        struct broker_reclaim r;
        struct broker_grant g;

        offer(3, NULL);
        borrow(2 * MiB, 2 * MiB, false, &g);
        cr_assert_eq(broker_drain(broker, producer, &r, err), 0);
        cr_assert_eq(r.n_free, 2);
        cr_assert_eq(r.n_pending, 1);
        cr_assert(producer->draining);
        cr_assert_eq(notices(NOTICE_RECLAIMED, producer, NULL, NULL, NULL, 0), 1);
        cr_assert_eq(broker_borrow(broker, consumer, 2 * MiB, 2 * MiB, false, &g, err),
                     E(NO_MEMORY));
        broker_reclaim_clear(&r);
}

/* ------------------------------------------------------------------------------ restart */

static struct broker *restart(void)
{
        struct journal *j = NULL;
        struct broker *p = NULL;

        cr_assert_eq(broker_new(&settings, &p), 0);
        cr_assert_eq(journal_open(journal_path, broker_apply, p, &j, NULL), 0);
        broker_attach_journal(p, j, 1 << 20);
        return p;
}

static void with_journal(void)
{
        struct journal *j = NULL;

        snprintf(dir, sizeof(dir), "/tmp/test-lease-XXXXXX");
        cr_assert_not_null(mkdtemp(dir));
        snprintf(journal_path, sizeof(journal_path), "%s/journal", dir);
        cr_assert_eq(journal_open(journal_path, NULL, NULL, &j, NULL), 0);
        broker_attach_journal(broker, j, 1 << 20);
}

Test(lease, a_restart_keeps_leases_both_sides_re_register_and_reports_the_rest_lost)
{
        struct broker_held held[4];
        struct broker_welcome w;
        struct broker_grant g;
        uint64_t chunk_ids[3], lease_id;
        int fds[3];

        with_journal();
        offer(3, chunk_ids);
        lease_id = borrow(4 * MiB, 4 * MiB, true, &g)->id;
        cr_assert_eq(broker_commit(broker), 0);
        broker = broker_free(broker); /* the daemon dies */

        broker = restart();
        cr_assert_eq(broker->n_chunks, 3);
        cr_assert_eq(broker->n_leases, 1);
        consumer = broker_find_gpu(broker, "GPU-C");
        cr_assert(consumer->restored);

        /* The consumer holds its lease and claims one the daemon never granted. */
        for (int i = 0; i < 2; i++) {
                held[i] = (struct broker_held){0};
                held[i].chunk_id = chunk_ids[i];
                held[i].size = 2 * MiB;
                held[i].lease_id = lease_id;
        }
        held[2] = (struct broker_held){0};
        held[2].chunk_id = 77;
        held[2].lease_id = 4242;
        consumer = hello("GPU-C", GPU_ROLE_CONSUMER, "GPU-P", &consumer_client, held, 3, NULL, &w);
        cr_assert_eq(w.n_lost_leases, 1);
        cr_assert_eq(w.lost_leases[0], 4242);
        free(w.lost_leases);

        /* The producer re-registers its three chunks with their handles. */
        for (int i = 0; i < 3; i++) {
                held[i] = (struct broker_held){0};
                held[i].chunk_id = chunk_ids[i];
                held[i].size = 2 * MiB;
                held[i].lease_id = i < 2 ? lease_id : 0;
                fds[i] = memfd_create("chunk", MFD_CLOEXEC);
        }
        producer = hello("GPU-P", GPU_ROLE_PRODUCER, "GPU-C", &producer_client, held, 3, fds, &w);
        cr_assert_eq(w.n_lost_leases, 0);
        free(w.lost_leases);
        for (int i = 0; i < 3; i++)
                cr_assert_eq(fds[i], -1);

        cr_assert_eq(broker->n_leases, 1);
        cr_assert_eq(broker_find_lease(broker, lease_id)->n_chunks, 2);
        cr_assert_eq(list_length(&producer->free_chunks), 1);
        /* A new grant does not reuse an id from before the restart. */
        cr_assert_gt(borrow(2 * MiB, 2 * MiB, false, &g)->id, lease_id);
}

/* An operator's drain is not the producer's to undo: it lasts through the producer's client
 * leaving and a new one registering (a supervisor's restart), and through aquad's restart,
 * refusing every offer with its own outcome, until an operator undrains the GPU. */
Test(lease, a_drain_outlives_its_producers_restart_and_aquads_until_undrained)
{
        uint64_t sizes[1] = {2 * MiB}, refs[1] = {1}, ids[1];
        struct broker_reclaim r;
        int fds[1];

        with_journal();
        offer(1, NULL);
        cr_assert_eq(broker_drain(broker, producer, &r, err), 0, "%s", err);
        broker_reclaim_clear(&r);
        drain_notices();
        broker_gpu_gone(broker, producer);
        producer =
            hello("GPU-P", GPU_ROLE_PRODUCER, "GPU-C", &producer_client, NULL, 0, NULL, NULL);
        cr_assert(producer->draining, "a new client of the GPU ended the drain");
        fds[0] = memfd_create("chunk", MFD_CLOEXEC);
        cr_assert_eq(broker_offer(broker, producer, sizes, refs, fds, NULL, 1, ids, err),
                     E(DRAINING));
        cr_assert(strstr(err, "drained by an operator") && strstr(err, "aquactl undrain"), "%s",
                  err);
        close(fds[0]);

        cr_assert_eq(broker_commit(broker), 0);
        broker = broker_free(broker); /* the daemon dies */
        broker = restart();
        cr_assert(broker_find_gpu(broker, "GPU-P")->draining, "the restart ended the drain");
        consumer =
            hello("GPU-C", GPU_ROLE_CONSUMER, "GPU-P", &consumer_client, NULL, 0, NULL, NULL);
        producer =
            hello("GPU-P", GPU_ROLE_PRODUCER, "GPU-C", &producer_client, NULL, 0, NULL, NULL);
        cr_assert(producer->draining);

        cr_assert_eq(broker_admin_undrain(broker, "GPU-P", err), 0, "%s", err);
        cr_assert_eq(broker_admin_undrain(broker, "GPU-P", err), E(INVALID));
        cr_assert(strstr(err, "is not draining"), "%s", err);
        offer(1, NULL);
        cr_assert_eq(broker_check(broker, err), 0, "%s", err);
}

static enum proc_liveness holder_liveness = PROC_UNKNOWN;

static enum proc_liveness liveness(const struct proc_id *id)
{
        return holder_liveness;
}

Test(lease, a_restart_releases_what_a_client_that_never_returns_held_once_it_is_gone)
{
        struct broker_grant g;

        with_journal();
        offer(2, NULL);
        borrow(2 * MiB, 2 * MiB, false, &g);
        cr_assert_eq(broker_commit(broker), 0);
        broker = broker_free(broker);

        broker = restart();
        producer =
            hello("GPU-P", GPU_ROLE_PRODUCER, "GPU-C", &producer_client, NULL, 0, NULL, NULL);
        /* It re-registered holding nothing: everything of it is dropped, the lease orphaned. */
        cr_assert_eq(broker->n_leases, 1);
        broker->settings.liveness = liveness;
        holder_liveness = PROC_UNKNOWN;
        broker_tick(broker, now_mono_ns() + 10 * NSEC_PER_SEC);
        /* Silent, and nobody can say its process is gone: it may still map the lease. */
        cr_assert_eq(broker->n_leases, 1);
        cr_assert(broker_find_gpu(broker, "GPU-C")->held_alive);
        holder_liveness = PROC_GONE;
        broker_tick(broker, now_mono_ns() + 20 * NSEC_PER_SEC);
        /* The consumer never came back and its process is gone: its lease is gone. */
        cr_assert_eq(broker->n_leases, 0);
        cr_assert_eq(broker->stats.leases_lost, 1);
        cr_assert_eq(broker->n_chunks, 0);
}

Test(lease, a_snapshot_replays_to_the_same_state)
{
        Aquaj__JournalRecord *snap = NULL;
        struct broker_grant g;
        struct broker *copy;

        offer(4, NULL);
        borrow(4 * MiB, 4 * MiB, true, &g);
        cr_assert_eq(broker_return(broker, consumer, g.lease->id, NULL, 0, 0, NULL, err), 0);
        borrow(12 * MiB, 12 * MiB, true, &g);
        cr_assert_eq(broker_pin(broker, "GPU-P", "GPU-C", err), 0, "%s", err);
        cr_assert_eq(broker_snapshot(broker, &snap), 0);
        cr_assert_eq(broker_new(&settings, &copy), 0);
        cr_assert_eq(broker_apply(snap, copy), 0);
        cr_assert_eq(copy->n_chunks, 4);
        cr_assert_eq(copy->n_leases, 1);
        cr_assert_eq(copy->lent_bytes, 8 * MiB);
        cr_assert_eq(copy->dram_granted, 4 * MiB);
        cr_assert_eq(broker_find_gpu(copy, "GPU-C")->dram_bytes, 4 * MiB);
        cr_assert_eq(copy->n_pins, 1);
        cr_assert_eq(copy->next_lease_id, broker->next_lease_id);
        aquaj__journal_record__free_unpacked(snap, NULL);
        broker_free(copy);
}

Test(lease, a_restart_asks_a_re_registering_consumer_again_for_what_is_being_reclaimed)
{
        struct broker_held held[2];
        struct broker_reclaim r;
        struct broker_grant g;
        uint64_t chunk_ids[2], lease_id, ids[4];
        char reason[64];
        size_t n = 0;

        with_journal();
        offer(2, chunk_ids);
        lease_id = borrow(4 * MiB, 4 * MiB, false, &g)->id;
        cr_assert_eq(
            broker_reclaim(broker, producer, 2 * MiB, false, false, "producer load", &r, err), 0);
        broker_reclaim_clear(&r);
        cr_assert_eq(broker_commit(broker), 0);
        drain_notices();
        broker = broker_free(broker);

        broker = restart();
        for (int i = 0; i < 2; i++) {
                held[i] = (struct broker_held){0};
                held[i].chunk_id = chunk_ids[i];
                held[i].size = 2 * MiB;
                held[i].lease_id = lease_id;
        }
        consumer =
            hello("GPU-C", GPU_ROLE_CONSUMER, "GPU-P", &consumer_client, held, 2, NULL, NULL);
        cr_assert_eq(notices(NOTICE_RECLAIM, consumer, ids, &n, reason, sizeof(reason)), 1);
        cr_assert_eq(n, 1);
        cr_assert_str_eq(reason, "producer load");
}

/* Pins from a placer plan name GPUs by ordinal; they must win over automatic pairing. */
/* A fabric producer's chunks: handles of BROKER_FABRIC_HANDLE_SIZE bytes, no descriptors. */
static void offer_fabric(size_t n, uint8_t *ret_handles)
{
        uint64_t sizes[16], refs[16], ids[16];

        for (size_t i = 0; i < n; i++) {
                sizes[i] = 2 * MiB;
                refs[i] = 200 + i;
                memset(ret_handles + i * BROKER_FABRIC_HANDLE_SIZE, 0xa0 + (int)i,
                       BROKER_FABRIC_HANDLE_SIZE);
        }
        cr_assert_eq(broker_offer(broker, producer, sizes, refs, NULL, ret_handles, n, ids, err), 0,
                     "%s", err);
}

Test(lease, fabric_handles_go_only_to_a_consumer_that_takes_them)
{
        uint8_t handles[2 * BROKER_FABRIC_HANDLE_SIZE];
        struct broker_grant g;
        size_t i = 0;

        offer_fabric(2, handles);
        /* A local consumer takes descriptors, which these chunks do not have. */
        cr_assert_eq(broker_borrow(broker, consumer, 2 * MiB, 2 * MiB, false, &g, err),
                     E(NO_MEMORY));
        consumer->fabric = true;
        cr_assert_not_null(borrow(4 * MiB, 4 * MiB, false, &g));
        for (struct list_node *n = g.lease->chunks.next; n != &g.lease->chunks; n = n->next, i++) {
                const struct chunk *c = list_entry(n, struct chunk, lease_node);
                cr_assert_eq(c->fd, -1);
                cr_assert_arr_eq(c->fabric,
                                 handles + (c->client_ref - 200) * BROKER_FABRIC_HANDLE_SIZE,
                                 BROKER_FABRIC_HANDLE_SIZE, "the bytes the producer gave");
        }
        cr_assert_eq(i, 2);
}

Test(lease, a_consumer_that_cannot_be_heard_keeps_its_lease_until_it_registers_it_again)
{
        uint8_t handles[2 * BROKER_FABRIC_HANDLE_SIZE];
        struct broker_reclaim rec = {0};
        struct broker_welcome w;
        struct broker_held held[2];
        struct broker_grant g;
        size_t i = 0;

        offer_fabric(2, handles);
        consumer->fabric = true;
        cr_assert_not_null(borrow(4 * MiB, 4 * MiB, false, &g));
        for (struct list_node *n = g.lease->chunks.next; n != &g.lease->chunks; n = n->next, i++)
                held[i] =
                    (struct broker_held){.chunk_id = list_entry(n, struct chunk, lease_node)->id,
                                         .size = 2 * MiB,
                                         .lease_id = g.lease->id};
        broker_gpu_detach(broker, consumer);
        cr_assert_null(consumer->owner);
        cr_assert(consumer->held_alive, "named silent at once");
        /* The producer's reuse waits: nothing comes back while the consumer may map it. */
        cr_assert_eq(broker_reclaim(broker, producer, 4 * MiB, false, false, "test", &rec, err), 0);
        cr_assert_eq(rec.n_free, 0);
        cr_assert_eq(rec.n_pending, 2);
        broker_reclaim_clear(&rec);
        broker_tick(broker, now_mono_ns() + 10 * NSEC_PER_SEC);
        cr_assert_eq(broker->n_leases, 1, "silence never releases it");
        /* It registers again from a new connection, listing what it maps: the lease is kept
         * and the reclaim is asked again. */
        drain_notices();
        cr_assert_eq(
            hello("GPU-C", GPU_ROLE_CONSUMER, "GPU-P", &consumer_client, held, 2, NULL, &w),
            consumer);
        cr_assert_eq(w.n_lost_leases, 0);
        free(w.lost_leases);
        cr_assert_eq(broker->n_leases, 1);
        cr_assert_eq(notices(NOTICE_RECLAIM, consumer, NULL, NULL, NULL, 0), 1);
}

Test(lease, an_operator_releases_what_an_unheard_consumer_held)
{
        uint8_t handles[2 * BROKER_FABRIC_HANDLE_SIZE];
        struct broker_grant g;

        offer_fabric(2, handles);
        consumer->fabric = true;
        cr_assert_not_null(borrow(4 * MiB, 4 * MiB, false, &g));
        cr_assert_eq(broker_admin_release(broker, "GPU-C", false, NULL, err), E(BUSY),
                     "registered: %s", err);
        broker_gpu_detach(broker, consumer);
        /* Nothing can tell whether it still maps them: only the operator's word releases. */
        cr_assert_eq(broker_admin_release(broker, "GPU-C", false, NULL, err), E(BUSY), "%s", err);
        cr_assert(strstr(err, "--force"), "%s", err);
        cr_assert_eq(broker_admin_release(broker, "GPU-C", true, NULL, err), 0, "%s", err);
        cr_assert_eq(broker->n_leases, 0);
        cr_assert_eq(producer->lent_bytes, 0, "the producer's memory is free again");
}

Test(lease, an_unheard_producer_has_its_own_reconcile_window_then_is_gone)
{
        uint8_t handles[2 * BROKER_FABRIC_HANDLE_SIZE];
        struct broker_grant g;
        uint64_t t0 = now_mono_ns();

        offer_fabric(2, handles);
        consumer->fabric = true;
        cr_assert_not_null(borrow(2 * MiB, 2 * MiB, false, &g));
        /* A silent consumer makes the window close every second (its window: 1 s). */
        broker_gpu_detach(broker, consumer);
        broker->settings.reconcile_timeout_ns = 10 * NSEC_PER_SEC;
        broker_gpu_detach(broker, producer);
        cr_assert_eq(list_length(&producer->free_chunks), 0, "no handles: nothing to grant");
        broker_tick(broker, t0 + 2 * NSEC_PER_SEC);
        broker_tick(broker, t0 + 4 * NSEC_PER_SEC);
        cr_assert_eq(broker_find_gpu(broker, "GPU-P"), producer, "inside its own window");
        cr_assert(producer->restored);
        broker_tick(broker, t0 + 12 * NSEC_PER_SEC);
        cr_assert(!broker_find_gpu(broker, "GPU-P") || !broker_find_gpu(broker, "GPU-P")->restored,
                  "gone once its window closed");
        cr_assert_eq(broker->n_leases, 1, "the consumer's lease stays, orphaned");
}

Test(pins, pair_gpus_named_by_ordinal)
{
        static const char *const prod[] = {"2", "3"}, *const cons[] = {"1", "0"};
        const char *uuids[] = {"GPU-A", "GPU-B", "GPU-C", "GPU-D"};
        enum gpu_role roles[] = {GPU_ROLE_CONSUMER, GPU_ROLE_CONSUMER, GPU_ROLE_PRODUCER,
                                 GPU_ROLE_PRODUCER};
        struct broker_link links[4];
        struct gpu *g[4];
        struct client owners[4];

        cr_assert_eq(broker_new(&settings, &broker), 0);
        cr_assert_eq(broker_set_config_pins(broker, prod, cons, 2), 0);
        for (int i = 0; i < 4; i++) {
                links[i] = (struct broker_link){.uuid = uuids[i], .bandwidth = 400};
        }
        for (uint32_t i = 0; i < 4; i++) {
                struct broker_hello h = {.who = &tenant,
                                         .uuid = uuids[i],
                                         .ordinal = i,
                                         .role = roles[i],
                                         .granularity = 2 * MiB,
                                         .links = links,
                                         .n_links = 4,
                                         .client_name = uuids[i]};
                struct broker_welcome w = {0};

                cr_assert_eq(broker_register(broker, &h, &owners[i], &w, err), 0, "%s", err);
                free(w.lost_leases);
                g[i] = w.gpu;
        }
        cr_assert_eq(g[0]->paired, g[3], "consumer 0 pinned to producer 3");
        cr_assert_eq(g[1]->paired, g[2], "consumer 1 pinned to producer 2");
        drain_notices();
        broker = broker_free(broker);
}

/* GPUs report links without a bandwidth; the operator's probe file says which link is fast. */
Test(pins, auto_pairing_prefers_the_faster_link_of_the_topology_file)
{
        struct topology_device devs[3] = {
            {.uuid = "GPU-C"}, {.uuid = "GPU-SLOW"}, {.uuid = "GPU-FAST"}};
        uint64_t bw[9] = {
            0, 100000000000ull, 900000000000ull, 100000000000ull, 0, 0, 900000000000ull, 0, 0};
        struct topology topo = {.devices = devs, .n_devices = 3, .bandwidth = bw};
        struct broker_settings with_links = settings;
        const char *uuids[] = {"GPU-SLOW", "GPU-FAST", "GPU-C"};
        enum gpu_role roles[] = {GPU_ROLE_PRODUCER, GPU_ROLE_PRODUCER, GPU_ROLE_CONSUMER};
        struct broker_link links[3];
        struct gpu *g[3];
        struct client owners[3];

        with_links.links = &topo;
        cr_assert_eq(broker_new(&with_links, &broker), 0);
        for (int i = 0; i < 3; i++) {
                links[i] = (struct broker_link){.uuid = uuids[i]};
        }
        for (uint32_t i = 0; i < 3; i++) {
                struct broker_hello h = {.who = &tenant,
                                         .uuid = uuids[i],
                                         .ordinal = i,
                                         .role = roles[i],
                                         .granularity = 2 * MiB,
                                         .links = links,
                                         .n_links = 3,
                                         .client_name = uuids[i]};
                struct broker_welcome w = {0};

                cr_assert_eq(broker_register(broker, &h, &owners[i], &w, err), 0, "%s", err);
                free(w.lost_leases);
                g[i] = w.gpu;
        }
        cr_assert_eq(g[2]->paired, g[1], "the consumer pairs over the 900 GB/s link");
        drain_notices();
        broker = broker_free(broker);
}

/* Registers uuid on host with links to the uuids in peers (no bandwidth reported). */
static struct gpu *hello_on(const char *host, const char *uuid, enum gpu_role role,
                            const char *const *peers, size_t n_peers, struct client *owner)
{
        struct broker_link links[4] = {{0}};
        struct broker_hello h = {.who = &tenant,
                                 .uuid = uuid,
                                 .role = role,
                                 .granularity = 2 * MiB,
                                 .links = links,
                                 .n_links = n_peers,
                                 .host = host,
                                 .client_name = uuid};
        struct broker_welcome w = {0};

        for (size_t i = 0; i < n_peers; i++)
                links[i] = (struct broker_link){.uuid = peers[i]};
        cr_assert_eq(broker_register(broker, &h, owner, &w, err), 0, "%s", err);
        free(w.lost_leases);
        return w.gpu;
}

/*
 * One NVLink domain of two hosts: the topology file links GPU-P (node-a) to GPU-R (node-b) at
 * 900 GB/s, which no client can report; GPU-L is on GPU-P's host at 100 GB/s.
 */
Test(pins, auto_pairing_links_hosts_from_the_topology_file_and_prefers_the_same_host)
{
        struct topology_device devs[3] = {{.uuid = "GPU-P", .host = "node-a"},
                                          {.uuid = "GPU-L", .host = "node-a"},
                                          {.uuid = "GPU-R", .host = "node-b"}};
        uint64_t bw[9] = {
            0, 100000000000ull, 900000000000ull, 100000000000ull, 0, 0, 900000000000ull, 0, 0};
        struct topology topo = {.devices = devs, .n_devices = 3, .bandwidth = bw};
        struct broker_settings with_links = settings;
        const char *to_l[] = {"GPU-L"}, *to_p[] = {"GPU-P"};
        struct client owners[3];
        struct gpu *p, *l, *r;

        with_links.links = &topo;
        cr_assert_eq(broker_new(&with_links, &broker), 0);
        l = hello_on("node-a", "GPU-L", GPU_ROLE_CONSUMER, to_p, 1, &owners[0]);
        r = hello_on("node-b", "GPU-R", GPU_ROLE_CONSUMER, NULL, 0, &owners[1]);
        p = hello_on("node-a", "GPU-P", GPU_ROLE_PRODUCER, to_l, 1, &owners[2]);
        cr_assert_eq(p->paired, l, "a same-host consumer over a faster cross-host one");
        cr_assert_null(r->paired);
        broker_gpu_gone(broker, l);
        cr_assert_eq(p->paired, r, "then the consumer on the other host, over the fabric");
        cr_assert_float_eq(p->pair_bandwidth, 900.0, 1e-9);
        drain_notices();
        broker = broker_free(broker);
}

/* Hosts not known: the topology file's hosts add no link, as before hosts existed. */
Test(pins, auto_pairing_adds_no_cross_host_link_for_gpus_without_a_host)
{
        struct topology_device devs[2] = {{.uuid = "GPU-P", .host = "node-a"},
                                          {.uuid = "GPU-R", .host = "node-b"}};
        uint64_t bw[4] = {0, 900000000000ull, 900000000000ull, 0};
        struct topology topo = {.devices = devs, .n_devices = 2, .bandwidth = bw};
        struct broker_settings with_links = settings;
        struct client owners[2];
        struct gpu *p;

        with_links.links = &topo;
        cr_assert_eq(broker_new(&with_links, &broker), 0);
        p = hello_on(NULL, "GPU-P", GPU_ROLE_PRODUCER, NULL, 0, &owners[0]);
        hello_on(NULL, "GPU-R", GPU_ROLE_CONSUMER, NULL, 0, &owners[1]);
        cr_assert_eq(p->paired, NULL);
        drain_notices();
        broker = broker_free(broker);
}

/* Registers uuid with an ordinal and no links. */
static struct gpu *hello_ordinal(const char *uuid, uint32_t ordinal, enum gpu_role role,
                                 struct client *owner)
{
        struct broker_hello h = {.who = &tenant,
                                 .uuid = uuid,
                                 .ordinal = ordinal,
                                 .role = role,
                                 .granularity = 2 * MiB,
                                 .client_name = uuid};
        struct broker_welcome w = {0};

        cr_assert_eq(broker_register(broker, &h, owner, &w, err), 0, "%s", err);
        free(w.lost_leases);
        return w.gpu;
}

/* Custody by identity, item 8: names that cannot mislead, before and after a restart. */
Test(lease, a_restored_gpu_keeps_its_ordinal_and_host_and_an_ambiguous_name_is_refused)
{
        struct broker_grant g;
        struct gpu *x = NULL;

        with_journal();
        producer->ordinal = 2;
        consumer->ordinal = 0;
        free(consumer->host);
        consumer->host = strdup("node-a");
        journal_gpu(broker, producer);
        journal_gpu(broker, consumer);
        offer(1, NULL);
        borrow(2 * MiB, 2 * MiB, false, &g);
        cr_assert_eq(broker_commit(broker), 0);
        broker = broker_free(broker);

        broker = restart();
        cr_assert_eq(broker_lookup_gpu(broker, "2", "release", &x, err), 0, "%s", err);
        cr_assert_str_eq(x->uuid, "GPU-P", "GPU 2 is the producer, not the first one restored");
        cr_assert_eq(broker_lookup_gpu(broker, "node-a:0", "release", &x, err), 0, "%s", err);
        cr_assert_str_eq(x->uuid, "GPU-C");
        cr_assert_str_eq(x->client_name, "GPU-C", "its client's name survives too");
        /* A second GPU 0 on another host: "0" names two and is refused, listing both. */
        consumer = NULL;
        hello_on("node-b", "GPU-D", GPU_ROLE_CONSUMER, NULL, 0, &consumer_client);
        cr_assert_eq(broker_lookup_gpu(broker, "0", "release", &x, err), E(INVALID));
        cr_assert(strstr(err, "GPU-C (node-a)") && strstr(err, "GPU-D (node-b)"), "%s", err);
        cr_assert_eq(broker_admin_release(broker, "0", true, NULL, err), E(INVALID), "%s", err);
        cr_assert_eq(broker->n_leases, 1, "nothing released on an ambiguous name");
        cr_assert_eq(broker_lookup_gpu(broker, "node-b:0", "release", &x, err), 0, "%s", err);
        cr_assert_str_eq(x->uuid, "GPU-D");
}

/* Static pairs written by GPU number hold after a restart, whoever registered first. */
Test(pins, pairs_by_ordinal_hold_for_restored_gpus)
{
        static const char *const prod[] = {"2"}, *const cons[] = {"0"};
        struct client owners[2];
        struct gpu *p, *c;

        snprintf(dir, sizeof(dir), "/tmp/test-lease-XXXXXX");
        cr_assert_not_null(mkdtemp(dir));
        snprintf(journal_path, sizeof(journal_path), "%s/journal", dir);
        cr_assert_eq(broker_new(&settings, &broker), 0);
        {
                struct journal *j = NULL;
                cr_assert_eq(journal_open(journal_path, NULL, NULL, &j, NULL), 0);
                broker_attach_journal(broker, j, 1 << 20);
        }
        cr_assert_eq(broker_set_config_pins(broker, prod, cons, 1), 0);
        p = hello_ordinal("GPU-X", 2, GPU_ROLE_PRODUCER, &owners[0]);
        c = hello_ordinal("GPU-Y", 0, GPU_ROLE_CONSUMER, &owners[1]);
        cr_assert_eq(c->paired, p);
        producer = p;
        offer(2, NULL);
        cr_assert_eq(broker_commit(broker), 0);
        drain_notices();
        broker = broker_free(broker);

        broker = restart();
        cr_assert_eq(broker_set_config_pins(broker, prod, cons, 1), 0);
        /* GPU 0 comes back first, while GPU 2 (which lends) is still the restored one: "2" and
         * "0" name them as before the restart, and the pair holds. */
        p = broker_find_gpu(broker, "GPU-X");
        cr_assert_eq(broker_lookup_gpu(broker, "2", "pair", &c, err), 0, "%s", err);
        cr_assert_eq(c, p, "GPU 2 is GPU-X, restored");
        c = hello_ordinal("GPU-Y", 0, GPU_ROLE_CONSUMER, &owners[1]);
        cr_assert_eq(c->paired, p, "the pair by number holds after the restart");
        cr_assert_eq(broker_lookup_gpu(broker, "0", "pair", &p, err), 0, "%s", err);
        cr_assert_eq(p, c);
        drain_notices();
        broker = broker_free(broker);
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        cr_assert_eq(system(cmd), 0);
        dir[0] = '\0';
}

/* A GPU of the pins' tests, with a peer link to every other one of them. */
static struct gpu *hello_linked(const char *uuid, uint32_t ordinal, enum gpu_role role,
                                struct client *owner)
{
        static const char *const all[] = {"GPU-A", "GPU-B", "GPU-C", "GPU-D",
                                          "GPU-O", "GPU-X", "GPU-Y"};
        struct broker_link links[ARRAY_SIZE(all)];
        struct broker_hello h = {.who = &tenant,
                                 .uuid = uuid,
                                 .ordinal = ordinal,
                                 .role = role,
                                 .granularity = 2 * MiB,
                                 .links = links,
                                 .n_links = ARRAY_SIZE(all),
                                 .client_name = uuid};
        struct broker_welcome w = {0};

        for (size_t i = 0; i < ARRAY_SIZE(all); i++)
                links[i] = (struct broker_link){.uuid = all[i], .bandwidth = 400};
        cr_assert_eq(broker_register(broker, &h, owner, &w, err), 0, "%s", err);
        free(w.lost_leases);
        return w.gpu;
}

/* A snapshot in the journal (every SIGTERM writes one) replaces the operator's pins, never the
 * config's, whichever of the two was set first. */
Test(pins, a_snapshot_keeps_the_configs_pins)
{
        static const char *const prod[] = {"2"}, *const cons[] = {"0"};
        Aquaj__JournalRecord *snap = NULL;
        struct broker *copy;

        cr_assert_eq(broker_new(&settings, &broker), 0);
        cr_assert_eq(broker_set_config_pins(broker, prod, cons, 1), 0);
        cr_assert_eq(broker_snapshot(broker, &snap), 0);
        cr_assert_eq(broker_new(&settings, &copy), 0);
        cr_assert_eq(broker_set_config_pins(copy, prod, cons, 1), 0);
        cr_assert_eq(broker_apply(snap, copy), 0);
        cr_assert_eq(copy->n_pins, 1, "the config's pin is still there");
        cr_assert_str_eq(copy->pins[0].source, "config");
        aquaj__journal_record__free_unpacked(snap, NULL);
        broker_free(copy);
        broker = broker_free(broker);
}

/* One GPU is in one pin however pins name it: an operator's pin by uuid wins over the config's by
 * ordinal, and the pairing neither fails nor pairs a GPU twice. */
Test(pins, an_operators_pin_by_uuid_wins_over_the_configs_by_ordinal)
{
        static const char *const prod[] = {"2", "3"}, *const cons[] = {"0", "1"};
        struct client owners[4];
        struct gpu *g[4];

        cr_assert_eq(broker_new(&settings, &broker), 0);
        cr_assert_eq(broker_set_config_pins(broker, prod, cons, 2), 0);
        g[0] = hello_linked("GPU-A", 0, GPU_ROLE_CONSUMER, &owners[0]);
        g[1] = hello_linked("GPU-B", 1, GPU_ROLE_CONSUMER, &owners[1]);
        g[2] = hello_linked("GPU-C", 2, GPU_ROLE_PRODUCER, &owners[2]);
        g[3] = hello_linked("GPU-D", 3, GPU_ROLE_PRODUCER, &owners[3]);
        cr_assert_eq(g[0]->paired, g[2]);
        cr_assert_eq(g[1]->paired, g[3]);
        cr_assert_eq(broker_pin(broker, "GPU-C", "GPU-B", err), 0, "%s", err);
        cr_assert_eq(g[1]->paired, g[2], "the operator's pin");
        /* Both config pins give way (each names a GPU of the operator's): 3 and 0 are free. */
        cr_assert_eq(g[0]->paired, g[3], "paired automatically once their pins gave way");
        cr_assert_eq(broker_unpin(broker, "GPU-C", err), 0, "%s", err);
        cr_assert_null(g[2]->paired, "unpinned: kept apart");
        cr_assert_null(g[0]->paired, "no producer is free for GPU 0");
        cr_assert_eq(g[3]->paired, g[1], "the config's pin of GPUs 3 and 1 stands again");
        drain_notices();
        broker = broker_free(broker);
}

/* A pinned GPU waits for its pin's other side: it is never lent to a stranger in the meantime,
 * only to be reclaimed when the planned GPU comes. */
Test(pins, a_pinned_producer_waits_for_its_consumer)
{
        static const char *const prod[] = {"2"}, *const cons[] = {"0"};
        struct client owners[3];
        struct gpu *p, *c, *other;

        cr_assert_eq(broker_new(&settings, &broker), 0);
        cr_assert_eq(broker_set_config_pins(broker, prod, cons, 1), 0);
        p = hello_linked("GPU-X", 2, GPU_ROLE_PRODUCER, &owners[0]);
        other = hello_linked("GPU-O", 1, GPU_ROLE_CONSUMER, &owners[1]);
        cr_assert_null(p->paired, "GPU 2 waits for GPU 0");
        cr_assert_null(other->paired, "and GPU 1 gets no producer of another's pin");
        c = hello_linked("GPU-Y", 0, GPU_ROLE_CONSUMER, &owners[2]);
        cr_assert_eq(c->paired, p);
        broker_gpu_gone(broker, p);
        cr_assert_null(c->paired, "its producer gone, the consumer waits");
        cr_assert_null(other->paired);
        drain_notices();
        broker = broker_free(broker);
}
