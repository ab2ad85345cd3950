/*
 * Aqua tensors and batched copies against the fake daemon, on simcuda: placement across tiers,
 * the DRAM budget, trim, reclaim to the same address (also with a copy in flight), promote after
 * a new lease, layer-wise transfers, and a long seeded random sequence with checksums.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aqua/aqua.h"
#include "ctx.h"
#include "cuda-driver.h"
#include "fake-daemon.h"
#include "gpu.h"
#include "util.h"

#define CHUNK     (UINT64_C(2) << 20)
#define MAX_PEER  64
#define LEASE_MAX 16

static struct fake fk;
static aqua_ctx *ctx;
static struct gpu_dev *peer, *local;

/* Chunks of GPU 1 as a producer would offer them; ids are 1000 + index. */
static gpu_handle peer_mem[MAX_PEER];
static size_t n_peer;
static uint64_t next_lease = 7;
static uint8_t *noise; /* see pattern() */

static char last_error[1024]; /* the last error libaqua logged */

static void test_log(enum aqua_log_level level, const char *message, void *userdata)
{
        fprintf(stderr, "libaqua[%d]: %s\n", level, message);
        if (level == AQUA_LOG_ERROR)
                snprintf(last_error, sizeof(last_error), "%s", message);
}

static void setup(void)
{
        aqua_set_log(test_log, NULL, AQUA_LOG_WARNING);
        test_sim_machine("test-tensor", "2x4GiB");
        fake_start(&fk);
        fake_open(&fk, 0, AQUA_ROLE_CONSUMER, "test-tensor", "GPU-peer", &ctx);
        cr_assert_eq(gpu_open(1, &peer), 0);
        cr_assert_eq(gpu_open(0, &local), 0);
        n_peer = 0;
        next_lease = 7;
}

static void teardown(void)
{
        ctx = aqua_close(ctx);
        for (size_t i = 0; i < n_peer; i++)
                gpu_release(peer, peer_mem[i]);
        peer = gpu_free(peer);
        local = gpu_free(local);
        fake_stop(&fk);
        test_sim_cleanup();
        free(noise);
        noise = NULL;
}

TestSuite(tensor, .init = setup, .fini = teardown, .timeout = 120);

/* ---------------------------------------------------------------- the fake daemon's part */

struct grant_job {
        size_t n;       /* chunks */
        uint64_t dram;  /* budget granted */
        uint64_t lease; /* its id */
        size_t first;   /* index of its first chunk in peer_mem */
};

static void *serve_grant(void *arg)
{
        struct grant_job *j = arg;
        Aqua__Envelope *e = fake_recv(&fk), reply = AQUA__ENVELOPE__INIT;
        Aqua__Grant g = AQUA__GRANT__INIT;
        Aqua__GrantedChunk gc[LEASE_MAX], *gcp[LEASE_MAX];
        Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
        int fds[LEASE_MAX];

        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_BORROW);
        for (size_t i = 0; i < j->n; i++) {
                cr_assert_eq(gpu_export(peer, peer_mem[j->first + i], &fds[i]), 0);
                aqua__granted_chunk__init(&gc[i]);
                gc[i].chunk_id = 1000 + j->first + i;
                gc[i].size = CHUNK;
                gcp[i] = &gc[i];
        }
        if (j->n) {
                f.kind = AQUA__SIDE_FRAME__KIND__KIND_GRANT_FDS;
                f.lease_id = j->lease;
                cr_assert_eq(side_send(fk.side_fd, &f, fds, j->n), 0);
                side_close_fds(fds, j->n);
        }
        g.lease_id = j->n ? j->lease : 0;
        g.n_chunks = j->n;
        g.chunks = gcp;
        g.dram_bytes = j->dram;
        reply.body_case = AQUA__ENVELOPE__BODY_GRANT;
        reply.grant = &g;
        reply.request_id = e->request_id;
        fake_send(&fk, &reply);
        aqua__envelope__free_unpacked(e, NULL);
        return NULL;
}

/* Borrow n new peer chunks as a tensor pool (and a DRAM budget); returns the lease. */
static aqua_lease *borrow_pool(size_t n, uint64_t dram)
{
        struct grant_job j = {.n = n, .dram = dram, .lease = next_lease++, .first = n_peer};
        struct aqua_grant g;
        pthread_t th;

        cr_assert_leq(n_peer + n, MAX_PEER);
        for (size_t i = 0; i < n; i++)
                cr_assert_eq(gpu_alloc_exportable(peer, CHUNK, false, &peer_mem[n_peer++]), 0);
        pthread_create(&th, NULL, serve_grant, &j);
        cr_assert_eq(aqua_borrow(ctx, n ? n * CHUNK : dram, 0,
                                 AQUA_BORROW_TENSORS | AQUA_BORROW_ALLOW_DRAM, &g),
                     0);
        pthread_join(th, NULL);
        cr_assert_eq(g.dptr, 0, "a pool lease's range is libaqua's");
        cr_assert_eq(g.dram_bytes, dram);
        return g.lease;
}

/* Acknowledge a Return (and free it): every chunk it names is back. */
static void answer_return(Aqua__Envelope *e)
{
        Aqua__Envelope r = AQUA__ENVELOPE__INIT;
        Aqua__ReturnReply rr = AQUA__RETURN_REPLY__INIT;

        rr.lease_id = e->return_->lease_id;
        rr.returned = (uint32_t)e->return_->n_chunk_ids;
        r.body_case = AQUA__ENVELOPE__BODY_RETURN_REPLY;
        r.return_reply = &rr;
        r.request_id = e->request_id;
        fake_send(&fk, &r);
        aqua__envelope__free_unpacked(e, NULL);
}

/* Send a reclaim notice for chunk ids and poll until libaqua returns them; *ret_moved gets the
 * tensor bytes the events reported as moved. */
static void reclaim(uint64_t lease_id, const uint64_t *ids, size_t n, uint64_t *ret_moved)
{
        Aqua__Envelope notice = AQUA__ENVELOPE__INIT, *e;
        Aqua__ReclaimNotice rn = AQUA__RECLAIM_NOTICE__INIT;
        struct aqua_event ev[16];
        uint64_t moved = 0;
        size_t got = 0;

        rn.lease_id = lease_id;
        rn.n_chunk_ids = n;
        rn.chunk_ids = (uint64_t *)ids;
        rn.deadline_ms = 5000;
        notice.body_case = AQUA__ENVELOPE__BODY_RECLAIM_NOTICE;
        notice.reclaim_notice = &rn;
        fake_send(&fk, &notice);
        /* Poll until libaqua has answered with its Return (the fake's socket is readable). */
        for (int i = 0; i < 1000; i++) {
                zmq_pollitem_t it = {.socket = fk.router, .events = ZMQ_POLLIN};

                cr_assert_eq(aqua_poll(ctx, ev, 16, &got), 0);
                for (size_t k = 0; k < got; k++) {
                        cr_assert_neq(ev[k].type, AQUA_EVENT_RECLAIM_FAILED, "error %d",
                                      ev[k].error);
                        if (ev[k].type == AQUA_EVENT_TENSOR_MIGRATED)
                                moved += ev[k].bytes;
                }
                if (got == 0 && zmq_poll(&it, 1, 5) == 1)
                        break;
        }
        e = fake_recv(&fk);
        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_RETURN);
        cr_assert_eq(e->return_->lease_id, lease_id);
        cr_assert_eq(e->return_->n_chunk_ids, n, "exactly the chunks asked for go back");
        answer_return(e);
        if (ret_moved)
                *ret_moved = moved;
}

/* ---------------------------------------------------------------- data */

/*
 * Chunk contents: one block of noise, made once, with the seed stamped on every 4 KiB page, so
 * that writing and checking cost a memcpy and a memcmp (checks run after every step).
 */
static void pattern(unsigned seed, uint8_t *buf)
{
        if (!noise) {
                unsigned s = 99;

                noise = malloc(CHUNK);
                for (size_t i = 0; i < CHUNK; i++)
                        noise[i] = (uint8_t)rand_r(&s);
        }
        memcpy(buf, noise, CHUNK);
        for (size_t p = 0; p < CHUNK; p += 4096)
                memcpy(buf + p, &seed, sizeof(seed));
}

static uint64_t chunk_addr(aqua_tensor *t, uint64_t off)
{
        struct aqua_tensor_range rg;

        cr_assert_eq(aqua_tensor_get_range(ctx, t, off, &rg), 0);
        cr_assert_neq(rg.tier, AQUA_TIER_NONE, "chunk at %llu not mapped", (unsigned long long)off);
        return rg.host ? (uint64_t)(uintptr_t)rg.host : aqua_tensor_dptr(t) + off;
}

/* Write or check a chunk of t through the driver, wherever the chunk lives. */
static void fill_chunk(aqua_tensor *t, uint64_t off, unsigned seed)
{
        uint8_t *buf = malloc(CHUNK);

        pattern(seed, buf);
        cr_assert_eq(gpu_copy(local, chunk_addr(t, off), (uint64_t)(uintptr_t)buf, CHUNK), 0);
        free(buf);
}

static bool chunk_holds(aqua_tensor *t, uint64_t off, unsigned seed)
{
        uint8_t *buf = malloc(CHUNK), *want = malloc(CHUNK);
        bool ok;

        pattern(seed, want);
        cr_assert_eq(gpu_copy(local, (uint64_t)(uintptr_t)buf, chunk_addr(t, off), CHUNK), 0);
        ok = memcmp(buf, want, CHUNK) == 0;
        free(buf);
        free(want);
        return ok;
}

static enum aqua_tier tier_at(aqua_tensor *t, uint64_t off)
{
        struct aqua_tensor_range rg;

        cr_assert_eq(aqua_tensor_get_range(ctx, t, off, &rg), 0);
        return rg.tier;
}

/* ---------------------------------------------------------------- tests */

Test(tensor, places_chunks_on_peer_memory_then_dram_within_the_budget)
{
        struct aqua_tensor_options o = AQUA_TENSOR_OPTIONS_INIT;
        struct aqua_tensor_info ti;
        struct aqua_tensor_range rg;
        struct aqua_info in;
        aqua_tensor *t;
        uint64_t dptr;

        borrow_pool(4, 2 * CHUNK);
        o.chunk_bytes = CHUNK;
        cr_assert_eq(aqua_tensor_new(ctx, 10 * CHUNK, &o, &t), 0);
        dptr = aqua_tensor_dptr(t);
        cr_assert_eq(aqua_tensor_grow(ctx, t, 3 * CHUNK + 1), 0);
        for (int i = 0; i < 4; i++)
                fill_chunk(t, i * CHUNK, 10 + i);
        cr_assert_eq(aqua_tensor_get_range(ctx, t, 0, &rg), 0);
        cr_assert_eq(rg.tier, AQUA_TIER_PEER);
        cr_assert_eq(rg.bytes, 4 * CHUNK);
        cr_assert_eq(aqua_tensor_grow(ctx, t, 6 * CHUNK), 0);
        cr_assert_eq(tier_at(t, 4 * CHUNK), AQUA_TIER_DRAM);
        fill_chunk(t, 4 * CHUNK, 14);
        fill_chunk(t, 5 * CHUNK, 15);

        /* The budget is spent: a clear outcome, and nothing of what is there changes. */
        cr_assert_eq(aqua_tensor_grow(ctx, t, 8 * CHUNK), AQUA_NO_MEMORY);
        cr_assert_eq(aqua_tensor_get_info(ctx, t, &ti), 0);
        cr_assert_eq(ti.end, 6 * CHUNK, "all or nothing");
        cr_assert_eq(ti.dptr, dptr);
        cr_assert_eq(ti.peer_bytes, 4 * CHUNK);
        cr_assert_eq(ti.dram_bytes, 2 * CHUNK);
        for (int i = 0; i < 6; i++)
                cr_assert(chunk_holds(t, i * CHUNK, 10 + i), "chunk %d", i);
        cr_assert_eq(aqua_get_info(ctx, &in), 0);
        cr_assert_eq(in.tensor_dram_bytes, 2 * CHUNK);
        cr_assert_eq(in.pool_free_bytes, 0);
        cr_assert_eq(aqua_tensor_grow(ctx, t, 11 * CHUNK), -ERANGE);
        cr_assert_null(aqua_tensor_free(ctx, t));
        cr_assert_eq(aqua_get_info(ctx, &in), 0);
        cr_assert_eq(in.pool_free_bytes, 4 * CHUNK, "peer chunks are free again");
        cr_assert_eq(in.tensor_dram_bytes, 0);
}

Test(tensor, uses_local_memory_only_when_allowed_and_honours_a_named_tier)
{
        struct aqua_tensor_options o = AQUA_TENSOR_OPTIONS_INIT;
        aqua_tensor *t, *d;

        borrow_pool(1, 0);
        o.chunk_bytes = CHUNK;
        o.flags = AQUA_TENSOR_ALLOW_LOCAL;
        cr_assert_eq(aqua_tensor_new(ctx, 4 * CHUNK, &o, &t), 0);
        cr_assert_eq(aqua_tensor_grow(ctx, t, 2 * CHUNK), 0);
        cr_assert_eq(tier_at(t, 0), AQUA_TIER_PEER);
        cr_assert_eq(tier_at(t, CHUNK), AQUA_TIER_LOCAL);
        o.flags = 0;
        o.tier = AQUA_TIER_DRAM;
        cr_assert_eq(aqua_tensor_new(ctx, 4 * CHUNK, &o, &d), 0);
        cr_assert_eq(aqua_tensor_grow(ctx, d, CHUNK), AQUA_NO_MEMORY, "no DRAM budget granted");
        aqua_tensor_free(ctx, d);
        aqua_tensor_free(ctx, t);
}

/*
 * A copy into tensor memory this GPU has lost write access to is accepted, as a GPU accepts it,
 * and faults when it runs (simcuda's strict mode, as a GPU does). libaqua finds out at its sync
 * point and reports the batch as lost, naming the tensor, the offset and the lease; asking after
 * the batch again never reads as done.
 */
Test(tensor, a_copy_that_faults_is_reported_lost_with_the_tensor_it_was_for)
{
        struct aqua_tensor_options o = AQUA_TENSOR_OPTIONS_INIT;
        const struct cuda_driver *d;
        CUmemAccessDesc ro = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READ};
        struct aqua_copy_piece piece;
        uint8_t *buf = calloc(1, CHUNK);
        aqua_ticket ticket;
        aqua_tensor *t;
        CUcontext primary;
        char want[128];

        borrow_pool(1, 0);
        o.chunk_bytes = CHUNK;
        cr_assert_eq(aqua_tensor_new(ctx, CHUNK, &o, &t), 0);
        cr_assert_eq(aqua_tensor_grow(ctx, t, CHUNK), 0);
        cr_assert_eq(tier_at(t, 0), AQUA_TIER_PEER);
        /* Write access goes, once the work the tensor's growth queued is done (taking it away
         * under that work would fault the context at once). */
        cr_assert_eq(cuda_driver_get(&d, NULL), 0);
        cr_assert_eq(d->cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
        cr_assert_eq(d->cuCtxSetCurrent(primary), CUDA_SUCCESS);
        cr_assert_eq(d->cuCtxSynchronize(), CUDA_SUCCESS);
        cr_assert_eq(d->cuMemSetAccess(aqua_tensor_dptr(t), CHUNK, &ro, 1), CUDA_SUCCESS);
        piece = (struct aqua_copy_piece){aqua_tensor_dptr(t) + 4096, (uint64_t)(uintptr_t)buf, 512};
        last_error[0] = '\0';
        /* Queued, as on a GPU; the fault may already be known when its completion event is
         * recorded (the stream ran it at once), and then the batch is reported there. */
        int r = aqua_copy_batch(ctx, &piece, 1, NULL, NULL, NULL, &ticket);
        cr_assert(r == 0 || r == -EIO, "%d", r);
        if (r == 0)
                cr_assert_eq(aqua_copy_wait(ctx, ticket), -EIO);
        else
                ticket = 1; /* the context's first batch */
        snprintf(want, sizeof(want),
                 "the tensor at 0x%" PRIx64 ", offset 4096 (peer memory of lease",
                 aqua_tensor_dptr(t));
        cr_assert(strstr(last_error, want), "the report does not name the tensor: %s", last_error);
        cr_assert(strstr(last_error, "CUDA_ERROR_ILLEGAL_ADDRESS"), "%s", last_error);
        cr_assert(strstr(last_error, "Its data is lost"), "%s", last_error);
        cr_assert_eq(aqua_copy_query(ctx, ticket), -EIO, "a failed batch never reads as done");
        cr_assert_eq(aqua_copy_wait(ctx, ticket), -EIO);
        /* The context is unusable now: the next batch is refused when queued. */
        cr_assert_eq(aqua_copy_batch(ctx, &piece, 1, NULL, NULL, NULL, NULL), -EIO);
        cr_assert_eq(d->cuCtxSetCurrent(NULL), CUDA_SUCCESS);
        cr_assert_eq(d->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
        free(buf);
}

Test(tensor, trims_head_and_tail_without_moving_the_middle)
{
        struct aqua_tensor_options o = AQUA_TENSOR_OPTIONS_INIT;
        struct aqua_tensor_info ti;
        struct aqua_info in;
        aqua_tensor *t;

        borrow_pool(6, 0);
        o.chunk_bytes = CHUNK;
        cr_assert_eq(aqua_tensor_new(ctx, 6 * CHUNK, &o, &t), 0);
        cr_assert_eq(aqua_tensor_grow(ctx, t, 6 * CHUNK), 0);
        for (int i = 0; i < 6; i++)
                fill_chunk(t, i * CHUNK, 30 + i);
        cr_assert_eq(aqua_tensor_trim(ctx, t, 2 * CHUNK, 4 * CHUNK), 0);
        cr_assert_eq(aqua_tensor_get_info(ctx, t, &ti), 0);
        cr_assert_eq(ti.begin, 2 * CHUNK);
        cr_assert_eq(ti.end, 4 * CHUNK);
        cr_assert_eq(tier_at(t, 0), AQUA_TIER_NONE);
        cr_assert_eq(tier_at(t, 5 * CHUNK), AQUA_TIER_NONE);
        cr_assert(chunk_holds(t, 2 * CHUNK, 32));
        cr_assert(chunk_holds(t, 3 * CHUNK, 33));
        cr_assert_eq(aqua_get_info(ctx, &in), 0);
        cr_assert_eq(in.pool_free_bytes, 4 * CHUNK);
        /* It grows again at its end, from the freed chunks. */
        cr_assert_eq(aqua_tensor_grow(ctx, t, 6 * CHUNK), 0);
        cr_assert_eq(tier_at(t, 5 * CHUNK), AQUA_TIER_PEER);
        cr_assert(chunk_holds(t, 3 * CHUNK, 33));
        aqua_tensor_free(ctx, t);
}

Test(tensor, moves_reclaimed_chunks_to_dram_at_the_same_address_and_promotes_them_back)
{
        struct aqua_tensor_options o = AQUA_TENSOR_OPTIONS_INIT;
        static const uint64_t ids[] = {1001, 1002};
        uint64_t moved = 0, promoted = 0;
        struct aqua_tensor_info ti;
        aqua_lease *l;
        aqua_tensor *t;
        uint64_t dptr;

        l = borrow_pool(4, 0);
        o.chunk_bytes = CHUNK;
        cr_assert_eq(aqua_tensor_new(ctx, 4 * CHUNK, &o, &t), 0);
        dptr = aqua_tensor_dptr(t);
        cr_assert_eq(aqua_tensor_grow(ctx, t, 3 * CHUNK), 0);
        for (int i = 0; i < 3; i++)
                fill_chunk(t, i * CHUNK, 50 + i);
        /* 1001 and 1002 back chunks 1 and 2; 1003 is free and goes back without a copy. */
        reclaim(7, ids, 2, &moved);
        cr_assert_eq(moved, 2 * CHUNK);
        cr_assert_eq(aqua_tensor_dptr(t), dptr);
        cr_assert_eq(tier_at(t, 0), AQUA_TIER_PEER);
        cr_assert_eq(tier_at(t, CHUNK), AQUA_TIER_DRAM);
        for (int i = 0; i < 3; i++)
                cr_assert(chunk_holds(t, i * CHUNK, 50 + i), "chunk %d", i);
        cr_assert_eq(aqua_return(ctx, l), -EBUSY, "chunk 0 still backs the tensor");

        /* The producer offers again: a new lease, and the opt-in promotion. */
        borrow_pool(2, 0);
        cr_assert_eq(aqua_tensor_promote(ctx, NULL, false, AQUA_ALL, &promoted), 0);
        cr_assert_eq(promoted, 2 * CHUNK);
        cr_assert_eq(aqua_tensor_get_info(ctx, t, &ti), 0);
        cr_assert_eq(ti.peer_bytes, 3 * CHUNK);
        cr_assert_eq(ti.dram_bytes, 0);
        cr_assert_eq(ti.dptr, dptr);
        for (int i = 0; i < 3; i++)
                cr_assert(chunk_holds(t, i * CHUNK, 50 + i), "chunk %d", i);
        aqua_tensor_free(ctx, t);
}

Test(tensor, waits_for_a_copy_in_flight_before_a_reclaim_moves_its_destination)
{
        struct aqua_tensor_options o = AQUA_TENSOR_OPTIONS_INIT;
        static const uint64_t ids[] = {1000, 1001, 1002, 1003};
        const size_t big = 256u << 20;
        struct aqua_copy_piece p[2 * 4];
        char *src = malloc(4 * CHUNK), *scratch = malloc(big), *sink = malloc(big);
        aqua_ticket ticket;
        aqua_tensor *t;

        cr_assert(src && scratch && sink);
        borrow_pool(4, 0);
        o.chunk_bytes = CHUNK;
        cr_assert_eq(aqua_tensor_new(ctx, 4 * CHUNK, &o, &t), 0);
        cr_assert_eq(aqua_tensor_grow(ctx, t, 4 * CHUNK), 0);
        for (size_t i = 0; i < 4 * CHUNK; i++)
                src[i] = (char)(i * 7 + 3);
        memset(scratch, 1, big);
        /* A large copy ahead of it on the same stream keeps the batch queued for a while. */
        cr_assert_eq(aqua_copy_batch(ctx,
                                     &(struct aqua_copy_piece){(uint64_t)(uintptr_t)sink,
                                                               (uint64_t)(uintptr_t)scratch, big},
                                     1, NULL, NULL, NULL, NULL),
                     0);
        for (int i = 0; i < 8; i++)
                p[i] =
                    (struct aqua_copy_piece){aqua_tensor_dptr(t) + i * (CHUNK / 2),
                                             (uint64_t)(uintptr_t)src + i * (CHUNK / 2), CHUNK / 2};
        cr_assert_eq(aqua_copy_batch(ctx, p, 8, NULL, NULL, NULL, &ticket), 0);
        reclaim(7, ids, 4, NULL);
        cr_assert_eq(aqua_copy_query(ctx, ticket), 0, "done before the chunks moved");
        cr_assert_eq(tier_at(t, 0), AQUA_TIER_DRAM);
        {
                char *back = malloc(4 * CHUNK);
                cr_assert_eq(
                    gpu_copy(local, (uint64_t)(uintptr_t)back, aqua_tensor_dptr(t), 4 * CHUNK), 0);
                cr_assert_eq(memcmp(back, src, 4 * CHUNK), 0);
                free(back);
        }
        aqua_tensor_free(ctx, t);
        free(src);
        free(scratch);
        free(sink);
}

static void *serve_return(void *arg)
{
        Aqua__Envelope *e = fake_recv(&fk);

        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_RETURN);
        answer_return(e);
        return arg;
}

/*
 * A returned lease is unmapped only after the batches still copying into it: on a GPU (and on
 * the strict simulator) unmapping memory under queued copies faults the context for good.
 */
Test(tensor, returns_a_lease_only_after_the_copies_into_it_are_done)
{
        struct grant_job j = {.n = 2, .lease = next_lease++, .first = n_peer};
        const size_t big = 256u << 20;
        char *src = malloc(2 * CHUNK), *scratch = malloc(big), *sink = malloc(big);
        struct aqua_grant g;
        aqua_ticket ticket;
        pthread_t th;

        cr_assert(src && scratch && sink);
        for (size_t i = 0; i < j.n; i++)
                cr_assert_eq(gpu_alloc_exportable(peer, CHUNK, false, &peer_mem[n_peer++]), 0);
        pthread_create(&th, NULL, serve_grant, &j);
        cr_assert_eq(aqua_borrow(ctx, 2 * CHUNK, 0, 0, &g), 0);
        pthread_join(th, NULL);
        memset(scratch, 1, big);
        memset(src, 5, 2 * CHUNK);
        /* A large copy ahead of it on the same stream keeps the batch queued for a while. */
        cr_assert_eq(aqua_copy_batch(ctx,
                                     &(struct aqua_copy_piece){(uint64_t)(uintptr_t)sink,
                                                               (uint64_t)(uintptr_t)scratch, big},
                                     1, NULL, NULL, NULL, NULL),
                     0);
        cr_assert_eq(
            aqua_copy_batch(ctx,
                            &(struct aqua_copy_piece){g.dptr, (uint64_t)(uintptr_t)src, 2 * CHUNK},
                            1, NULL, NULL, NULL, &ticket),
            0);
        pthread_create(&th, NULL, serve_return, NULL);
        cr_assert_eq(aqua_return(ctx, g.lease), 0);
        pthread_join(th, NULL);
        cr_assert_eq(aqua_copy_query(ctx, ticket), 0);
        /* The context still works: nothing faulted. */
        cr_assert_eq(aqua_copy_batch(ctx,
                                     &(struct aqua_copy_piece){(uint64_t)(uintptr_t)sink,
                                                               (uint64_t)(uintptr_t)src, CHUNK},
                                     1, NULL, NULL, NULL, &ticket),
                     0);
        cr_assert_eq(aqua_copy_wait(ctx, ticket), 0);
        free(src);
        free(scratch);
        free(sink);
}

/* Scattered small pieces, with and without the driver's batch call: same bytes arrive. */
static void scatter_and_gather(bool batch)
{
        enum { N = 256, B = 16384 };
        struct aqua_copy_piece p[N];
        char *src = malloc(N * B * 2), *back = malloc(N * B);
        struct aqua_tensor_options o = AQUA_TENSOR_OPTIONS_INIT;
        aqua_ticket tk;
        aqua_tensor *t;

        ctx->no_batch_copy = !batch;
        borrow_pool(8, 0);
        o.chunk_bytes = CHUNK;
        cr_assert_eq(aqua_tensor_new(ctx, 8 * CHUNK, &o, &t), 0);
        cr_assert_eq(aqua_tensor_grow(ctx, t, 8 * CHUNK), 0);
        for (size_t i = 0; i < N * B * 2; i++)
                src[i] = (char)(i * 13 + 1);
        /* Every other block of the source, to blocks of the tensor in reverse order. */
        for (int i = 0; i < N; i++)
                p[i] = (struct aqua_copy_piece){aqua_tensor_dptr(t) + (uint64_t)(N - 1 - i) * B,
                                                (uint64_t)(uintptr_t)src + (uint64_t)i * 2 * B, B};
        cr_assert_eq(aqua_copy_batch(ctx, p, N, NULL, NULL, NULL, &tk), 0);
        cr_assert_eq(aqua_copy_wait(ctx, tk), 0);
        cr_assert_eq(gpu_copy(local, (uint64_t)(uintptr_t)back, aqua_tensor_dptr(t), N * B), 0);
        for (int i = 0; i < N; i++)
                cr_assert_eq(memcmp(back + (N - 1 - i) * B, src + i * 2 * B, B), 0, "block %d", i);
        aqua_tensor_free(ctx, t);
        free(src);
        free(back);
}

Test(tensor, copies_scattered_pieces_through_the_batch_call)
{
        scatter_and_gather(true);
}

Test(tensor, copies_scattered_pieces_without_the_batch_call)
{
        scatter_and_gather(false);
}

Test(tensor, merges_neighbouring_pieces)
{
        struct aqua_copy_piece p[] = {
            {100, 1000, 10}, {110, 1010, 5}, {115, 2000, 5}, {120, 2005, 1}, {500, 3000, 1}};

        cr_assert_eq(copy_merge(p, 5), 3);
        cr_assert_eq(p[0].bytes, 15);
        cr_assert_eq(p[1].dst, 115);
        cr_assert_eq(p[1].bytes, 6);
        cr_assert_eq(p[2].dst, 500);
}

Test(tensor, offloads_and_prefetches_layer_by_layer)
{
        enum { LAYERS = 4 };
        struct aqua_tensor_options o = AQUA_TENSOR_OPTIONS_INIT;
        char *work = malloc(LAYERS * CHUNK), *back = malloc(LAYERS * CHUNK);
        struct CUevent_st *ev;
        aqua_layers *ly;
        aqua_tensor *t;

        borrow_pool(LAYERS, 0);
        o.chunk_bytes = CHUNK;
        cr_assert_eq(aqua_tensor_new(ctx, LAYERS * CHUNK, &o, &t), 0);
        cr_assert_eq(aqua_layers_new(ctx, LAYERS, NULL, NULL, &ly), 0);
        for (size_t i = 0; i < LAYERS * CHUNK; i++)
                work[i] = (char)(i * 31 + 7);
        /* Prefill: each layer's KV is mapped and offloaded as soon as it exists. */
        for (unsigned l = 0; l < LAYERS; l++) {
                struct aqua_copy_piece p = {aqua_tensor_dptr(t) + l * CHUNK,
                                            (uint64_t)(uintptr_t)work + l * CHUNK, CHUNK};

                cr_assert_eq(aqua_tensor_grow(ctx, t, (l + 1) * CHUNK), 0);
                cr_assert_eq(aqua_layers_offload(ly, l, &p, 1, NULL), 0);
        }
        for (unsigned l = 0; l < LAYERS; l++)
                cr_assert_eq(aqua_layers_wait(ly, l), 0);
        /* Decode: layer l + 1 comes back while layer l "computes". */
        for (unsigned l = 0; l < LAYERS; l++) {
                struct aqua_copy_piece p = {(uint64_t)(uintptr_t)back + l * CHUNK,
                                            aqua_tensor_dptr(t) + l * CHUNK, CHUNK};

                cr_assert_eq(aqua_layers_prefetch(ly, l, &p, 1, NULL), 0);
        }
        for (unsigned l = 0; l < LAYERS; l++) {
                cr_assert_eq(aqua_layers_event(ly, l, &ev), 0);
                cr_assert_not_null(ev);
                cr_assert_eq(aqua_layers_wait(ly, l), 0);
                cr_assert_eq(aqua_layers_query(ly, l), 0);
        }
        cr_assert_eq(memcmp(back, work, LAYERS * CHUNK), 0);
        cr_assert_eq(aqua_layers_query(ly, LAYERS), -EINVAL);
        aqua_layers_free(ly);
        aqua_tensor_free(ctx, t);
        free(work);
        free(back);
}

/*
 * A long random sequence of grow, trim, write, reclaim, re-offer (a new lease) and promote on
 * three tensors; every mapped chunk is checked after each step. Seeded and bounded in steps.
 */
Test(tensor, keeps_every_byte_across_a_long_random_sequence)
{
        enum { TENSORS = 3, CHUNKS = 6, STEPS = 300 };
        struct aqua_tensor_options o = AQUA_TENSOR_OPTIONS_INIT;
        aqua_tensor *t[TENSORS];
        uint64_t dptr[TENSORS];
        unsigned seed_of[TENSORS][CHUNKS] = {{0}};
        unsigned seed = 12345, next_seed = 1;
        aqua_lease *leases[16];
        size_t n_leases = 0;
        uint64_t moved_total = 0, promoted_total = 0;

        leases[n_leases++] = borrow_pool(8, 4 * CHUNK);
        o.chunk_bytes = CHUNK;
        for (int k = 0; k < TENSORS; k++) {
                cr_assert_eq(aqua_tensor_new(ctx, CHUNKS * CHUNK, &o, &t[k]), 0);
                dptr[k] = aqua_tensor_dptr(t[k]);
        }
        for (int step = 0; step < STEPS; step++) {
                int k = rand_r(&seed) % TENSORS, op = rand_r(&seed) % 6;
                struct aqua_tensor_info ti;

                cr_assert_eq(aqua_tensor_get_info(ctx, t[k], &ti), 0);
                switch (op) {
                case 0: { /* grow */
                        uint64_t end = (uint64_t)(rand_r(&seed) % (CHUNKS + 1)) * CHUNK;
                        int r = aqua_tensor_grow(ctx, t[k], end);

                        cr_assert(r == 0 || r == AQUA_NO_MEMORY, "grow: %d", r);
                        break;
                }
                case 1: { /* trim one chunk at an end */
                        bool head = rand_r(&seed) & 1;

                        if (ti.begin == ti.end)
                                break;
                        cr_assert_eq(aqua_tensor_trim(ctx, t[k], ti.begin + (head ? CHUNK : 0),
                                                      ti.end - (head ? 0 : CHUNK)),
                                     0);
                        seed_of[k][(head ? ti.begin : ti.end - CHUNK) / CHUNK] = 0;
                        break;
                }
                case 2: /* write */
                        for (uint64_t off = ti.begin; off < ti.end; off += CHUNK)
                                if (rand_r(&seed) & 1) {
                                        seed_of[k][off / CHUNK] = next_seed;
                                        fill_chunk(t[k], off, next_seed++);
                                }
                        break;
                case 3: { /* reclaim some peer chunks of one lease */
                        size_t li = (size_t)rand_r(&seed) % n_leases;
                        uint64_t ids[LEASE_MAX];
                        size_t n = 0;

                        for (size_t c = 0; c < leases[li]->n_chunks; c++)
                                if (leases[li]->chunks[c].tier == AQUA_TIER_PEER &&
                                    (rand_r(&seed) & 1))
                                        ids[n++] = leases[li]->chunks[c].id;
                        if (n) {
                                uint64_t moved = 0;

                                reclaim(leases[li]->id, ids, n, &moved);
                                moved_total += moved;
                        }
                        break;
                }
                case 4: /* re-offer */
                        if (n_leases < 16 && n_peer + 4 <= MAX_PEER)
                                leases[n_leases++] = borrow_pool(4, 0);
                        break;
                case 5: { /* promote */
                        uint64_t promoted = 0;

                        cr_assert_eq(aqua_tensor_promote(ctx, rand_r(&seed) & 1 ? t[k] : NULL,
                                                         false, AQUA_ALL, &promoted),
                                     0);
                        promoted_total += promoted;
                        break;
                }
                }
                for (int j = 0; j < TENSORS; j++) {
                        /* Reclaim and promote move any tensor; the rest only the one named. */
                        if (op != 3 && op != 5 && j != k && step != STEPS - 1)
                                continue;
                        cr_assert_eq(aqua_tensor_get_info(ctx, t[j], &ti), 0);
                        cr_assert_eq(ti.dptr, dptr[j], "the address never changes");
                        for (uint64_t off = ti.begin; off < ti.end; off += CHUNK)
                                if (seed_of[j][off / CHUNK])
                                        cr_assert(chunk_holds(t[j], off, seed_of[j][off / CHUNK]),
                                                  "step %d op %d: tensor %d chunk %llu", step, op,
                                                  j, (unsigned long long)(off / CHUNK));
                }
        }
        /* The sequence did what it is for: data moved off producers and back. */
        cr_assert_gt(moved_total, 0);
        cr_assert_gt(promoted_total, 0);
        for (int k = 0; k < TENSORS; k++)
                aqua_tensor_free(ctx, t[k]);
}
