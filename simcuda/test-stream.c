/* Streams, events and batch copies: order, asynchrony, and the documented misuse errors. */
#include <pthread.h>

#include "test-sim.h"

static void setup(void)
{
        sim_machine("2x64MiB");
}

TestSuite(stream, .init = setup, .fini = sim_machine_cleanup);

/* A host function that holds its stream until the test opens the gate. */
struct gate {
        pthread_mutex_t lock;
        pthread_cond_t cond;
        bool open;
};

static struct gate gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};

static void CUDA_CB gate_wait(void *arg)
{
        struct gate *g = arg;

        pthread_mutex_lock(&g->lock);
        while (!g->open)
                pthread_cond_wait(&g->cond, &g->lock);
        pthread_mutex_unlock(&g->lock);
}

static void gate_open(struct gate *g)
{
        pthread_mutex_lock(&g->lock);
        g->open = true;
        pthread_cond_broadcast(&g->cond);
        pthread_mutex_unlock(&g->lock);
}

static void *gate_opener(void *arg)
{
        gate_open(arg);
        return NULL;
}

Test(stream, runs_in_order_after_the_call_returns)
{
        CUdeviceptr p;
        CUstream s;
        int one = 1, two = 2, out = 0;

        sim_start(0);
        CU_OK(cuMemAlloc(&p, 4096));
        CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CU_OK(cuLaunchHostFunc(s, gate_wait, &gate));
        CU_OK(cuMemcpyHtoDAsync(p, &one, sizeof(one), s));
        CU_OK(cuMemcpyHtoDAsync(p, &two, sizeof(two), s));
        CU_OK(cuMemcpyDtoHAsync(&out, p, sizeof(out), s));
        CU_EXPECT(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
        cr_assert_eq(out, 0, "nothing ran while the stream was held");
        gate_open(&gate);
        CU_OK(cuStreamSynchronize(s));
        CU_OK(cuStreamQuery(s));
        cr_assert_eq(out, 2, "the copies ran in the order they were queued");
        CU_OK(cuStreamDestroy(s));
        CU_OK(cuMemFree(p));
}

Test(stream, events_order_work_across_streams)
{
        CUdeviceptr p, q;
        CUstream a, b;
        CUevent e;
        int v = 5, out = 0;

        sim_start(0);
        CU_OK(cuMemAlloc(&p, 4096));
        CU_OK(cuMemAlloc(&q, 4096));
        CU_OK(cuMemsetD8(q, 0, 4096));
        CU_OK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
        CU_OK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
        CU_OK(cuEventCreate(&e, CU_EVENT_DEFAULT));
        CU_OK(cuLaunchHostFunc(a, gate_wait, &gate));
        CU_OK(cuMemcpyHtoDAsync(p, &v, sizeof(v), a));
        CU_OK(cuEventRecord(e, a));
        CU_EXPECT(cuEventQuery(e), CUDA_ERROR_NOT_READY);
        CU_OK(cuStreamWaitEvent(b, e, 0));
        CU_OK(cuMemcpyDtoDAsync(q, p, sizeof(v), b));
        CU_OK(cuMemcpyDtoHAsync(&out, q, sizeof(out), b));
        CU_EXPECT(cuStreamQuery(b), CUDA_ERROR_NOT_READY);
        gate_open(&gate);
        CU_OK(cuStreamSynchronize(b));
        cr_assert_eq(out, 5, "b waited for the write a made before the event");
        CU_OK(cuEventQuery(e));
        CU_OK(cuEventDestroy(e));
        CU_OK(cuStreamDestroy(a));
        CU_OK(cuStreamDestroy(b));
}

Test(stream, event_timing_follows_the_documented_rules)
{
        CUevent start, end, untimed, never;
        CUdeviceptr p;
        CUstream s;
        float ms = -1;
        static char buf[1 << 20];

        sim_start(0);
        CU_OK(cuMemAlloc(&p, sizeof(buf)));
        CU_OK(cuStreamCreate(&s, 0));
        CU_OK(cuEventCreate(&start, 0));
        CU_OK(cuEventCreate(&end, 0));
        CU_OK(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));
        CU_OK(cuEventCreate(&never, 0));
        CU_OK(cuLaunchHostFunc(s, gate_wait, &gate));
        CU_OK(cuEventRecord(start, s));
        CU_OK(cuMemcpyHtoDAsync(p, buf, sizeof(buf), s));
        CU_OK(cuEventRecord(end, s));
        CU_OK(cuEventRecord(untimed, s));
        CU_EXPECT(cuEventElapsedTime(&ms, start, end), CUDA_ERROR_NOT_READY);
        gate_open(&gate);
        CU_OK(cuEventSynchronize(end));
        CU_OK(cuEventSynchronize(untimed));
        CU_OK(cuEventElapsedTime(&ms, start, end));
        cr_assert_geq(ms, 0.0f);
        CU_EXPECT(cuEventElapsedTime(&ms, start, untimed), CUDA_ERROR_INVALID_HANDLE);
        CU_EXPECT(cuEventElapsedTime(&ms, start, never), CUDA_ERROR_INVALID_HANDLE);
        CU_EXPECT(cuEventCreate(&never, 0x100), CUDA_ERROR_INVALID_VALUE);
        CU_OK(cuEventDestroy(start));
        CU_OK(cuEventDestroy(end));
        CU_OK(cuEventDestroy(untimed));
        CU_OK(cuEventDestroy(never));
        CU_OK(cuStreamDestroy(s));
}

Test(stream, the_legacy_default_stream_waits_for_blocking_streams)
{
        CUdeviceptr p;
        CUstream s;
        pthread_t opener;
        int v = 11, out = 0;

        sim_start(0);
        CU_OK(cuMemAlloc(&p, 4096));
        CU_OK(cuMemsetD8(p, 0, 4096));
        CU_OK(cuStreamCreate(&s, 0));
        CU_OK(cuLaunchHostFunc(s, gate_wait, &gate));
        CU_OK(cuMemcpyHtoDAsync(p, &v, sizeof(v), s));
        cr_assert_eq(pthread_create(&opener, NULL, gate_opener, &gate), 0);
        /* A synchronous copy orders after all work of blocking streams. */
        CU_OK(cuMemcpyDtoH(&out, p, sizeof(out)));
        cr_assert_eq(out, 11);
        pthread_join(opener, NULL);
}

Test(stream, queued_work_survives_stream_destruction)
{
        CUdeviceptr p;
        CUstream s;
        int v = 3, out = 0;

        sim_start(0);
        CU_OK(cuMemAlloc(&p, 4096));
        CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CU_OK(cuLaunchHostFunc(s, gate_wait, &gate));
        CU_OK(cuMemcpyHtoDAsync(p, &v, sizeof(v), s));
        CU_OK(cuStreamDestroy(s));
        gate_open(&gate);
        CU_OK(cuCtxSynchronize());
        CU_OK(cuMemcpyDtoH(&out, p, sizeof(out)));
        cr_assert_eq(out, 3);
}

#define BLOCKS 64
#define BLOCK  (16 << 10)

/* Scatter BLOCKS host blocks into every other device block, then gather them back. */
Test(stream, batch_copies_move_scattered_blocks)
{
        static char host[BLOCKS * BLOCK], back[BLOCKS * BLOCK];
        CUdeviceptr dsts[BLOCKS], srcs[BLOCKS];
        size_t sizes[BLOCKS], idx = 0;
        CUmemcpyAttributes attr = {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
        CUdeviceptr p;
        CUstream s;

        sim_start(0);
        for (size_t i = 0; i < sizeof(host); i++)
                host[i] = (char)(i * 31 + 7);
        p = map_new(0, GRAN, NULL);
        CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        for (int i = 0; i < BLOCKS; i++) {
                dsts[i] = p + (CUdeviceptr)(2 * i) * BLOCK;
                srcs[i] = (CUdeviceptr)(host + i * BLOCK);
                sizes[i] = BLOCK;
        }
        CU_OK(cuMemcpyBatchAsync(dsts, srcs, sizes, BLOCKS, &attr, &idx, 1, s));
        for (int i = 0; i < BLOCKS; i++) {
                dsts[i] = (CUdeviceptr)(back + i * BLOCK);
                srcs[i] = p + (CUdeviceptr)(2 * i) * BLOCK;
        }
        CU_OK(cuMemcpyBatchAsync(dsts, srcs, sizes, BLOCKS, &attr, &idx, 1, s));
        CU_OK(cuStreamSynchronize(s));
        cr_assert_eq(memcmp(host, back, sizeof(host)), 0);
}

Test(stream, batch_sources_read_during_the_call_may_be_reused_at_once)
{
        CUmemcpyAttributes attrs[2] = {
            {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL},
            {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM},
        };
        size_t idx[2] = {0, 1}, sizes[2] = {sizeof(int), sizeof(int)};
        CUdeviceptr p, dsts[2], srcs[2];
        CUstream s;
        int ephemeral = 1, later = 2, out[2] = {0};

        sim_start(0);
        CU_OK(cuMemAlloc(&p, 4096));
        CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CU_OK(cuLaunchHostFunc(s, gate_wait, &gate));
        dsts[0] = p;
        dsts[1] = p + 64;
        srcs[0] = (CUdeviceptr)&ephemeral;
        srcs[1] = (CUdeviceptr)&later;
        CU_OK(cuMemcpyBatchAsync(dsts, srcs, sizes, 2, attrs, idx, 2, s));
        ephemeral = 100; /* allowed: read during the call */
        later = 200;     /* read in stream order, so the new value is what lands */
        gate_open(&gate);
        CU_OK(cuStreamSynchronize(s));
        CU_OK(cuMemcpyDtoH(&out[0], p, sizeof(int)));
        CU_OK(cuMemcpyDtoH(&out[1], p + 64, sizeof(int)));
        cr_assert_eq(out[0], 1);
        cr_assert_eq(out[1], 200);
}

Test(stream, batch_misuse_is_an_invalid_value)
{
        CUmemcpyAttributes attr = {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
        CUmemcpyAttributes bad = {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_INVALID};
        size_t idx0 = 0, idx1 = 1, sizes[2] = {4, 4}, idx2[2] = {0, 0};
        CUmemcpyAttributes two[2] = {attr, attr};
        CUdeviceptr p, dsts[2], srcs[2];
        CUstream s;
        int v[2];

        sim_start(0);
        CU_OK(cuMemAlloc(&p, 4096));
        CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        dsts[0] = p;
        dsts[1] = p + 8;
        srcs[0] = (CUdeviceptr)&v[0];
        srcs[1] = (CUdeviceptr)&v[1];
        CU_EXPECT(cuMemcpyBatchAsync(dsts, srcs, sizes, 2, &attr, &idx0, 1, NULL),
                  CUDA_ERROR_INVALID_VALUE);
        CU_EXPECT(cuMemcpyBatchAsync(dsts, srcs, sizes, 2, &attr, &idx1, 1, s),
                  CUDA_ERROR_INVALID_VALUE);
        CU_EXPECT(cuMemcpyBatchAsync(dsts, srcs, sizes, 2, &bad, &idx0, 1, s),
                  CUDA_ERROR_INVALID_VALUE);
        CU_EXPECT(cuMemcpyBatchAsync(dsts, srcs, sizes, 2, two, idx2, 2, s),
                  CUDA_ERROR_INVALID_VALUE);
        CU_EXPECT(cuMemcpyBatchAsync(dsts, srcs, sizes, 0, &attr, &idx0, 1, s),
                  CUDA_ERROR_INVALID_VALUE);
        CU_OK(cuMemcpyBatchAsync(dsts, srcs, sizes, 2, &attr, &idx0, 1, s));
        CU_OK(cuStreamSynchronize(s));
}

/*
 * Each piece is checked against the mapping it touches, however many pieces before it passed: a
 * piece reaching the hole is refused when queued (the driver has no mapping for it), and a write
 * into the mapping open only for reading is accepted and faults when the batch runs, as a GPU
 * faults: none of the batch lands, the context gets the sticky CUDA_ERROR_ILLEGAL_ADDRESS.
 */
Test(stream, every_batch_piece_is_checked_against_its_own_mapping)
{
        CUmemAllocationProp prop = device_prop(0, false);
        CUmemAccessDesc ro = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READ};
        CUmemcpyAttributes attr = {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
        CUmemGenericAllocationHandle a, b;
        CUdeviceptr p, dsts[3], srcs[3];
        size_t idx = 0, sizes[3] = {64, 64, 64};
        static char host[3][64];
        CUstream s;

        SIM_ONLY();
        sim_start(0);
        CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        /* [read-write][read-only][hole] */
        CU_OK(cuMemAddressReserve(&p, 3 * GRAN, 0, 0, 0));
        CU_OK(cuMemCreate(&a, GRAN, &prop, 0));
        CU_OK(cuMemCreate(&b, GRAN, &prop, 0));
        CU_OK(cuMemMap(p, GRAN, 0, a, 0));
        CU_OK(cuMemMap(p + GRAN, GRAN, 0, b, 0));
        set_rw(p, GRAN, 0);
        CU_OK(cuMemSetAccess(p + GRAN, GRAN, &ro, 1));
        for (int i = 0; i < 3; i++) {
                dsts[i] = p + (CUdeviceptr)i * 64;
                srcs[i] = (CUdeviceptr)host[i];
        }
        CU_OK(cuMemcpyBatchAsync(dsts, srcs, sizes, 3, &attr, &idx, 1, s));
        /* Reading the read-only mapping passes. */
        dsts[0] = (CUdeviceptr)host[0];
        srcs[0] = p + GRAN;
        dsts[2] = (CUdeviceptr)host[2];
        CU_OK(cuMemcpyBatchAsync(dsts, srcs, sizes, 3, &attr, &idx, 1, s));
        /* A read that runs from the read-only mapping into the hole, or starts in it. */
        srcs[2] = p + 2 * GRAN - 32;
        CU_EXPECT(cuMemcpyBatchAsync(dsts, srcs, sizes, 3, &attr, &idx, 1, s),
                  CUDA_ERROR_INVALID_VALUE);
        srcs[2] = p + 2 * GRAN;
        CU_EXPECT(cuMemcpyBatchAsync(dsts, srcs, sizes, 3, &attr, &idx, 1, s),
                  CUDA_ERROR_INVALID_VALUE);
        CU_OK(cuStreamSynchronize(s));
        /* A write that runs from the open mapping into the read-only one: queued, it faults. */
        memset(host[0], 7, sizeof(host[0]));
        srcs[0] = srcs[2] = (CUdeviceptr)host[0];
        dsts[0] = p;
        dsts[2] = p + GRAN - 32;
        CU_OK(cuMemcpyBatchAsync(dsts, srcs, sizes, 3, &attr, &idx, 1, s));
        CU_EXPECT(cuStreamSynchronize(s), CUDA_ERROR_ILLEGAL_ADDRESS);
        CU_EXPECT(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
        CU_EXPECT(cuMemcpyBatchAsync(dsts, srcs, sizes, 1, &attr, &idx, 1, s),
                  CUDA_ERROR_ILLEGAL_ADDRESS);
}

Test(stream, peer_copies_move_between_devices)
{
        CUcontext c0, c1;
        CUdeviceptr a, b;
        int v = 77, out = 0;

        NEED_TWO_DEVICES();
        c0 = sim_start(0);
        CU_OK(cuMemAlloc(&a, 4096));
        CU_OK(cuDevicePrimaryCtxRetain(&c1, 1));
        CU_OK(cuCtxSetCurrent(c1));
        CU_OK(cuMemAlloc(&b, 4096));
        CU_OK(cuCtxSetCurrent(c0));
        CU_OK(cuMemcpyHtoD(a, &v, sizeof(v)));
        CU_OK(cuMemcpyPeer(b, c1, a, c0, sizeof(v)));
        CU_OK(cuMemcpyPeerAsync(a + 64, c0, b, c1, sizeof(v), NULL));
        CU_OK(cuCtxSynchronize());
        CU_OK(cuMemcpyDtoH(&out, a + 64, sizeof(out)));
        cr_assert_eq(out, 77);
}

/*
 * Documented (CUDA C Programming Guide, "Stream and Event Behavior"): recording an event on a
 * stream of another context fails, and so does timing two events of different contexts; a
 * stream may wait on an event of another context.
 */
Test(stream, events_belong_to_the_context_they_were_made_in)
{
        CUcontext c0, c1;
        CUevent e0, e1;
        CUstream s0, s1;
        float ms;

        NEED_TWO_DEVICES();
        c1 = sim_start(1);
        CU_OK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
        CU_OK(cuEventCreate(&e1, 0));
        c0 = sim_start(0);
        CU_OK(cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));
        CU_OK(cuEventCreate(&e0, 0));
        CU_EXPECT(cuEventRecord(e0, s1), CUDA_ERROR_INVALID_HANDLE);
        CU_EXPECT(cuEventRecord(e1, s0), CUDA_ERROR_INVALID_HANDLE);
        /* The NULL stream is the current context's. */
        CU_EXPECT(cuEventRecord(e1, NULL), CUDA_ERROR_INVALID_HANDLE);
        CU_OK(cuEventRecord(e0, NULL));
        CU_OK(cuEventRecord(e0, s0));
        CU_OK(cuEventRecord(e1, s1));
        CU_OK(cuStreamWaitEvent(s0, e1, 0));
        CU_OK(cuEventSynchronize(e0));
        CU_OK(cuEventSynchronize(e1));
        CU_EXPECT(cuEventElapsedTime(&ms, e0, e1), CUDA_ERROR_INVALID_HANDLE);
        CU_OK(cuCtxSetCurrent(c1));
        CU_OK(cuEventRecord(e1, NULL));
        CU_OK(cuEventDestroy(e1));
        CU_OK(cuEventDestroy(e0));
        (void)c0;
}

/* cuda.h: CU_EVENT_WAIT_EXTERNAL "is invalid when used outside of capture". */
Test(stream, an_external_event_wait_outside_capture_is_refused)
{
        CUstream s;
        CUevent e;

        sim_start(0);
        CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CU_OK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
        CU_OK(cuEventRecord(e, s));
        CU_EXPECT(cuStreamWaitEvent(s, e, CU_EVENT_WAIT_EXTERNAL), CUDA_ERROR_INVALID_VALUE);
        CU_OK(cuStreamWaitEvent(s, e, CU_EVENT_WAIT_DEFAULT));
        CU_OK(cuEventDestroy(e));
}

/*
 * The last cuDevicePrimaryCtxRelease destroys the context: its streams and events are dead
 * handles, its cuMemAlloc memory is gone, and calls made in it say the context is destroyed;
 * a new retain gives a fresh context under the same handle.
 */
Test(stream, the_last_primary_context_release_destroys_what_was_made_in_it)
{
        CUcontext ctx, again;
        CUdeviceptr p;
        CUstream s;
        CUevent e;
        size_t free, total;

        SIM_ONLY(); /* dead handles are undefined behaviour to pass on a real driver */
        ctx = sim_start(0);
        CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CU_OK(cuEventCreate(&e, 0));
        CU_OK(cuMemAlloc(&p, 4096));
        CU_OK(cuEventRecord(e, s));
        CU_OK(cuDevicePrimaryCtxRelease(0));
        CU_EXPECT(cuMemGetInfo(&free, &total), CUDA_ERROR_CONTEXT_IS_DESTROYED);
        CU_EXPECT(cuMemAlloc(&p, 4096), CUDA_ERROR_CONTEXT_IS_DESTROYED);
        CU_EXPECT(cuStreamCreate(&s, 0), CUDA_ERROR_CONTEXT_IS_DESTROYED);
        CU_EXPECT(cuCtxSynchronize(), CUDA_ERROR_CONTEXT_IS_DESTROYED);
        CU_EXPECT(cuMemcpyHtoD(p, &free, sizeof(free)), CUDA_ERROR_CONTEXT_IS_DESTROYED);
        CU_EXPECT(cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
        CU_EXPECT(cuEventQuery(e), CUDA_ERROR_INVALID_HANDLE);
        CU_EXPECT(cuEventRecord(e, s), CUDA_ERROR_INVALID_HANDLE);

        CU_OK(cuDevicePrimaryCtxRetain(&again, 0));
        cr_assert_eq(again, ctx);
        CU_OK(cuMemGetInfo(&free, &total));
        CU_EXPECT(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
        CU_EXPECT(cuMemcpyHtoD(p, &free, sizeof(free)), CUDA_ERROR_INVALID_VALUE);
        CU_EXPECT(cuStreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);
        CU_EXPECT(cuEventDestroy(e), CUDA_ERROR_INVALID_HANDLE);
        CU_OK(cuStreamCreate(&s, 0));
        CU_OK(cuStreamSynchronize(s));
}

static void CUDA_CB set_flag(void *arg)
{
        *(int *)arg = 1;
}

/* A copy queued into p behind a closed gate; *host is its other side. */
static CUstream queue_behind_gate(CUdeviceptr p, int *host)
{
        CUstream s;

        gate.open = false;
        CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CU_OK(cuLaunchHostFunc(s, gate_wait, &gate));
        CU_OK(cuMemcpyDtoHAsync(host, p, sizeof(*host), s));
        return s;
}

/*
 * Strict mode (the default): unmapping memory that queued work still touches does not wait for
 * it; the work faults as it would on a GPU: it never runs, its stream and its context report
 * CUDA_ERROR_ILLEGAL_ADDRESS from then on, and only a new context works again.
 */
Test(stream, unmapping_under_queued_work_faults_its_context)
{
        CUmemGenericAllocationHandle h;
        CUdeviceptr p, q;
        CUstream s;
        CUcontext ctx;
        size_t free, total;
        int host = -1, v = 1, ran = 0;

        SIM_ONLY();
        sim_start(0);
        p = map_new(0, GRAN, &h);
        CU_OK(cuMemsetD8(p, 0x11, GRAN));
        s = queue_behind_gate(p, &host);
        /* Queued after the copy: a faulted context runs nothing more, host functions neither. */
        CU_OK(cuLaunchHostFunc(s, set_flag, &ran));
        CU_OK(cuMemUnmap(p, GRAN));
        gate_open(&gate);
        CU_EXPECT(cuStreamSynchronize(s), CUDA_ERROR_ILLEGAL_ADDRESS);
        cr_assert_eq(host, -1, "the faulted copy ran");
        cr_assert_eq(ran, 0, "work after the fault ran");
        CU_EXPECT(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
        CU_EXPECT(cuMemcpy((CUdeviceptr)&host, (CUdeviceptr)&v, sizeof(v)),
                  CUDA_ERROR_ILLEGAL_ADDRESS);
        CU_EXPECT(cuStreamQuery(s), CUDA_ERROR_ILLEGAL_ADDRESS);
        CU_EXPECT(cuMemGetInfo(&free, &total), CUDA_ERROR_ILLEGAL_ADDRESS);
        CU_EXPECT(cuMemAlloc(&q, 4096), CUDA_ERROR_ILLEGAL_ADDRESS);
        /* VMM calls go on, so the program can clean up. */
        CU_OK(cuMemRelease(h));
        /* The sticky error lasts as long as the context. */
        CU_OK(cuDevicePrimaryCtxRelease(0));
        CU_OK(cuDevicePrimaryCtxRetain(&ctx, 0));
        CU_OK(cuMemcpy((CUdeviceptr)&host, (CUdeviceptr)&v, sizeof(v)));
        CU_OK(cuMemAddressFree(p, GRAN));
}

/* Taking a device's access away under its queued work is the same fault. */
Test(stream, revoking_access_under_queued_work_faults_its_context)
{
        CUmemAccessDesc none = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                                .flags = CU_MEM_ACCESS_FLAGS_PROT_NONE};
        CUdeviceptr p;
        CUstream s;
        int host = -1;

        SIM_ONLY();
        sim_start(0);
        p = map_new(0, GRAN, NULL);
        s = queue_behind_gate(p, &host);
        CU_OK(cuMemSetAccess(p, GRAN, &none, 1));
        gate_open(&gate);
        CU_EXPECT(cuStreamSynchronize(s), CUDA_ERROR_ILLEGAL_ADDRESS);
        cr_assert_eq(host, -1);
}

/* Work that does not touch the range is not affected by its unmapping. */
Test(stream, unmapping_beside_queued_work_leaves_it_alone)
{
        CUdeviceptr p, q;
        CUstream s;
        int host = -1;

        SIM_ONLY();
        sim_start(0);
        p = map_new(0, GRAN, NULL);
        q = map_new(0, GRAN, NULL);
        CU_OK(cuMemsetD8(p, 0, GRAN));
        s = queue_behind_gate(p, &host);
        CU_OK(cuMemUnmap(q, GRAN));
        gate_open(&gate);
        CU_OK(cuStreamSynchronize(s));
        cr_assert_eq(host, 0);
}

/* AQUA_SIM_STRICT=0: unmapping waits for the queued work instead (what simcuda did before). */
Test(stream, relaxed_mode_lets_queued_work_finish_before_an_unmap)
{
        pthread_t opener;
        CUdeviceptr p;
        CUstream s;
        int host = -1;

        SIM_ONLY();
        setenv("AQUA_SIM_STRICT", "0", 1);
        sim_start(0);
        p = map_new(0, GRAN, NULL);
        CU_OK(cuMemsetD8(p, 0x22, GRAN));
        s = queue_behind_gate(p, &host);
        cr_assert_eq(pthread_create(&opener, NULL, gate_opener, &gate), 0);
        CU_OK(cuMemUnmap(p, GRAN));
        pthread_join(opener, NULL);
        CU_OK(cuStreamSynchronize(s));
        cr_assert_eq(host, 0x22222222);
}
