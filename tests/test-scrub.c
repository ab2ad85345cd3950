/*
 * Scrubbing through a real aquad: chunks a consumer mapped reach another consumer only after
 * their producer has zeroed and verified them (ScrubRequest / ScrubDone); the consumer that left
 * the data gets it back without a scrub; dirty survives a restart; producers clean only what they
 * were asked to. The raw producer "scrubs" its memfds the way libaqua zeroes and reads back GPU
 * memory.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
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
static struct raw producer, consumer, other, admin;

static void teardown(void)
{
        raw_close(&producer);
        raw_close(&consumer);
        raw_close(&other);
        raw_close(&admin);
        aquad_stop_in_teardown(daemon_);
        daemon_ = NULL;
}

TestSuite(scrub, .fini = teardown);

/* Offer n chunks, keeping their memfds in fds and their ids in ids. */
static void offer(size_t n, int *fds, uint64_t *ids)
{
        Aqua__Envelope *o = raw_offer(&producer, n, 2 * MiB, fds);

        cr_assert_eq(o->body_case, BODY(OFFER_REPLY), "offer: error %d", raw_error_code(o));
        for (size_t i = 0; i < n; i++)
                ids[i] = o->offer_reply->chunk_ids[i];
        raw_free(o);
}

static Aqua__Envelope *give_back(struct raw *r, uint64_t lease)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Return rt = AQUA__RETURN__INIT;

        rt.lease_id = lease;
        e.body_case = BODY(RETURN);
        e.return_ = &rt;
        return raw_call(r, &e);
}

/* Borrow bytes; the grant's lease id, and each chunk's fd written with "secret of <who>". */
static uint64_t borrow_and_write(struct raw *r, uint64_t bytes, const char *who, uint64_t *ids)
{
        Aqua__Envelope *g;
        char text[48];
        int fds[8];
        size_t n;
        uint64_t lease;

        g = raw_borrow(r, bytes, bytes, false, fds, 8, &n);
        cr_assert_eq(g->body_case, BODY(GRANT), "borrow: error %d", raw_error_code(g));
        snprintf(text, sizeof(text), "secret of %s", who);
        for (size_t i = 0; i < n; i++) {
                cr_assert_eq(pwrite(fds[i], text, strlen(text) + 1, 0), (ssize_t)strlen(text) + 1);
                if (ids)
                        ids[i] = g->grant->chunks[i]->chunk_id;
        }
        side_close_fds(fds, n);
        lease = g->grant->lease_id;
        raw_free(g);
        return lease;
}

/* What the producer's library does with a ScrubRequest: zero, read back, report. */
static Aqua__Envelope *scrub(int *fds, const uint64_t *ids, size_t n_ids, Aqua__ScrubRequest *rq,
                             bool fail)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__ScrubDone d = AQUA__SCRUB_DONE__INIT;
        uint64_t done[16], failed[16];
        static char zero[64], buf[64];

        for (size_t i = 0; i < rq->n_chunk_ids; i++) {
                size_t k;
                for (k = 0; k < n_ids && ids[k] != rq->chunk_ids[i]; k++)
                        ;
                cr_assert_lt(k, n_ids, "asked to scrub chunk %lu it never offered",
                             (unsigned long)rq->chunk_ids[i]);
                cr_assert_eq(pwrite(fds[k], zero, sizeof(zero), 0), (ssize_t)sizeof(zero));
                cr_assert_eq(pread(fds[k], buf, sizeof(buf), 0), (ssize_t)sizeof(buf));
                if (fail || memcmp(buf, zero, sizeof(zero)) != 0)
                        failed[d.n_failed_chunk_ids++] = rq->chunk_ids[i];
                else
                        done[d.n_chunk_ids++] = rq->chunk_ids[i];
        }
        d.chunk_ids = done;
        d.failed_chunk_ids = failed;
        e.body_case = BODY(SCRUB_DONE);
        e.scrub_done = &d;
        return raw_call(&producer, &e);
}

static size_t count_state(const char *state)
{
        Aqua__Envelope *q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_CHUNKS);
        size_t n = 0;

        for (size_t i = 0; i < q->admin_reply->n_chunks; i++)
                n += strcmp(q->admin_reply->chunks[i]->state, state) == 0;
        raw_free(q);
        return n;
}

Test(scrub, the_same_consumer_gets_its_chunks_back_without_a_scrub)
{
        uint64_t ids[2], first[2], again[2], lease;
        int fds[2];
        Aqua__Envelope *r;

        cr_assert_eq(aquad_start(NULL, &daemon_), 0);
        test_connect_as(daemon_, &producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C");
        test_connect_as(daemon_, &consumer, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", "GPU-P");
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        offer(2, fds, ids);
        lease = borrow_and_write(&consumer, 4 * MiB, "C", first);
        raw_free(give_back(&consumer, lease));
        cr_assert_eq(count_state("dirty"), 2, "returned chunks are dirty");
        lease = borrow_and_write(&consumer, 4 * MiB, "C", again);
        cr_assert((again[0] == first[0] && again[1] == first[1]) ||
                  (again[0] == first[1] && again[1] == first[0]));
        r = raw_wait(&producer, 0, BODY(SCRUB_REQUEST), 0);
        cr_assert_null(r, "no scrub was asked for");
        raw_free(give_back(&consumer, lease));
        side_close_fds(fds, 2);
}

/* A consumer in a child process: borrows everything, writes into it, and waits to be killed. */
static pid_t spawn_consumer(void)
{
        int p[2];
        pid_t pid;
        char ok = 0;

        cr_assert_eq(pipe(p), 0);
        pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
                struct raw me;
                Aqua__Envelope *w;

                close(p[0]);
                if (raw_connect(&me, aquad_endpoint(daemon_), aquad_side_path(daemon_)) == 0 &&
                    (w = raw_hello(&me, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", "GPU-P", NULL, 0,
                                   NULL)) &&
                    w->body_case == BODY(WELCOME)) {
                        borrow_and_write(&me, 4 * MiB, "the dead", NULL);
                        ok = 1;
                }
                (void)!write(p[1], &ok, 1);
                pause();
                _exit(0);
        }
        close(p[1]);
        cr_assert_eq(read(p[0], &ok, 1), 1);
        close(p[0]);
        cr_assert_eq(ok, 1, "the child consumer borrowed and wrote");
        return pid;
}

Test(scrub, what_a_dead_consumer_left_is_scrubbed_before_the_next_one_gets_it)
{
        Aqua__Envelope *rq, *r, *g;
        uint64_t ids[2];
        int fds[2], got[2], status;
        size_t n;
        pid_t pid;

        cr_assert_eq(aquad_start(NULL, &daemon_), 0);
        test_connect_as(daemon_, &producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C");
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        offer(2, fds, ids);
        pid = spawn_consumer();
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);

        rq = raw_wait(&producer, 0, BODY(SCRUB_REQUEST), RAW_TIMEOUT_MS);
        cr_assert_not_null(rq, "the producer is asked to scrub");
        cr_assert_eq(rq->scrub_request->n_chunk_ids, 2);
        cr_assert(raw_memfd_has(fds[0], "secret of the dead") ||
                  raw_memfd_has(fds[1], "secret of the dead"));
        cr_assert_eq(count_state("scrubbing"), 2);

        /* The same GPU, another client: nothing until the scrub is done. */
        test_connect_as(daemon_, &consumer, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", "GPU-P");
        g = raw_borrow(&consumer, 2 * MiB, 2 * MiB, false, got, 2, &n);
        cr_assert_eq(raw_error_code(g), E(NO_MEMORY), "dirty chunks are granted to nobody");
        raw_free(g);

        r = scrub(fds, ids, 2, rq->scrub_request, false);
        cr_assert_eq(r->body_case, BODY(ACK), "error %d", raw_error_code(r));
        raw_free(r);
        raw_free(rq);
        cr_assert_eq(count_state("free"), 2);
        g = raw_borrow(&consumer, 4 * MiB, 4 * MiB, false, got, 2, &n);
        cr_assert_eq(g->body_case, BODY(GRANT), "error %d", raw_error_code(g));
        cr_assert_eq(n, 2);
        for (size_t i = 0; i < n; i++)
                cr_assert_not(raw_memfd_has(got[i], "secret of the dead"),
                              "the new one sees zeros");
        side_close_fds(got, n);
        raw_free(give_back(&consumer, g->grant->lease_id));
        raw_free(g);
        side_close_fds(fds, 2);
}

Test(scrub, a_pair_change_scrubs_what_the_old_consumer_left)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *r, *rq, *g;
        Aqua__AdminPair pair = AQUA__ADMIN_PAIR__INIT;
        uint64_t ids[2], lease;
        int fds[2], got[2];
        size_t n;

        cr_assert_eq(aquad_start(NULL, &daemon_), 0);
        test_connect_as(daemon_, &producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C");
        test_connect_as(daemon_, &consumer, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", "GPU-P");
        test_connect_as(daemon_, &other, AQUA__ROLE__ROLE_CONSUMER, "GPU-D", NULL);
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        offer(2, fds, ids);
        lease = borrow_and_write(&consumer, 4 * MiB, "C", NULL);
        raw_free(give_back(&consumer, lease));
        cr_assert_null(raw_wait(&producer, 0, BODY(SCRUB_REQUEST), 0));

        pair.producer = (char *)"GPU-P";
        pair.consumer = (char *)"GPU-D";
        e.body_case = BODY(ADMIN_PAIR);
        e.admin_pair = &pair;
        r = raw_call(&admin, &e);
        cr_assert_eq(r->body_case, BODY(ACK), "error %d", raw_error_code(r));
        raw_free(r);
        rq = raw_wait(&producer, 0, BODY(SCRUB_REQUEST), RAW_TIMEOUT_MS);
        cr_assert_not_null(rq, "the new pair starts with a scrub");
        cr_assert_eq(rq->scrub_request->n_chunk_ids, 2);
        g = raw_borrow(&other, 2 * MiB, 2 * MiB, false, got, 2, &n);
        cr_assert_eq(raw_error_code(g), E(NO_MEMORY));
        raw_free(g);
        raw_free(scrub(fds, ids, 2, rq->scrub_request, false));
        raw_free(rq);
        g = raw_borrow(&other, 4 * MiB, 4 * MiB, false, got, 2, &n);
        cr_assert_eq(g->body_case, BODY(GRANT), "error %d", raw_error_code(g));
        for (size_t i = 0; i < n; i++)
                cr_assert_not(raw_memfd_has(got[i], "secret of C"));
        side_close_fds(got, n);
        raw_free(g);
        side_close_fds(fds, 2);
}

Test(scrub, a_chunk_that_fails_its_scrub_goes_back_to_its_producer)
{
        Aqua__Envelope *rq, *r, *back;
        uint64_t ids[2];
        int fds[2], status;
        pid_t pid;

        cr_assert_eq(aquad_start(NULL, &daemon_), 0);
        test_connect_as(daemon_, &producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C");
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        offer(2, fds, ids);
        pid = spawn_consumer();
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        rq = raw_wait(&producer, 0, BODY(SCRUB_REQUEST), RAW_TIMEOUT_MS);
        cr_assert_not_null(rq);
        r = scrub(fds, ids, 2, rq->scrub_request, true);
        cr_assert_eq(r->body_case, BODY(ACK));
        raw_free(r);
        back = raw_wait(&producer, 0, BODY(RECLAIMED), RAW_TIMEOUT_MS);
        cr_assert_not_null(back, "failed chunks come back to be released");
        cr_assert_eq(back->reclaimed->n_chunk_ids, 2);
        raw_free(back);
        raw_free(rq);
        cr_assert_eq(count_state("free") + count_state("scrubbing") + count_state("dirty"), 0);
        side_close_fds(fds, 2);
}

Test(scrub, a_producer_cleans_only_what_it_was_asked_to_and_dirt_survives_a_restart)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *r, *g, *w, *rq;
        Aqua__ScrubDone d = AQUA__SCRUB_DONE__INIT;
        Aqua__HeldChunk held[2], *heldp[2];
        uint64_t ids[2], lease;
        int fds[2], got[2];
        size_t n;

        cr_assert_eq(aquad_start(NULL, &daemon_), 0);
        test_connect_as(daemon_, &producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C");
        test_connect_as(daemon_, &consumer, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", "GPU-P");
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        offer(2, fds, ids);
        lease = borrow_and_write(&consumer, 4 * MiB, "C", NULL);
        raw_free(give_back(&consumer, lease));
        /* Unasked, a producer's word changes nothing: the chunks stay dirty. */
        d.chunk_ids = ids;
        d.n_chunk_ids = 2;
        e.body_case = BODY(SCRUB_DONE);
        e.scrub_done = &d;
        r = raw_call(&producer, &e);
        cr_assert_eq(r->body_case, BODY(ACK));
        raw_free(r);
        cr_assert_eq(count_state("dirty"), 2);
        /* Only a producer may say it. */
        r = raw_call(&consumer, &e);
        cr_assert_eq(raw_error_code(r), E(WRONG_ROLE));
        raw_free(r);

        /* aquad dies; after the restart nobody's data is known to be whose: scrub first. */
        cr_assert_eq(aquad_kill(daemon_, SIGKILL), 128 + SIGKILL);
        raw_close(&producer);
        raw_close(&consumer);
        raw_close(&admin);
        cr_assert_eq(aquad_restart(daemon_), 0);
        test_connect_as(daemon_, &consumer, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", "GPU-P");
        cr_assert_eq(raw_connect(&producer, aquad_endpoint(daemon_), aquad_side_path(daemon_)), 0);
        for (size_t i = 0; i < 2; i++) {
                aqua__held_chunk__init(&held[i]);
                held[i].chunk_id = ids[i];
                held[i].size = 2 * MiB;
                heldp[i] = &held[i];
        }
        w = raw_hello(&producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C", heldp, 2, fds);
        cr_assert_eq(w->body_case, BODY(WELCOME), "error %d", raw_error_code(w));
        raw_free(w);
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        rq = raw_wait(&producer, 0, BODY(SCRUB_REQUEST), RAW_TIMEOUT_MS);
        cr_assert_not_null(rq, "dirty chunks are scrubbed after a restart");
        cr_assert_eq(rq->scrub_request->n_chunk_ids, 2);
        g = raw_borrow(&consumer, 2 * MiB, 2 * MiB, false, got, 2, &n);
        cr_assert_eq(raw_error_code(g), E(NO_MEMORY));
        raw_free(g);
        raw_free(scrub(fds, ids, 2, rq->scrub_request, false));
        raw_free(rq);
        g = raw_borrow(&consumer, 4 * MiB, 4 * MiB, false, got, 2, &n);
        cr_assert_eq(g->body_case, BODY(GRANT), "error %d", raw_error_code(g));
        side_close_fds(got, n);
        raw_free(g);
        side_close_fds(fds, 2);
}

Test(scrub, can_be_turned_off_for_a_single_tenant)
{
        uint64_t ids[2], lease;
        int fds[2], status;
        pid_t pid;
        Aqua__Envelope *g;
        int got[2];
        size_t n;

        cr_assert_eq(aquad_start("scrub-chunks: false\n", &daemon_), 0);
        test_connect_as(daemon_, &producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C");
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        offer(2, fds, ids);
        pid = spawn_consumer();
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        while (count_state("free") != 2) /* the death seen, the chunks back */
                sleep_ns(5 * NSEC_PER_MSEC);
        test_connect_as(daemon_, &consumer, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", "GPU-P");
        g = raw_borrow(&consumer, 4 * MiB, 4 * MiB, false, got, 2, &n);
        cr_assert_eq(g->body_case, BODY(GRANT), "error %d", raw_error_code(g));
        lease = g->grant->lease_id;
        cr_assert_null(raw_wait(&producer, 0, BODY(SCRUB_REQUEST), 0));
        side_close_fds(got, n);
        raw_free(give_back(&consumer, lease));
        raw_free(g);
        side_close_fds(fds, 2);
}
