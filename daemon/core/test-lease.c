/* The lease state machine (lease.c): grants, partial grants, returns, reclaim with deadlines,
 * drain, fabric handles. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "test/fixture.h"

TestSuite(lease, .init = setup, .fini = teardown);

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
