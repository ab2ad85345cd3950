/* The pins and the pairing over registered GPUs (pairs.c): ordinals, topology files, hosts,
 * restored GPUs, precedence, snapshots. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "test/fixture.h"

TestSuite(pairs, .init = setup, .fini = teardown);

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

Test(pairs, pair_gpus_named_by_ordinal)
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
Test(pairs, auto_pairing_prefers_the_faster_link_of_the_topology_file)
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

/*
 * One NVLink domain of two hosts: the topology file links GPU-P (node-a) to GPU-R (node-b) at
 * 900 GB/s, which no client can report; GPU-L is on GPU-P's host at 100 GB/s.
 */
Test(pairs, auto_pairing_links_hosts_from_the_topology_file_and_prefers_the_same_host)
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
Test(pairs, auto_pairing_adds_no_cross_host_link_for_gpus_without_a_host)
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

/* Static pairs written by GPU number hold after a restart, whoever registered first. */
Test(pairs, pairs_by_ordinal_hold_for_restored_gpus)
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

/* A snapshot in the journal (every SIGTERM writes one) replaces the operator's pins, never the
 * config's, whichever of the two was set first. */
Test(pairs, a_snapshot_keeps_the_configs_pins)
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
Test(pairs, an_operators_pin_by_uuid_wins_over_the_configs_by_ordinal)
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
Test(pairs, a_pinned_producer_waits_for_its_consumer)
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
