/* The pool as the code outside the core sees it (view.c): its values agree with the books. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "test/fixture.h"

TestSuite(view, .init = setup, .fini = teardown);

/* What the transport and the metrics read (view.c) is what the books say, cut where asked. */
Test(view, the_views_agree_with_the_books)
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
