/*
 * A client on "another host" for tests/netns/run: one DEALER to aquad's remote.endpoint, with
 * CURVE keys or plain (--plain), driven by lines on stdin; one line out per command:
 *   hello admin|producer|consumer [fabric] -> "welcome ID" | "error CODE MESSAGE" | "timeout"
 *                                     (fabric: the Hello says fabric_handles)
 *   offer LEN                      -> "offered ID" | "error CODE MESSAGE" | "timeout"
 *                                     (one 2 MiB chunk with a fabric handle of LEN bytes)
 *   status                         -> "status clients=N" | "error CODE MESSAGE" | "timeout"
 *   reconnect                      -> "reconnected" (a new connection, a new routing id)
 * Usage: remote-client [--plain] [--timeout MS] [--routing-id ID] ENDPOINT
 *                      [SERVER_PUB_FILE CLIENT_KEY_FILE]
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "curve.h"
#include "time-util.h"
#include "wire.h"

static const struct wire_limits limits = {
    .max_message = 64u << 20, .max_repeated = 1u << 20, .max_string = 1u << 16};

static void *zctx, *dealer;
static char server[CURVE_KEY_TEXT + 1], pub[CURVE_KEY_TEXT + 1], sec[CURVE_KEY_TEXT + 1];
static bool plain;
static int timeout_ms = 2000;
static const char *endpoint, *routing_id;
static uint64_t next_id = 1;

static int open_dealer(void)
{
        int zero = 0;

        if (dealer)
                zmq_close(dealer);
        dealer = zmq_socket(zctx, ZMQ_DEALER);
        if (!dealer)
                return -errno;
        zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof(zero));
        if (routing_id && zmq_setsockopt(dealer, ZMQ_ROUTING_ID, routing_id, strlen(routing_id)) < 0)
                return -errno;
        if (!plain && (zmq_setsockopt(dealer, ZMQ_CURVE_SERVERKEY, server, CURVE_KEY_TEXT) < 0 ||
                       zmq_setsockopt(dealer, ZMQ_CURVE_PUBLICKEY, pub, CURVE_KEY_TEXT) < 0 ||
                       zmq_setsockopt(dealer, ZMQ_CURVE_SECRETKEY, sec, CURVE_KEY_TEXT) < 0))
                return -errno;
        return zmq_connect(dealer, endpoint) < 0 ? -errno : 0;
}

/* Send e and wait for the reply with its request id; NULL on timeout. */
static Aqua__Envelope *call(Aqua__Envelope *e)
{
        uint64_t deadline = now_mono_ns() + (uint64_t)timeout_ms * NSEC_PER_MSEC;
        void *buf = NULL;
        size_t n;

        e->request_id = next_id++;
        if (wire_encode(e, &buf, &n) < 0)
                return NULL;
        /* DONTWAIT: with the handshake refused nothing is connected, and that is a timeout. */
        zmq_send(dealer, buf, n, ZMQ_DONTWAIT);
        free(buf);
        for (;;) {
                zmq_pollitem_t it = {.socket = dealer, .events = ZMQ_POLLIN};
                long left = ms_until(deadline);
                zmq_msg_t m;
                Aqua__Envelope *r = NULL;
                char err[256];

                if (left <= 0 || zmq_poll(&it, 1, left) <= 0)
                        return NULL;
                zmq_msg_init(&m);
                if (zmq_msg_recv(&m, dealer, ZMQ_DONTWAIT) < 0) {
                        zmq_msg_close(&m);
                        continue;
                }
                if (wire_decode(zmq_msg_data(&m), zmq_msg_size(&m), &limits, &r, err,
                                sizeof(err)) == 0 &&
                    r->request_id == e->request_id) {
                        zmq_msg_close(&m);
                        return r;
                }
                if (r)
                        aqua__envelope__free_unpacked(r, NULL);
                zmq_msg_close(&m);
        }
}

static void print_error_or(Aqua__Envelope *r, const char *what)
{
        if (!r)
                printf("timeout\n");
        else if (r->body_case == AQUA__ENVELOPE__BODY_ERROR)
                printf("error %d %s\n", r->error->code, r->error->message);
        else
                printf("unexpected %s (wanted %s)\n", wire_body_name(r), what);
}

static void hello(const char *role)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *r;
        Aqua__Hello h = AQUA__HELLO__INIT;

        h.role = strncmp(role, "producer", 8) == 0   ? AQUA__ROLE__ROLE_PRODUCER
                 : strncmp(role, "consumer", 8) == 0 ? AQUA__ROLE__ROLE_CONSUMER
                                                     : AQUA__ROLE__ROLE_ADMIN;
        h.fabric_handles = strstr(role, " fabric") != NULL;
        h.client_name = "remote-client";
        h.gpu_uuid = "GPU-00000000-0000-0000-0000-0000000000aa";
        h.gpu_capacity = 1ull << 34;
        h.granularity = 2u << 20;
        e.body_case = AQUA__ENVELOPE__BODY_HELLO;
        e.hello = &h;
        r = call(&e);
        if (r && r->body_case == AQUA__ENVELOPE__BODY_WELCOME)
                printf("welcome %llu\n", (unsigned long long)r->welcome->client_id);
        else
                print_error_or(r, "Welcome");
        if (r)
                aqua__envelope__free_unpacked(r, NULL);
}

/* An Offer of one chunk whose fabric handle has len bytes (64 is a CUmemFabricHandle's size). */
static void offer(size_t len)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *r;
        Aqua__Offer o = AQUA__OFFER__INIT;
        Aqua__ChunkOffer c = AQUA__CHUNK_OFFER__INIT, *cp = &c;
        uint8_t handle[256] = {0};

        c.client_ref = 1;
        c.size = 2u << 20;
        c.fabric_handle =
            (ProtobufCBinaryData){.len = len < sizeof(handle) ? len : 0, .data = handle};
        o.chunks = &cp;
        o.n_chunks = 1;
        e.body_case = AQUA__ENVELOPE__BODY_OFFER;
        e.offer = &o;
        r = call(&e);
        if (r && r->body_case == AQUA__ENVELOPE__BODY_OFFER_REPLY && r->offer_reply->n_chunk_ids)
                printf("offered %llu\n", (unsigned long long)r->offer_reply->chunk_ids[0]);
        else
                print_error_or(r, "OfferReply");
        if (r)
                aqua__envelope__free_unpacked(r, NULL);
}

static void status(void)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *r;
        Aqua__AdminQuery q = AQUA__ADMIN_QUERY__INIT;

        q.what = AQUA__ADMIN_QUERY__WHAT__WHAT_STATUS;
        e.body_case = AQUA__ENVELOPE__BODY_ADMIN_QUERY;
        e.admin_query = &q;
        r = call(&e);
        if (r && r->body_case == AQUA__ENVELOPE__BODY_ADMIN_REPLY && r->admin_reply->status)
                printf("status clients=%u\n", r->admin_reply->status->clients);
        else
                print_error_or(r, "AdminReply");
        if (r)
                aqua__envelope__free_unpacked(r, NULL);
}

int main(int argc, char **argv)
{
        char line[256], err[256];
        int i = 1;

        for (; i < argc && argv[i][0] == '-'; i++) {
                if (strcmp(argv[i], "--plain") == 0)
                        plain = true;
                else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc)
                        timeout_ms = atoi(argv[++i]);
                else if (strcmp(argv[i], "--routing-id") == 0 && i + 1 < argc)
                        routing_id = argv[++i];
        }
        if (i >= argc || (!plain && i + 3 > argc)) {
                fprintf(stderr, "usage: remote-client [--plain] [--timeout MS] ENDPOINT "
                                "[SERVER_PUB CLIENT_KEY]\n");
                return 2;
        }
        endpoint = argv[i];
        if (!plain && (curve_keyfile_load(argv[i + 1], server, NULL, err, sizeof(err)) < 0 ||
                       curve_keyfile_load(argv[i + 2], pub, sec, err, sizeof(err)) < 0)) {
                fprintf(stderr, "remote-client: %s\n", err);
                return 2;
        }
        zctx = zmq_ctx_new();
        if (!zctx || open_dealer() < 0) {
                fprintf(stderr, "remote-client: %s\n", zmq_strerror(errno));
                return 1;
        }
        setvbuf(stdout, NULL, _IOLBF, 0);
        while (fgets(line, sizeof(line), stdin)) {
                line[strcspn(line, "\n")] = '\0';
                if (strncmp(line, "hello ", 6) == 0)
                        hello(line + 6);
                else if (strncmp(line, "offer ", 6) == 0)
                        offer(strtoul(line + 6, NULL, 10));
                else if (strcmp(line, "status") == 0)
                        status();
                else if (strcmp(line, "reconnect") == 0)
                        printf(open_dealer() == 0 ? "reconnected\n" : "reconnect failed\n");
                else if (strcmp(line, "quit") == 0)
                        break;
                else
                        printf("unknown command\n");
        }
        zmq_close(dealer);
        zmq_ctx_term(zctx);
        return 0;
}
