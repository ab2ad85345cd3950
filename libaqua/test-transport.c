/* The client transport against a tiny fake daemon: a ROUTER and a side-channel listener. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include "fake-daemon.h"
#include "side.h"
#include "time-util.h"
#include "transport.h"
#include "util.h"
#include "wire.h"

static struct fake fk;
static struct transport *t;

static void setup(void)
{
        fake_start(&fk);
        cr_assert_eq(transport_new(fk.endpoint, fk.side_path, NULL, &t), 0);
}

static void teardown(void)
{
        t = transport_free(t);
        fake_stop(&fk);
}

TestSuite(transport, .init = setup, .fini = teardown, .timeout = 30);

static void handshake(void)
{
        uint8_t token[SIDE_TOKEN_LEN];

        cr_assert_eq(transport_side_start(t), 0);
        fake_accept(&fk, false);
        cr_assert_eq(transport_side_finish(t, token), 0);
        cr_assert_arr_eq(token, fake_token, SIDE_TOKEN_LEN);
}

static void load_request(Aqua__Envelope *e, Aqua__LoadReport *lr)
{
        aqua__envelope__init(e);
        aqua__load_report__init(lr);
        lr->load = 0.5;
        e->body_case = AQUA__ENVELOPE__BODY_LOAD;
        e->load = lr;
}

/* Wait (boundedly, so a broken build fails instead of hanging) until an envelope arrives. */
static Aqua__Envelope *next_blocking(void)
{
        uint64_t until = now_mono_ns() + 10 * NSEC_PER_SEC;
        Aqua__Envelope *e = NULL;

        for (;;) {
                int r = transport_next(t, &e);
                if (r == 0)
                        return e;
                cr_assert_eq(r, -EAGAIN);
                cr_assert_eq(transport_wait(t, until), 0, "nothing arrived");
        }
}

/* Drain until idle: ZeroMQ may still be finishing its own connection chores. */
static void settle(void)
{
        Aqua__Envelope *e;

        for (int i = 0; i < 1000 && !transport_idle(t); i++) {
                while (transport_next(t, &e) == 0) {
                        cr_assert_fail("unexpected %s", wire_body_name(e));
                        aqua__envelope__free_unpacked(e, NULL);
                }
                usleep(1000);
        }
        cr_assert(transport_idle(t));
}

Test(transport, hands_over_the_token_of_the_side_channel)
{
        handshake();
        cr_assert(transport_side_connected(t));
}

Test(transport, reports_a_refusal_with_its_reason)
{
        uint8_t token[SIDE_TOKEN_LEN];

        cr_assert_eq(transport_side_start(t), 0);
        fake_accept(&fk, true);
        cr_assert_eq(transport_side_finish(t, token), TRANSPORT_E_REJECTED);
        cr_assert_str_eq(transport_reject_reason(t), "uid 1234 is not allowed");
        cr_assert_not(transport_side_connected(t));
}

Test(transport, says_when_nobody_listens)
{
        struct transport *t2 = NULL;
        char path[160];

        snprintf(path, sizeof(path), "%s/none.side", fk.dir);
        cr_assert_eq(transport_new("ipc:///nonexistent/x.sock", path, NULL, &t2), 0);
        cr_assert_eq(transport_side_start(t2), -ENOENT);
        transport_free(t2);
}

Test(transport, waits_for_the_token_until_the_deadline)
{
        uint8_t token[SIDE_TOKEN_LEN];

        /* Connected (the backlog takes it) but never accepted: no HELLO comes. */
        cr_assert_eq(transport_side_connect(t, now_mono_ns() + 50 * NSEC_PER_MSEC, token),
                     -ETIMEDOUT);
}

struct script {
        int notices_before; /* notices sent before the reply */
        bool stray_reply;   /* a reply to some other request before ours */
        bool close_side;    /* close the side channel instead of replying */
};

static void *fake_daemon(void *arg)
{
        const struct script *s = arg;
        Aqua__Envelope *req = fake_recv(&fk);

        for (int i = 0; i < s->notices_before; i++)
                fake_send_pair_changed(&fk, 0, i == 0 ? "GPU-a" : "GPU-b");
        if (s->stray_reply)
                fake_send_ack(&fk, req->request_id + 1000);
        if (s->close_side)
                fk.side_fd = safe_close(fk.side_fd);
        else
                fake_send_ack(&fk, req->request_id);
        aqua__envelope__free_unpacked(req, NULL);
        return NULL;
}

Test(transport, matches_the_reply_and_queues_what_came_before_it_in_order)
{
        struct script s = {.notices_before = 2, .stray_reply = true};
        Aqua__Envelope req, *reply = NULL, *e;
        Aqua__LoadReport lr;
        pthread_t th;

        handshake();
        load_request(&req, &lr);
        pthread_create(&th, NULL, fake_daemon, &s);
        cr_assert_eq(transport_call(t, &req, now_mono_ns() + 10 * NSEC_PER_SEC, &reply), 0);
        pthread_join(th, NULL);
        cr_assert_neq(req.request_id, 0);
        cr_assert_eq(reply->request_id, req.request_id);
        cr_assert_eq(reply->body_case, AQUA__ENVELOPE__BODY_ACK);
        aqua__envelope__free_unpacked(reply, NULL);

        cr_assert_eq(transport_next(t, &e), 0);
        cr_assert_str_eq(e->pair_changed->paired_with, "GPU-a");
        aqua__envelope__free_unpacked(e, NULL);
        cr_assert_eq(transport_next(t, &e), 0);
        cr_assert_str_eq(e->pair_changed->paired_with, "GPU-b");
        aqua__envelope__free_unpacked(e, NULL);
        cr_assert_eq(transport_next(t, &e), 0);
        cr_assert_eq(e->request_id, req.request_id + 1000);
        aqua__envelope__free_unpacked(e, NULL);
        cr_assert_eq(transport_next(t, &e), -EAGAIN);
}

Test(transport, learns_at_once_that_the_daemon_died_during_a_call)
{
        struct script s = {.close_side = true};
        Aqua__Envelope req, *reply = NULL;
        Aqua__LoadReport lr;
        pthread_t th;

        handshake();
        load_request(&req, &lr);
        pthread_create(&th, NULL, fake_daemon, &s);
        /* The deadline is far: only the side channel's EOF can end this call early. */
        cr_assert_eq(transport_call(t, &req, UINT64_MAX, &reply), TRANSPORT_E_CLOSED);
        pthread_join(th, NULL);
        cr_assert_not(transport_side_connected(t));
}

Test(transport, gives_up_on_a_reply_at_the_deadline)
{
        Aqua__Envelope req, *reply = NULL;
        Aqua__LoadReport lr;

        handshake();
        load_request(&req, &lr);
        cr_assert_eq(transport_call(t, &req, now_mono_ns() + 50 * NSEC_PER_MSEC, &reply),
                     -ETIMEDOUT);
}

Test(transport, takes_the_descriptors_of_the_lease_asked_for)
{
        Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
        struct side_msg *m = NULL;
        uint64_t ids[1] = {42};
        int fd = memfd_create("chunk", MFD_CLOEXEC);

        handshake();
        /* Another lease's frame first: it must stay queued. */
        f.kind = AQUA__SIDE_FRAME__KIND__KIND_GRANT_FDS;
        f.lease_id = 8;
        cr_assert_eq(side_send(fk.side_fd, &f, &fd, 1), 0);
        f.lease_id = 7;
        f.n_chunk_ids = 1;
        f.chunk_ids = ids;
        cr_assert_eq(side_send(fk.side_fd, &f, &fd, 1), 0);
        close(fd);

        cr_assert_eq(transport_side_take(t, AQUA__SIDE_FRAME__KIND__KIND_GRANT_FDS, 7,
                                         now_mono_ns() + 10 * NSEC_PER_SEC, &m),
                     0);
        cr_assert_eq(m->frame->lease_id, 7);
        cr_assert_eq(m->n_fds, 1);
        cr_assert_geq(fcntl(m->fds[0], F_GETFD), 0);
        side_msg_free(m);
        cr_assert_eq(transport_side_take(t, AQUA__SIDE_FRAME__KIND__KIND_GRANT_FDS, 8, 0, &m), 0);
        cr_assert_eq(m->frame->lease_id, 8);
        side_msg_free(m);
        cr_assert_eq(transport_side_take(t, AQUA__SIDE_FRAME__KIND__KIND_GRANT_FDS, 9, 0, &m),
                     -ETIMEDOUT);
}

Test(transport, is_idle_until_a_notice_arrives_and_its_fd_says_so)
{
        Aqua__Envelope req, *e;
        Aqua__LoadReport lr;
        struct pollfd p = {.fd = transport_fd(t), .events = POLLIN};

        handshake();
        /* A first message so the fake daemon knows whom to send to. */
        load_request(&req, &lr);
        req.request_id = transport_next_id(t);
        cr_assert_eq(transport_send(t, &req), 0);
        e = fake_recv(&fk);
        aqua__envelope__free_unpacked(e, NULL);

        settle();

        fake_send_pair_changed(&fk, 0, "GPU-c");
        cr_assert_eq(poll(&p, 1, 10000), 1, "the fd did not wake up");
        cr_assert_not(transport_idle(t));
        e = next_blocking();
        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_PAIR_CHANGED);
        aqua__envelope__free_unpacked(e, NULL);
        settle();
}

Test(transport, drops_what_does_not_decode_and_carries_on)
{
        Aqua__Envelope req, *e;
        Aqua__LoadReport lr;

        handshake();
        load_request(&req, &lr);
        req.request_id = transport_next_id(t);
        cr_assert_eq(transport_send(t, &req), 0);
        e = fake_recv(&fk);
        aqua__envelope__free_unpacked(e, NULL);

        fake_send_raw(&fk, "\xff\xff\xff garbage", 12);
        fake_send_pair_changed(&fk, 0, "GPU-d");
        e = next_blocking();
        cr_assert_str_eq(e->pair_changed->paired_with, "GPU-d");
        aqua__envelope__free_unpacked(e, NULL);
        cr_assert_eq(transport_dropped(t), 1);
}

Test(transport, wakes_its_fd_with_the_timer)
{
        struct pollfd p = {.fd = transport_fd(t), .events = POLLIN};
        Aqua__Envelope *e;
        bool fired = false;

        cr_assert_eq(transport_set_timer(t, now_mono_ns() + 10 * NSEC_PER_MSEC), 0);
        /* ZeroMQ may wake the fd too while it connects; drain it and wait again. */
        for (int i = 0; i < 100 && !fired; i++) {
                cr_assert_eq(poll(&p, 1, 10000), 1);
                while (transport_next(t, &e) == 0)
                        aqua__envelope__free_unpacked(e, NULL);
                fired = transport_timer_fired(t);
        }
        cr_assert(fired);
        cr_assert_not(transport_timer_fired(t));
}

Test(transport, sees_the_side_channel_close_while_idle)
{
        handshake();
        fk.side_fd = safe_close(fk.side_fd);
        cr_assert_eq(transport_side_pump(t), TRANSPORT_E_CLOSED);
        cr_assert_not(transport_side_connected(t));
}
