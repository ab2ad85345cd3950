/*
 * The remote control path: requests through aquad's remote.endpoint (tcp+CURVE) against a raw
 * ZeroMQ CURVE DEALER/ROUTER echo of the same request bytes over tcp on the same host, in the
 * same run; median round trips of interleaved blocks. Two requests: a status query from a
 * remote admin, and a borrow of one 2 MiB chunk by a consumer on "another host" (a fabric
 * client: its grant carries the chunk's 64-byte fabric handle) from a fabric producer's offer,
 * returned after each round trip outside the timing.
 *
 *   bench-remote --endpoint tcp://... --server-key FILE.pub --key-file FILE [--rounds 4000]
 *                [--cycle] [--borrow-only]
 *
 * --cycle times a borrow and its return together; --borrow-only measures the borrow alone.
 *
 * Prints "name value" lines (remote_aquad_us, remote_echo_us, remote_ratio and p99s for the
 * status query; remote_borrow_us, remote_borrow_echo_us, remote_borrow_ratio and p99s).
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "curve.h"
#include "echo.h"
#include "time-util.h"
#include "util.h"
#include "wire.h"

static char server[CURVE_KEY_TEXT + 1], pub[CURVE_KEY_TEXT + 1], sec[CURVE_KEY_TEXT + 1];
#define CHUNK (UINT64_C(2) << 20)

static int rounds = 4000;
/* --cycle: a borrow's round trip and its return's, timed together (the echo answers twice). */
static bool cycle;
/* --borrow-only: skip the status query's measure. */
static bool borrow_only;
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

/*
 * Send e (a fresh request id) and wait for its reply, passing over notices; the time between.
 * With want (a body case), aquad's reply must be that; *ret gets it (or it is freed).
 */
static uint64_t call(void *d, Aqua__Envelope *e, int want, Aqua__Envelope **ret)
{
        struct wire_limits lim = WIRE_LIMITS_DEFAULT;
        Aqua__Envelope *r = NULL;
        char reply[65536];
        void *buf;
        size_t len;
        uint64_t t0;
        int n;

        encode(e, &buf, &len);
        t0 = now_mono_ns();
        if (zmq_send(d, buf, len, 0) < 0)
                die("send");
        for (;;) {
                if ((n = zmq_recv(d, reply, sizeof(reply), 0)) < 0)
                        die("receive");
                if (!want)
                        break;
                if (wire_decode(reply, (size_t)MIN(n, (int)sizeof(reply)), &lim, &r, NULL, 0) != 0) {
                        fprintf(stderr, "bench-remote: aquad sent garbage\n");
                        exit(1);
                }
                if (r->request_id == next_id)
                        break;
                aqua__envelope__free_unpacked(r, NULL); /* a notice */
                r = NULL;
        }
        t0 = now_mono_ns() - t0;
        free(buf);
        if (want && (int)r->body_case != want) {
                fprintf(stderr, "bench-remote: aquad answered %s with %s%s%s\n",
                        wire_body_name(e), wire_body_name(r),
                        r->body_case == AQUA__ENVELOPE__BODY_ERROR ? ": " : "",
                        r->body_case == AQUA__ENVELOPE__BODY_ERROR ? r->error->message : "");
                exit(1);
        }
        if (ret)
                *ret = r;
        else if (r)
                aqua__envelope__free_unpacked(r, NULL);
        return t0;
}

static void hello(void *d, Aqua__Role role, const char *uuid, const char *peer)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Hello h = AQUA__HELLO__INIT;
        Aqua__PeerLink link = AQUA__PEER_LINK__INIT, *links[] = {&link};

        h.role = role;
        h.client_name = "bench-remote";
        if (uuid) {
                h.gpu_uuid = (char *)uuid;
                h.gpu_capacity = UINT64_C(80) << 30;
                h.granularity = CHUNK;
                h.fabric_handles = true;
        }
        if (peer) {
                link.gpu_uuid = (char *)peer;
                link.bandwidth_gbps = 900;
                h.links = links;
                h.n_links = 1;
        }
        e.body_case = AQUA__ENVELOPE__BODY_HELLO;
        e.hello = &h;
        call(d, &e, AQUA__ENVELOPE__BODY_WELCOME, NULL);
}

/* The producer offers one chunk with a made-up fabric handle (aquad only passes it on). */
static void offer(void *d)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Offer o = AQUA__OFFER__INIT;
        Aqua__ChunkOffer c = AQUA__CHUNK_OFFER__INIT, *cs[] = {&c};
        uint8_t handle[64];

        memset(handle, 0xab, sizeof(handle));
        c.client_ref = 1;
        c.size = CHUNK;
        c.fabric_handle = (ProtobufCBinaryData){.len = sizeof(handle), .data = handle};
        o.chunks = cs;
        o.n_chunks = 1;
        e.body_case = AQUA__ENVELOPE__BODY_OFFER;
        e.offer = &o;
        call(d, &e, AQUA__ENVELOPE__BODY_OFFER_REPLY, NULL);
}

static void status_query(Aqua__Envelope *e, Aqua__AdminQuery *q)
{
        *e = (Aqua__Envelope)AQUA__ENVELOPE__INIT;
        *q = (Aqua__AdminQuery)AQUA__ADMIN_QUERY__INIT;
        e->body_case = AQUA__ENVELOPE__BODY_ADMIN_QUERY;
        e->admin_query = q;
}

static void borrow_request(Aqua__Envelope *e, Aqua__Borrow *b)
{
        *e = (Aqua__Envelope)AQUA__ENVELOPE__INIT;
        *b = (Aqua__Borrow)AQUA__BORROW__INIT;
        b->bytes = b->min_bytes = CHUNK;
        e->body_case = AQUA__ENVELOPE__BODY_BORROW;
        e->borrow = b;
}

static uint64_t status_rtt(void *d, bool aquad)
{
        Aqua__Envelope e;
        Aqua__AdminQuery q;

        status_query(&e, &q);
        return call(d, &e, aquad ? AQUA__ENVELOPE__BODY_ADMIN_REPLY : 0, NULL);
}

/* A borrow's round trip; aquad's grant (one chunk, its fabric handle) is returned after it,
 * timed with it under --cycle. */
static uint64_t borrow_rtt(void *d, bool aquad)
{
        Aqua__Envelope e, *g = NULL, *done;
        Aqua__Borrow b;
        Aqua__Return rt = AQUA__RETURN__INIT;
        uint64_t t, tr;

        borrow_request(&e, &b);
        t = call(d, &e, aquad ? AQUA__ENVELOPE__BODY_GRANT : 0, aquad ? &g : NULL);
        if (!aquad)
                return cycle ? t + call(d, &e, 0, NULL) : t;
        if (g->grant->n_chunks != 1 || g->grant->chunks[0]->fabric_handle.len != 64) {
                fprintf(stderr, "bench-remote: the grant has no chunk with its fabric handle\n");
                exit(1);
        }
        rt.lease_id = g->grant->lease_id;
        e = (Aqua__Envelope)AQUA__ENVELOPE__INIT;
        e.body_case = AQUA__ENVELOPE__BODY_RETURN;
        e.return_ = &rt;
        tr = call(d, &e, AQUA__ENVELOPE__BODY_RETURN_REPLY, &done);
        if (cycle)
                t += tr;
        aqua__envelope__free_unpacked(done, NULL);
        aqua__envelope__free_unpacked(g, NULL);
        return t;
}

static int cmp_u64(const void *a, const void *b)
{
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return x < y ? -1 : x > y;
}

/* Interleaved blocks of round trips through aquad and through the echo; medians and p99s. */
static void measure(const char *name, void *aq, void *ec, uint64_t (*rtt)(void *, bool))
{
        uint64_t *t_aq = calloc(rounds, sizeof(uint64_t)), *t_ec = calloc(rounds, sizeof(uint64_t));
        int blocks = 20, per = rounds / blocks, k_aq = 0, k_ec = 0;

        if (!t_aq || !t_ec)
                die("memory");
        for (int i = 0; i < 500; i++) {
                rtt(aq, true);
                rtt(ec, false);
        }
        /* Alternate in blocks so that drift of the machine hits both sides alike. */
        for (int b = 0; b < blocks; b++) {
                for (int i = 0; i < per; i++)
                        t_aq[k_aq++] = rtt(aq, true);
                for (int i = 0; i < per; i++)
                        t_ec[k_ec++] = rtt(ec, false);
        }
        qsort(t_aq, k_aq, sizeof(uint64_t), cmp_u64);
        qsort(t_ec, k_ec, sizeof(uint64_t), cmp_u64);
        printf("%s_aquad_us %.2f\n", name, t_aq[k_aq / 2] / 1e3);
        printf("%s_echo_us %.2f\n", name, t_ec[k_ec / 2] / 1e3);
        printf("%s_aquad_p99_us %.2f\n", name, t_aq[k_aq * 99 / 100] / 1e3);
        printf("%s_echo_p99_us %.2f\n", name, t_ec[k_ec * 99 / 100] / 1e3);
        printf("%s_ratio %.3f\n", name, (double)t_aq[k_aq / 2] / (double)t_ec[k_ec / 2]);
        free(t_aq);
        free(t_ec);
}

int main(int argc, char **argv)
{
        static const struct option opts[] = {
            {"endpoint", required_argument, NULL, 'e'},
            {"server-key", required_argument, NULL, 's'},
            {"key-file", required_argument, NULL, 'k'},
            {"rounds", required_argument, NULL, 'r'},
            {"cycle", no_argument, NULL, 'c'},
            {"borrow-only", no_argument, NULL, 'b'},
            {},
        };
        const char *ep = NULL, *server_file = NULL, *key_file = NULL;
        char err[256], line[256], echo_ep[128], echo_key[CURVE_KEY_TEXT + 1];
        int o, p[2];
        void *admin, *producer, *consumer, *ec;
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
                case 'c':
                        cycle = true;
                        break;
                case 'b':
                        borrow_only = true;
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
                prctl(PR_SET_PDEATHSIG, SIGTERM); /* gone with the bench, whatever its end */
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
        admin = dealer_to(ep, server);
        producer = dealer_to(ep, server);
        consumer = dealer_to(ep, server);
        ec = dealer_to(echo_ep, echo_key);
        hello(admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        hello(producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-BENCH-P", NULL);
        hello(consumer, AQUA__ROLE__ROLE_CONSUMER, "GPU-BENCH-C", "GPU-BENCH-P");
        offer(producer);
        if (!borrow_only)
                measure("remote", admin, ec, status_rtt);
        measure("remote_borrow", consumer, ec, borrow_rtt);
        zmq_close(admin);
        zmq_close(producer);
        zmq_close(consumer);
        zmq_close(ec);
        zmq_ctx_term(zctx);
        kill(echo, SIGTERM);
        waitpid(echo, NULL, 0);
        return 0;
}
