/*
 * The public API against the fake daemon, on simcuda: opening and its errors, registration,
 * events from aqua_poll(), reconnecting, and the producer's and consumer's flows message by
 * message. The real daemon is exercised by the integration tests in tests/.
 */
#include <criterion/criterion.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "aqua/aqua.h"
#include "fake-daemon.h"
#include "gpu.h"
#include "time-util.h"
#include "util.h"

#define CHUNK (UINT64_C(2) << 20)

static struct fake fk;
static struct aqua_options opts = AQUA_OPTIONS_INIT;
static aqua_ctx *ctx;

static char last_error[512];

/* The library's messages go to the test's stderr, shown when a test fails. */
static void test_log(enum aqua_log_level level, const char *message, void *userdata)
{
        fprintf(stderr, "libaqua[%d]: %s\n", level, message);
        if (level <= AQUA_LOG_ERROR)
                snprintf(last_error, sizeof(last_error), "%s", message);
}

static void setup(void)
{
        aqua_set_log(test_log, NULL, AQUA_LOG_DEBUG);
        test_sim_machine("test-api", "2x1GiB");
        unsetenv("AQUA_ENDPOINT");
        unsetenv("AQUA_SIDE_PATH");
        fake_start(&fk);
        opts.endpoint = fk.endpoint;
        opts.side_path = fk.side_path;
        opts.client_name = "test-api";
        opts.chunk_bytes = CHUNK;
}

static void teardown(void)
{
        ctx = aqua_close(ctx);
        fake_stop(&fk);
        test_sim_cleanup();
}

TestSuite(api, .init = setup, .fini = teardown, .timeout = 60);

/* ---------------------------------------------------------------- helpers */

static Aqua__Hello *hello_seen;

/* Keep a copy of the last Hello for the test to look at. */
static void keep_hello(const Aqua__Hello *h)
{
        size_t len = aqua__hello__get_packed_size(h);
        uint8_t *buf = malloc(len ? len : 1);

        aqua__hello__pack(h, buf);
        if (hello_seen)
                aqua__hello__free_unpacked(hello_seen, NULL);
        hello_seen = aqua__hello__unpack(NULL, len, buf);
        free(buf);
}

/* The daemon's half of aqua_open(): accept, take the Hello, welcome it. */
static void *serve_open(void *arg)
{
        Aqua__Envelope *e;

        fake_accept(&fk, false);
        e = fake_recv(&fk);
        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_HELLO);
        cr_assert_eq(e->hello->token.len, SIDE_TOKEN_LEN);
        cr_assert_arr_eq(e->hello->token.data, fake_token, SIDE_TOKEN_LEN);
        fake_welcome(&fk, e->request_id, 42, "GPU-peer");
        keep_hello(e->hello);
        aqua__envelope__free_unpacked(e, NULL);
        return arg;
}

static void open_as(enum aqua_role role)
{
        pthread_t th;

        pthread_create(&th, NULL, serve_open, NULL);
        cr_assert_eq(aqua_open(0, role, &opts, &ctx), 0);
        pthread_join(th, NULL);
}

/* Poll until an event of type arrives, waiting on aqua_fd() in between (bounded). */
static struct aqua_event wait_event(enum aqua_event_type type)
{
        struct aqua_event ev[4];
        int fd;

        cr_assert_eq(aqua_fd(ctx, &fd), 0);
        for (int i = 0; i < 1000; i++) {
                struct pollfd p = {.fd = fd, .events = POLLIN};
                size_t n = 0;

                cr_assert_eq(aqua_poll(ctx, ev, 4, &n), 0);
                for (size_t k = 0; k < n; k++)
                        if (ev[k].type == type)
                                return ev[k];
                poll(&p, 1, 10);
        }
        cr_assert_fail("no event %d", type);
        return ev[0];
}

static void send_env(Aqua__Envelope *e, uint64_t request_id)
{
        e->request_id = request_id;
        fake_send(&fk, e);
}

/* Answer request_id with an Error of code and message. */
static void send_error(Aqua__ErrorCode code, const char *message, uint64_t request_id)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Error err = AQUA__ERROR__INIT;

        err.code = code;
        err.message = (char *)message;
        e.body_case = AQUA__ENVELOPE__BODY_ERROR;
        e.error = &err;
        send_env(&e, request_id);
}

/* ---------------------------------------------------------------- opening */

Test(api, names_outcomes_and_errors)
{
        cr_assert_str_eq(aqua_strerror(0), "success");
        cr_assert_str_eq(aqua_strerror(AQUA_TIMEOUT), "timed out before completion");
        cr_assert_str_eq(aqua_strerror(-ENOTCONN), "not connected to aquad");
        cr_assert_str_eq(aqua_strerror(-ENOMEM), strerror(ENOMEM));
        cr_assert_str_eq(aqua_strerror(1000), "unknown outcome");
        cr_assert_str_eq(aqua_version(), "0.1.0");
}

Test(api, refuses_bad_arguments)
{
        struct aqua_options small = {.size = 1};

        cr_assert_eq(aqua_open(-1, AQUA_ROLE_CONSUMER, &opts, &ctx), -EINVAL);
        cr_assert_eq(aqua_open(0, 0, &opts, &ctx), -EINVAL);
        cr_assert_eq(aqua_open(0, AQUA_ROLE_CONSUMER, &opts, NULL), -EINVAL);
        cr_assert_eq(aqua_open(0, AQUA_ROLE_CONSUMER, &small, &ctx), -EINVAL);
        cr_assert_null(ctx);
        cr_assert_null(aqua_close(NULL));
}

Test(api, says_which_device_does_not_exist)
{
        cr_assert_eq(aqua_open(2, AQUA_ROLE_CONSUMER, &opts, &ctx), -ENODEV);
}

Test(api, says_when_no_daemon_listens)
{
        int r;

        fake_unlisten(&fk);
        r = aqua_open(0, AQUA_ROLE_CONSUMER, &opts, &ctx);
        cr_assert(r == -ENOENT || r == -ECONNREFUSED, "got %d", r);
}

Test(api, says_when_there_is_no_cuda_driver)
{
        setenv("AQUA_CUDA_LIBRARY", "/nonexistent/libcuda.so.1", 1);
        cr_assert_eq(aqua_open(0, AQUA_ROLE_CONSUMER, &opts, &ctx), -ELIBACC);
}

Test(api, derives_the_side_channel_from_the_endpoint)
{
        pthread_t th;

        /* fake's endpoint is DIR/d.sock and its side channel DIR/d.side: aquad's naming. */
        opts.side_path = NULL;
        pthread_create(&th, NULL, serve_open, NULL);
        cr_assert_eq(aqua_open(0, AQUA_ROLE_NEUTRAL, &opts, &ctx), 0);
        pthread_join(th, NULL);
}

Test(api, registers_the_gpu_with_its_identity)
{
        struct aqua_info info;

        open_as(AQUA_ROLE_CONSUMER);
        cr_assert_eq(aqua_get_info(ctx, &info), 0);
        cr_assert(info.connected);
        cr_assert_eq(info.client_id, 42);
        cr_assert_str_eq(info.paired_with, "GPU-peer");
        cr_assert_eq(info.dram_budget, UINT64_C(1) << 30);
        cr_assert_eq(info.capacity, UINT64_C(1) << 30);
        cr_assert_eq(info.granularity, CHUNK);

        cr_assert_not_null(hello_seen);
        cr_assert_eq(hello_seen->role, AQUA__ROLE__ROLE_CONSUMER);
        cr_assert_str_eq(hello_seen->gpu_uuid, info.gpu_uuid);
        cr_assert_eq(strncmp(info.gpu_uuid, "GPU-", 4), 0);
        cr_assert_eq(strlen(info.gpu_uuid), 40);
        cr_assert_eq(hello_seen->gpu_ordinal, 0);
        cr_assert_eq(hello_seen->gpu_capacity, UINT64_C(1) << 30);
        cr_assert_eq(hello_seen->granularity, CHUNK);
        cr_assert_str_eq(hello_seen->client_name, "test-api");
        cr_assert_eq(hello_seen->n_links, 1, "the other simulated GPU is a peer");
        cr_assert_neq(strcmp(hello_seen->links[0]->gpu_uuid, info.gpu_uuid), 0);
        cr_assert_eq(hello_seen->n_held, 0);
        aqua__hello__free_unpacked(hello_seen, NULL);
        hello_seen = NULL;
}

static void *serve_reject(void *arg)
{
        fake_accept(&fk, true);
        return arg;
}

Test(api, is_refused_when_the_daemon_rejects_the_user)
{
        pthread_t th;

        pthread_create(&th, NULL, serve_reject, NULL);
        cr_assert_eq(aqua_open(0, AQUA_ROLE_CONSUMER, &opts, &ctx), -EACCES);
        pthread_join(th, NULL);
}

static const struct {
        Aqua__SideFrame__RejectReason reason;
        const char *text;
        int error;
} refusals[] = {
    {AQUA__SIDE_FRAME__REJECT_REASON__REJECT_REASON_PERMISSION, "uid 1234 is not allowed", -EACCES},
    {AQUA__SIDE_FRAME__REJECT_REASON__REJECT_REASON_CLIENT_LIMIT,
     "the limit of 256 clients is reached", -EUSERS},
    {AQUA__SIDE_FRAME__REJECT_REASON__REJECT_REASON_STOPPING, "aquad is stopping", -ESHUTDOWN},
};
static size_t refusal;

static void *serve_reject_reason(void *arg)
{
        fake_reject(&fk, refusals[refusal].reason, refusals[refusal].text);
        return arg;
}

/* A full or stopping daemon is worth trying again later; a refusal of the user is not. */
Test(api, tells_each_reason_for_a_refusal_apart_and_logs_the_daemons_words)
{
        for (refusal = 0; refusal < ARRAY_SIZE(refusals); refusal++) {
                pthread_t th;

                last_error[0] = '\0';
                pthread_create(&th, NULL, serve_reject_reason, NULL);
                cr_assert_eq(aqua_open(0, AQUA_ROLE_CONSUMER, &opts, &ctx), refusals[refusal].error,
                             "%s", refusals[refusal].text);
                pthread_join(th, NULL);
                cr_assert(strstr(last_error, refusals[refusal].text), "logged: %s", last_error);
                cr_assert_neq(strcmp(aqua_strerror(refusals[refusal].error), "Unknown error"), 0);
                safe_close(fk.side_fd);
                fk.side_fd = -1;
        }
}

/* ---------------------------------------------------------------- events */

Test(api, polls_nothing_when_nothing_arrived)
{
        struct aqua_event ev[4];
        size_t n = 99;

        open_as(AQUA_ROLE_NEUTRAL);
        for (int i = 0; i < 100; i++) {
                cr_assert_eq(aqua_poll(ctx, ev, 4, &n), 0);
                cr_assert_eq(n, 0);
        }
        cr_assert_eq(aqua_poll(ctx, NULL, 0, &n), 0);
}

Test(api, turns_notices_into_events)
{
        struct aqua_info info;

        open_as(AQUA_ROLE_CONSUMER);
        fake_send_pair_changed(&fk, 0, "GPU-other");
        wait_event(AQUA_EVENT_PAIR_CHANGED);
        cr_assert_eq(aqua_get_info(ctx, &info), 0);
        cr_assert_str_eq(info.paired_with, "GPU-other");
}

Test(api, reports_load_without_waiting)
{
        struct aqua_load load = {.load = 0.25, .used_bytes = 1 << 20, .free_bytes = 3 << 20};
        Aqua__Envelope *e;

        open_as(AQUA_ROLE_CONSUMER);
        cr_assert_eq(aqua_report_load(ctx, &load), 0);
        e = fake_recv(&fk);
        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_LOAD);
        cr_assert_float_eq(e->load->load, 0.25, 1e-9);
        cr_assert_eq(e->load->used_bytes, 1 << 20);
        fake_send_ack(&fk, e->request_id);
        aqua__envelope__free_unpacked(e, NULL);
        load.load = -1;
        cr_assert_eq(aqua_report_load(ctx, &load), -EINVAL);
}

/* Serve the fake daemon's side of a reconnect from the polling thread itself. */
static bool serve_reconnect_step(void)
{
        zmq_pollitem_t items[2] = {
            {.fd = fk.listen_fd, .events = ZMQ_POLLIN},
            {.socket = fk.router, .events = ZMQ_POLLIN},
        };
        bool welcomed = false;

        if (zmq_poll(items, 2, 0) <= 0)
                return false;
        if (items[0].revents & ZMQ_POLLIN)
                fake_accept(&fk, false);
        if (items[1].revents & ZMQ_POLLIN) {
                Aqua__Envelope *e = fake_recv(&fk);

                if (e->body_case == AQUA__ENVELOPE__BODY_HELLO) {
                        keep_hello(e->hello);
                        fake_welcome(&fk, e->request_id, 43, "GPU-peer");
                        welcomed = true;
                }
                aqua__envelope__free_unpacked(e, NULL);
        }
        return welcomed;
}

Test(api, reconnects_and_registers_again_after_the_daemon_restarts)
{
        struct aqua_event ev[4];
        struct aqua_info info;
        bool reconnected = false;
        int fd;

        open_as(AQUA_ROLE_CONSUMER);
        /* The daemon dies: its side channel closes, its socket path goes away. */
        fake_unlisten(&fk);
        wait_event(AQUA_EVENT_DISCONNECTED);
        cr_assert_eq(aqua_get_info(ctx, &info), 0);
        cr_assert_not(info.connected);
        cr_assert_eq(aqua_report_load(ctx, &(struct aqua_load){.load = 0.5}), -ENOTCONN);

        /* It comes back. aqua_fd() wakes the loop when it is time to try again. */
        fake_listen(&fk);
        cr_assert_eq(aqua_fd(ctx, &fd), 0);
        for (int i = 0; i < 2000 && !reconnected; i++) {
                struct pollfd p = {.fd = fd, .events = POLLIN};
                size_t n = 0;

                serve_reconnect_step();
                cr_assert_eq(aqua_poll(ctx, ev, 4, &n), 0);
                for (size_t k = 0; k < n; k++)
                        reconnected |= ev[k].type == AQUA_EVENT_RECONNECTED;
                poll(&p, 1, 5);
        }
        cr_assert(reconnected);
        cr_assert_eq(aqua_get_info(ctx, &info), 0);
        cr_assert(info.connected);
        cr_assert_eq(info.client_id, 43);
        cr_assert_not_null(hello_seen);
        aqua__hello__free_unpacked(hello_seen, NULL);
        hello_seen = NULL;
}

/* ---------------------------------------------------------------- consumer */

static struct gpu_dev *peer, *local;
static gpu_handle peer_mem[3];

/* Three chunks of the other GPU, as a producer would have offered them. */
static void make_peer_chunks(void)
{
        cr_assert_eq(gpu_open(1, &peer), 0);
        cr_assert_eq(gpu_open(0, &local), 0);
        for (int i = 0; i < 3; i++)
                cr_assert_eq(gpu_alloc_exportable(peer, CHUNK, false, &peer_mem[i]), 0);
}

static void drop_peer_chunks(void)
{
        for (int i = 0; i < 3; i++)
                if (peer_mem[i])
                        gpu_release(peer, peer_mem[i]);
        peer = gpu_free(peer);
        local = gpu_free(local);
}

static void *serve_borrow(void *arg)
{
        Aqua__Envelope *e = fake_recv(&fk), reply = AQUA__ENVELOPE__INIT;
        Aqua__Grant g = AQUA__GRANT__INIT;
        Aqua__GrantedChunk gc[3], *gcp[3];
        Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
        int fds[3];

        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_BORROW);
        cr_assert_eq(e->borrow->bytes, 3 * CHUNK);
        cr_assert_eq(e->borrow->min_bytes, CHUNK);
        for (int i = 0; i < 3; i++) {
                cr_assert_eq(gpu_export(peer, peer_mem[i], &fds[i]), 0);
                aqua__granted_chunk__init(&gc[i]);
                gc[i].chunk_id = 101 + i;
                gc[i].size = CHUNK;
                gcp[i] = &gc[i];
        }
        /* The fds first, as aquad sends them. */
        f.kind = AQUA__SIDE_FRAME__KIND__KIND_GRANT_FDS;
        f.lease_id = 7;
        cr_assert_eq(side_send(fk.side_fd, &f, fds, 3), 0);
        side_close_fds(fds, 3);
        g.lease_id = 7;
        g.n_chunks = 3;
        g.chunks = gcp;
        reply.body_case = AQUA__ENVELOPE__BODY_GRANT;
        reply.grant = &g;
        send_env(&reply, e->request_id);
        aqua__envelope__free_unpacked(e, NULL);
        return arg;
}

static void fill(uint64_t dptr, uint64_t size, unsigned seed)
{
        uint32_t *buf = malloc(size);

        for (size_t i = 0; i < size / 4; i++)
                buf[i] = seed * 2654435761u + (uint32_t)i;
        cr_assert_eq(gpu_copy(local, dptr, (uint64_t)(uintptr_t)buf, size), 0);
        free(buf);
}

static bool holds(uint64_t src, uint64_t size, unsigned seed)
{
        uint32_t *buf = malloc(size);
        bool ok = true;

        cr_assert_eq(gpu_copy(local, (uint64_t)(uintptr_t)buf, src, size), 0);
        for (size_t i = 0; i < size / 4 && ok; i++)
                ok = buf[i] == seed * 2654435761u + (uint32_t)i;
        free(buf);
        return ok;
}

static void expect_return(const uint64_t *ids, size_t n, bool reply)
{
        Aqua__Envelope *e = fake_recv(&fk), r = AQUA__ENVELOPE__INIT;
        Aqua__ReturnReply rr = AQUA__RETURN_REPLY__INIT;

        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_RETURN, "got %d", e->body_case);
        cr_assert_eq(e->return_->lease_id, 7);
        cr_assert_eq(e->return_->n_chunk_ids, n);
        for (size_t i = 0; i < n; i++)
                cr_assert_eq(e->return_->chunk_ids[i], ids[i]);
        if (reply) {
                rr.lease_id = 7;
                rr.returned = (uint32_t)n;
                r.body_case = AQUA__ENVELOPE__BODY_RETURN_REPLY;
                r.return_reply = &rr;
                send_env(&r, e->request_id);
        }
        aqua__envelope__free_unpacked(e, NULL);
}

static void *serve_return_rest(void *arg)
{
        static const uint64_t rest[] = {101, 103};

        expect_return(rest, 2, true);
        return arg;
}

Test(api, maps_a_grant_and_moves_a_reclaimed_chunk_to_host_memory_in_poll)
{
        Aqua__Envelope notice = AQUA__ENVELOPE__INIT;
        Aqua__ReclaimNotice rn = AQUA__RECLAIM_NOTICE__INIT;
        static const uint64_t reclaimed[] = {102};
        struct aqua_grant g;
        struct aqua_lease_info li;
        struct aqua_chunk_info ci;
        struct aqua_event ev;
        pthread_t th;

        make_peer_chunks();
        open_as(AQUA_ROLE_CONSUMER);
        pthread_create(&th, NULL, serve_borrow, NULL);
        cr_assert_eq(aqua_borrow(ctx, 3 * CHUNK, CHUNK, 0, &g), 0);
        pthread_join(th, NULL);
        cr_assert_not_null(g.lease);
        cr_assert_eq(g.bytes, 3 * CHUNK);
        cr_assert_neq(g.dptr, 0);
        cr_assert_not(g.partial);
        for (int i = 0; i < 3; i++)
                fill(g.dptr + i * CHUNK, CHUNK, 20 + i);

        rn.lease_id = 7;
        rn.n_chunk_ids = 1;
        rn.chunk_ids = (uint64_t *)reclaimed;
        rn.deadline_ms = 5000;
        rn.reason = "producer load";
        notice.body_case = AQUA__ENVELOPE__BODY_RECLAIM_NOTICE;
        notice.reclaim_notice = &rn;
        send_env(&notice, 0);
        ev = wait_event(AQUA_EVENT_MIGRATED);
        cr_assert_eq(ev.lease, g.lease);
        cr_assert_eq(ev.offset, CHUNK);
        cr_assert_eq(ev.bytes, CHUNK);
        expect_return(reclaimed, 1, true);

        for (int i = 0; i < 3; i++)
                cr_assert(holds(g.dptr + i * CHUNK, CHUNK, 20 + i), "chunk %d", i);
        cr_assert_eq(aqua_lease_get_info(ctx, g.lease, &li), 0);
        cr_assert_eq(li.lease_id, 7);
        cr_assert_eq(li.peer_bytes, 2 * CHUNK);
        cr_assert_eq(li.dram_bytes, CHUNK);
        cr_assert_eq(aqua_lease_get_chunk(ctx, g.lease, 1, &ci), 0);
        cr_assert_eq(ci.chunk_id, 102);
        cr_assert_eq(ci.tier, AQUA_TIER_DRAM);
        cr_assert_null(ci.host, "mapped at the same device address");
        cr_assert_eq(aqua_lease_get_chunk(ctx, g.lease, 3, &ci), -ERANGE);

        /* Only what is still the producer's goes back with the lease. */
        pthread_create(&th, NULL, serve_return_rest, NULL);
        cr_assert_eq(aqua_return(ctx, g.lease), 0);
        pthread_join(th, NULL);
        cr_assert_eq(aqua_lease_get_info(ctx, g.lease, &li), -EINVAL);
        drop_peer_chunks();
}

static void *serve_refusal(void *arg)
{
        Aqua__Envelope *e = fake_recv(&fk);
        Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
        int fd = memfd_create("stale", MFD_CLOEXEC);

        /* Fds for a lease that is then refused: the client must close them. */
        f.kind = AQUA__SIDE_FRAME__KIND__KIND_GRANT_FDS;
        f.lease_id = 9;
        cr_assert_eq(side_send(fk.side_fd, &f, &fd, 1), 0);
        close(fd);
        send_error(AQUA__ERROR_CODE__ERROR_CODE_NO_MEMORY, "borrow: nothing to lend",
                   e->request_id);
        aqua__envelope__free_unpacked(e, NULL);
        return arg;
}

Test(api, reports_a_refused_borrow_as_its_outcome)
{
        struct aqua_grant g;
        pthread_t th;

        open_as(AQUA_ROLE_CONSUMER);
        pthread_create(&th, NULL, serve_refusal, NULL);
        cr_assert_eq(aqua_borrow(ctx, CHUNK, CHUNK, 0, &g), AQUA_NO_MEMORY);
        pthread_join(th, NULL);
        cr_assert_eq(aqua_borrow(ctx, CHUNK, 2 * CHUNK, 0, &g), -EINVAL);
        cr_assert_eq(aqua_offer(ctx, CHUNK, NULL), -EPERM);
}

/* ---------------------------------------------------------------- producer */

static uint64_t used_on(int device)
{
        struct gpu_dev *g;
        uint64_t free_b, total;

        cr_assert_eq(gpu_open(device, &g), 0);
        cr_assert_eq(gpu_mem_info(g, &free_b, &total), 0);
        gpu_free(g);
        return total - free_b;
}

static void *serve_offer(void *arg)
{
        Aqua__Envelope *e, reply = AQUA__ENVELOPE__INIT;
        Aqua__OfferReply orp = AQUA__OFFER_REPLY__INIT;
        static uint64_t ids[3] = {11, 12, 13};
        Aqua__SideFrame *f;
        int fds[8];
        size_t n = 0;

        f = fake_side_recv(&fk, fds, 8, &n);
        cr_assert_eq(f->kind, AQUA__SIDE_FRAME__KIND__KIND_OFFER_FDS);
        cr_assert_eq(n, 3);
        e = fake_recv(&fk);
        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_OFFER);
        cr_assert_eq(e->request_id, f->request_id);
        cr_assert_eq(e->offer->n_chunks, 3);
        cr_assert_eq(e->offer->chunks[2]->size, CHUNK);
        /* This daemon keeps no handle: the producer's own is what holds the memory. */
        side_close_fds(fds, n);
        aqua__side_frame__free_unpacked(f, NULL);
        orp.n_chunk_ids = 3;
        orp.chunk_ids = ids;
        reply.body_case = AQUA__ENVELOPE__BODY_OFFER_REPLY;
        reply.offer_reply = &orp;
        send_env(&reply, e->request_id);
        aqua__envelope__free_unpacked(e, NULL);
        return arg;
}

/* A producer that offered 3 chunks (ids 11, 12, 13), served by the fake daemon. */
static void open_producer_with_three_chunks(void)
{
        pthread_t th;

        open_as(AQUA_ROLE_PRODUCER);
        pthread_create(&th, NULL, serve_offer, NULL);
        cr_assert_eq(aqua_offer(ctx, 3 * CHUNK, NULL), 0);
        pthread_join(th, NULL);
}

static void *serve_reclaim(void *arg)
{
        Aqua__Envelope *e = fake_recv(&fk), reply = AQUA__ENVELOPE__INIT,
                       later = AQUA__ENVELOPE__INIT;
        Aqua__ReclaimReply rr = AQUA__RECLAIM_REPLY__INIT;
        Aqua__Reclaimed rd = AQUA__RECLAIMED__INIT;
        static uint64_t now_ids[] = {11}, pending_ids[] = {12};

        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_RECLAIM_REQUEST);
        cr_assert_eq(e->reclaim_request->bytes, 2 * CHUNK);
        rr.n_chunk_ids = 1;
        rr.chunk_ids = now_ids;
        rr.n_pending_chunk_ids = 1;
        rr.pending_chunk_ids = pending_ids;
        rr.deadline_ms = 5000;
        reply.body_case = AQUA__ENVELOPE__BODY_RECLAIM_REPLY;
        reply.reclaim_reply = &rr;
        send_env(&reply, e->request_id);
        /* The consumer returns chunk 12 a little later. */
        usleep(20000);
        rd.n_chunk_ids = 1;
        rd.chunk_ids = pending_ids;
        later.body_case = AQUA__ENVELOPE__BODY_RECLAIMED;
        later.reclaimed = &rd;
        send_env(&later, 0);
        aqua__envelope__free_unpacked(e, NULL);
        return arg;
}

Test(api, offers_chunks_and_frees_them_when_reclaimed)
{
        Aqua__Envelope *e, reply = AQUA__ENVELOPE__INIT;
        Aqua__ReclaimReply rr = AQUA__RECLAIM_REPLY__INIT;
        static uint64_t last[] = {13};
        struct aqua_info info;
        struct aqua_event ev;
        uint64_t offered = 0, freed = 0;
        pthread_t th;

        open_as(AQUA_ROLE_PRODUCER);
        pthread_create(&th, NULL, serve_offer, NULL);
        cr_assert_eq(aqua_offer(ctx, 3 * CHUNK, &offered), 0);
        pthread_join(th, NULL);
        cr_assert_eq(offered, 3 * CHUNK);
        cr_assert_eq(aqua_get_info(ctx, &info), 0);
        cr_assert_eq(info.offered_bytes, 3 * CHUNK);
        cr_assert_eq(used_on(0), 3 * CHUNK);

        pthread_create(&th, NULL, serve_reclaim, NULL);
        cr_assert_eq(aqua_reclaim(ctx, 2 * CHUNK, AQUA_FOREVER, &freed), 0);
        pthread_join(th, NULL);
        cr_assert_eq(freed, 2 * CHUNK);
        cr_assert_eq(used_on(0), CHUNK);

        /* The non-blocking form: the result comes as an event. */
        cr_assert_eq(aqua_reclaim_async(ctx, AQUA_ALL), AQUA_PENDING);
        e = fake_recv(&fk);
        cr_assert(e->reclaim_request->all);
        rr.n_chunk_ids = 1;
        rr.chunk_ids = last;
        reply.body_case = AQUA__ENVELOPE__BODY_RECLAIM_REPLY;
        reply.reclaim_reply = &rr;
        send_env(&reply, e->request_id);
        aqua__envelope__free_unpacked(e, NULL);
        ev = wait_event(AQUA_EVENT_RECLAIMED);
        cr_assert_eq(ev.bytes, CHUNK);
        cr_assert_eq(used_on(0), 0);
        cr_assert_eq(aqua_get_info(ctx, &info), 0);
        cr_assert_eq(info.offered_bytes, 0);
}

static uint64_t pending_ids[] = {12, 13};

/* A reclaim the consumer does not answer in time. */
static void *serve_pending_reclaim(void *arg)
{
        Aqua__Envelope *e = fake_recv(&fk), reply = AQUA__ENVELOPE__INIT;
        Aqua__ReclaimReply rr = AQUA__RECLAIM_REPLY__INIT;

        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_RECLAIM_REQUEST);
        rr.n_pending_chunk_ids = 2;
        rr.pending_chunk_ids = pending_ids;
        reply.body_case = AQUA__ENVELOPE__BODY_RECLAIM_REPLY;
        reply.reclaim_reply = &rr;
        send_env(&reply, e->request_id);
        aqua__envelope__free_unpacked(e, NULL);
        return arg;
}

Test(api, reports_what_a_reclaim_freed_before_its_timeout_and_the_rest_as_events)
{
        Aqua__Envelope later = AQUA__ENVELOPE__INIT;
        Aqua__Reclaimed rd = AQUA__RECLAIMED__INIT;
        struct aqua_event ev;
        uint64_t freed = 99;
        pthread_t th;

        open_producer_with_three_chunks();

        pthread_create(&th, NULL, serve_pending_reclaim, NULL);
        cr_assert_eq(aqua_reclaim(ctx, 2 * CHUNK, 50, &freed), AQUA_TIMEOUT);
        pthread_join(th, NULL);
        cr_assert_eq(freed, 0);

        rd.n_chunk_ids = 2;
        rd.chunk_ids = pending_ids;
        later.body_case = AQUA__ENVELOPE__BODY_RECLAIMED;
        later.reclaimed = &rd;
        send_env(&later, 0);
        ev = wait_event(AQUA_EVENT_RECLAIMED);
        cr_assert_eq(ev.bytes, 2 * CHUNK);
        cr_assert_eq(used_on(0), CHUNK);
}

/* The reply to a blocking reclaim that gave up on it comes while a second one waits. */
static void *serve_late_reclaim_reply(void *arg)
{
        static uint64_t first[] = {11, 12}, second[] = {13};
        Aqua__Envelope *late = arg, *e = fake_recv(&fk), reply = AQUA__ENVELOPE__INIT;
        Aqua__ReclaimReply rr = AQUA__RECLAIM_REPLY__INIT;

        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_RECLAIM_REQUEST);
        reply.body_case = AQUA__ENVELOPE__BODY_RECLAIM_REPLY;
        reply.reclaim_reply = &rr;
        rr.n_chunk_ids = 2;
        rr.chunk_ids = first;
        send_env(&reply, late->request_id);
        rr.n_chunk_ids = 1;
        rr.chunk_ids = second;
        send_env(&reply, e->request_id);
        aqua__envelope__free_unpacked(e, NULL);
        return NULL;
}

Test(api, a_reclaim_reply_given_up_on_is_not_taken_for_the_next_reclaims)
{
        Aqua__Envelope *first;
        struct aqua_event ev;
        uint64_t freed = 99;
        pthread_t th;

        open_producer_with_three_chunks();

        /* aquad takes the first request and answers only later. */
        cr_assert_eq(aqua_reclaim(ctx, CHUNK, 50, &freed), AQUA_TIMEOUT);
        first = fake_recv(&fk);
        cr_assert_eq(first->body_case, AQUA__ENVELOPE__BODY_RECLAIM_REQUEST);

        pthread_create(&th, NULL, serve_late_reclaim_reply, first);
        cr_assert_eq(aqua_reclaim(ctx, CHUNK, AQUA_FOREVER, &freed), 0);
        pthread_join(th, NULL);
        aqua__envelope__free_unpacked(first, NULL);
        cr_assert_eq(freed, CHUNK, "the second reclaim counts its own reply only");
        ev = wait_event(AQUA_EVENT_RECLAIMED);
        cr_assert_eq(ev.bytes, 2 * CHUNK, "the first one's chunks are reported as an event");
        cr_assert_eq(used_on(0), 0);
}

/* A daemon whose replies name at most two chunks. */
static void *serve_reclaim_in_parts(void *arg)
{
        static uint64_t first[] = {11, 12}, second[] = {13};

        for (int part = 0; part < 2; part++) {
                Aqua__Envelope *e = fake_recv(&fk), reply = AQUA__ENVELOPE__INIT;
                Aqua__ReclaimReply rr = AQUA__RECLAIM_REPLY__INIT;

                cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_RECLAIM_REQUEST);
                cr_assert(e->reclaim_request->all);
                rr.n_chunk_ids = part == 0 ? 2 : 1;
                rr.chunk_ids = part == 0 ? first : second;
                reply.body_case = AQUA__ENVELOPE__BODY_RECLAIM_REPLY;
                reply.reclaim_reply = &rr;
                send_env(&reply, e->request_id);
                aqua__envelope__free_unpacked(e, NULL);
        }
        return arg;
}

/* Its first reply frees two chunks at once, the second names one its consumer still holds,
 * which comes back a little later. */
static void *serve_reclaim_free_then_pending(void *arg)
{
        static uint64_t first[] = {11, 12}, second[] = {13};
        Aqua__Envelope later = AQUA__ENVELOPE__INIT;
        Aqua__Reclaimed rd = AQUA__RECLAIMED__INIT;

        for (int part = 0; part < 2; part++) {
                Aqua__Envelope *e = fake_recv(&fk), reply = AQUA__ENVELOPE__INIT;
                Aqua__ReclaimReply rr = AQUA__RECLAIM_REPLY__INIT;

                cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_RECLAIM_REQUEST);
                if (part == 0) {
                        rr.n_chunk_ids = 2;
                        rr.chunk_ids = first;
                } else {
                        rr.n_pending_chunk_ids = 1;
                        rr.pending_chunk_ids = second;
                }
                reply.body_case = AQUA__ENVELOPE__BODY_RECLAIM_REPLY;
                reply.reclaim_reply = &rr;
                send_env(&reply, e->request_id);
                aqua__envelope__free_unpacked(e, NULL);
        }
        usleep(100 * 1000);
        rd.n_chunk_ids = 1;
        rd.chunk_ids = second;
        later.body_case = AQUA__ENVELOPE__BODY_RECLAIMED;
        later.reclaimed = &rd;
        send_env(&later, 0);
        return arg;
}

Test(api, a_reclaim_waits_for_what_a_later_reply_left_with_the_consumer)
{
        uint64_t freed = 0;
        pthread_t th;

        open_producer_with_three_chunks();
        pthread_create(&th, NULL, serve_reclaim_free_then_pending, NULL);
        cr_assert_eq(aqua_reclaim(ctx, 3 * CHUNK, AQUA_FOREVER, &freed), 0);
        pthread_join(th, NULL);
        cr_assert_eq(freed, 3 * CHUNK);
        cr_assert_eq(used_on(0), 0);
}

Test(api, asks_again_when_a_reclaim_reply_is_cut_short)
{
        uint64_t freed = 0;
        pthread_t th;

        open_producer_with_three_chunks();
        pthread_create(&th, NULL, serve_reclaim_in_parts, NULL);
        cr_assert_eq(aqua_reclaim(ctx, AQUA_ALL, AQUA_FOREVER, &freed), 0);
        pthread_join(th, NULL);
        cr_assert_eq(freed, 3 * CHUNK);
        cr_assert_eq(used_on(0), 0);
}

/* A restarted daemon that got the reclaim before the Hello of this connection: it answers
 * NOT_REGISTERED (having done nothing), then takes the registration and the reclaim asked
 * again. */
static void *serve_reclaim_to_a_restarted_daemon(void *arg)
{
        Aqua__Envelope *e = fake_recv(&fk), reply = AQUA__ENVELOPE__INIT;
        Aqua__ReclaimReply rr = AQUA__RECLAIM_REPLY__INIT;
        static uint64_t now_ids[] = {11, 12};
        Aqua__SideFrame *f;
        int fds[8];
        size_t n = 0;

        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_RECLAIM_REQUEST);
        send_error(AQUA__ERROR_CODE__ERROR_CODE_NOT_REGISTERED,
                   "reclaim_request before a successful Hello", e->request_id);
        aqua__envelope__free_unpacked(e, NULL);

        fake_accept(&fk, false);
        e = fake_recv(&fk);
        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_HELLO, "got %d", e->body_case);
        keep_hello(e->hello);
        /* The held chunks' descriptors came first; this daemon keeps none. */
        f = fake_side_recv(&fk, fds, 8, &n);
        cr_assert_eq(f->kind, AQUA__SIDE_FRAME__KIND__KIND_REREGISTER_FDS);
        cr_assert_eq(n, 3);
        side_close_fds(fds, n);
        aqua__side_frame__free_unpacked(f, NULL);
        fake_welcome(&fk, e->request_id, 43, "GPU-peer");
        aqua__envelope__free_unpacked(e, NULL);

        e = fake_recv(&fk);
        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_RECLAIM_REQUEST, "got %d", e->body_case);
        cr_assert_eq(e->reclaim_request->bytes, 2 * CHUNK);
        rr.n_chunk_ids = 2;
        rr.chunk_ids = now_ids;
        reply.body_case = AQUA__ENVELOPE__BODY_RECLAIM_REPLY;
        reply.reclaim_reply = &rr;
        send_env(&reply, e->request_id);
        aqua__envelope__free_unpacked(e, NULL);
        return arg;
}

Test(api, a_reclaim_that_reached_a_restarted_daemon_before_the_hello_is_asked_again)
{
        struct aqua_info info;
        uint64_t freed = 0;
        pthread_t th;

        open_producer_with_three_chunks();
        pthread_create(&th, NULL, serve_reclaim_to_a_restarted_daemon, NULL);
        cr_assert_eq(aqua_reclaim(ctx, 2 * CHUNK, 10000, &freed), 0);
        pthread_join(th, NULL);
        cr_assert_eq(freed, 2 * CHUNK);
        cr_assert_eq(used_on(0), CHUNK);
        cr_assert_not_null(hello_seen);
        cr_assert_eq(hello_seen->n_held, 3, "the new registration names what it holds");
        cr_assert_eq(aqua_get_info(ctx, &info), 0);
        cr_assert(info.connected);
        cr_assert_eq(info.client_id, 43);
}

/* ---------------------------------------------------------------- scrubbing across a restart */

/* Five of them are more than the two 256 MiB scrub steps one aqua_poll() takes. */
#define BIG_CHUNK (UINT64_C(128) << 20)
#define N_BIG     5

/* Offer N_BIG BIG_CHUNKs (ids 11, 12, ...) to the fake daemon. */
static void *serve_big_offer(void *arg)
{
        Aqua__Envelope *e, reply = AQUA__ENVELOPE__INIT;
        Aqua__OfferReply orp = AQUA__OFFER_REPLY__INIT;
        static uint64_t ids[N_BIG] = {11, 12, 13, 14, 15};
        Aqua__SideFrame *f;
        int fds[8];
        size_t n = 0;

        f = fake_side_recv(&fk, fds, 8, &n);
        e = fake_recv(&fk);
        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_OFFER);
        side_close_fds(fds, n);
        aqua__side_frame__free_unpacked(f, NULL);
        orp.n_chunk_ids = N_BIG;
        orp.chunk_ids = ids;
        reply.body_case = AQUA__ENVELOPE__BODY_OFFER_REPLY;
        reply.offer_reply = &orp;
        send_env(&reply, e->request_id);
        aqua__envelope__free_unpacked(e, NULL);
        return arg;
}

static void send_scrub_request(void)
{
        static uint64_t ids[N_BIG] = {11, 12, 13, 14, 15};
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__ScrubRequest rq = AQUA__SCRUB_REQUEST__INIT;

        rq.n_chunk_ids = N_BIG;
        rq.chunk_ids = ids;
        e.body_case = AQUA__ENVELOPE__BODY_SCRUB_REQUEST;
        e.scrub_request = &rq;
        send_env(&e, 0);
}

/* Count, per chunk id 11.., how often a ScrubDone named it; Hellos are welcomed. */
static void count_scrub_done(unsigned counts[N_BIG])
{
        zmq_pollitem_t items[2] = {
            {.fd = fk.listen_fd, .events = ZMQ_POLLIN},
            {.socket = fk.router, .events = ZMQ_POLLIN},
        };

        while (zmq_poll(items, 2, 0) > 0) {
                if (items[0].revents & ZMQ_POLLIN)
                        fake_accept(&fk, false);
                if (!(items[1].revents & ZMQ_POLLIN))
                        continue;
                Aqua__Envelope *e = fake_recv(&fk);
                if (e->body_case == AQUA__ENVELOPE__BODY_HELLO) {
                        keep_hello(e->hello);
                        fake_welcome(&fk, e->request_id, 44, "GPU-peer");
                } else if (e->body_case == AQUA__ENVELOPE__BODY_SCRUB_DONE) {
                        for (size_t i = 0; i < e->scrub_done->n_chunk_ids; i++)
                                if (e->scrub_done->chunk_ids[i] >= 11 &&
                                    e->scrub_done->chunk_ids[i] < 11 + N_BIG)
                                        counts[e->scrub_done->chunk_ids[i] - 11]++;
                        fake_send_ack(&fk, e->request_id);
                }
                aqua__envelope__free_unpacked(e, NULL);
        }
}

/*
 * A daemon asks for five chunks to be scrubbed and dies before the producer got through them
 * (one aqua_poll() takes two 256 MiB steps; the chunks are 640 MiB). The restarted one asks
 * again. Each chunk must
 * be scrubbed once for the new request: work left from the old one would answer the new request
 * early (the daemon grants the chunk as clean) and then zero it again under its new consumer.
 */
Test(api, scrubs_left_from_a_lost_daemon_are_not_done_for_the_next_one)
{
        struct aqua_event ev[8];
        unsigned before[N_BIG] = {0}, after[N_BIG] = {0}, done = 0;
        bool reconnected = false;
        pthread_t th;
        size_t n;
        int fd;

        opts.chunk_bytes = BIG_CHUNK;
        open_as(AQUA_ROLE_PRODUCER);
        pthread_create(&th, NULL, serve_big_offer, NULL);
        cr_assert_eq(aqua_offer(ctx, N_BIG * BIG_CHUNK, NULL), 0);
        pthread_join(th, NULL);

        send_scrub_request();
        /* One aqua_poll() that reads the request: it scrubs what its steps allow. */
        while (done == 0) {
                cr_assert_eq(aqua_poll(ctx, ev, 8, &n), 0);
                poll(NULL, 0, 20);
                count_scrub_done(before);
                for (int i = 0; i < N_BIG; i++)
                        done += before[i];
        }
        cr_assert_lt(done, N_BIG, "one aqua_poll() scrubbed every chunk: nothing was left");
        /* The daemon dies with the rest not done, and comes back. */
        fake_unlisten(&fk);
        wait_event(AQUA_EVENT_DISCONNECTED);
        fake_listen(&fk);
        cr_assert_eq(aqua_fd(ctx, &fd), 0);
        for (int i = 0; i < 2000 && !reconnected; i++) {
                count_scrub_done(after);
                cr_assert_eq(aqua_poll(ctx, ev, 8, &n), 0);
                for (size_t k = 0; k < n; k++)
                        reconnected |= ev[k].type == AQUA_EVENT_RECONNECTED;
                poll(&(struct pollfd){.fd = fd, .events = POLLIN}, 1, 5);
        }
        cr_assert(reconnected);
        memset(after, 0, sizeof(after));
        send_scrub_request();
        for (int i = 0; i < 50; i++) {
                cr_assert_eq(aqua_poll(ctx, ev, 8, &n), 0);
                count_scrub_done(after);
                poll(NULL, 0, 5);
        }
        for (int i = 0; i < N_BIG; i++)
                cr_assert_eq(after[i], 1, "chunk %d was scrubbed %u times for one request", 11 + i,
                             after[i]);
        aqua__hello__free_unpacked(hello_seen, NULL);
        hello_seen = NULL;
}
