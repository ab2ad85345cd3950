/* What ends leases from outside the state machine (departure.c): a client gone on either
 * side, a client unheard, an operator's release. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "test/fixture.h"

TestSuite(departure, .init = setup, .fini = teardown);

Test(departure, consumer_death_returns_its_chunks_and_dram_to_the_pool)
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

Test(departure, producer_death_keeps_leased_chunks_and_asks_consumers_to_move_off)
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
Test(departure, a_producer_gone_under_a_lease_emptied_by_unusable_chunks_outlives_it)
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

Test(departure, a_consumer_that_cannot_be_heard_keeps_its_lease_until_it_registers_it_again)
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
        cr_assert(consumer->silent, "named silent at once");
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

Test(departure, an_operator_releases_what_an_unheard_consumer_held)
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

Test(departure, an_unheard_producer_has_its_own_reconcile_window_then_is_gone)
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
