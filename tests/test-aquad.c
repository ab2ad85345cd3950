/* aquad end to end: a real daemon on a private endpoint, driven by raw protocol clients. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "rawclient.h"
#include "testutil.h"
#include "time-util.h"

#define MiB        (UINT64_C(1) << 20)
#define E(name)    AQUA__ERROR_CODE__ERROR_CODE_##name
#define BODY(name) AQUA__ENVELOPE__BODY_##name

static struct aquad *daemon_;
static struct raw producer, consumer, admin;

static void start(const char *extra)
{
        cr_assert_eq(aquad_start(extra, &daemon_), 0, "aquad did not start");
}

static void cast(const char *extra)
{
        start(extra);
        test_connect_cast(daemon_, &producer, &consumer, &admin);
}

static void teardown(void)
{
        raw_close(&producer);
        raw_close(&consumer);
        raw_close(&admin);
        aquad_stop_in_teardown(daemon_);
        daemon_ = NULL;
}

TestSuite(aquad, .fini = teardown);

static Aqua__Envelope *status(void)
{
        Aqua__Envelope *r = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_STATUS);

        cr_assert_not_null(r);
        cr_assert_eq(r->body_case, BODY(ADMIN_REPLY));
        return r;
}

/* Poll the daemon's status until check() holds or timeout_ms pass; no fixed sleeps. */
static bool eventually(bool (*check)(const Aqua__StatusInfo *), uint64_t timeout_ms)
{
        uint64_t deadline = now_mono_ns() + timeout_ms * NSEC_PER_MSEC;

        for (;;) {
                Aqua__Envelope *r = status();
                bool ok = check(r->admin_reply->status);
                raw_free(r);
                if (ok)
                        return true;
                if (now_mono_ns() > deadline)
                        return false;
                sleep_ns(5 * NSEC_PER_MSEC);
        }
}

static uint64_t offer(struct raw *r, size_t n, int *fds, uint64_t *ids)
{
        Aqua__Envelope *o = raw_offer(r, n, 2 * MiB, fds);

        cr_assert_not_null(o);
        cr_assert_eq(o->body_case, BODY(OFFER_REPLY), "offer: error %d", raw_error_code(o));
        cr_assert_eq(o->offer_reply->n_chunk_ids, n);
        for (size_t i = 0; ids && i < n; i++)
                ids[i] = o->offer_reply->chunk_ids[i];
        raw_free(o);
        return n;
}

static Aqua__Envelope *reclaim(struct raw *r, uint64_t bytes, bool all)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__ReclaimRequest rq = AQUA__RECLAIM_REQUEST__INIT;

        rq.bytes = bytes;
        rq.all = all;
        e.body_case = BODY(RECLAIM_REQUEST);
        e.reclaim_request = &rq;
        return raw_call(r, &e);
}

static Aqua__Envelope *give_back(struct raw *r, uint64_t lease, uint64_t *ids, size_t n)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Return rt = AQUA__RETURN__INIT;

        rt.lease_id = lease;
        rt.chunk_ids = ids;
        rt.n_chunk_ids = n;
        e.body_case = BODY(RETURN);
        e.return_ = &rt;
        return raw_call(r, &e);
}

/* An admin request that must be acknowledged. */
static void admin_ack(Aqua__Envelope *e)
{
        Aqua__Envelope *r = raw_call(&admin, e);

        cr_assert_eq(r->body_case, BODY(ACK), "error %d", raw_error_code(r));
        raw_free(r);
}

Test(aquad, grants_chunks_of_the_paired_producer_with_their_descriptors)
{
        uint64_t ids[4];
        int fds[8];
        size_t n;
        Aqua__Envelope *g;

        cast(NULL);
        offer(&producer, 4, NULL, ids);
        g = raw_borrow(&consumer, 6 * MiB, 6 * MiB, false, fds, 8, &n);
        cr_assert_not_null(g);
        cr_assert_eq(g->body_case, BODY(GRANT), "error %d", raw_error_code(g));
        cr_assert_neq(g->grant->lease_id, 0);
        cr_assert_eq(g->grant->n_chunks, 3);
        cr_assert_eq(n, 3);
        cr_assert_not(g->grant->partial);
        for (size_t i = 0; i < n; i++) {
                char text[32];
                size_t k;
                for (k = 0; k < 4 && ids[k] != g->grant->chunks[i]->chunk_id; k++)
                        ;
                cr_assert_lt(k, 4);
                snprintf(text, sizeof(text), "chunk %zu", k);
                cr_assert(raw_memfd_has(fds[i], text), "the fd of chunk %zu is the offered one", k);
                cr_assert_str_eq(g->grant->chunks[i]->producer_uuid, "GPU-P");
                close(fds[i]);
        }
        raw_free(g);
}

Test(aquad, grants_dram_budget_when_no_producer_can_lend)
{
        Aqua__Envelope *g;
        size_t n;

        start("dram-budget: 64MiB\n");
        test_connect_as(daemon_, &consumer, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", NULL);
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        g = raw_borrow(&consumer, 100 * MiB, 16 * MiB, true, NULL, 0, &n);
        cr_assert_eq(g->body_case, BODY(GRANT));
        cr_assert_eq(g->grant->lease_id, 0);
        cr_assert_eq(g->grant->dram_bytes, 64 * MiB);
        cr_assert(g->grant->partial);
        raw_free(g);
        g = raw_borrow(&consumer, 100 * MiB, 16 * MiB, true, NULL, 0, &n);
        cr_assert_eq(raw_error_code(g), E(NO_MEMORY));
        cr_assert(strstr(g->error->message, "borrow"), "%s", g->error->message);
        raw_free(g);
}

Test(aquad, reclaim_frees_unleased_chunks_at_once_and_the_rest_when_returned)
{
        Aqua__Envelope *g, *rr, *notice, *ret, *done;
        uint64_t lease, pending;
        int fds[4];
        size_t n;

        cast(NULL);
        offer(&producer, 2, NULL, NULL);
        g = raw_borrow(&consumer, 2 * MiB, 2 * MiB, false, fds, 4, &n);
        lease = g->grant->lease_id;
        raw_free(g);

        rr = reclaim(&producer, 4 * MiB, false);
        cr_assert_eq(rr->body_case, BODY(RECLAIM_REPLY), "error %d", raw_error_code(rr));
        cr_assert_eq(rr->reclaim_reply->n_chunk_ids, 1, "the free chunk comes back at once");
        cr_assert_eq(rr->reclaim_reply->n_pending_chunk_ids, 1);
        cr_assert_gt(rr->reclaim_reply->deadline_ms, 0);
        pending = rr->reclaim_reply->pending_chunk_ids[0];
        raw_free(rr);

        notice = raw_wait(&consumer, 0, BODY(RECLAIM_NOTICE), RAW_TIMEOUT_MS);
        cr_assert_not_null(notice);
        cr_assert_eq(notice->reclaim_notice->lease_id, lease);
        cr_assert_eq(notice->reclaim_notice->chunk_ids[0], pending);
        cr_assert_str_eq(notice->reclaim_notice->reason, "producer load");
        raw_free(notice);

        close(fds[0]); /* "moved to DRAM and unmapped" */
        ret = give_back(&consumer, lease, &pending, 1);
        cr_assert_eq(ret->body_case, BODY(RETURN_REPLY), "error %d", raw_error_code(ret));
        cr_assert_eq(ret->return_reply->returned, 1);
        raw_free(ret);

        done = raw_wait(&producer, 0, BODY(RECLAIMED), RAW_TIMEOUT_MS);
        cr_assert_not_null(done);
        cr_assert_eq(done->reclaimed->n_chunk_ids, 1);
        cr_assert_eq(done->reclaimed->chunk_ids[0], pending);
        raw_free(done);
}

static bool one_deadline_missed(const Aqua__StatusInfo *s)
{
        return s->deadline_misses == 1;
}

Test(aquad, a_consumer_that_misses_the_deadline_is_barred_and_keeps_its_chunks)
{
        Aqua__Envelope *g, *rr, *q, *late;
        uint64_t lease;
        int fds[4];
        size_t n;

        cast("reclaim-deadline: 100ms\n");
        offer(&producer, 2, NULL, NULL);
        g = raw_borrow(&consumer, 2 * MiB, 2 * MiB, false, fds, 4, &n);
        lease = g->grant->lease_id;
        raw_free(g);
        rr = reclaim(&producer, 0, true);
        raw_free(rr);

        cr_assert(eventually(one_deadline_missed, 10000));
        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_GPUS);
        for (size_t i = 0; i < q->admin_reply->n_gpus; i++)
                if (strcmp(q->admin_reply->gpus[i]->uuid, "GPU-C") == 0)
                        cr_assert(q->admin_reply->gpus[i]->barred);
        raw_free(q);
        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_EVENTS);
        bool reported = false;
        for (size_t i = 0; i < q->admin_reply->n_events; i++)
                reported |= strcmp(q->admin_reply->events[i]->kind, "deadline-miss") == 0;
        cr_assert(reported);
        raw_free(q);

        offer(&producer, 1, NULL, NULL);
        g = raw_borrow(&consumer, 2 * MiB, 2 * MiB, false, NULL, 0, &n);
        cr_assert_eq(raw_error_code(g), E(BARRED));
        raw_free(g);
        /* The producer has not been told the chunk is free: the consumer still maps it. */
        late = raw_wait(&producer, 0, BODY(RECLAIMED), 0);
        cr_assert_null(late);

        close(fds[0]);
        raw_free(give_back(&consumer, lease, NULL, 0));
        late = raw_wait(&producer, 0, BODY(RECLAIMED), RAW_TIMEOUT_MS);
        cr_assert_not_null(late);
        raw_free(late);
}

static bool nothing_lent(const Aqua__StatusInfo *s)
{
        return s->lent_bytes == 0 && s->leases == 0;
}

/* A consumer in a child process: registers, borrows, says so on the pipe, then waits to die. */
static pid_t spawn_consumer(int *ready)
{
        int p[2];
        pid_t pid;

        cr_assert_eq(pipe(p), 0);
        pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
                struct raw me;
                Aqua__Envelope *w, *g;
                int fds[8];
                size_t n;
                char ok = 0;

                close(p[0]);
                if (raw_connect(&me, aquad_endpoint(daemon_), aquad_side_path(daemon_)) == 0 &&
                    (w = raw_hello(&me, AQUA__ROLE__ROLE_CONSUMER, "GPU-K", "GPU-P", NULL, 0,
                                   NULL)) &&
                    w->body_case == BODY(WELCOME) &&
                    (g = raw_borrow(&me, 4 * MiB, 4 * MiB, false, fds, 8, &n)) &&
                    g->body_case == BODY(GRANT) && n == 2)
                        ok = 1;
                (void)!write(p[1], &ok, 1);
                pause();
                _exit(0);
        }
        close(p[1]);
        *ready = p[0];
        return pid;
}

/*
 * EOF on the side channel tells aquad at once; the bound below is generous on purpose (shared,
 * noisy machines): how fast it really is shows in the log line, not in a timed assertion.
 */
Test(aquad, a_killed_consumer_returns_its_chunks_to_the_pool)
{
        Aqua__Envelope *s;
        uint64_t killed;
        int ready, wstatus;
        char ok = 0;
        pid_t pid;

        start(NULL);
        test_connect_as(daemon_, &producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-K");
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        offer(&producer, 2, NULL, NULL);
        pid = spawn_consumer(&ready);
        cr_assert_eq(read(ready, &ok, 1), 1);
        close(ready);
        cr_assert_eq(ok, 1, "the child consumer got its lease");
        s = status();
        cr_assert_eq(s->admin_reply->status->lent_bytes, 4 * MiB);
        raw_free(s);

        kill(pid, SIGKILL);
        killed = now_mono_ns();
        waitpid(pid, &wstatus, 0);
        cr_assert(eventually(nothing_lent, 10000), "chunks back in the pool");
        cr_log_info("chunks back in the pool %.1f ms after SIGKILL",
                    (double)(now_mono_ns() - killed) / 1e6);
        s = status();
        cr_assert_eq(s->admin_reply->status->pool_bytes, 4 * MiB, "both chunks are in the pool");
        raw_free(s);
}

/* A producer in a child process: registers, offers three chunks, says so, waits to die. */
static pid_t spawn_producer(int *ready)
{
        int p[2];
        pid_t pid;

        cr_assert_eq(pipe(p), 0);
        pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
                struct raw me;
                Aqua__Envelope *w, *o;
                char ok = 0;

                close(p[0]);
                if (raw_connect(&me, aquad_endpoint(daemon_), aquad_side_path(daemon_)) == 0 &&
                    (w = raw_hello(&me, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C", NULL, 0,
                                   NULL)) &&
                    w->body_case == BODY(WELCOME) && (o = raw_offer(&me, 3, 2 * MiB, NULL)) &&
                    o->body_case == BODY(OFFER_REPLY))
                        ok = 1;
                (void)!write(p[1], &ok, 1);
                pause();
                _exit(0);
        }
        close(p[1]);
        *ready = p[0];
        return pid;
}

Test(aquad, a_killed_producer_leaves_leased_memory_alive_and_tells_the_consumer)
{
        Aqua__Envelope *g, *notice, *ret, *q;
        int fds[4], ready, wstatus;
        char ok = 0;
        size_t n;
        pid_t pid;

        start(NULL);
        test_connect_as(daemon_, &consumer, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", "GPU-P");
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        pid = spawn_producer(&ready);
        cr_assert_eq(read(ready, &ok, 1), 1);
        close(ready);
        cr_assert_eq(ok, 1, "the child producer offered its chunks");
        g = raw_borrow(&consumer, 4 * MiB, 4 * MiB, false, fds, 4, &n);
        cr_assert_eq(g->body_case, BODY(GRANT), "error %d", raw_error_code(g));
        cr_assert_eq(n, 2);

        kill(pid, SIGKILL);
        waitpid(pid, &wstatus, 0);
        notice = raw_wait(&consumer, 0, BODY(RECLAIM_NOTICE), RAW_TIMEOUT_MS);
        cr_assert_not_null(notice);
        cr_assert_str_eq(notice->reclaim_notice->reason, "producer gone");
        cr_assert_eq(notice->reclaim_notice->lease_id, g->grant->lease_id);
        cr_assert_eq(notice->reclaim_notice->n_chunk_ids, 2);
        cr_assert_eq(notice->reclaim_notice->deadline_ms, 0, "at the consumer's own pace");
        raw_free(notice);
        /* The data is still there through the consumer's handles, its producer dead. */
        for (size_t i = 0; i < n; i++)
                cr_assert(raw_memfd_has(fds[i], "chunk 0") || raw_memfd_has(fds[i], "chunk 1") ||
                          raw_memfd_has(fds[i], "chunk 2"));

        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_CHUNKS);
        cr_assert_eq(q->admin_reply->n_chunks, 2, "the unleased chunk was dropped");
        raw_free(q);
        side_close_fds(fds, n);
        ret = give_back(&consumer, g->grant->lease_id, NULL, 0);
        cr_assert_eq(ret->body_case, BODY(RETURN_REPLY));
        raw_free(ret);
        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_CHUNKS);
        cr_assert_eq(q->admin_reply->n_chunks, 0);
        raw_free(q);
        raw_free(g);
}

Test(aquad, a_killed_aquad_restarts_with_leases_reconciled_none_lost_or_duplicated)
{
        Aqua__HeldChunk held[3], *heldp[3];
        Aqua__Envelope *g, *w, *q;
        uint64_t ids[3], lease;
        int pfds[3], cfds[4];
        size_t n;

        cast(NULL);
        offer(&producer, 3, pfds, ids);
        g = raw_borrow(&consumer, 4 * MiB, 4 * MiB, false, cfds, 4, &n);
        lease = g->grant->lease_id;
        cr_assert_eq(n, 2);

        cr_assert_eq(aquad_kill(daemon_, SIGKILL), 128 + SIGKILL);
        raw_close(&producer);
        raw_close(&consumer);
        raw_close(&admin);
        cr_assert_eq(aquad_restart(daemon_), 0);

        /* The consumer re-registers what it maps, and one lease the daemon never granted. */
        cr_assert_eq(raw_connect(&consumer, aquad_endpoint(daemon_), aquad_side_path(daemon_)), 0);
        for (size_t i = 0; i < 3; i++) {
                aqua__held_chunk__init(&held[i]);
                heldp[i] = &held[i];
        }
        for (size_t i = 0; i < 2; i++) {
                held[i].chunk_id = g->grant->chunks[i]->chunk_id;
                held[i].size = 2 * MiB;
                held[i].lease_id = lease;
        }
        held[2].chunk_id = 9999;
        held[2].size = 2 * MiB;
        held[2].lease_id = 777;
        w = raw_hello(&consumer, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", "GPU-P", heldp, 3, NULL);
        cr_assert_eq(w->body_case, BODY(WELCOME), "error %d", raw_error_code(w));
        cr_assert_eq(w->welcome->n_lost_leases, 1);
        cr_assert_eq(w->welcome->lost_leases[0], 777);
        raw_free(w);

        /* The producer re-registers all three chunks with their handles. */
        cr_assert_eq(raw_connect(&producer, aquad_endpoint(daemon_), aquad_side_path(daemon_)), 0);
        for (size_t i = 0; i < 3; i++) {
                held[i].chunk_id = ids[i];
                held[i].size = 2 * MiB;
                held[i].lease_id = 0;
                for (size_t k = 0; k < 2; k++)
                        if (g->grant->chunks[k]->chunk_id == ids[i])
                                held[i].lease_id = lease;
        }
        w = raw_hello(&producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C", heldp, 3, pfds);
        cr_assert_eq(w->body_case, BODY(WELCOME), "error %d", raw_error_code(w));
        cr_assert_eq(w->welcome->n_lost_leases, 0);
        raw_free(w);

        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_LEASES);
        cr_assert_eq(q->admin_reply->n_leases, 1, "one lease, not lost, not duplicated");
        cr_assert_eq(q->admin_reply->leases[0]->lease_id, lease);
        cr_assert_eq(q->admin_reply->leases[0]->chunks, 2);
        raw_free(q);
        raw_free(g);

        /* The third chunk is grantable again through the handle the producer re-sent. */
        g = raw_borrow(&consumer, 2 * MiB, 2 * MiB, false, cfds + 2, 2, &n);
        cr_assert_eq(g->body_case, BODY(GRANT), "error %d", raw_error_code(g));
        cr_assert_gt(g->grant->lease_id, lease, "lease ids are not reused");
        cr_assert_eq(n, 1);
        cr_assert(raw_memfd_has(cfds[2], "chunk 0") || raw_memfd_has(cfds[2], "chunk 1") ||
                  raw_memfd_has(cfds[2], "chunk 2"));
        raw_free(g);
        side_close_fds(pfds, 3);
        side_close_fds(cfds, 3);
}

Test(aquad, refuses_a_uid_and_gid_not_in_the_allow_list)
{
        struct raw r;

        start("allow: {users: [65534], groups: [65534]}\nadmin: {users: [65534]}\n");
        cr_assert_eq(raw_connect(&r, aquad_endpoint(daemon_), aquad_side_path(daemon_)), 1);
        cr_assert(strstr(r.reject, "not in the allowed users or groups"), "%s", r.reject);
        raw_close(&r);
}

Test(aquad, answers_malformed_and_oversized_messages_while_others_carry_on)
{
        static char big[(64 << 10) + 1];
        const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
        Aqua__Envelope *r, *g;
        struct raw bad;
        size_t n;
        int fds[4];

        cast("limits: {message-size: 64KiB}\n");
        offer(&producer, 2, NULL, NULL);
        cr_assert_eq(raw_connect(&bad, aquad_endpoint(daemon_), aquad_side_path(daemon_)), 0);

        r = raw_call_bytes(&bad, junk, sizeof(junk), 0);
        cr_assert_eq(raw_error_code(r), E(MALFORMED));
        cr_assert(strstr(r->error->message, "Envelope"), "%s", r->error->message);
        raw_free(r);

        memset(big, 'x', sizeof(big));
        r = raw_call_bytes(&bad, big, sizeof(big), 0);
        cr_assert_eq(raw_error_code(r), E(TOO_LARGE));
        cr_assert(strstr(r->error->message, "limit"), "%s", r->error->message);
        raw_free(r);

        /* The consumer is served in between. */
        g = raw_borrow(&consumer, 2 * MiB, 2 * MiB, false, fds, 4, &n);
        cr_assert_eq(g->body_case, BODY(GRANT));
        raw_free(g);
        close(fds[0]);

        r = raw_borrow(&bad, 2 * MiB, 0, false, NULL, 0, &n);
        cr_assert_eq(raw_error_code(r), E(NOT_REGISTERED));
        raw_free(r);

        bad.no_secret = true; /* it knows the uuid, not the secret */
        r = raw_hello(&bad, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", NULL, NULL, 0, NULL);
        cr_assert_eq(raw_error_code(r), E(BUSY), "GPU-C is taken");
        raw_free(r);

        r = raw_offer(&consumer, 1, 2 * MiB, NULL);
        cr_assert_eq(raw_error_code(r), E(WRONG_ROLE));
        raw_free(r);

        r = raw_borrow(&consumer, 4 * MiB, 8 * MiB, false, NULL, 0, &n);
        cr_assert_eq(raw_error_code(r), E(INVALID));
        cr_assert(strstr(r->error->message, "min_bytes"), "%s", r->error->message);
        raw_free(r);
        raw_close(&bad);
}

Test(aquad, answers_an_offer_whose_descriptors_do_not_match)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *r;
        Aqua__Offer o = AQUA__OFFER__INIT;
        Aqua__ChunkOffer co = AQUA__CHUNK_OFFER__INIT, *cop[] = {&co};
        Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
        int fds[2] = {raw_memfd(2 * MiB, "a"), raw_memfd(2 * MiB, "b")};

        cast(NULL);
        co.size = 2 * MiB;
        o.chunks = cop;
        o.n_chunks = 1;
        e.body_case = BODY(OFFER);
        e.offer = &o;
        e.request_id = 4242;
        cr_assert_eq(raw_send(&producer, &e), 0);
        f.kind = AQUA__SIDE_FRAME__KIND__KIND_OFFER_FDS;
        f.request_id = 4242;
        cr_assert_eq(side_send(producer.side, &f, fds, 2), 0);
        r = raw_wait(&producer, 4242, 0, RAW_TIMEOUT_MS);
        cr_assert_eq(raw_error_code(r), E(SIDE_CHANNEL));
        cr_assert(strstr(r->error->message, "2 descriptors for 1 chunks"), "%s", r->error->message);
        raw_free(r);
        side_close_fds(fds, 2);
}

Test(aquad, throttles_requests_beyond_the_pending_limit)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *r;
        Aqua__Offer o = AQUA__OFFER__INIT;
        Aqua__ChunkOffer co = AQUA__CHUNK_OFFER__INIT, *cop[] = {&co};

        cast("limits: {pending-requests: 2}\nrequest-timeout: 60s\n");
        co.size = 2 * MiB;
        o.chunks = cop;
        o.n_chunks = 1;
        e.body_case = BODY(OFFER);
        e.offer = &o;
        /* Offers whose descriptors never come wait; the third is refused. */
        for (uint64_t id = 1; id <= 3; id++) {
                e.request_id = 100 + id;
                cr_assert_eq(raw_send(&producer, &e), 0);
        }
        r = raw_wait(&producer, 103, 0, RAW_TIMEOUT_MS);
        cr_assert_eq(raw_error_code(r), E(THROTTLED));
        raw_free(r);
}

Test(aquad, answers_admin_queries_and_refuses_changes_to_non_admins)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *r, *g;
        Aqua__AdminDrain d = AQUA__ADMIN_DRAIN__INIT;
        int fds[4];
        size_t n;

        cast("admin: {users: [65534]}\nallow: {users: [root]}\n");
        offer(&producer, 3, NULL, NULL);
        g = raw_borrow(&consumer, 2 * MiB, 2 * MiB, false, fds, 4, &n);
        close(fds[0]);

        r = status();
        cr_assert_eq(r->admin_reply->status->clients, 3);
        cr_assert_eq(r->admin_reply->status->gpus, 2);
        cr_assert_eq(r->admin_reply->status->pairs, 1);
        cr_assert_eq(r->admin_reply->status->leases, 1);
        cr_assert_eq(r->admin_reply->status->pool_bytes, 6 * MiB);
        cr_assert_eq(r->admin_reply->status->lent_bytes, 2 * MiB);
        raw_free(r);
        r = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_PAIRS);
        cr_assert_eq(r->admin_reply->n_pairs, 1);
        cr_assert_str_eq(r->admin_reply->pairs[0]->producer_uuid, "GPU-P");
        cr_assert_str_eq(r->admin_reply->pairs[0]->consumer_uuid, "GPU-C");
        cr_assert_str_eq(r->admin_reply->pairs[0]->source, "auto");
        raw_free(r);
        r = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_LEASES);
        cr_assert_eq(r->admin_reply->n_leases, 1);
        cr_assert_eq(r->admin_reply->leases[0]->lease_id, g->grant->lease_id);
        cr_assert_str_eq(r->admin_reply->leases[0]->state, "granted");
        raw_free(r);
        r = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_CHUNKS);
        cr_assert_eq(r->admin_reply->n_chunks, 3);
        cr_assert_not(r->admin_reply->truncated);
        raw_free(r);
        r = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_GPUS);
        cr_assert_eq(r->admin_reply->n_gpus, 2);
        raw_free(r);
        r = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_EVENTS);
        cr_assert_geq(r->admin_reply->n_events, 3);
        raw_free(r);

        d.gpu = (char *)"GPU-P";
        e.body_case = BODY(ADMIN_DRAIN);
        e.admin_drain = &d;
        r = raw_call(&admin, &e);
        cr_assert_eq(raw_error_code(r), E(PERMISSION));
        cr_assert(strstr(r->error->message, "admin allow list"), "%s", r->error->message);
        raw_free(r);
        raw_free(g);
}

Test(aquad, drains_pairs_and_unpairs_for_an_admin)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *g, *notice;
        Aqua__AdminDrain d = AQUA__ADMIN_DRAIN__INIT;
        Aqua__AdminUnpair u = AQUA__ADMIN_UNPAIR__INIT;
        Aqua__AdminPair p = AQUA__ADMIN_PAIR__INIT;
        int fds[4];
        size_t n;

        cast(NULL);
        notice = raw_wait(&consumer, 0, BODY(PAIR_CHANGED), RAW_TIMEOUT_MS);
        cr_assert_str_eq(notice->pair_changed->paired_with, "GPU-P", "paired automatically");
        raw_free(notice);
        offer(&producer, 2, NULL, NULL);
        g = raw_borrow(&consumer, 2 * MiB, 2 * MiB, false, fds, 4, &n);
        close(fds[0]);

        u.gpu = (char *)"GPU-C";
        e.body_case = BODY(ADMIN_UNPAIR);
        e.admin_unpair = &u;
        admin_ack(&e);
        notice = raw_wait(&consumer, 0, BODY(PAIR_CHANGED), RAW_TIMEOUT_MS);
        cr_assert_str_eq(notice->pair_changed->paired_with, "");
        raw_free(notice);

        p.producer = (char *)"GPU-P";
        p.consumer = (char *)"GPU-C";
        e.body_case = BODY(ADMIN_PAIR);
        e.admin_pair = &p;
        admin_ack(&e);
        notice = raw_wait(&consumer, 0, BODY(PAIR_CHANGED), RAW_TIMEOUT_MS);
        cr_assert_str_eq(notice->pair_changed->paired_with, "GPU-P");
        raw_free(notice);

        d.gpu = (char *)"GPU-P";
        e.body_case = BODY(ADMIN_DRAIN);
        e.admin_drain = &d;
        admin_ack(&e);
        notice = raw_wait(&consumer, 0, BODY(RECLAIM_NOTICE), RAW_TIMEOUT_MS);
        cr_assert_str_eq(notice->reclaim_notice->reason, "drain");
        raw_free(notice);
        notice = raw_wait(&producer, 0, BODY(RECLAIMED), RAW_TIMEOUT_MS);
        cr_assert_eq(notice->reclaimed->n_chunk_ids, 1, "the free chunk at once");
        raw_free(notice);
        raw_free(g);
}

Test(aquad, tells_clients_when_it_stops)
{
        Aqua__Envelope *s;

        cast(NULL);
        cr_assert_eq(aquad_kill(daemon_, SIGTERM), 0);
        s = raw_wait(&consumer, 0, BODY(STOPPING), RAW_TIMEOUT_MS);
        cr_assert_not_null(s);
        cr_assert_str_eq(s->stopping->reason, "SIGTERM");
        raw_free(s);
}

/* How many lines of aquad's log contain text. */
static size_t log_lines_with(const char *text)
{
        FILE *f = fopen(aquad_log_path(daemon_), "re");
        char line[1024];
        size_t n = 0;

        cr_assert_not_null(f, "no log at %s", aquad_log_path(daemon_));
        while (fgets(line, sizeof(line), f))
                n += strstr(line, text) != NULL;
        fclose(f);
        return n;
}

Test(aquad, logs_a_flood_of_malformed_side_frames_a_few_times_and_serves_the_client_on)
{
        static const char garbage[] = "\xff\xff\xff\xff not a side frame";
        int fds[2];

        cr_assert_eq(aquad_start_logged(NULL, &daemon_), 0, "aquad did not start");
        test_connect_as(daemon_, &producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C");
        for (int i = 0; i < 2000; i++)
                cr_assert_eq(send(producer.side, garbage, sizeof(garbage), 0),
                             (ssize_t)sizeof(garbage), "frame %d: %m", i);
        /* The offer's descriptors follow the garbage on the side channel: once it is answered,
         * aquad has read every frame before them. */
        offer(&producer, 2, fds, NULL);
        close(fds[0]);
        close(fds[1]);
        cr_assert_eq(log_lines_with("malformed side frame"), 1,
                     "the first one, and no summary yet");
        /* The rest are summed up when the client goes. */
        raw_close(&producer);
        for (int i = 0; i < 500 && log_lines_with("1999 more malformed side frames") == 0; i++)
                sleep_ns(10 * NSEC_PER_MSEC);
        cr_assert_eq(log_lines_with("1999 more malformed side frames (2000 in all)"), 1);
        cr_assert_eq(log_lines_with("malformed side frame"), 2);
}

/* One command to an aqua-agent (tests/aqua-agent.c) and its answer, which must start "ok". */
static const char *agent_do(FILE *in, FILE *out, char *line, size_t len, const char *cmd)
{
        fprintf(in, "%s\n", cmd);
        fflush(in);
        cr_assert_not_null(fgets(line, (int)len, out), "the agent died at '%s'", cmd);
        line[strcspn(line, "\n")] = 0;
        cr_assert_eq(strncmp(line, "ok", 2), 0, "%s: %s", cmd, line);
        return line;
}

static void sim_cleanup(void)
{
        test_sim_remove(getenv("AQUA_SIM_MACHINE"));
}

/*
 * A producer whose descriptors are no GPU memory (a pipe, /dev/null): a libaqua consumer cannot
 * import them. They must leave the pool rather than be granted to it again and again.
 */
Test(aquad, chunks_a_consumer_cannot_import_leave_the_pool_and_the_borrow_gets_dram,
     .fini = sim_cleanup)
{
        char machine[64], line[512], *uuid;
        Aqua__Envelope *o, *q, *n;
        uint64_t ids[3];
        int pipefd[2], bad[3];
        FILE *in, *out;
        pid_t pid;

        snprintf(machine, sizeof(machine), "aquad-import-%d", (int)getpid());
        setenv("AQUA_SIM_MACHINE", machine, 1);
        setenv("AQUA_SIM_DEVICES", "2x1GiB", 1);
        unsetenv("AQUA_SIM_TOPOLOGY");
        unsetenv("AQUA_SIM_RUNTIME_DIR");
        start("dram-budget: 64MiB\n");
        setenv("AQUA_ENDPOINT", aquad_endpoint(daemon_), 1);
        setenv("AQUA_SIDE_PATH", aquad_side_path(daemon_), 1);
        test_agent_spawn(&pid, &in, &out);
        agent_do(in, out, line, sizeof(line), "open consumer 0");

        /* The raw producer pairs with the consumer's simulated GPU through a link to it. */
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_GPUS);
        cr_assert_eq(q->admin_reply->n_gpus, 1);
        uuid = strdup(q->admin_reply->gpus[0]->uuid);
        raw_free(q);
        test_connect_as(daemon_, &producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", uuid);
        free(uuid);
        cr_assert_eq(pipe2(pipefd, O_CLOEXEC), 0);
        bad[0] = pipefd[0];
        bad[1] = open("/dev/null", O_RDWR | O_CLOEXEC);
        bad[2] = pipefd[1];
        o = raw_offer_fds(&producer, bad, 3, 2 * MiB);
        cr_assert_eq(o->body_case, BODY(OFFER_REPLY), "offer: error %d", raw_error_code(o));
        memcpy(ids, o->offer_reply->chunk_ids, sizeof(ids));
        raw_free(o);
        for (size_t i = 0; i < 3; i++)
                close(bad[i]);

        /* The three chunks are granted once, found unusable, and DRAM makes up for them. */
        agent_do(in, out, line, sizeof(line), "borrow 6291456 2097152 dram");
        cr_assert_str_eq(line, "ok 0 0 6291456", "%s", line);
        n = raw_wait(&producer, 0, BODY(RECLAIMED), RAW_TIMEOUT_MS);
        cr_assert_not_null(n, "the producer was not told its chunks left the pool");
        cr_assert_eq(n->reclaimed->n_chunk_ids, 3);
        for (size_t i = 0; i < 3; i++)
                cr_assert(n->reclaimed->chunk_ids[i] == ids[0] ||
                          n->reclaimed->chunk_ids[i] == ids[1] ||
                          n->reclaimed->chunk_ids[i] == ids[2]);
        raw_free(n);
        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_CHUNKS);
        cr_assert_eq(q->admin_reply->n_chunks, 0, "unusable chunks are still in the pool");
        raw_free(q);
        /* And the next borrow is not offered them again. */
        agent_do(in, out, line, sizeof(line), "borrow 2097152 2097152 dram");
        cr_assert_str_eq(line, "ok 1 0 2097152", "%s", line);
        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_EVENTS);
        bool seen = false;
        for (size_t i = 0; i < q->admin_reply->n_events; i++)
                seen |= strstr(q->admin_reply->events[i]->text, "could not import") != NULL;
        cr_assert(seen, "no event names the unusable chunks");
        raw_free(q);
        test_agent_kill(&pid, in, out);
}

/* Registers uuid with this role from host, reporting no peer link (its driver sees no other). */
static void connect_on_host(struct raw *r, const char *host, Aqua__Role role, const char *uuid)
{
        Aqua__Envelope *w;

        cr_assert_eq(raw_connect(r, aquad_endpoint(daemon_), aquad_side_path(daemon_)), 0);
        r->host = host;
        w = raw_hello(r, role, uuid, NULL, NULL, 0, NULL);
        cr_assert_not_null(w);
        cr_assert_eq(w->body_case, BODY(WELCOME), "hello answered with error %d",
                     raw_error_code(w));
        raw_free(w);
}

/* Two hosts of one NVLink domain: only the topology file, which names both, links them. */
Test(aquad, pairs_gpus_of_two_hosts_over_a_link_of_the_topology_file)
{
        static const char topo[] = "devices:\n"
                                   "  - {host: node-a, uuid: GPU-P, memory: 80GiB}\n"
                                   "  - {host: node-b, uuid: GPU-C, memory: 80GiB}\n"
                                   "links: [{a: 0, b: 1, bandwidth: 900GB}]\n";
        char path[] = "/tmp/aqua-domain-XXXXXX", config[128];
        Aqua__Envelope *r;
        int fd = mkstemp(path);

        cr_assert_geq(fd, 0);
        cr_assert_eq(write(fd, topo, sizeof(topo) - 1), (ssize_t)sizeof(topo) - 1);
        close(fd);
        snprintf(config, sizeof(config), "topology: %s\n", path);
        start(config);
        connect_on_host(&producer, "node-a", AQUA__ROLE__ROLE_PRODUCER, "GPU-P");
        connect_on_host(&consumer, "node-b", AQUA__ROLE__ROLE_CONSUMER, "GPU-C");
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        r = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_PAIRS);
        unlink(path);
        cr_assert_eq(r->admin_reply->n_pairs, 1);
        cr_assert_str_eq(r->admin_reply->pairs[0]->producer_uuid, "GPU-P");
        cr_assert_str_eq(r->admin_reply->pairs[0]->consumer_uuid, "GPU-C");
        cr_assert_str_eq(r->admin_reply->pairs[0]->source, "auto");
        cr_assert_float_eq(r->admin_reply->pairs[0]->bandwidth_gbps, 900.0, 1e-9);
        raw_free(r);
}
