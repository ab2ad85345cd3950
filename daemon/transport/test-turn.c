/*
 * The turn of aquad's loop (turn.c), driven without a ROUTER: requests go to dispatch_envelope,
 * what aquad sends goes to a sink. Many custody changes in a turn are one commit; nothing leaves
 * before it; a refused commit undoes every change of its turn; a degraded journal is not tried
 * again before its probe; a grant the ROUTER cannot take is taken back.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dispatch.h"
#include "fuzz-dispatch.h"
#include "log.h"
#include "outbox.h"
#include "server.h"
#include "state.h"
#include "time-util.h"
#include "turn.h"

#define CHUNK   FUZZ_CHUNK
#define MAX_OUT 64

static struct server *srv;
static struct client *fake[2]; /* FUZZ_PRODUCER, FUZZ_CONSUMER */
static int peer[2];
static int memfd = -1;
static char dir[64], journal[128];

/* What the sink saw: each message's kind and, for an Error, its code. */
/* The pool as the transport may see it: counts, stats and the newest lease (views). */
static struct broker_counts pool_counts(void);
static struct broker_stats pool_stats(void);
static uint64_t newest_lease_id(void);

static struct {
        Aqua__Envelope__BodyCase body;
        uint64_t request_id;
        int code;
} out[MAX_OUT];
static size_t n_out;
static Aqua__Envelope__BodyCase refuse_body; /* the sink says refuse_errno to these */
static int refuse_who = -1;                   /* and to everything for this client */
static int refuse_errno = -EAGAIN;

static int sink(struct server *s, const void *rid, size_t rlen, const void *buf, size_t len)
{
        Aqua__Envelope *e = aqua__envelope__unpack(NULL, len, buf);

        (void)s;
        cr_assert_not_null(e);
        if (e->body_case == refuse_body ||
            (refuse_who >= 0 && rlen == FUZZ_ROUTING_LEN &&
             memcmp(rid, fuzz_routing_id((size_t)refuse_who), rlen) == 0)) {
                aqua__envelope__free_unpacked(e, NULL);
                return refuse_errno;
        }
        cr_assert_lt(n_out, MAX_OUT);
        out[n_out].body = e->body_case;
        out[n_out].request_id = e->request_id;
        out[n_out].code = e->body_case == AQUA__ENVELOPE__BODY_ERROR ? e->error->code : 0;
        n_out++;
        aqua__envelope__free_unpacked(e, NULL);
        return 0;
}

static void send_env(size_t who, Aqua__Envelope *e)
{
        void *buf;
        size_t len;
        struct origin o = {.rid = fuzz_routing_id(who), .rlen = FUZZ_ROUTING_LEN, .fd = -1};

        cr_assert_eq(wire_encode(e, &buf, &len), 0);
        dispatch_envelope(srv, &o, buf, len);
        free(buf);
}

static void hello(size_t who)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Hello h = AQUA__HELLO__INIT;
        Aqua__PeerLink link = AQUA__PEER_LINK__INIT, *links[] = {&link};
        uint8_t token[SIDE_TOKEN_LEN];

        fuzz_token(who, token);
        h.token = (ProtobufCBinaryData){.len = sizeof(token), .data = token};
        h.role = who == FUZZ_PRODUCER ? AQUA__ROLE__ROLE_PRODUCER : AQUA__ROLE__ROLE_CONSUMER;
        h.gpu_uuid = who == FUZZ_PRODUCER ? "GPU-P" : "GPU-C";
        h.gpu_capacity = UINT64_C(80) << 30;
        h.granularity = CHUNK;
        link.gpu_uuid = who == FUZZ_PRODUCER ? "GPU-C" : "GPU-P";
        link.bandwidth_gbps = 450;
        h.links = links;
        h.n_links = 1;
        e.body_case = AQUA__ENVELOPE__BODY_HELLO;
        e.hello = &h;
        e.request_id = 1 + who;
        send_env(who, &e);
}

static void setup(void)
{
        struct config *cfg = NULL;
        char *error = NULL, yaml[512];
        int n;

        signal(SIGXFSZ, SIG_IGN); /* a write past RLIMIT_FSIZE fails with EFBIG instead */
        snprintf(dir, sizeof(dir), "/tmp/aquad-turn-XXXXXX");
        cr_assert_not_null(mkdtemp(dir));
        snprintf(journal, sizeof(journal), "%s/journal", dir);
        n = snprintf(yaml, sizeof(yaml),
                     "endpoint: ipc://%s/aquad.sock\nside-socket: %s/aquad.side\njournal: %s\n"
                     "reclaim-deadline: 1s\n",
                     dir, dir, journal);
        cr_assert_eq(config_load("turn.yaml", yaml, (size_t)n, &cfg, &error), 0, "%s", error);
        cr_assert_eq(server_new(cfg, "turn.yaml", SERVER_UNBOUND, &srv), 0);
        srv->sink = sink;
        memfd = memfd_create("chunk", MFD_CLOEXEC);
        cr_assert(memfd >= 0 && ftruncate(memfd, CHUNK) == 0);
        for (size_t i = 0; i < 2; i++) {
                struct client *c = calloc(1, sizeof(*c));
                int sv[2];

                cr_assert_not_null(c);
                cr_assert_eq(
                    socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
                c->id = srv->next_client_id++;
                c->side_fd = sv[0];
                peer[i] = sv[1];
                c->cred = (struct side_cred){getpid(), getuid(), getgid()};
                fuzz_token(i, c->token);
                list_init(&c->pending);
                list_init(&c->outbox);
                list_init(&c->deferred);
                list_append(&srv->clients, &c->node);
                srv->n_clients++;
                fake[i] = c;
                hello(i);
        }
        server_end_turn(srv);
        cr_assert(fake[0]->registered && fake[1]->registered);
        cr_assert_eq(out[0].body, AQUA__ENVELOPE__BODY_WELCOME);
        n_out = 0;
}

static void teardown(void)
{
        char cmd[96];

        srv = server_free(srv);
        for (size_t i = 0; i < 2; i++)
                close(peer[i]);
        close(memfd);
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        (void)!system(cmd);
}

/* The producer offers n chunks: their descriptors, then the Offer, in the current turn. */
static void offer(size_t n, uint64_t request_id)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Offer o = AQUA__OFFER__INIT;
        Aqua__ChunkOffer ch[8], *chs[8];
        Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
        int fds[8];

        cr_assert_leq(n, 8);
        for (size_t i = 0; i < n; i++) {
                aqua__chunk_offer__init(&ch[i]);
                ch[i].size = CHUNK;
                ch[i].client_ref = i;
                chs[i] = &ch[i];
                fds[i] = dup(memfd);
        }
        f.kind = AQUA__SIDE_FRAME__KIND__KIND_OFFER_FDS;
        f.request_id = request_id;
        dispatch_side_frame(srv, fake[FUZZ_PRODUCER], &f, fds, n);
        o.chunks = chs;
        o.n_chunks = n;
        e.body_case = AQUA__ENVELOPE__BODY_OFFER;
        e.offer = &o;
        e.request_id = request_id;
        send_env(FUZZ_PRODUCER, &e);
}

static void borrow(uint64_t request_id)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Borrow b = AQUA__BORROW__INIT;

        b.bytes = CHUNK;
        e.body_case = AQUA__ENVELOPE__BODY_BORROW;
        e.borrow = &b;
        e.request_id = request_id;
        send_env(FUZZ_CONSUMER, &e);
}

/* Side frames the consumer got (their descriptors closed). */
static size_t grant_frames(void)
{
        size_t n = 0;

        for (;;) {
                Aqua__SideFrame *f = NULL;
                int fds[SIDE_MAX_FDS];
                size_t k = 0;
                int r = side_recv(peer[FUZZ_CONSUMER], &f, fds, SIDE_MAX_FDS, &k);

                if (r != 0)
                        return n;
                n += f->kind == AQUA__SIDE_FRAME__KIND__KIND_GRANT_FDS;
                side_close_fds(fds, k);
                aqua__side_frame__free_unpacked(f, NULL);
        }
}

static void journal_full(bool full)
{
        struct stat st;
        struct rlimit rl = {RLIM_INFINITY, RLIM_INFINITY};

        cr_assert_eq(stat(journal, &st), 0);
        if (full)
                rl.rlim_cur = (rlim_t)st.st_size;
        cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
}

TestSuite(turn, .init = setup, .fini = teardown);

Test(turn, many_custody_changes_one_commit_nothing_before)
{
        uint64_t commits = pool_stats().journal_commits;

        offer(4, 10);
        for (uint64_t i = 0; i < 4; i++)
                borrow(20 + i);
        /* Nothing has left: not the offer's reply, not a grant, not a descriptor. */
        cr_assert_eq(n_out, 0);
        cr_assert_eq(grant_frames(), 0);
        cr_assert_eq(pool_stats().journal_commits, commits);
        server_end_turn(srv);
        cr_assert_eq(pool_stats().journal_commits, commits + 1, "one commit for the turn");
        cr_assert_eq(n_out, 5);
        cr_assert_eq(out[0].body, AQUA__ENVELOPE__BODY_OFFER_REPLY);
        for (size_t i = 1; i < 5; i++) {
                cr_assert_eq(out[i].body, AQUA__ENVELOPE__BODY_GRANT, "reply %zu", i);
                cr_assert_eq(out[i].request_id, 20 + i - 1);
        }
        cr_assert_eq(grant_frames(), 4);
        cr_assert_eq(pool_counts().leases, 4);
}

Test(turn, refused_commit_undoes_the_turn_and_degraded_waits_for_its_probe)
{
        uint64_t errors;
        char err[BROKER_ERR_MAX];

        offer(2, 10);
        server_end_turn(srv);
        n_out = 0;
        offer(2, 11);
        borrow(20);
        borrow(21);
        borrow(22);
        journal_full(true);
        server_end_turn(srv);
        cr_assert_eq(n_out, 4);
        for (size_t i = 0; i < 4; i++)
                cr_assert_eq(out[i].code, AQUA__ERROR_CODE__ERROR_CODE_JOURNAL, "reply %zu: %d", i,
                             out[i].code);
        cr_assert_eq(grant_frames(), 0, "no descriptor of an undone grant leaves");
        cr_assert_eq(pool_counts().leases, 0);
        cr_assert_eq(pool_counts().chunks, 2, "the undone offer's chunks are gone");
        cr_assert_eq(broker_check(srv->broker, err), 0, "%s", err);
        /* Degraded: refused at once, the journal not tried again before its probe. */
        errors = pool_stats().journal_errors;
        n_out = 0;
        borrow(23);
        server_end_turn(srv);
        cr_assert_eq(n_out, 1);
        cr_assert_eq(out[0].code, AQUA__ERROR_CODE__ERROR_CODE_JOURNAL);
        cr_assert_eq(pool_stats().journal_errors, errors);
        cr_assert_gt(server_turn_deadline(srv), now_mono_ns(), "the probe has its own time");
        /* The disk has room again: the probe finds it, and grants follow. */
        journal_full(false);
        srv->journal_probe_ns = now_mono_ns();
        server_end_turn(srv);
        cr_assert_eq(pool_counts().journal_error, 0);
        n_out = 0;
        borrow(24);
        server_end_turn(srv);
        cr_assert_eq(n_out, 1);
        cr_assert_eq(out[0].body, AQUA__ENVELOPE__BODY_GRANT);
        cr_assert_eq(pool_counts().leases, 1);
}

static void reclaim_all(uint64_t request_id)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__ReclaimRequest r = AQUA__RECLAIM_REQUEST__INIT;

        r.all = true;
        e.body_case = AQUA__ENVELOPE__BODY_RECLAIM_REQUEST;
        e.reclaim_request = &r;
        e.request_id = request_id;
        send_env(FUZZ_PRODUCER, &e);
}

/* Past ZeroMQ's high-water mark the consumer is still there and holds what its Grant hands
 * over: the Grant waits in its outbox, in front of the notices that name its lease. */
Test(turn, a_grant_to_a_full_queue_waits_in_front_of_its_notices)
{
        size_t grant = SIZE_MAX, notice = SIZE_MAX;

        offer(2, 10);
        server_end_turn(srv);
        n_out = 0;
        refuse_who = FUZZ_CONSUMER;
        borrow(20);
        server_end_turn(srv);
        cr_assert_eq(n_out, 0);
        cr_assert_eq(srv->stats.replies_deferred, 1);
        cr_assert_eq(srv->stats.custody_undelivered, 0);
        cr_assert_eq(srv->stats.send_dropped, 0);
        cr_assert_eq(pool_counts().leases, 1, "the lease stays the consumer's");
        cr_assert_eq(grant_frames(), 1, "its descriptors went");

        /* The producer takes its memory back: the consumer's notice queues behind the Grant,
         * even once the queue takes messages again. */
        reclaim_all(30);
        server_end_turn(srv);
        cr_assert_eq(n_out, 1);
        cr_assert_eq(out[0].body, AQUA__ENVELOPE__BODY_RECLAIM_REPLY);
        server_flush_outboxes(srv);
        cr_assert_eq(n_out, 1, "nothing overtakes the waiting Grant");
        refuse_who = -1;
        server_flush_outboxes(srv);
        for (size_t i = 0; i < n_out; i++) {
                if (out[i].body == AQUA__ENVELOPE__BODY_GRANT && out[i].request_id == 20)
                        grant = i;
                if (out[i].body == AQUA__ENVELOPE__BODY_RECLAIM_NOTICE)
                        notice = i;
        }
        cr_assert_neq(grant, SIZE_MAX, "the Grant arrived");
        cr_assert_neq(notice, SIZE_MAX, "the ReclaimNotice arrived");
        cr_assert_lt(grant, notice);
        cr_assert_eq(srv->n_outbox, 0);
}

/* A Grant the ROUTER refuses for good (its client is gone): custody nobody would know of. */
Test(turn, a_grant_the_router_cannot_take_is_taken_back)
{
        uint64_t commits;

        offer(2, 10);
        server_end_turn(srv);
        n_out = 0;
        refuse_errno = -EHOSTUNREACH;
        refuse_body = AQUA__ENVELOPE__BODY_GRANT;
        borrow(20);
        server_end_turn(srv);
        refuse_body = 0;
        refuse_errno = -EAGAIN;
        cr_assert_eq(n_out, 0);
        cr_assert_eq(srv->stats.custody_undelivered, 1);
        cr_assert_eq(pool_counts().leases, 0, "the lease nobody heard of is gone");
        /* Taking it back is journaled with the next turn, or when the linger ends. */
        cr_assert_gt(pool_counts().uncommitted, 0);
        commits = pool_stats().journal_commits;
        server_end_turn(srv);
        cr_assert_eq(pool_stats().journal_commits, commits + 1);
        (void)grant_frames();
        borrow(21);
        server_end_turn(srv);
        cr_assert_eq(n_out, 1);
        cr_assert_eq(out[0].body, AQUA__ENVELOPE__BODY_GRANT);
}

Test(turn, a_request_that_could_touch_a_change_ends_the_turn_first)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__ReclaimRequest rq = AQUA__RECLAIM_REQUEST__INIT;
        uint64_t commits;

        offer(2, 10);
        server_end_turn(srv);
        n_out = 0;
        commits = pool_stats().journal_commits;
        borrow(20);
        /* The producer takes its memory back in the same read: the grant is settled first. */
        rq.all = true;
        e.body_case = AQUA__ENVELOPE__BODY_RECLAIM_REQUEST;
        e.reclaim_request = &rq;
        e.request_id = 30;
        send_env(FUZZ_PRODUCER, &e);
        cr_assert_eq(pool_stats().journal_commits, commits + 1);
        cr_assert_eq(n_out, 1);
        cr_assert_eq(out[0].body, AQUA__ENVELOPE__BODY_GRANT);
        server_end_turn(srv);
        cr_assert_eq(out[1].body, AQUA__ENVELOPE__BODY_RECLAIM_REPLY);
}

static void return_lease(uint64_t lease_id, uint64_t request_id)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Return rt = AQUA__RETURN__INIT;

        rt.lease_id = lease_id;
        e.body_case = AQUA__ENVELOPE__BODY_RETURN;
        e.return_ = &rt;
        e.request_id = request_id;
        send_env(FUZZ_CONSUMER, &e);
}

Test(turn, a_return_joins_the_turn_unless_it_names_a_lease_granted_in_it)
{
        uint64_t commits, first;
        char err[BROKER_ERR_MAX];

        offer(4, 10);
        borrow(20);
        server_end_turn(srv);
        first = newest_lease_id();
        n_out = 0;
        commits = pool_stats().journal_commits;
        /* A borrow, the return of the lease granted before, another borrow: one turn. */
        borrow(21);
        return_lease(first, 22);
        borrow(23);
        cr_assert_eq(pool_stats().journal_commits, commits);
        cr_assert_eq(n_out, 0);
        /* A return that names the lease this turn just granted (a guess: its consumer has not
         * heard of it) waits for the turn's end. */
        return_lease(newest_lease_id(), 24);
        cr_assert_eq(pool_stats().journal_commits, commits + 1);
        cr_assert_eq(n_out, 3);
        server_end_turn(srv);
        cr_assert_eq(n_out, 4);
        cr_assert_eq(out[3].body, AQUA__ENVELOPE__BODY_RETURN_REPLY);
        cr_assert_eq(pool_counts().leases, 1);
        cr_assert_eq(broker_check(srv->broker, err), 0, "%s", err);
}

Test(turn, a_refused_turn_undoes_its_grants_and_keeps_its_returns)
{
        uint64_t first;
        char err[BROKER_ERR_MAX];

        offer(2, 10);
        borrow(20);
        server_end_turn(srv);
        first = newest_lease_id();
        n_out = 0;
        (void)grant_frames();
        borrow(21);
        return_lease(first, 22);
        journal_full(true);
        server_end_turn(srv);
        journal_full(false);
        cr_assert_eq(n_out, 2);
        cr_assert_eq(out[0].code, AQUA__ERROR_CODE__ERROR_CODE_JOURNAL);
        cr_assert_eq(out[1].body, AQUA__ENVELOPE__BODY_RETURN_REPLY);
        cr_assert_eq(grant_frames(), 0);
        cr_assert_eq(pool_counts().leases, 0);
        cr_assert_eq(broker_check(srv->broker, err), 0, "%s", err);
}

/* What aquad logged while fn ran (stderr, where its log goes). */
static char *logged_during(void (*fn)(void))
{
        char path[] = "/tmp/test-turn-log-XXXXXX";
        int fd = mkstemp(path), saved = dup(2);
        static char text[16384];
        ssize_t n;

        cr_assert_geq(fd, 0);
        unlink(path);
        fflush(stderr);
        dup2(fd, 2);
        fn();
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
        n = pread(fd, text, sizeof(text) - 1, 0);
        close(fd);
        text[n > 0 ? n : 0] = '\0';
        return text;
}

static size_t count_lines(const char *text, const char *needle)
{
        size_t n = 0;

        for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
                n++;
        return n;
}

static void errors_and_a_drop(void)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Borrow b = AQUA__BORROW__INIT;

        /* An Offer of nothing, a Borrow before a Hello, and a grant the ROUTER does not take. */
        offer(0, 5);
        e.body_case = AQUA__ENVELOPE__BODY_BORROW;
        e.borrow = &b;
        e.request_id = 6;
        send_env(3, &e);
        offer(1, 10);
        server_end_turn(srv);
        refuse_errno = -EHOSTUNREACH;
        refuse_body = AQUA__ENVELOPE__BODY_GRANT;
        borrow(20);
        server_end_turn(srv);
        refuse_body = 0;
        refuse_errno = -EAGAIN;
}

static void many_errors(void)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Borrow b = AQUA__BORROW__INIT;

        e.body_case = AQUA__ENVELOPE__BODY_BORROW;
        e.borrow = &b;
        for (uint64_t i = 0; i < 500; i++) {
                e.request_id = 100 + i;
                send_env(3, &e);
                if (i % 50 == 49) {
                        server_end_turn(srv);
                        n_out = 0;
                }
        }
}

/* Each error reply and each dropped send has a line naming the client, the request and why, so
 * that every counter of the metrics can be explained; a flood costs a few lines, which count
 * what they held back. */
Test(turn, every_error_reply_and_dropped_send_has_a_line_in_the_log)
{
        uint64_t errors = srv->stats.errors, dropped = srv->stats.send_dropped;
        const char *log;

        log_setup("aquad", LOG_LEVEL_INFO);
        log = logged_during(errors_and_a_drop);
        cr_assert_eq(srv->stats.errors - errors, 2, "%s", log);
        cr_assert_eq(srv->stats.send_dropped - dropped, 1);
        cr_assert_eq(count_lines(log, "Error "), 2, "%s", log);
        cr_assert_eq(count_lines(log, "Dropped a grant to client "), 1, "%s", log);
        cr_assert_not_null(strstr(log, "Error ERROR_CODE_NOT_REGISTERED to a connection without a "
                                       "Hello, answering its borrow (request 6): "),
                           "%s", log);
        cr_assert_not_null(strstr(log, "answering its offer (request 5): "), "%s", log);
        cr_assert_not_null(strstr(log, "the reply to its borrow could not be sent"), "%s", log);

        errors = srv->stats.errors;
        log = logged_during(many_errors);
        cr_assert_eq(srv->stats.errors - errors, 500);
        cr_assert_leq(count_lines(log, "Error ERROR_CODE_NOT_REGISTERED"), 10, "%s", log);
        cr_assert_geq(count_lines(log, "Error ERROR_CODE_NOT_REGISTERED"), 1, "%s", log);
}

static struct broker_counts pool_counts(void)
{
        struct broker_counts n;

        broker_counts(srv->broker, &n);
        return n;
}

static struct broker_stats pool_stats(void)
{
        struct broker_totals t;

        broker_totals(srv->broker, &t);
        return t.stats;
}

static uint64_t newest_lease_id(void)
{
        struct broker_lease_view v[64];
        size_t n = broker_view_leases(srv->broker, now_mono_ns(), v, 64);
        uint64_t id = 0;

        for (size_t i = 0; i < n; i++)
                id = v[i].id > id ? v[i].id : id;
        return id;
}
