/*
 * The remote control path: a status query through aquad's remote.endpoint (tcp+CURVE, an admin
 * registered with its key) against a raw ZeroMQ CURVE DEALER/ROUTER echo of the same bytes over
 * tcp on the same host, in the same run; median round trips of interleaved blocks.
 *
 *   bench-remote --endpoint tcp://... --server-key FILE.pub --key-file FILE [--rounds 4000]
 *
 * Prints "name value" lines (remote_bytes, remote_aquad_us, remote_echo_us, remote_ratio, p99s).
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "curve.h"
#include "echo.h"
#include "time-util.h"
#include "util.h"
#include "wire.h"

static char server[CURVE_KEY_TEXT + 1], pub[CURVE_KEY_TEXT + 1], sec[CURVE_KEY_TEXT + 1];
static int rounds = 4000;
static void *zctx;

static _Noreturn void die(const char *what)
{
        fprintf(stderr, "bench-remote: %s: %s\n", what, zmq_strerror(errno));
        exit(1);
}

/* A CURVE echo on an ephemeral loopback port; its endpoint and key go up the pipe. */
static _Noreturn void echo_server(int out)
{
        void *z = zmq_ctx_new(), *router = zmq_socket(z, ZMQ_ROUTER);
        char epub[CURVE_KEY_TEXT + 1], esec[CURVE_KEY_TEXT + 1], ep[128], line[256];
        size_t len = sizeof(ep);
        int one = 1;

        if (zmq_curve_keypair(epub, esec) < 0 ||
            zmq_setsockopt(router, ZMQ_CURVE_SERVER, &one, sizeof(one)) < 0 ||
            zmq_setsockopt(router, ZMQ_CURVE_SECRETKEY, esec, CURVE_KEY_TEXT) < 0 ||
            zmq_bind(router, "tcp://127.0.0.1:*") < 0 ||
            zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &len) < 0)
                die("echo server");
        snprintf(line, sizeof(line), "%s %s\n", ep, epub);
        if (write(out, line, strlen(line)) < 0)
                die("echo pipe");
        close(out);
        echo_serve(router);
}

static void *dealer_to(const char *ep, const char *server_key)
{
        void *d = zmq_socket(zctx, ZMQ_DEALER);
        int zero = 0;

        zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof(zero));
        if (zmq_setsockopt(d, ZMQ_CURVE_SERVERKEY, server_key, CURVE_KEY_TEXT) < 0 ||
            zmq_setsockopt(d, ZMQ_CURVE_PUBLICKEY, pub, CURVE_KEY_TEXT) < 0 ||
            zmq_setsockopt(d, ZMQ_CURVE_SECRETKEY, sec, CURVE_KEY_TEXT) < 0 ||
            zmq_connect(d, ep) < 0)
                die("connect");
        return d;
}

static uint64_t next_id;

static void encode(Aqua__Envelope *e, void **buf, size_t *len)
{
        e->request_id = ++next_id;
        if (wire_encode(e, buf, len) < 0)
                die("encode");
}

/* One round trip of a fresh status query; with check, aquad's reply must be its answer. */
static uint64_t round_trip(void *d, bool check)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *r = NULL;
        Aqua__AdminQuery q = AQUA__ADMIN_QUERY__INIT;
        struct wire_limits lim = WIRE_LIMITS_DEFAULT;
        char reply[65536];
        void *buf;
        size_t len;
        uint64_t t0;
        int n;

        e.body_case = AQUA__ENVELOPE__BODY_ADMIN_QUERY;
        e.admin_query = &q;
        encode(&e, &buf, &len);
        t0 = now_mono_ns();
        if (zmq_send(d, buf, len, 0) < 0 || (n = zmq_recv(d, reply, sizeof(reply), 0)) < 0)
                die("round trip");
        t0 = now_mono_ns() - t0;
        free(buf);
        if (check) {
                if (wire_decode(reply, (size_t)MIN(n, (int)sizeof(reply)), &lim, &r, NULL, 0) != 0 ||
                    r->body_case != AQUA__ENVELOPE__BODY_ADMIN_REPLY || r->request_id != next_id) {
                        fprintf(stderr, "bench-remote: aquad answered a status query with %s\n",
                                r ? wire_body_name(r) : "garbage");
                        exit(1);
                }
                aqua__envelope__free_unpacked(r, NULL);
        }
        return t0;
}

static void hello(void *d)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *r = NULL;
        Aqua__Hello h = AQUA__HELLO__INIT;
        struct wire_limits lim = WIRE_LIMITS_DEFAULT;
        char reply[4096];
        void *buf;
        size_t len;
        int n;

        h.role = AQUA__ROLE__ROLE_ADMIN;
        h.client_name = "bench-remote";
        e.body_case = AQUA__ENVELOPE__BODY_HELLO;
        e.hello = &h;
        encode(&e, &buf, &len);
        zmq_send(d, buf, len, 0);
        free(buf);
        n = zmq_recv(d, reply, sizeof(reply), 0);
        if (n < 0 || wire_decode(reply, (size_t)n, &lim, &r, NULL, 0) != 0 ||
            r->body_case != AQUA__ENVELOPE__BODY_WELCOME) {
                fprintf(stderr, "bench-remote: aquad did not welcome the remote admin\n");
                exit(1);
        }
        aqua__envelope__free_unpacked(r, NULL);
}

static int cmp_u64(const void *a, const void *b)
{
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
        static const struct option opts[] = {
            {"endpoint", required_argument, NULL, 'e'},
            {"server-key", required_argument, NULL, 's'},
            {"key-file", required_argument, NULL, 'k'},
            {"rounds", required_argument, NULL, 'r'},
            {},
        };
        const char *ep = NULL, *server_file = NULL, *key_file = NULL;
        char err[256], line[256], echo_ep[128], echo_key[CURVE_KEY_TEXT + 1];
        int o, p[2], blocks = 20, per, k_aq = 0, k_ec = 0;
        uint64_t *t_aq, *t_ec;
        void *aq, *ec;
        ssize_t n;
        pid_t echo;

        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1)
                switch (o) {
                case 'e':
                        ep = optarg;
                        break;
                case 's':
                        server_file = optarg;
                        break;
                case 'k':
                        key_file = optarg;
                        break;
                case 'r':
                        rounds = atoi(optarg);
                        break;
                default:
                        return 2;
                }
        if (!ep || !server_file || !key_file || rounds < 100) {
                fprintf(stderr, "usage: bench-remote --endpoint EP --server-key FILE --key-file "
                                "FILE [--rounds N]\n");
                return 2;
        }
        if (curve_keyfile_load(server_file, server, NULL, err, sizeof(err)) < 0 ||
            curve_keyfile_load(key_file, pub, sec, err, sizeof(err)) < 0) {
                fprintf(stderr, "bench-remote: %s\n", err);
                return 2;
        }
        if (pipe(p) < 0)
                die("pipe");
        /* Its own process, like aquad: the client side is then the same for both. */
        echo = fork();
        if (echo == 0) {
                close(p[0]);
                echo_server(p[1]);
        }
        close(p[1]);
        n = read(p[0], line, sizeof(line) - 1);
        close(p[0]);
        line[n > 0 ? n : 0] = '\0';
        if (sscanf(line, "%127s %40s", echo_ep, echo_key) != 2)
                die("echo server start");

        zctx = zmq_ctx_new();
        aq = dealer_to(ep, server);
        ec = dealer_to(echo_ep, echo_key);
        hello(aq);
        t_aq = calloc(rounds, sizeof(uint64_t));
        t_ec = calloc(rounds, sizeof(uint64_t));
        for (int i = 0; i < 500; i++) {
                round_trip(aq, true);
                round_trip(ec, false);
        }
        per = rounds / blocks;
        /* Alternate in blocks so that drift of the machine hits both sides alike. */
        for (int b = 0; b < blocks; b++) {
                for (int i = 0; i < per; i++)
                        t_aq[k_aq++] = round_trip(aq, false);
                for (int i = 0; i < per; i++)
                        t_ec[k_ec++] = round_trip(ec, false);
        }
        qsort(t_aq, k_aq, sizeof(uint64_t), cmp_u64);
        qsort(t_ec, k_ec, sizeof(uint64_t), cmp_u64);
        printf("remote_aquad_us %.2f\n", t_aq[k_aq / 2] / 1e3);
        printf("remote_echo_us %.2f\n", t_ec[k_ec / 2] / 1e3);
        printf("remote_aquad_p99_us %.2f\n", t_aq[k_aq * 99 / 100] / 1e3);
        printf("remote_echo_p99_us %.2f\n", t_ec[k_ec * 99 / 100] / 1e3);
        printf("remote_ratio %.3f\n", (double)t_aq[k_aq / 2] / (double)t_ec[k_ec / 2]);
        zmq_close(aq);
        zmq_close(ec);
        zmq_ctx_term(zctx);
        kill(echo, SIGTERM);
        waitpid(echo, NULL, 0);
        free(t_aq);
        free(t_ec);
        return 0;
}
