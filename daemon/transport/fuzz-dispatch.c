/*
 * Fuzz harness for aquad's message entry point. Each input is a script of records, each one
 * message from one of four fake clients (a producer, a consumer, an admin, and a stranger that
 * has not registered) fed to dispatch_envelope() or dispatch_side_frame() of a real server,
 * built once per process on a private endpoint; or a client's death, or time passing. After
 * every input the pool's books must add up, and once every client is gone the pool must be
 * empty and no chunk handle left open.
 *
 * Record: 1 header byte, then for messages a 2-byte little-endian length and that many bytes.
 *   header & 3:        client (0 producer GPU-P, 1 consumer GPU-C, 2 admin, 3 stranger)
 *   (header >> 2) & 3: 0 an Envelope, 1 a SideFrame with (header >> 4) memfds, 2 the client
 *                      dies (and connects again, not registered), 3 time passes (the first
 *                      payload byte, in 100 ms steps)
 *   header >> 4:       for an Envelope, FUZZ_TCP: it came over tcp (remote.endpoint) on a
 *                      routing id of its own, FUZZ_TCP_KNOWN: with the CURVE identity that
 *                      remote.clients lists (else one it does not)
 * tests/fuzz/dispatch-seeds.c writes the seed corpus (tests/fuzz/dispatch/); AQUA_FUZZ_VERBOSE=1
 * logs what the daemon does with an input.
 */
#include <dirent.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "descriptors.h"
#include "dispatch.h"
#include "drop.h"
#include "fuzz-dispatch.h"
#include "log.h"
#include "reload.h"
#include "server.h"
#include "state.h"
#include "time-util.h"
#include "turn.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct server *srv;
static struct client *fake[FUZZ_CLIENTS];
static int peer[FUZZ_CLIENTS]; /* the clients' ends of their side channels */
static uint8_t *hello[FUZZ_CLIENTS];
static size_t hello_len[FUZZ_CLIENTS];
static int memfd = -1;
static char dir[64];
static char journal_path[128];

static void die(const char *what, const char *detail)
{
        fprintf(stderr, "fuzz-dispatch: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
        abort();
}

/* Chunk handles open in this process: the harness's own memfd and every copy it handed out. Other
 * descriptors come and go with the fuzzer itself (its symbolizer pipes, for one). */
static int count_chunk_fds(void)
{
        DIR *d = opendir("/proc/self/fd");
        struct dirent *de;
        int n = 0;

        if (!d)
                return -1;
        while ((de = readdir(d))) {
                char path[300], target[64];
                ssize_t len;

                snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
                len = readlink(path, target, sizeof(target) - 1);
                if (len > 0) {
                        target[len] = '\0';
                        n += strncmp(target, "/memfd:chunk", 12) == 0;
                }
        }
        closedir(d);
        return n;
}

static void cleanup(void)
{
        char cmd[96];

        srv = server_free(srv);
        for (size_t i = 0; i < FUZZ_CLIENTS; i++) {
                safe_close(peer[i]);
                free(hello[i]);
        }
        safe_close(memfd);
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        (void)!system(cmd);
}

static void encode_hello(size_t i)
{
        static const char *const uuid[] = {"GPU-P", "GPU-C", NULL, NULL};
        static const char *const mate[] = {"GPU-C", "GPU-P", NULL, NULL};
        static const Aqua__Role role[] = {AQUA__ROLE__ROLE_PRODUCER, AQUA__ROLE__ROLE_CONSUMER,
                                          AQUA__ROLE__ROLE_ADMIN, 0};
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Hello h = AQUA__HELLO__INIT;
        Aqua__PeerLink link = AQUA__PEER_LINK__INIT, *links[] = {&link};
        uint8_t token[SIDE_TOKEN_LEN];
        void *buf;

        fuzz_token(i, token);
        h.token = (ProtobufCBinaryData){.len = sizeof(token), .data = token};
        h.role = role[i];
        h.gpu_uuid = (char *)(uuid[i] ? uuid[i] : "");
        h.gpu_capacity = UINT64_C(80) << 30;
        h.granularity = FUZZ_CHUNK;
        if (mate[i]) {
                link.gpu_uuid = (char *)mate[i];
                link.bandwidth_gbps = 450;
                h.links = links;
                h.n_links = 1;
        }
        e.body_case = AQUA__ENVELOPE__BODY_HELLO;
        e.hello = &h;
        e.request_id = 1000 + i;
        if (wire_encode(&e, &buf, &hello_len[i]) < 0)
                die("out of memory", NULL);
        hello[i] = buf;
}

/* Connect fake client i: a side channel whose far end the harness reads. */
static void add_client(size_t i)
{
        struct client *c = calloc(1, sizeof(*c));
        int sv[2];

        if (!c || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
                die("cannot make a client", NULL);
        c->id = srv->next_client_id++;
        c->side_fd = sv[0];
        peer[i] = sv[1];
        c->cred = (struct side_cred){getpid(), getuid(), getgid()};
        list_init(&c->pending);
        list_init(&c->outbox);
        list_init(&c->deferred);
        fuzz_token(i, c->token);
        list_append(&srv->clients, &c->node);
        srv->n_clients++;
        fake[i] = c;
}

static void add_clients(void)
{
        for (size_t i = 0; i < FUZZ_CLIENTS; i++) {
                add_client(i);
                encode_hello(i);
        }
}

/* aquad forgets a connection on a Goodbye, or when its holder registers the GPU again from
 * another: that client connects again, as a new one. */
static void revive_clients(void)
{
        for (size_t i = 0; i < FUZZ_CLIENTS; i++) {
                bool there = false;

                for (struct list_node *n = srv->clients.next; n != &srv->clients && !there;
                     n = n->next)
                        there = list_entry(n, struct client, node) == fake[i];
                if (!there) {
                        close(peer[i]);
                        add_client(i);
                }
        }
}

/* What the daemon sends goes nowhere but must encode as a message its peers would read. */
static int sink(struct server *s, const void *rid, size_t rlen, const void *buf, size_t len)
{
        Aqua__Envelope *e = aqua__envelope__unpack(NULL, len, buf);

        (void)s;
        if (!e || rlen != FUZZ_ROUTING_LEN)
                die("the daemon sent what does not decode", NULL);
        aqua__envelope__free_unpacked(e, NULL);
        return 0;
}

static void setup(void)
{
        _cleanup_(config_freep) struct config *cfg = NULL;
        _cleanup_free_ char *error = NULL;
        char yaml[1024];
        int n, r;

        /* AQUA_FUZZ_VERBOSE=1 shows what the daemon makes of each input. */
        log_setup("fuzz-dispatch", getenv("AQUA_FUZZ_VERBOSE") ? LOG_LEVEL_DEBUG : LOG_LEVEL_ERROR);
        /* tmpfs when there is one: the journal is fsync'd after every change. */
        snprintf(dir, sizeof(dir), "%s/aquad-fuzz-XXXXXX",
                 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        if (!mkdtemp(dir))
                die("cannot make a folder", dir);
        snprintf(journal_path, sizeof(journal_path), "%s/journal", dir);
        n = snprintf(yaml, sizeof(yaml),
                     "endpoint: ipc://%s/aquad.sock\n"
                     "side-socket: %s/aquad.side\n"
                     "journal: %s\n"
                     "dram-budget: 64MiB\n"
                     "reclaim-deadline: 1s\n"
                     "request-timeout: 5s\n"
                     "limits: {chunks: 256, leases: 32, pending-requests: 4, repeated-items: 64,"
                     " message-size: 64KiB}\n",
                     dir, dir, journal_path);
        if (config_load("fuzz.yaml", yaml, (size_t)n, &cfg, &error) < 0)
                die("bad config", error);
        /* One remote identity, as remote.clients would give it, without binding tcp. */
        cfg->remote.clients = calloc(1, sizeof(*cfg->remote.clients));
        if (!cfg->remote.clients || !(cfg->remote.clients[0].user = strdup(FUZZ_TCP_IDENTITY)) ||
            !(cfg->remote.clients[0].keys = calloc(1, sizeof(char *))) ||
            !(cfg->remote.clients[0].keys[0] = strdup(FUZZ_TCP_KEY)))
                die("out of memory", NULL);
        cfg->remote.clients[0].n_keys = 1;
        cfg->remote.n_clients = 1;
        r = server_new(cfg, "fuzz.yaml", SERVER_UNBOUND, &srv);
        if (r < 0)
                die("cannot start the server", strerror(-r));
        cfg = NULL;
        srv->sink = sink; /* unbound: no socket, no signals */
        memfd = memfd_create("chunk", MFD_CLOEXEC);
        if (memfd < 0 || ftruncate(memfd, FUZZ_CHUNK) < 0)
                die("cannot make a memfd", NULL);
        add_clients();
        atexit(cleanup);
}

/* Clients registered over tcp go as their grace ends; they hold nothing. Through the server's
 * own removal, which frees what a client owns (held parts, pending requests, its outbox). */
static void drop_remote(void)
{
        struct list_node *pos, *tmp;

        list_for_each(pos, tmp, &srv->clients)
        {
                struct client *c = list_entry(pos, struct client, node);

                if (!c->remote)
                        continue;
                if (c->gpu)
                        die("a remote client registered a GPU", NULL);
                server_drop_client(srv, c);
        }
}

static void remote_envelope(size_t who, unsigned flags, const uint8_t *data, size_t len)
{
        struct origin o = {
            .rid = fuzz_tcp_routing_id(who),
            .rlen = FUZZ_ROUTING_LEN,
            .fd = -1,
            .remote = true,
            .key =
                flags & FUZZ_TCP_KNOWN ? FUZZ_TCP_KEY : "mallorymallorymallorymallorymallorymallo",
            .addr = "10.0.0.9",
        };

        dispatch_envelope(srv, &o, data, len);
}

/* An Envelope from who over ipc://, where ZeroMQ tells no connection. */
static void local_envelope(size_t who, const void *data, size_t len)
{
        struct origin o = {.rid = fuzz_routing_id(who), .rlen = FUZZ_ROUTING_LEN, .fd = -1};

        dispatch_envelope(srv, &o, data, len);
        revive_clients();
}

/* A fresh pool and journal, and the producer, consumer and admin registered again. */
static void reset(void)
{
        struct broker_settings none = {0};
        struct journal *j = NULL;

        drop_remote();
        srv->broker = broker_free(srv->broker);
        unlink(journal_path);
        if (broker_new(&none, &srv->broker) < 0)
                die("out of memory", NULL);
        server_apply_settings(srv);
        if (server_apply_pins(srv) < 0 ||
            journal_open(journal_path, broker_apply, srv->broker, &j, NULL) < 0)
                die("cannot open the journal", journal_path);
        broker_attach_journal(srv->broker, j, srv->config->journal_compact_bytes);
        for (size_t i = 0; i < FUZZ_CLIENTS; i++) {
                fuzz_token(i, fake[i]->token);
                fake[i]->registered = false;
                fake[i]->routing_id_len = 0;
        }
        for (size_t i = 0; i < FUZZ_CLIENTS; i++)
                if (i != FUZZ_STRANGER)
                        local_envelope(i, hello[i], hello_len[i]);
}

/* Client i's process ends: the server removes it as on EOF (server_drop_client), then the same
 * process connects again, a new client with a new side channel. */
static void kill_client(size_t i)
{
        server_drop_client(srv, fake[i]);
        close(peer[i]);
        add_client(i);
        server_end_turn(srv);
}

/* Read what the daemon sent on the side channels, closing the descriptors as a client would. */
static void drain(void)
{
        for (size_t i = 0; i < FUZZ_CLIENTS; i++)
                for (;;) {
                        Aqua__SideFrame *f = NULL;
                        int fds[SIDE_MAX_FDS];
                        size_t n = 0;
                        int r = side_recv(peer[i], &f, fds, SIDE_MAX_FDS, &n);

                        if (r < 0 || r == SIDE_E_EOF)
                                break;
                        if (r == 0) {
                                side_close_fds(fds, n);
                                aqua__side_frame__free_unpacked(f, NULL);
                        }
                }
}

static void side_frame(struct client *c, const uint8_t *data, size_t len, size_t n_fds)
{
        Aqua__SideFrame *f = aqua__side_frame__unpack(NULL, len, data);
        int fds[16];

        if (!f)
                return; /* read_side() drops it the same way */
        for (size_t i = 0; i < n_fds; i++)
                if ((fds[i] = dup(memfd)) < 0)
                        die("cannot dup", NULL);
        dispatch_side_frame(srv, c, f, fds, n_fds);
        aqua__side_frame__free_unpacked(f, NULL);
}

static void time_passes(uint64_t ns)
{
        uint64_t now = now_mono_ns() + ns;

        server_turn_barrier(srv);
        broker_tick(srv->broker, now);
        for (size_t i = 0; i < FUZZ_CLIENTS; i++)
                pending_expire(srv, fake[i], now);
        server_end_turn(srv);
}

static void check(const char *when)
{
        char err[BROKER_ERR_MAX];

        if (broker_check(srv->broker, err) != 0)
                die(when, err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        char err[BROKER_ERR_MAX];
        int n;

        if (!srv)
                setup();
        reset();
        while (size > 0) {
                uint8_t h = data[0];
                size_t who = h & 3, op = (h >> 2) & 3, len = 0;

                data++, size--;
                if (op == FUZZ_OP_ENVELOPE || op == FUZZ_OP_SIDE_FRAME) {
                        if (size < 2)
                                break;
                        len = MIN((size_t)data[0] | (size_t)data[1] << 8, size - 2);
                        data += 2, size -= 2;
                }
                switch (op) {
                case FUZZ_OP_ENVELOPE:
                        if ((h >> 4) & FUZZ_TCP)
                                remote_envelope(who, h >> 4, data, len);
                        else
                                local_envelope(who, data, len);
                        break;
                case FUZZ_OP_SIDE_FRAME:
                        side_frame(fake[who], data, len, h >> 4);
                        break;
                case FUZZ_OP_DIE:
                        kill_client(who);
                        break;
                default:
                        time_passes((size ? data[0] : 1) * 100 * NSEC_PER_MSEC);
                        len = size ? 1 : 0;
                        break;
                }
                data += len, size -= len;
                if (!(op == FUZZ_OP_ENVELOPE && ((h >> 4) & FUZZ_TURN_OPEN)))
                        server_end_turn(srv);
                drain();
                check("after a record");
        }
        /* Everything still waiting times out, then every client goes away. */
        time_passes(UINT64_C(3600) * NSEC_PER_SEC);
        check("after the deadlines");
        for (size_t i = 0; i < FUZZ_CLIENTS; i++)
                kill_client(i);
        drop_remote();
        drain();
        check("after every client left");
        struct broker_counts left;

        broker_counts(srv->broker, &left);
        if (left.chunks || left.leases || left.dram_granted) {
                snprintf(err, sizeof(err), "%zu chunks, %zu leases, %" PRIu64 " bytes of DRAM",
                         left.chunks, left.leases, left.dram_granted);
                die("the pool is not empty after every client left", err);
        }
        n = count_chunk_fds();
        if (n != 1) {
                snprintf(err, sizeof(err), "%d chunk handles open, 1 expected", n);
                die("descriptors leaked", err);
        }
        return 0;
}
