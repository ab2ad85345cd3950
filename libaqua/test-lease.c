/* Consumer leases on simcuda: import and map exported chunks, move them to host memory, undo. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake-daemon.h"
#include "gpu.h"
#include "lease.h"
#include "util.h"

#define CHUNK   (UINT64_C(2) << 20)
#define NCHUNKS 4

static struct gpu_dev *prod, *cons;
static struct lease_table table;
static gpu_handle handles[NCHUNKS];
static int fds[NCHUNKS];
static struct lease_grant_chunk grant[NCHUNKS];

static void setup(void)
{
        test_sim_machine("test-lease", "2x1GiB");
        cr_assert_eq(gpu_open(1, &prod), 0);
        cr_assert_eq(gpu_open(0, &cons), 0);
        for (int i = 0; i < NCHUNKS; i++) {
                cr_assert_eq(gpu_alloc_exportable(prod, CHUNK, false, &handles[i]), 0);
                cr_assert_eq(gpu_export(prod, handles[i], &fds[i]), 0);
                grant[i] = (struct lease_grant_chunk){.id = 100 + i, .size = CHUNK, .fd = fds[i]};
        }
}

static void teardown(void)
{
        lease_table_clear(&table, cons);
        for (int i = 0; i < NCHUNKS; i++) {
                if (handles[i])
                        gpu_release(prod, handles[i]);
                fds[i] = safe_close(fds[i]);
                handles[i] = 0;
        }
        prod = gpu_free(prod);
        cons = gpu_free(cons);
        test_sim_cleanup();
}

TestSuite(lease, .init = setup, .fini = teardown, .timeout = 60);

/* Let go of the producer's side of the chunks, as a producer that handed them over would. */
static void producer_lets_go(void)
{
        for (int i = 0; i < NCHUNKS; i++) {
                gpu_release(prod, handles[i]);
                handles[i] = 0;
                fds[i] = safe_close(fds[i]);
        }
}

static uint64_t used_on_producer(void)
{
        uint64_t free_b, total;

        cr_assert_eq(gpu_mem_info(prod, &free_b, &total), 0);
        return total - free_b;
}

static void fill(uint64_t dptr, uint64_t size, unsigned seed)
{
        uint32_t *buf = malloc(size);

        for (size_t i = 0; i < size / 4; i++)
                buf[i] = seed * 2654435761u + (uint32_t)i;
        cr_assert_eq(gpu_copy(cons, dptr, (uint64_t)(uintptr_t)buf, size), 0);
        free(buf);
}

static bool holds(uint64_t src, uint64_t size, unsigned seed)
{
        uint32_t *buf = malloc(size);
        bool ok = true;

        cr_assert_eq(gpu_copy(cons, (uint64_t)(uintptr_t)buf, src, size), 0);
        for (size_t i = 0; i < size / 4 && ok; i++)
                ok = buf[i] == seed * 2654435761u + (uint32_t)i;
        free(buf);
        return ok;
}

Test(lease, maps_granted_chunks_back_to_back_for_the_consumer)
{
        struct aqua_lease *l = NULL;

        cr_assert_eq(lease_create(&table, cons, 7, grant, NCHUNKS, false, &l), 0);
        cr_assert_eq(l->size, NCHUNKS * CHUNK);
        cr_assert_eq(table.peer_bytes, NCHUNKS * CHUNK);
        cr_assert_eq(lease_get(&table, 7), l);
        cr_assert_eq(lease_chunk_by_id(&table, 102), &l->chunks[2]);
        cr_assert_eq(l->chunks[2].offset, 2 * CHUNK);
        fill(l->dptr, l->size, 1);
        cr_assert(holds(l->dptr, l->size, 1));
}

Test(lease, keeps_the_data_at_the_same_address_when_a_chunk_moves_to_host_memory)
{
        struct aqua_lease *l = NULL;
        uint64_t before;

        cr_assert_eq(lease_create(&table, cons, 7, grant, NCHUNKS, false, &l), 0);
        for (int i = 0; i < NCHUNKS; i++)
                fill(l->dptr + i * CHUNK, CHUNK, 10 + i);
        producer_lets_go();
        before = used_on_producer();
        cr_assert_eq(before, NCHUNKS * CHUNK, "the consumer's mappings keep the memory alive");

        cr_assert_eq(lease_migrate(&table, cons, l, &l->chunks[1]), 0);
        cr_assert_eq(l->chunks[1].tier, AQUA_TIER_DRAM);
        cr_assert_null(l->chunks[1].host);
        cr_assert_eq(table.dram_bytes, CHUNK);
        cr_assert_eq(table.peer_bytes, (NCHUNKS - 1) * CHUNK);
        /* The producer's chunk is free once nobody maps it any more. */
        cr_assert_eq(used_on_producer(), before - CHUNK);
        for (int i = 0; i < NCHUNKS; i++)
                cr_assert(holds(l->dptr + i * CHUNK, CHUNK, 10 + i), "chunk %d", i);
        cr_assert_eq(lease_migrate(&table, cons, l, &l->chunks[1]), -EINVAL, "moved only once");
}

Test(lease, falls_back_to_pinned_memory_where_host_memory_cannot_be_mapped)
{
        struct aqua_lease *l = NULL;

        cr_assert_eq(lease_create(&table, cons, 7, grant, NCHUNKS, false, &l), 0);
        fill(l->dptr + 3 * CHUNK, CHUNK, 33);
        table.no_host_map = true;
        cr_assert_eq(lease_migrate(&table, cons, l, &l->chunks[3]), 0);
        cr_assert_eq(l->chunks[3].tier, AQUA_TIER_DRAM);
        cr_assert_not_null(l->chunks[3].host);
        cr_assert_not(l->chunks[3].mapped);
        cr_assert(holds((uint64_t)(uintptr_t)l->chunks[3].host, CHUNK, 33));
}

Test(lease, frees_everything_when_destroyed)
{
        struct aqua_lease *l = NULL;

        cr_assert_eq(lease_create(&table, cons, 7, grant, NCHUNKS, false, &l), 0);
        cr_assert_eq(lease_migrate(&table, cons, l, &l->chunks[0]), 0);
        producer_lets_go();
        lease_table_remove(&table, cons, l);
        cr_assert_null(lease_get(&table, 7));
        cr_assert_null(lease_chunk_by_id(&table, 101));
        cr_assert_eq(table.peer_bytes, 0);
        cr_assert_eq(table.dram_bytes, 0);
        cr_assert_eq(used_on_producer(), 0);
}

Test(lease, leaves_nothing_behind_when_a_chunk_cannot_be_imported)
{
        struct lease_grant_chunk bad[NCHUNKS];
        struct aqua_lease *l = NULL;

        memcpy(bad, grant, sizeof(bad));
        bad[0].fd = 0; /* stdin: not a simcuda allocation */
        bad[2].fd = 0;
        cr_assert_eq(lease_create(&table, cons, 7, bad, NCHUNKS, false, &l), -EIO);
        /* All the bad ones are named, for the daemon to drop them together. */
        for (size_t i = 0; i < NCHUNKS; i++)
                cr_assert_eq(bad[i].unusable, i == 0 || i == 2, "chunk %zu", i);
        cr_assert_null(lease_get(&table, 7));
        cr_assert_null(lease_chunk_by_id(&table, 100));
        cr_assert_eq(table.peer_bytes, 0);
        producer_lets_go();
        cr_assert_eq(used_on_producer(), 0, "the good imports were released");
}

Test(lease, refuses_a_chunk_that_is_not_a_multiple_of_the_granularity)
{
        struct aqua_lease *l = NULL;

        grant[1].size = CHUNK / 2;
        cr_assert_eq(lease_create(&table, cons, 7, grant, NCHUNKS, false, &l), -EPROTO);
        cr_assert_eq(table.peer_bytes, 0);
}
