/* The fake daemon of the unit tests. */
#include "fake-daemon.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "aqua/aqua.h"
#include "util.h"
#include "wire.h"

const uint8_t fake_token[SIDE_TOKEN_LEN] = "0123456789abcdef";

void fake_listen(struct fake *f)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};

        f->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        strcpy(sa.sun_path, f->side_path);
        cr_assert_eq(bind(f->listen_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
        cr_assert_eq(listen(f->listen_fd, 8), 0);
}

void fake_unlisten(struct fake *f)
{
        f->side_fd = safe_close(f->side_fd);
        f->listen_fd = safe_close(f->listen_fd);
        unlink(f->side_path);
}

void fake_start(struct fake *f)
{
        int linger = 0;

        memset(f, 0, sizeof(*f));
        f->listen_fd = f->side_fd = -1;
        strcpy(f->dir, "/tmp/aqua-test-fake-XXXXXX");
        cr_assert_not_null(mkdtemp(f->dir));
        snprintf(f->endpoint, sizeof(f->endpoint), "ipc://%s/d.sock", f->dir);
        snprintf(f->side_path, sizeof(f->side_path), "%s/d.side", f->dir);
        f->zctx = zmq_ctx_new();
        f->router = zmq_socket(f->zctx, ZMQ_ROUTER);
        zmq_setsockopt(f->router, ZMQ_LINGER, &linger, sizeof(linger));
        cr_assert_eq(zmq_bind(f->router, f->endpoint), 0);
        fake_listen(f);
}

void fake_stop(struct fake *f)
{
        char path[256];

        if (f->have_peer)
                zmq_msg_close(&f->peer);
        f->have_peer = false;
        zmq_close(f->router);
        zmq_ctx_term(f->zctx);
        fake_unlisten(f);
        snprintf(path, sizeof(path), "%s/d.sock", f->dir);
        unlink(path);
        rmdir(f->dir);
}

void fake_accept(struct fake *f, bool reject)
{
        Aqua__SideFrame fr = AQUA__SIDE_FRAME__INIT;

        if (reject) {
                /* As an aquad from before reject reasons refused. */
                fake_reject(f, AQUA__SIDE_FRAME__REJECT_REASON__REJECT_REASON_UNSPECIFIED,
                            "uid 1234 is not allowed");
                return;
        }
        f->side_fd = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        cr_assert_geq(f->side_fd, 0);
        fr.kind = AQUA__SIDE_FRAME__KIND__KIND_HELLO;
        fr.token = (ProtobufCBinaryData){.len = SIDE_TOKEN_LEN, .data = (uint8_t *)fake_token};
        cr_assert_eq(side_send(f->side_fd, &fr, NULL, 0), 0);
}

void fake_reject(struct fake *f, Aqua__SideFrame__RejectReason reason, const char *text)
{
        Aqua__SideFrame fr = AQUA__SIDE_FRAME__INIT;

        f->side_fd = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        cr_assert_geq(f->side_fd, 0);
        fr.kind = AQUA__SIDE_FRAME__KIND__KIND_REJECT;
        fr.reject_reason = reason;
        fr.text = (char *)text;
        cr_assert_eq(side_send(f->side_fd, &fr, NULL, 0), 0);
}

Aqua__Envelope *fake_recv(struct fake *f)
{
        struct wire_limits lim = WIRE_LIMITS_DEFAULT;
        Aqua__Envelope *e = NULL;
        zmq_msg_t id, body;

        zmq_msg_init(&id);
        zmq_msg_init(&body);
        cr_assert_geq(zmq_msg_recv(&id, f->router, 0), 0);
        cr_assert_geq(zmq_msg_recv(&body, f->router, 0), 0);
        cr_assert_eq(wire_decode(zmq_msg_data(&body), zmq_msg_size(&body), &lim, &e, NULL, 0), 0);
        zmq_msg_close(&body);
        if (f->have_peer)
                zmq_msg_close(&f->peer);
        f->peer = id;
        f->have_peer = true;
        return e;
}

Aqua__SideFrame *fake_side_recv(struct fake *f, int *fds, size_t max, size_t *ret_n)
{
        Aqua__SideFrame *fr = NULL;

        cr_assert_eq(side_recv(f->side_fd, &fr, fds, max, ret_n), 0);
        return fr;
}

void fake_send_raw(struct fake *f, const void *buf, size_t len)
{
        zmq_msg_t id;

        cr_assert(f->have_peer);
        zmq_msg_init(&id);
        zmq_msg_copy(&id, &f->peer);
        cr_assert_geq(zmq_msg_send(&id, f->router, ZMQ_SNDMORE), 0);
        cr_assert_geq(zmq_send(f->router, buf, len, 0), 0);
}

void fake_send(struct fake *f, Aqua__Envelope *e)
{
        void *buf;
        size_t len;

        cr_assert_eq(wire_encode(e, &buf, &len), 0);
        fake_send_raw(f, buf, len);
        free(buf);
}

void fake_send_pair_changed(struct fake *f, uint64_t request_id, const char *paired)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__PairChanged pc = AQUA__PAIR_CHANGED__INIT;

        pc.paired_with = (char *)paired;
        e.request_id = request_id;
        e.body_case = AQUA__ENVELOPE__BODY_PAIR_CHANGED;
        e.pair_changed = &pc;
        fake_send(f, &e);
}

void fake_send_ack(struct fake *f, uint64_t request_id)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Ack ack = AQUA__ACK__INIT;

        e.request_id = request_id;
        e.body_case = AQUA__ENVELOPE__BODY_ACK;
        e.ack = &ack;
        fake_send(f, &e);
}

void fake_welcome(struct fake *f, uint64_t request_id, uint64_t client_id, const char *paired)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Welcome w = AQUA__WELCOME__INIT;

        w.client_id = client_id;
        w.paired_with = (char *)paired;
        w.dram_budget = UINT64_C(1) << 30; /* as if the GPU held 1 GiB granted before */
        w.reclaim_deadline_ms = 5000;
        e.request_id = request_id;
        e.body_case = AQUA__ENVELOPE__BODY_WELCOME;
        e.welcome = &w;
        fake_send(f, &e);
}

struct open_serve {
        struct fake *f;
        const char *paired;
};

static void *serve_open(void *arg)
{
        struct open_serve *o = arg;
        Aqua__Envelope *e;

        fake_accept(o->f, false);
        e = fake_recv(o->f);
        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_HELLO);
        fake_welcome(o->f, e->request_id, 42, o->paired);
        aqua__envelope__free_unpacked(e, NULL);
        return NULL;
}

void fake_open(struct fake *f, int device, enum aqua_role role, const char *client_name,
               const char *paired, aqua_ctx **ret)
{
        struct aqua_options o = AQUA_OPTIONS_INIT;
        struct open_serve serve = {f, paired};
        pthread_t th;

        o.endpoint = f->endpoint;
        o.side_path = f->side_path;
        o.client_name = client_name;
        pthread_create(&th, NULL, serve_open, &serve);
        cr_assert_eq(aqua_open(device, role, &o, ret), 0);
        pthread_join(th, NULL);
}

void test_sim_machine(const char *name, const char *devices)
{
        char id[96];

        snprintf(id, sizeof(id), "%s-%d", name, (int)getpid());
        setenv("AQUA_SIM_MACHINE", id, 1);
        setenv("AQUA_SIM_DEVICES", devices, 1);
        unsetenv("AQUA_SIM_TOPOLOGY");
}

void test_sim_cleanup(void)
{
        const char *base = getenv("AQUA_SIM_RUNTIME_DIR"), *id = getenv("AQUA_SIM_MACHINE");
        struct dirent *de;
        char path[512];
        DIR *d;

        if (!id)
                return;
        snprintf(path, sizeof(path), "%s/aqua-sim-%u-%s", base && *base ? base : "/dev/shm",
                 (unsigned)getuid(), id);
        d = opendir(path);
        if (!d)
                return;
        while ((de = readdir(d)))
                if (de->d_name[0] != '.')
                        unlinkat(dirfd(d), de->d_name, 0);
        closedir(d);
        rmdir(path);
}
