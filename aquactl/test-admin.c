/* The admin session against a scripted stand-in for aquad: handshake, replies, and each way it
 * fails. */
#include <criterion/criterion.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <zmq.h>

#include "admin.h"
#include "side.h"
#include "wire.h"

#define TIMEOUT_MS 5000

/*
 * A stand-in daemon: a listening side channel and a ROUTER, driven by a script in a thread.
 * The script records what it saw; the test asserts on it after the thread is joined.
 */
struct fake {
        char dir[64];
        char side_path[128];
        char endpoint[160];
        int listener;
        int conn;
        void *zctx, *router;
        pthread_t thread;
        void (*script)(struct fake *f);
        /* What the script saw. */
        Aqua__Role hello_role;
        char hello_name[64];
        bool token_matched;
        int query_what;
};

static struct fake fk;
static const uint8_t token[SIDE_TOKEN_LEN] = "0123456789abcdef";

static void fake_setup(void)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        int timeout = TIMEOUT_MS;

        memset(&fk, 0, sizeof(fk));
        fk.conn = -1;
        strcpy(fk.dir, "/tmp/aquactl-test-XXXXXX");
        cr_assert_not_null(mkdtemp(fk.dir));
        snprintf(fk.side_path, sizeof(fk.side_path), "%s/aquad.side", fk.dir);
        snprintf(fk.endpoint, sizeof(fk.endpoint), "ipc://%s/aquad.sock", fk.dir);
        fk.listener = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        cr_assert_geq(fk.listener, 0);
        strcpy(sa.sun_path, fk.side_path);
        cr_assert_eq(bind(fk.listener, (struct sockaddr *)&sa, sizeof(sa)), 0);
        cr_assert_eq(listen(fk.listener, 4), 0);
        fk.zctx = zmq_ctx_new();
        fk.router = zmq_socket(fk.zctx, ZMQ_ROUTER);
        zmq_setsockopt(fk.router, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
        cr_assert_eq(zmq_bind(fk.router, fk.endpoint), 0);
}

static void fake_teardown(void)
{
        char path[200];
        int linger = 0;

        if (fk.router) {
                zmq_setsockopt(fk.router, ZMQ_LINGER, &linger, sizeof(linger));
                zmq_close(fk.router);
                zmq_ctx_term(fk.zctx);
        }
        safe_close(fk.listener);
        safe_close(fk.conn);
        unlink(fk.side_path);
        snprintf(path, sizeof(path), "%s/aquad.sock", fk.dir);
        unlink(path);
        rmdir(fk.dir);
}

TestSuite(admin, .init = fake_setup, .fini = fake_teardown);

static void *fake_main(void *arg)
{
        struct fake *f = arg;
        struct pollfd p = {.fd = f->listener, .events = POLLIN};

        if (poll(&p, 1, TIMEOUT_MS) == 1)
                f->conn = accept4(f->listener, NULL, NULL, SOCK_CLOEXEC);
        if (f->conn >= 0)
                f->script(f);
        /* Stay connected until the client hangs up, as aquad would. */
        if (f->conn >= 0) {
                char b;

                p = (struct pollfd){.fd = f->conn, .events = POLLIN};
                if (poll(&p, 1, TIMEOUT_MS) == 1)
                        (void)!recv(f->conn, &b, 1, 0);
        }
        return NULL;
}

static void fake_start(void (*script)(struct fake *f))
{
        fk.script = script;
        cr_assert_eq(pthread_create(&fk.thread, NULL, fake_main, &fk), 0);
}

static void fake_join(void)
{
        pthread_join(fk.thread, NULL);
}

static void greet(struct fake *f)
{
        Aqua__SideFrame hello = AQUA__SIDE_FRAME__INIT;

        hello.kind = AQUA__SIDE_FRAME__KIND__KIND_HELLO;
        hello.token = (ProtobufCBinaryData){.len = sizeof(token), .data = (uint8_t *)token};
        side_send(f->conn, &hello, NULL, 0);
}

/* Receive one request; its sender's identity goes to id. NULL on timeout. */
static Aqua__Envelope *fake_recv(struct fake *f, zmq_msg_t *id)
{
        static const struct wire_limits limits = WIRE_LIMITS_DEFAULT;
        Aqua__Envelope *e = NULL;
        zmq_msg_t body;

        zmq_msg_init(id);
        zmq_msg_init(&body);
        if (zmq_msg_recv(id, f->router, 0) < 0 || zmq_msg_recv(&body, f->router, 0) < 0 ||
            wire_decode(zmq_msg_data(&body), zmq_msg_size(&body), &limits, &e, NULL, 0) != 0)
                e = NULL;
        zmq_msg_close(&body);
        return e;
}

static void fake_send(struct fake *f, zmq_msg_t *id, Aqua__Envelope *e)
{
        void *buf;
        size_t len;

        if (wire_encode(e, &buf, &len) < 0)
                return;
        zmq_send(f->router, zmq_msg_data(id), zmq_msg_size(id), ZMQ_SNDMORE);
        zmq_send(f->router, buf, len, 0);
        free(buf);
}

/* Take the Hello and record it; returns its request id (0 when none came). */
static uint64_t take_hello(struct fake *f, zmq_msg_t *id)
{
        Aqua__Envelope *e;
        uint64_t rid = 0;

        greet(f);
        e = fake_recv(f, id);
        if (e && e->body_case == AQUA__ENVELOPE__BODY_HELLO) {
                f->hello_role = e->hello->role;
                snprintf(f->hello_name, sizeof(f->hello_name), "%s", e->hello->client_name);
                f->token_matched = e->hello->token.len == sizeof(token) &&
                                   memcmp(e->hello->token.data, token, sizeof(token)) == 0;
                rid = e->request_id;
        }
        if (e)
                aqua__envelope__free_unpacked(e, NULL);
        return rid;
}

static void welcome(struct fake *f, zmq_msg_t *id, uint64_t rid)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Welcome w = AQUA__WELCOME__INIT;

        w.client_id = 99;
        e.request_id = rid;
        e.body_case = AQUA__ENVELOPE__BODY_WELCOME;
        e.welcome = &w;
        fake_send(f, id, &e);
}

/* Welcome the client, and answer its first query with a notice, then one GPU. */
static void script_serve_query(struct fake *f)
{
        Aqua__Envelope notice = AQUA__ENVELOPE__INIT, reply = AQUA__ENVELOPE__INIT, *q;
        Aqua__PairChanged pc = AQUA__PAIR_CHANGED__INIT;
        Aqua__AdminReply ar = AQUA__ADMIN_REPLY__INIT;
        Aqua__GpuInfo g = AQUA__GPU_INFO__INIT, *gl[1] = {&g};
        zmq_msg_t id;

        welcome(f, &id, take_hello(f, &id));
        zmq_msg_close(&id);
        q = fake_recv(f, &id);
        if (!q)
                return;
        f->query_what =
            q->body_case == AQUA__ENVELOPE__BODY_ADMIN_QUERY ? (int)q->admin_query->what : -1;
        notice.body_case = AQUA__ENVELOPE__BODY_PAIR_CHANGED;
        notice.pair_changed = &pc;
        fake_send(f, &id, &notice);
        g.uuid = "GPU-abc";
        ar.n_gpus = 1;
        ar.gpus = gl;
        reply.request_id = q->request_id;
        reply.body_case = AQUA__ENVELOPE__BODY_ADMIN_REPLY;
        reply.admin_reply = &ar;
        fake_send(f, &id, &reply);
        zmq_msg_close(&id);
        aqua__envelope__free_unpacked(q, NULL);
}

static struct admin *connect_ok(void)
{
        struct admin *a = NULL;
        char err[512] = "";
        int r;

        r = admin_connect(fk.endpoint, fk.side_path, "aquactl-test", TIMEOUT_MS, &a, err,
                          sizeof(err));
        cr_assert_eq(r, 0, "r=%d: %s", r, err);
        return a;
}

Test(admin, registers_as_admin_and_gets_the_reply_to_its_query)
{
        Aqua__Envelope q = AQUA__ENVELOPE__INIT, *reply = NULL;
        Aqua__AdminQuery aq = AQUA__ADMIN_QUERY__INIT;
        struct admin *a;
        char err[512] = "";

        fake_start(script_serve_query);
        a = connect_ok();
        aq.what = AQUA__ADMIN_QUERY__WHAT__WHAT_GPUS;
        q.body_case = AQUA__ENVELOPE__BODY_ADMIN_QUERY;
        q.admin_query = &aq;
        cr_assert_eq(admin_call(a, &q, &reply, err, sizeof(err)), 0, "%s", err);
        /* The PairChanged notice before it was skipped. */
        cr_assert_eq(reply->body_case, AQUA__ENVELOPE__BODY_ADMIN_REPLY);
        cr_assert_eq(reply->admin_reply->n_gpus, 1);
        cr_assert_str_eq(reply->admin_reply->gpus[0]->uuid, "GPU-abc");
        aqua__envelope__free_unpacked(reply, NULL);
        admin_free(a);
        fake_join();
        cr_assert_eq(fk.hello_role, AQUA__ROLE__ROLE_ADMIN);
        cr_assert_str_eq(fk.hello_name, "aquactl-test");
        cr_assert(fk.token_matched);
        cr_assert_eq(fk.query_what, AQUA__ADMIN_QUERY__WHAT__WHAT_GPUS);
}

static void expect_connect_failure(int outcome, const char *needle)
{
        struct admin *a = NULL;
        char err[512] = "";
        int r;

        r = admin_connect(fk.endpoint, fk.side_path, "aquactl", 300, &a, err, sizeof(err));
        cr_assert_eq(r, outcome, "r=%d: %s", r, err);
        cr_assert_null(a);
        cr_assert(strstr(err, needle), "'%s' not in '%s'", needle, err);
}

Test(admin, names_the_endpoint_when_no_daemon_listens)
{
        /* A socket file left behind by a dead daemon: connect is refused. */
        fk.listener = safe_close(fk.listener);
        expect_connect_failure(ADMIN_E_NOT_RUNNING, "aquad is not running at ipc://");
        unlink(fk.side_path);
        expect_connect_failure(ADMIN_E_NOT_RUNNING, "No such file or directory");
        expect_connect_failure(ADMIN_E_NOT_RUNNING, fk.endpoint);
}

Test(admin, reports_permission_denied_on_the_socket)
{
        pid_t pid;
        int status;

        chmod(fk.side_path, 0600);
        /* root passes every permission check, so the attempt runs as nobody. */
        pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
                struct admin *a = NULL;
                char err[512];

                if (geteuid() == 0 && (setgid(65534) < 0 || setuid(65534) < 0))
                        _exit(100);
                _exit(admin_connect(fk.endpoint, fk.side_path, "aquactl", 300, &a, err,
                                    sizeof(err)) == ADMIN_E_DENIED &&
                              strstr(err, "permission denied")
                          ? 0
                          : 1);
        }
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFEXITED(status));
        cr_assert_eq(WEXITSTATUS(status), 0);
}

static void send_reject(struct fake *f, Aqua__SideFrame__RejectReason reason, const char *text)
{
        Aqua__SideFrame reject = AQUA__SIDE_FRAME__INIT;

        reject.kind = AQUA__SIDE_FRAME__KIND__KIND_REJECT;
        reject.reject_reason = reason;
        reject.text = (char *)text;
        side_send(f->conn, &reject, NULL, 0);
        f->conn = safe_close(f->conn);
}

/* As an aquad from before reject reasons refused. */
static void script_reject(struct fake *f)
{
        send_reject(f, AQUA__SIDE_FRAME__REJECT_REASON__REJECT_REASON_UNSPECIFIED,
                    "uid 1000 is not allowed");
}

Test(admin, passes_on_the_reason_for_a_rejection)
{
        fake_start(script_reject);
        expect_connect_failure(ADMIN_E_DENIED, "refused this user: uid 1000 is not allowed");
        fake_join();
}

static void script_reject_stopping(struct fake *f)
{
        send_reject(f, AQUA__SIDE_FRAME__REJECT_REASON__REJECT_REASON_STOPPING,
                    "aquad is stopping");
}

/* Not a permission problem: the operator should not go looking at allow lists. */
Test(admin, a_stopping_aquad_refusing_the_side_channel_is_unreachable_not_denied)
{
        fake_start(script_reject_stopping);
        expect_connect_failure(ADMIN_E_STOPPING, "is stopping: aquad is stopping");
        fake_join();
}

static void script_refuse_admin(struct fake *f)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Error err = AQUA__ERROR__INIT;
        zmq_msg_t id;

        e.request_id = take_hello(f, &id);
        err.code = AQUA__ERROR_CODE__ERROR_CODE_PERMISSION;
        err.message = "admin commands need group aqua-admin";
        e.body_case = AQUA__ENVELOPE__BODY_ERROR;
        e.error = &err;
        fake_send(f, &id, &e);
        zmq_msg_close(&id);
}

Test(admin, treats_a_permission_error_to_hello_as_denied)
{
        fake_start(script_refuse_admin);
        expect_connect_failure(ADMIN_E_DENIED, "need group aqua-admin");
        fake_join();
}

static void script_silent(struct fake *f)
{
        zmq_msg_t id;

        take_hello(f, &id);
        zmq_msg_close(&id);
}

Test(admin, times_out_when_hello_goes_unanswered)
{
        fake_start(script_silent);
        expect_connect_failure(ADMIN_E_TIMEOUT, "no reply from aquad at ipc://");
        fake_join();
}

static void script_never_greet(struct fake *f)
{
}

Test(admin, times_out_when_the_side_channel_stays_silent)
{
        fake_start(script_never_greet);
        expect_connect_failure(ADMIN_E_TIMEOUT, "sent no greeting");
        fake_join();
}

/* Welcome, then answer the first query as stop_with says. */
static void stop_after_welcome(struct fake *f, bool close_side)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *q;
        Aqua__DaemonStopping st = AQUA__DAEMON_STOPPING__INIT;
        zmq_msg_t id;

        welcome(f, &id, take_hello(f, &id));
        zmq_msg_close(&id);
        q = fake_recv(f, &id);
        if (close_side) {
                f->conn = safe_close(f->conn);
        } else {
                st.reason = "SIGTERM";
                e.body_case = AQUA__ENVELOPE__BODY_STOPPING;
                e.stopping = &st;
                fake_send(f, &id, &e);
        }
        zmq_msg_close(&id);
        if (q)
                aqua__envelope__free_unpacked(q, NULL);
}

static void script_stopping(struct fake *f)
{
        stop_after_welcome(f, false);
}

static void script_hang_up(struct fake *f)
{
        stop_after_welcome(f, true);
}

static void expect_call_failure(int outcome, const char *needle)
{
        Aqua__Envelope q = AQUA__ENVELOPE__INIT, *reply = NULL;
        Aqua__AdminQuery aq = AQUA__ADMIN_QUERY__INIT;
        struct admin *a = connect_ok();
        char err[512] = "";

        q.body_case = AQUA__ENVELOPE__BODY_ADMIN_QUERY;
        q.admin_query = &aq;
        cr_assert_eq(admin_call(a, &q, &reply, err, sizeof(err)), outcome, "%s", err);
        cr_assert_null(reply);
        cr_assert(strstr(err, needle), "'%s' not in '%s'", needle, err);
        admin_free(a);
}

Test(admin, stops_waiting_when_the_daemon_says_it_is_stopping)
{
        fake_start(script_stopping);
        expect_call_failure(ADMIN_E_STOPPING, "is stopping: SIGTERM");
        fake_join();
}

Test(admin, stops_waiting_when_the_side_channel_closes)
{
        fake_start(script_hang_up);
        expect_call_failure(ADMIN_E_STOPPING, "closed the connection");
        fake_join();
}

Test(admin, derives_the_side_channel_path_from_an_ipc_endpoint)
{
        static const struct {
                const char *endpoint, *side;
        } cases[] = {
            {"ipc:///run/aqua/aquad.sock", "/run/aqua/aquad.side"},
            {"ipc:///tmp/x/aquad", "/tmp/x/aquad.side"},
            {"ipc:///tmp/a.b/aquad.ipc", "/tmp/a.b/aquad.ipc.side"},
            {"tcp://10.0.0.1:7000", "/run/aqua/aquad.side"},
        };

        for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
                _cleanup_free_ char *s = admin_side_path(cases[i].endpoint);

                cr_assert_str_eq(s, cases[i].side);
        }
}
