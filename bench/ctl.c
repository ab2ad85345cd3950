/*
 * Control-plane benchmark: a small request through aquad (LoadReport -> Ack from a registered
 * client) against a raw ZeroMQ DEALER/ROUTER echo of the same bytes, in the same run: median
 * round trip with one client, and throughput with many clients in closed loops.
 *
 *   bench-ctl --endpoint ipc://... --side PATH [--clients 32] [--rounds 4000] [--seconds 1]
 *
 * Prints "name value" lines (rtt_aquad_us, rtt_echo_us, rtt_ratio, tput_aquad, tput_echo,
 * tput_ratio, ...); bench/run turns them into BENCH lines.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "echo.h"
#include "side.h"
#include "time-util.h"
#include "wire.h"

static const char *endpoint, *side_path;
static char echo_endpoint[256];
static int n_clients = 32, rounds = 4000;
static double seconds = 1.0;

static _Noreturn void die(const char *what)
{
        fprintf(stderr, "bench-ctl: %s: %s\n", what, strerror(errno));
        exit(1);
}

/* ---------------------------------------------------------------- raw echo server */

static _Noreturn void echo_server(const char *ep)
{
        void *z = zmq_ctx_new(), *router = zmq_socket(z, ZMQ_ROUTER);

        if (zmq_bind(router, ep) < 0)
                die("bind echo");
        echo_serve(router);
}

/* ---------------------------------------------------------------- clients */

struct client {
        void *dealer;
        int side_fd;
        bool echo; /* talking to the raw echo server */
        uint64_t next_id;
        void *req; /* the encoded request, re-sent with a fresh id each round for aquad */
        size_t req_len;
        uint64_t ops;
};

static void *zctx;

static void encode_load(struct client *c)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__LoadReport lr = AQUA__LOAD_REPORT__INIT;

        free(c->req);
        lr.load = 0.5;
        lr.used_bytes = UINT64_C(12) << 30;
        lr.free_bytes = UINT64_C(4) << 30;
        e.request_id = ++c->next_id;
        e.body_case = AQUA__ENVELOPE__BODY_LOAD;
        e.load = &lr;
        if (wire_encode(&e, &c->req, &c->req_len) < 0)
                die("encode");
}

/* Register as a neutral GPU client: side channel, token, Hello, Welcome. */
static void client_register(struct client *c, int index)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        Aqua__SideFrame *f = NULL;
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *reply = NULL;
        Aqua__Hello h = AQUA__HELLO__INIT;
        struct wire_limits lim = WIRE_LIMITS_DEFAULT;
        char uuid[64], buf[4096];
        void *out;
        size_t n_fds, len;
        int fds[4], n;

        c->side_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", side_path);
        if (connect(c->side_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
                die("connect side channel");
        if (side_recv(c->side_fd, &f, fds, 4, &n_fds) != 0 ||
            f->kind != AQUA__SIDE_FRAME__KIND__KIND_HELLO) {
                errno = EPROTO;
                die("side channel hello");
        }
        snprintf(uuid, sizeof(uuid), "GPU-bench%03d-%08x-0000-0000-000000000000", index,
                 (unsigned)getpid());
        h.token = f->token;
        h.role = AQUA__ROLE__ROLE_NEUTRAL;
        h.gpu_uuid = uuid;
        h.gpu_ordinal = (uint32_t)index;
        h.gpu_capacity = UINT64_C(16) << 30;
        h.granularity = UINT64_C(2) << 20;
        h.client_name = "bench-ctl";
        e.request_id = ++c->next_id;
        e.body_case = AQUA__ENVELOPE__BODY_HELLO;
        e.hello = &h;
        if (wire_encode(&e, &out, &len) < 0)
                die("encode hello");
        aqua__side_frame__free_unpacked(f, NULL);
        zmq_send(c->dealer, out, len, 0);
        free(out);
        n = zmq_recv(c->dealer, buf, sizeof(buf), 0);
        if (n < 0 || wire_decode(buf, (size_t)n, &lim, &reply, NULL, 0) != 0 ||
            reply->body_case != AQUA__ENVELOPE__BODY_WELCOME) {
                fprintf(stderr, "bench-ctl: aquad did not welcome client %d%s%s\n", index,
                        reply && reply->body_case == AQUA__ENVELOPE__BODY_ERROR ? ": " : "",
                        reply && reply->body_case == AQUA__ENVELOPE__BODY_ERROR
                            ? reply->error->message
                            : "");
                exit(1);
        }
        aqua__envelope__free_unpacked(reply, NULL);
}

static void client_open(struct client *c, bool echo, int index)
{
        memset(c, 0, sizeof(*c));
        c->side_fd = -1;
        c->echo = echo;
        c->dealer = zmq_socket(zctx, ZMQ_DEALER);
        if (zmq_connect(c->dealer, echo ? echo_endpoint : endpoint) < 0)
                die("connect");
        if (!echo)
                client_register(c, index);
        encode_load(c);
}

static void client_close(struct client *c)
{
        int linger = 0;

        zmq_setsockopt(c->dealer, ZMQ_LINGER, &linger, sizeof(linger));
        zmq_close(c->dealer);
        if (c->side_fd >= 0)
                close(c->side_fd);
        free(c->req);
}

/* One round trip of the prepared request; with check, the reply must be aquad's Ack. */
static void client_round(struct client *c, bool check)
{
        struct wire_limits lim = WIRE_LIMITS_DEFAULT;
        Aqua__Envelope *e = NULL;
        char buf[4096];
        int n;

        if (zmq_send(c->dealer, c->req, c->req_len, 0) < 0)
                die("send");
        n = zmq_recv(c->dealer, buf, sizeof(buf), 0);
        if (n < 0)
                die("recv");
        if (check && !c->echo) {
                if (wire_decode(buf, (size_t)n, &lim, &e, NULL, 0) != 0 ||
                    e->body_case != AQUA__ENVELOPE__BODY_ACK || e->request_id != c->next_id) {
                        fprintf(stderr, "bench-ctl: aquad answered a load report with %s\n",
                                e ? wire_body_name(e) : "garbage");
                        exit(1);
                }
                aqua__envelope__free_unpacked(e, NULL);
        }
        c->ops++;
}

/* A fresh request id costs both sides the same encoding: the echo carries the same bytes. */
static void client_step(struct client *c)
{
        encode_load(c);
        client_round(c, false);
}

static int cmp_u64(const void *a, const void *b)
{
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return x < y ? -1 : x > y;
}

/* ---------------------------------------------------------------- round trip */

static void bench_rtt(void)
{
        struct client aq, ec;
        uint64_t *t_aq = calloc(rounds, sizeof(uint64_t)), *t_ec = calloc(rounds, sizeof(uint64_t));
        int blocks = 20, per = rounds / blocks, k_aq = 0, k_ec = 0;

        client_open(&aq, false, 0);
        client_open(&ec, true, 0);
        for (int i = 0; i < 500; i++) {
                encode_load(&aq);
                client_round(&aq, true);
                encode_load(&ec);
                client_round(&ec, true);
        }
        /* Alternate in blocks so that drift of the machine hits both sides alike. */
        for (int b = 0; b < blocks; b++)
                for (int side = 0; side < 2; side++)
                        for (int i = 0; i < per; i++) {
                                struct client *c = side ? &ec : &aq;
                                uint64_t t0;

                                encode_load(c);
                                t0 = now_mono_ns();
                                client_round(c, false);
                                if (side)
                                        t_ec[k_ec++] = now_mono_ns() - t0;
                                else
                                        t_aq[k_aq++] = now_mono_ns() - t0;
                        }
        qsort(t_aq, k_aq, sizeof(uint64_t), cmp_u64);
        qsort(t_ec, k_ec, sizeof(uint64_t), cmp_u64);
        printf("rtt_bytes %zu\n", aq.req_len);
        printf("rtt_aquad_us %.2f\n", t_aq[k_aq / 2] / 1e3);
        printf("rtt_echo_us %.2f\n", t_ec[k_ec / 2] / 1e3);
        printf("rtt_aquad_p99_us %.2f\n", t_aq[k_aq * 99 / 100] / 1e3);
        printf("rtt_echo_p99_us %.2f\n", t_ec[k_ec * 99 / 100] / 1e3);
        printf("rtt_ratio %.3f\n", (double)t_aq[k_aq / 2] / (double)t_ec[k_ec / 2]);
        client_close(&aq);
        client_close(&ec);
        free(t_aq);
        free(t_ec);
}

/* ---------------------------------------------------------------- throughput */

static volatile int go, stop;

static void *client_thread(void *arg)
{
        struct client *c = arg;

        while (!__atomic_load_n(&go, __ATOMIC_ACQUIRE))
                usleep(100);
        while (!__atomic_load_n(&stop, __ATOMIC_RELAXED))
                client_step(c);
        return NULL;
}

static double run_tput(bool echo)
{
        struct client *cs = calloc(n_clients, sizeof(*cs));
        pthread_t *th = calloc(n_clients, sizeof(*th));
        uint64_t t0, t1, ops = 0;

        for (int i = 0; i < n_clients; i++)
                client_open(&cs[i], echo, i + 1);
        go = stop = 0;
        for (int i = 0; i < n_clients; i++)
                pthread_create(&th[i], NULL, client_thread, &cs[i]);
        /* Count only the steady state: ops between two snapshots. */
        __atomic_store_n(&go, 1, __ATOMIC_RELEASE);
        usleep(200000);
        for (int i = 0; i < n_clients; i++)
                ops -= __atomic_load_n(&cs[i].ops, __ATOMIC_RELAXED);
        t0 = now_mono_ns();
        sleep_ns((uint64_t)(seconds * 1e9));
        t1 = now_mono_ns();
        for (int i = 0; i < n_clients; i++)
                ops += __atomic_load_n(&cs[i].ops, __ATOMIC_RELAXED);
        __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
        for (int i = 0; i < n_clients; i++) {
                pthread_join(th[i], NULL);
                client_close(&cs[i]);
        }
        free(cs);
        free(th);
        return (double)ops / ((double)(t1 - t0) / 1e9);
}

static int cmp_double(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;
        return x < y ? -1 : x > y;
}

/*
 * Alternate short runs against aquad and the echo; the ratio of each adjacent pair sees the
 * same machine load, and the median of the pairs' ratios is what is reported.
 */
static void bench_tput(void)
{
        enum { PAIRS = 5 };
        double ratio[PAIRS], aq[PAIRS], ec[PAIRS];

        for (int i = 0; i < PAIRS; i++) {
                aq[i] = run_tput(false);
                ec[i] = run_tput(true);
                ratio[i] = aq[i] / ec[i];
        }
        qsort(ratio, PAIRS, sizeof(double), cmp_double);
        qsort(aq, PAIRS, sizeof(double), cmp_double);
        qsort(ec, PAIRS, sizeof(double), cmp_double);
        printf("tput_clients %d\n", n_clients);
        printf("tput_aquad %.0f\n", aq[PAIRS / 2]);
        printf("tput_echo %.0f\n", ec[PAIRS / 2]);
        printf("tput_ratio %.3f\n", ratio[PAIRS / 2]);
}

int main(int argc, char **argv)
{
        static const struct option opts[] = {
            {"endpoint", required_argument, NULL, 'e'}, {"side", required_argument, NULL, 's'},
            {"clients", required_argument, NULL, 'c'},  {"rounds", required_argument, NULL, 'r'},
            {"seconds", required_argument, NULL, 't'},  {},
        };
        char dir[] = "/tmp/aqua-bench-echo-XXXXXX";
        pid_t echo;
        int o;

        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1)
                switch (o) {
                case 'e':
                        endpoint = optarg;
                        break;
                case 's':
                        side_path = optarg;
                        break;
                case 'c':
                        n_clients = atoi(optarg);
                        break;
                case 'r':
                        rounds = atoi(optarg);
                        break;
                case 't':
                        seconds = atof(optarg);
                        break;
                default:
                        return 2;
                }
        if (!endpoint || !side_path || n_clients < 1 || rounds < 100) {
                fprintf(stderr, "usage: bench-ctl --endpoint EP --side PATH [--clients N] "
                                "[--rounds N] [--seconds S]\n");
                return 2;
        }
        if (!mkdtemp(dir))
                die("mkdtemp");
        snprintf(echo_endpoint, sizeof(echo_endpoint), "ipc://%s/echo.sock", dir);
        /* Its own process, like aquad: the client side is then the same for both. */
        echo = fork();
        if (echo == 0)
                echo_server(echo_endpoint);
        zctx = zmq_ctx_new();
        bench_rtt();
        bench_tput();
        zmq_ctx_term(zctx);
        kill(echo, SIGTERM);
        waitpid(echo, NULL, 0);
        snprintf(echo_endpoint, sizeof(echo_endpoint), "%s/echo.sock", dir);
        unlink(echo_endpoint);
        rmdir(dir);
        return 0;
}
