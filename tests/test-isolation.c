/*
 * Tenants kept apart by a real aquad: a consumer gets only what it was granted and can touch no
 * other lease; tokens cannot be reused, guessed or lent to another process; the sockets carry the
 * configured mode and group and other users are refused; a flooding client is throttled while
 * the others keep their service.
 */
#include <criterion/criterion.h>
#include <grp.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "harness.h"
#include "rawclient.h"
#include "testutil.h"
#include "time-util.h"
#include "util.h"
#include "wire.h"

#define MiB        (UINT64_C(1) << 20)
#define E(name)    AQUA__ERROR_CODE__ERROR_CODE_##name
#define BODY(name) AQUA__ENVELOPE__BODY_##name

static struct aquad *daemon_;
static struct raw p1, c1, p2, c2, admin;

static void teardown(void)
{
        raw_close(&p1);
        raw_close(&c1);
        raw_close(&p2);
        raw_close(&c2);
        raw_close(&admin);
        aquad_stop_in_teardown(daemon_);
        daemon_ = NULL;
}

TestSuite(isolation, .fini = teardown);

static void start(const char *extra)
{
        cr_assert_eq(aquad_start(extra, &daemon_), 0, "aquad did not start");
}

/* Offer n chunks of 2 MiB whose memfds hold "<label> <i>". */
static void offer_labelled(struct raw *r, size_t n, const char *label)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *reply;
        Aqua__Offer o = AQUA__OFFER__INIT;
        Aqua__ChunkOffer co[8], *cop[8];
        Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
        int fds[8];

        for (size_t i = 0; i < n; i++) {
                char text[32];
                snprintf(text, sizeof(text), "%s %zu", label, i);
                fds[i] = raw_memfd(2 * MiB, text);
                cr_assert_geq(fds[i], 0);
                aqua__chunk_offer__init(&co[i]);
                co[i].size = 2 * MiB;
                co[i].client_ref = i;
                cop[i] = &co[i];
        }
        o.chunks = cop;
        o.n_chunks = n;
        e.body_case = BODY(OFFER);
        e.offer = &o;
        e.request_id = r->next_id++;
        f.kind = AQUA__SIDE_FRAME__KIND__KIND_OFFER_FDS;
        f.request_id = e.request_id;
        cr_assert_eq(side_send(r->side, &f, fds, n), 0);
        side_close_fds(fds, n);
        cr_assert_eq(raw_send(r, &e), 0);
        reply = raw_wait(r, e.request_id, 0, RAW_TIMEOUT_MS);
        cr_assert_eq(reply->body_case, BODY(OFFER_REPLY), "offer: error %d", raw_error_code(reply));
        raw_free(reply);
}

static Aqua__Envelope *give_back(struct raw *r, uint64_t lease, uint64_t *ids, size_t n,
                                 uint64_t dram)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Return rt = AQUA__RETURN__INIT;

        rt.lease_id = lease;
        rt.chunk_ids = ids;
        rt.n_chunk_ids = n;
        rt.dram_bytes = dram;
        e.body_case = BODY(RETURN);
        e.return_ = &rt;
        return raw_call(r, &e);
}

static bool fd_holds_label(int fd, const char *label, size_t n)
{
        for (size_t i = 0; i < n; i++) {
                char text[32];
                snprintf(text, sizeof(text), "%s %zu", label, i);
                if (raw_memfd_has(fd, text))
                        return true;
        }
        return false;
}

static bool side_is_quiet(const struct raw *r)
{
        struct pollfd p = {.fd = r->side, .events = POLLIN};

        return poll(&p, 1, 0) == 0;
}

Test(isolation, a_consumer_gets_only_its_grants_and_cannot_touch_another_lease)
{
        Aqua__Envelope *g1, *g2, *r, *q;
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__ReclaimRequest rq = AQUA__RECLAIM_REQUEST__INIT;
        uint64_t l1, l2, a;
        int fds1[4], fds2[4];
        size_t n1, n2;

        start("dram-budget: 64MiB\n");
        test_connect_as(daemon_, &p1, AQUA__ROLE__ROLE_PRODUCER, "GPU-P1", "GPU-C1");
        test_connect_as(daemon_, &c1, AQUA__ROLE__ROLE_CONSUMER, "GPU-C1", "GPU-P1");
        test_connect_as(daemon_, &p2, AQUA__ROLE__ROLE_PRODUCER, "GPU-P2", "GPU-C2");
        test_connect_as(daemon_, &c2, AQUA__ROLE__ROLE_CONSUMER, "GPU-C2", "GPU-P2");
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        offer_labelled(&p1, 3, "first");
        offer_labelled(&p2, 3, "second");

        g1 = raw_borrow(&c1, 4 * MiB, 4 * MiB, false, fds1, 4, &n1);
        cr_assert_eq(g1->body_case, BODY(GRANT), "error %d", raw_error_code(g1));
        l1 = g1->grant->lease_id;
        a = g1->grant->chunks[0]->chunk_id;
        cr_assert(side_is_quiet(&c2), "nothing reached the other consumer's side channel");
        g2 = raw_borrow(&c2, 4 * MiB, 4 * MiB, false, fds2, 4, &n2);
        cr_assert_eq(g2->body_case, BODY(GRANT), "error %d", raw_error_code(g2));
        l2 = g2->grant->lease_id;
        cr_assert(side_is_quiet(&c1));
        /* Each got descriptors of its own producer's chunks, and only those. */
        for (size_t i = 0; i < n1; i++)
                cr_assert(fd_holds_label(fds1[i], "first", 3));
        for (size_t i = 0; i < n2; i++) {
                cr_assert(fd_holds_label(fds2[i], "second", 3));
                cr_assert_neq(g2->grant->chunks[i]->chunk_id, a);
        }

        r = give_back(&c2, l1, NULL, 0, 0);
        cr_assert_eq(raw_error_code(r), E(UNKNOWN_LEASE), "returning another's lease");
        raw_free(r);
        r = give_back(&c2, l1, &a, 1, 0);
        cr_assert_eq(raw_error_code(r), E(UNKNOWN_LEASE), "returning a chunk of another's lease");
        raw_free(r);
        r = give_back(&c2, l2, &a, 1, 0);
        cr_assert_eq(raw_error_code(r), E(UNKNOWN_CHUNK), "slipping another's chunk into a return");
        raw_free(r);
        r = give_back(&c2, 0, NULL, 0, 16 * MiB);
        cr_assert_eq(raw_error_code(r), E(INVALID), "returning DRAM budget it does not hold");
        raw_free(r);
        /* A producer reclaims only its own chunks: the other consumer hears nothing. */
        rq.all = true;
        e.body_case = BODY(RECLAIM_REQUEST);
        e.reclaim_request = &rq;
        r = raw_call(&p2, &e);
        cr_assert_eq(r->body_case, BODY(RECLAIM_REPLY));
        cr_assert_eq(r->reclaim_reply->n_pending_chunk_ids, n2);
        for (size_t i = 0; i < r->reclaim_reply->n_pending_chunk_ids; i++)
                cr_assert_neq(r->reclaim_reply->pending_chunk_ids[i], a);
        raw_free(r);
        r = raw_wait(&c1, 0, BODY(RECLAIM_NOTICE), 200);
        cr_assert_null(r, "the first consumer was asked for nothing");

        /* The first lease is untouched. */
        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_LEASES);
        for (size_t i = 0; i < q->admin_reply->n_leases; i++) {
                const Aqua__LeaseInfo *li = q->admin_reply->leases[i];
                if (li->lease_id != l1)
                        continue;
                cr_assert_str_eq(li->consumer_uuid, "GPU-C1");
                cr_assert_str_eq(li->state, "granted");
                cr_assert_eq(li->chunks, n1);
        }
        raw_free(q);
        side_close_fds(fds1, n1);
        side_close_fds(fds2, n2);
        raw_free(g1);
        raw_free(g2);
}

static Aqua__Envelope *hello_with(struct raw *r, const uint8_t *token)
{
        uint8_t mine[SIDE_TOKEN_LEN];
        Aqua__Envelope *w;

        memcpy(mine, r->token, sizeof(mine));
        memcpy(r->token, token, sizeof(mine));
        w = raw_hello(r, AQUA__ROLE__ROLE_CONSUMER, "GPU-Y", NULL, NULL, 0, NULL);
        memcpy(r->token, mine, sizeof(mine));
        return w;
}

Test(isolation, a_used_or_guessed_token_is_refused_and_a_second_hello_too)
{
        uint8_t guess[SIDE_TOKEN_LEN];
        struct raw y;
        Aqua__Envelope *w;

        start(NULL);
        test_connect_as(daemon_, &c1, AQUA__ROLE__ROLE_CONSUMER, "GPU-X", NULL);
        w = raw_hello(&c1, AQUA__ROLE__ROLE_CONSUMER, "GPU-X2", NULL, NULL, 0, NULL);
        cr_assert_eq(raw_error_code(w), E(INVALID));
        cr_assert(strstr(w->error->message, "already registered"), "%s", w->error->message);
        raw_free(w);

        cr_assert_eq(raw_connect(&y, aquad_endpoint(daemon_), aquad_side_path(daemon_)), 0);
        w = hello_with(&y, c1.token);
        cr_assert_eq(raw_error_code(w), E(PERMISSION), "a token that was used already");
        raw_free(w);
        memset(guess, 0x5a, sizeof(guess));
        w = hello_with(&y, guess);
        cr_assert_eq(raw_error_code(w), E(PERMISSION), "a guessed token");
        raw_free(w);
        w = hello_with(&y, y.token);
        cr_assert_eq(w->body_case, BODY(WELCOME), "its own token still works");
        raw_free(w);
        raw_close(&y);
}

/*
 * Another process connects a side channel and hands its token over: the token is a secret of
 * that process, and aquad sees over the ipc connection that the Hello comes from someone else.
 */
Test(isolation, a_token_lent_to_another_process_is_refused)
{
        uint8_t token[SIDE_TOKEN_LEN];
        int to_parent[2], to_child[2];
        struct raw mine;
        Aqua__Envelope *w;
        pid_t pid;
        char done = 1;
        int status;

        start(NULL);
        cr_assert_eq(pipe(to_parent), 0);
        cr_assert_eq(pipe(to_child), 0);
        pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
                struct raw r;
                int ok = raw_connect(&r, aquad_endpoint(daemon_), aquad_side_path(daemon_)) == 0;
                (void)!write(to_parent[1], ok ? r.token : (uint8_t[SIDE_TOKEN_LEN]){0},
                             SIDE_TOKEN_LEN);
                (void)!read(to_child[0], &done, 1);
                _exit(ok ? 0 : 1);
        }
        cr_assert_eq(read(to_parent[0], token, sizeof(token)), (ssize_t)sizeof(token));
        cr_assert_eq(raw_connect(&mine, aquad_endpoint(daemon_), aquad_side_path(daemon_)), 0);
        w = hello_with(&mine, token);
        cr_assert_eq(raw_error_code(w), E(PERMISSION));
        cr_assert(strstr(w->error->message, "another process"), "%s", w->error->message);
        raw_free(w);
        raw_close(&mine);
        cr_assert_eq(write(to_child[1], &done, 1), 1);
        waitpid(pid, &status, 0);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

Test(isolation, sockets_carry_the_configured_mode_and_group)
{
        gid_t gid = geteuid() == 0 ? 4242 : getgid();
        char yaml[128];
        struct stat st;
        const char *ipc;

        snprintf(yaml, sizeof(yaml), "socket-mode: 0640\nsocket-group: \"%u\"\n", (unsigned)gid);
        start(yaml);
        /* Answering a client means set-up is over, modes and groups included. */
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        ipc = aquad_endpoint(daemon_) + strlen("ipc://");
        cr_assert_eq(stat(ipc, &st), 0);
        cr_assert_eq(st.st_mode & 07777, 0640, "ZeroMQ socket mode %o", st.st_mode & 07777);
        cr_assert_eq(st.st_gid, gid);
        cr_assert(S_ISSOCK(st.st_mode));
        cr_assert_eq(stat(aquad_side_path(daemon_), &st), 0);
        cr_assert_eq(st.st_mode & 07777, 0640, "side socket mode %o", st.st_mode & 07777);
        cr_assert_eq(st.st_gid, gid);
        teardown();

        start(NULL);
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        cr_assert_eq(stat(aquad_side_path(daemon_), &st), 0);
        cr_assert_eq(st.st_mode & 07777, 0660, "the default mode");
}

/* In a child as user and group nobody: connect to the side channel; 0 accepted, 1 refused by
 * aquad, 2 the kernel refused the connection (EACCES). */
static int connect_as_nobody(void)
{
        pid_t pid = fork();
        int status;

        cr_assert_geq(pid, 0);
        if (pid == 0) {
                struct raw r;
                int rc;

                if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
                        _exit(99);
                rc = raw_connect(&r, aquad_endpoint(daemon_), aquad_side_path(daemon_));
                if (rc == 1 && !strstr(r.reject, "not in the allowed"))
                        _exit(98);
                _exit(rc == 0 ? 0 : rc == 1 ? 1 : rc == -EACCES ? 2 : 97);
        }
        waitpid(pid, &status, 0);
        cr_assert(WIFEXITED(status));
        return WEXITSTATUS(status);
}

Test(isolation, another_user_cannot_connect_or_is_refused_by_its_credentials)
{
        if (geteuid() != 0)
                cr_skip_test("needs root to act as another user");
        /* The harness's folder is private (0700); open it so that only the sockets decide. */
        start(NULL);
        cr_assert_eq(chmod(aquad_dir(daemon_), 0755), 0);
        cr_assert_eq(connect_as_nobody(), 2, "the default mode 0660 keeps others out");
        teardown();

        start("socket-mode: 0666\n");
        cr_assert_eq(chmod(aquad_dir(daemon_), 0755), 0);
        cr_assert_eq(connect_as_nobody(), 1, "SO_PEERCRED names a user not allowed");
        teardown();

        start("socket-mode: 0666\nallow: {users: [nobody, root]}\n");
        cr_assert_eq(chmod(aquad_dir(daemon_), 0755), 0);
        cr_assert_eq(connect_as_nobody(), 0, "allowed by name");
}

/* ------------------------------------------------------------------------------ flooding */

struct flood {
        atomic_bool stop;
        uint64_t sent, granted, throttled, other;
        char first_other[160];
};

static void flood_drain(struct raw *r, struct flood *f, int timeout_ms)
{
        for (;;) {
                Aqua__Envelope *e = raw_recv(r, timeout_ms);
                if (!e)
                        return;
                if (e->body_case == BODY(GRANT))
                        f->granted++;
                else if (raw_error_code(e) == E(THROTTLED))
                        f->throttled++;
                else if (e->request_id != 0 && f->other++ == 0)
                        snprintf(f->first_other, sizeof(f->first_other), "%d %s", raw_error_code(e),
                                 raw_error_code(e) >= 0 ? e->error->message : "");
                raw_free(e);
        }
}

/* A consumer with no producer borrowing DRAM (a journaled change each) without ever waiting. */
static void *flooder(void *arg)
{
        struct flood *f = arg;
        struct raw r;
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *w;
        Aqua__Borrow b = AQUA__BORROW__INIT;
        void *buf = NULL;
        size_t len;

        if (raw_connect(&r, aquad_endpoint(daemon_), aquad_side_path(daemon_)) != 0)
                return NULL;
        w = raw_hello(&r, AQUA__ROLE__ROLE_CONSUMER, "GPU-F", NULL, NULL, 0, NULL);
        raw_free(w);
        b.bytes = 2 * MiB;
        b.allow_dram = true;
        e.body_case = BODY(BORROW);
        e.borrow = &b;
        e.request_id = 1000;
        if (wire_encode(&e, &buf, &len) < 0)
                return NULL;
        while (!atomic_load(&f->stop)) {
                for (int i = 0; i < 64; i++)
                        if (zmq_send(r.dealer, buf, len, ZMQ_DONTWAIT) == (int)len)
                                f->sent++;
                flood_drain(&r, f, 0);
        }
        flood_drain(&r, f, 1000);
        free(buf);
        raw_close(&r);
        return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

        return x < y ? -1 : x > y;
}

/* Borrow and return one chunk n times, pausing between, each round trip's time in lat (us). */
static void well_behaved(size_t n, uint64_t *lat, uint64_t *errors)
{
        for (size_t i = 0; i < n; i++) {
                uint64_t t0 = now_mono_ns();
                int fds[2];
                size_t k;
                Aqua__Envelope *g = raw_borrow(&c1, 2 * MiB, 2 * MiB, false, fds, 2, &k), *r;

                if (!g || g->body_case != BODY(GRANT)) {
                        (*errors)++;
                        raw_free(g);
                        continue;
                }
                side_close_fds(fds, k);
                r = give_back(&c1, g->grant->lease_id, NULL, 0, 0);
                if (!r || r->body_case != BODY(RETURN_REPLY))
                        (*errors)++;
                lat[i] = (now_mono_ns() - t0) / 2 / 1000;
                raw_free(r);
                raw_free(g);
                sleep_ns(20 * NSEC_PER_MSEC); /* 100 requests/s: well below the limit */
        }
}

Test(isolation, a_flooding_client_is_throttled_while_others_keep_their_service)
{
        enum { ROUNDS = 60, RATE = 200, BURST = 50 };
        uint64_t quiet[ROUNDS] = {0}, busy[ROUNDS] = {0}, errors = 0;
        struct flood f = {0};
        pthread_t t;
        uint64_t t0, secs_ms;
        char yaml[160];

        snprintf(yaml, sizeof(yaml),
                 "dram-budget: 64GiB\nlimits: {request-rate: %d, request-burst: %d}\n", RATE,
                 BURST);
        start(yaml);
        test_connect_as(daemon_, &p1, AQUA__ROLE__ROLE_PRODUCER, "GPU-P1", "GPU-C1");
        test_connect_as(daemon_, &c1, AQUA__ROLE__ROLE_CONSUMER, "GPU-C1", "GPU-P1");
        offer_labelled(&p1, 2, "chunk");

        well_behaved(ROUNDS, quiet, &errors);
        cr_assert_eq(pthread_create(&t, NULL, flooder, &f), 0);
        t0 = now_mono_ns();
        well_behaved(ROUNDS, busy, &errors);
        atomic_store(&f.stop, true);
        secs_ms = (now_mono_ns() - t0) / NSEC_PER_MSEC;
        pthread_join(t, NULL);

        qsort(quiet, ROUNDS, sizeof(*quiet), cmp_u64);
        qsort(busy, ROUNDS, sizeof(*busy), cmp_u64);
        test_note(
            "flood: well-behaved client: %d borrow+return rounds alone, %d beside the flooder, "
            "%" PRIu64 " errors; round trip median %" PRIu64 " us alone, %" PRIu64
            " us beside it (p90 %" PRIu64 " / %" PRIu64 " us)\n"
            "flood: flooder over %" PRIu64 " ms: %" PRIu64 " requests sent, %" PRIu64
            " served, %" PRIu64 " throttled, %" PRIu64 " other answers (limit %d/s, burst %d)",
            ROUNDS, ROUNDS, errors, quiet[ROUNDS / 2], busy[ROUNDS / 2], quiet[ROUNDS * 9 / 10],
            busy[ROUNDS * 9 / 10], secs_ms, f.sent, f.granted, f.throttled, f.other, RATE, BURST);
        cr_assert_eq(errors, 0, "every request of the well-behaved client was served");
        cr_assert_eq(f.other, 0, "%s", f.first_other);
        cr_assert_gt(f.throttled, 0, "the flooder was throttled");
        /* What it got served is what the bucket allows, however fast it sent. */
        cr_assert_leq(f.granted, BURST + RATE * (secs_ms + 2000) / 1000);
}
