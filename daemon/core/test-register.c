/* Registration and reconciliation after a restart (register.c, broker-journal.c's replay):
 * leases kept, re-registered or lost, drains and custody restored, snapshots. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "test/fixture.h"

TestSuite(register, .init = setup, .fini = teardown);

static enum proc_liveness holder_liveness = PROC_UNKNOWN;

static enum proc_liveness liveness(const struct proc_id *id)
{
        return holder_liveness;
}


Test(register, a_restart_keeps_leases_both_sides_re_register_and_reports_the_rest_lost)
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
Test(register, a_drain_outlives_its_producers_restart_and_aquads_until_undrained)
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

Test(register, a_restart_releases_what_a_client_that_never_returns_held_once_it_is_gone)
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
        cr_assert(broker_find_gpu(broker, "GPU-C")->silent);
        holder_liveness = PROC_GONE;
        broker_tick(broker, now_mono_ns() + 20 * NSEC_PER_SEC);
        /* The consumer never came back and its process is gone: its lease is gone. */
        cr_assert_eq(broker->n_leases, 0);
        cr_assert_eq(broker->stats.leases_lost, 1);
        cr_assert_eq(broker->n_chunks, 0);
}

Test(register, a_snapshot_replays_to_the_same_state)
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

Test(register, a_restart_asks_a_re_registering_consumer_again_for_what_is_being_reclaimed)
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

/* Custody by identity, item 8: names that cannot mislead, before and after a restart. */
Test(register, a_restored_gpu_keeps_its_ordinal_and_host_and_an_ambiguous_name_is_refused)
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
