/*
 * aquad restarted in the middle of a flow, driven by raw protocol clients: what either side
 * finished while it was away reaches the other, in whatever order they come back.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "rawclient.h"
#include "testutil.h"

#define MiB        (UINT64_C(1) << 20)
#define BODY(name) AQUA__ENVELOPE__BODY_##name

static struct aquad *daemon_;
static struct raw producer, consumer, admin;

static void close_all(void)
{
        raw_close(&producer);
        raw_close(&consumer);
        raw_close(&admin);
}

static void teardown(void)
{
        close_all();
        aquad_stop_in_teardown(daemon_);
        daemon_ = NULL;
}

TestSuite(restart, .fini = teardown, .timeout = 60);

/*
 * Start aquad with extra config, connect the producer, the consumer and an admin, and lease the
 * consumer the one 2 MiB chunk the producer offers; its descriptors in *pfd and *cfd.
 */
static void lend_one_chunk(const char *extra, int *pfd, int *cfd, uint64_t *ret_lease,
                           uint64_t *ret_chunk)
{
        Aqua__Envelope *g;
        size_t got;

        cr_assert_eq(aquad_start(extra, &daemon_), 0);
        test_connect_cast(daemon_, &producer, &consumer, &admin);
        raw_free(raw_offer(&producer, 1, 2 * MiB, pfd));
        g = raw_borrow(&consumer, 2 * MiB, 2 * MiB, false, cfd, 1, &got);
        cr_assert_eq(g->body_case, BODY(GRANT), "error %d", raw_error_code(g));
        if (ret_lease)
                *ret_lease = g->grant->lease_id;
        if (ret_chunk)
                *ret_chunk = g->grant->chunks[0]->chunk_id;
        raw_free(g);
}

/* The producer takes everything back: the one chunk is leased, so it is pending. */
static void reclaim_all(void)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *r;
        Aqua__ReclaimRequest rq = AQUA__RECLAIM_REQUEST__INIT;

        rq.all = true;
        e.body_case = BODY(RECLAIM_REQUEST);
        e.reclaim_request = &rq;
        r = raw_call(&producer, &e);
        cr_assert_eq(r->body_case, BODY(RECLAIM_REPLY), "error %d", raw_error_code(r));
        cr_assert_eq(r->reclaim_reply->n_pending_chunk_ids, 1);
        raw_free(r);
}

/* Whether an event of kind whose text holds text is in aquad's ring. */
static bool event_has(const char *kind, const char *text)
{
        Aqua__Envelope *q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_EVENTS);
        bool has = false;

        for (size_t i = 0; i < q->admin_reply->n_events; i++)
                has |= strcmp(q->admin_reply->events[i]->kind, kind) == 0 &&
                       strstr(q->admin_reply->events[i]->text, text);
        raw_free(q);
        return has;
}

/* Say hello again after a restart, listing what the client holds. */
static void rehello(struct raw *r, Aqua__Role role, const char *uuid, const char *peer,
                    const uint64_t *chunk_ids, uint64_t lease, size_t n, const int *fds)
{
        Aqua__HeldChunk held[8], *heldp[8];
        Aqua__Envelope *w;

        cr_assert_leq(n, 8);
        for (size_t i = 0; i < n; i++) {
                aqua__held_chunk__init(&held[i]);
                held[i].chunk_id = chunk_ids[i];
                held[i].size = 2 * MiB;
                held[i].lease_id = lease;
                heldp[i] = &held[i];
        }
        cr_assert_eq(raw_connect(r, aquad_endpoint(daemon_), aquad_side_path(daemon_)), 0);
        w = raw_hello(r, role, uuid, peer, heldp, n, fds);
        cr_assert_eq(w->body_case, BODY(WELCOME), "error %d", raw_error_code(w));
        raw_free(w);
}

/*
 * A reclaim is pending when aquad stops; the consumer moves its data to DRAM meanwhile; the
 * producer re-registers first. The chunk must come back to it, not vanish from the pool while
 * the producer still counts it as offered.
 */
Test(restart, a_reclaim_finished_while_aquad_was_away_reaches_a_producer_back_first)
{
        Aqua__Envelope *n;
        uint64_t chunk, lease;
        int pfd, cfd;

        lend_one_chunk(NULL, &pfd, &cfd, &lease, &chunk);
        reclaim_all();

        cr_assert_eq(aquad_kill(daemon_, SIGTERM), 0);
        close_all();
        close(cfd); /* the consumer moved off and unmapped */
        cr_assert_eq(aquad_restart(daemon_), 0);
        rehello(&producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C", &chunk, lease, 1, &pfd);
        rehello(&consumer, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", "GPU-P", NULL, 0, 0, NULL);

        n = raw_wait(&producer, 0, BODY(RECLAIMED), 5000);
        cr_assert_not_null(n, "the producer never heard that its chunk is back");
        cr_assert_eq(n->reclaimed->n_chunk_ids, 1);
        cr_assert_eq(n->reclaimed->chunk_ids[0], chunk);
        raw_free(n);
        /* A completed reclaim, not a lost lease. */
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        n = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_STATUS);
        cr_assert_eq(n->admin_reply->status->leases_lost, 0, "counted as lost");
        raw_free(n);
        cr_assert(event_has("lease", "returned by GPU-C while aquad was away"));
        cr_assert_not(event_has("lease", "lost"), "a 'lease lost' event for a completed reclaim");
        close(pfd);
}

static void pair_request(bool pair)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *r;
        Aqua__AdminPair p = AQUA__ADMIN_PAIR__INIT;
        Aqua__AdminUnpair u = AQUA__ADMIN_UNPAIR__INIT;

        if (pair) {
                p.producer = "GPU-P";
                p.consumer = "GPU-C";
                e.body_case = BODY(ADMIN_PAIR);
                e.admin_pair = &p;
        } else {
                u.gpu = "GPU-P";
                e.body_case = BODY(ADMIN_UNPAIR);
                e.admin_unpair = &u;
        }
        r = raw_call(&admin, &e);
        cr_assert_eq(r->body_case, BODY(ACK), "error %d", raw_error_code(r));
        raw_free(r);
}

/* Read what arrives until a message of body does (true) or nothing does for timeout_ms. */
static bool drain_for(struct raw *r, Aqua__Envelope__BodyCase body, int timeout_ms)
{
        for (size_t i = 0; i < r->n_notices; i++)
                if (r->notices[i]->body_case == body)
                        return true;
        for (Aqua__Envelope *e; (e = raw_recv(r, timeout_ms));) {
                bool seen = e->body_case == body;
                raw_free(e);
                if (seen)
                        return true;
        }
        return false;
}

/*
 * Notices are state, not datagrams: a consumer that does not read while thousands of pair
 * changes pile up on its queue still gets the ReclaimNotice that follows, and its deadline runs
 * from when aquad could hand it over, not from when it was due.
 */
Test(restart, a_notice_behind_a_full_queue_is_delivered_and_its_deadline_starts_then)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *r, *q;
        Aqua__Return rt = AQUA__RETURN__INIT;
        uint64_t chunk, lease;
        int pfd, cfd;

        lend_one_chunk("reclaim-deadline: 2s\nlimits:\n  request-rate: 0\n", &pfd, &cfd, &lease,
                       &chunk);

        /* Far more PairChanged notices than ZeroMQ and the kernel queue for a peer that does not
         * read (about 1000 in each of two pipes, and a socket buffer of small messages). */
        for (int i = 0; i < 12000; i++)
                pair_request(i % 2 == 1);
        drain_for(&producer, AQUA__ENVELOPE__BODY__NOT_SET, 200); /* all of it */
        reclaim_all();
        /* Until it is delivered the lease is not overdue: its deadline has not started. */
        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_LEASES);
        cr_assert_eq(q->admin_reply->n_leases, 1);
        cr_assert(q->admin_reply->leases[0]->notice_pending, "the notice waits in the outbox");
        cr_assert_not(q->admin_reply->leases[0]->overdue);
        raw_free(q);
        /* Longer than the deadline: were it running, the consumer would be barred now. */
        usleep(2500 * 1000);

        cr_assert(drain_for(&consumer, BODY(RECLAIM_NOTICE), 1000),
                  "the consumer never saw the reclaim");
        /* It moves off and returns the chunk in time, counted from the delivery. */
        rt.lease_id = lease;
        rt.chunk_ids = &chunk;
        rt.n_chunk_ids = 1;
        e = (Aqua__Envelope)AQUA__ENVELOPE__INIT;
        e.body_case = BODY(RETURN);
        e.return_ = &rt;
        r = raw_call(&consumer, &e);
        cr_assert_eq(r->body_case, BODY(RETURN_REPLY), "error %d", raw_error_code(r));
        raw_free(r);
        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_STATUS);
        cr_assert_eq(q->admin_reply->status->deadline_misses, 0,
                     "barred for a deadline it could not have seen");
        raw_free(q);
        close(pfd);
        close(cfd);
}

static Aqua__Envelope *release_as(const char *gpu, bool force)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__AdminRelease rl = AQUA__ADMIN_RELEASE__INIT;

        rl.gpu = (char *)gpu;
        rl.force = force;
        e.body_case = BODY(ADMIN_RELEASE);
        e.admin_release = &rl;
        return raw_call(&admin, &e);
}

static Aqua__Envelope *release(const char *gpu)
{
        return release_as(gpu, false);
}

/* The state aquad lists for chunk id. */
static bool chunk_is(uint64_t id, const char *state)
{
        Aqua__Envelope *q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_CHUNKS);
        bool is = false;

        for (size_t k = 0; k < q->admin_reply->n_chunks; k++)
                is |= q->admin_reply->chunks[k]->chunk_id == id &&
                      strcmp(q->admin_reply->chunks[k]->state, state) == 0;
        raw_free(q);
        return is;
}

/*
 * A consumer silent after a restart keeps its leases while its process may run; aquactl shows
 * it as silent. An operator's release is refused while that process runs (naming it); --force
 * ends the lease and quarantines its chunk: it is lent to nobody while the process may map it.
 * A connected client's GPU cannot be released from under it.
 */
Test(restart, an_operator_releases_what_a_silent_consumer_held_and_nothing_else)
{
        Aqua__Envelope *q, *r;
        uint64_t chunk, lease;
        int pfd, cfd;
        bool silent = false;

        lend_one_chunk("reconcile-timeout: 200ms\nscrub-chunks: false\n", &pfd, &cfd, &lease,
                       &chunk);
        r = release("GPU-C");
        cr_assert_eq(raw_error_code(r), AQUA__ERROR_CODE__ERROR_CODE_BUSY, "a connected client");
        raw_free(r);

        cr_assert_eq(aquad_kill(daemon_, SIGTERM), 0);
        close_all();
        cr_assert_eq(aquad_restart(daemon_), 0);
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
        rehello(&producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C", &chunk, lease, 1, &pfd);
        /* The consumer (this process) runs but says nothing: after the window it is silent. */
        for (int i = 0; i < 300 && !silent; i++) {
                q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_GPUS);
                for (size_t k = 0; k < q->admin_reply->n_gpus; k++)
                        silent |= strcmp(q->admin_reply->gpus[k]->uuid, "GPU-C") == 0 &&
                                  q->admin_reply->gpus[k]->silent;
                raw_free(q);
                usleep(10000);
        }
        cr_assert(silent, "aquactl never showed the consumer as silent");
        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_STATUS);
        cr_assert_eq(q->admin_reply->status->leases, 1, "kept while its process may run");
        raw_free(q);

        r = release("GPU-C");
        cr_assert_eq(raw_error_code(r), AQUA__ERROR_CODE__ERROR_CODE_BUSY,
                     "its process runs: refused");
        cr_assert(strstr(r->error->message, "still runs") && strstr(r->error->message, "--force"),
                  "%s", r->error->message);
        raw_free(r);
        r = release_as("GPU-C", true);
        cr_assert_eq(r->body_case, BODY(ACK), "error %d", raw_error_code(r));
        cr_assert(strstr(r->ack->text, "1 chunks are quarantined"), "%s", r->ack->text);
        raw_free(r);
        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_STATUS);
        cr_assert_eq(q->admin_reply->status->leases, 0);
        raw_free(q);
        cr_assert(chunk_is(chunk, "quarantined"), "lent to nobody while this process may map it");
        /* Nor handed back: the producer's reclaim of it waits for the process to be gone. */
        reclaim_all();
        cr_assert(chunk_is(chunk, "quarantined"));
        r = release("GPU-P");
        cr_assert_eq(raw_error_code(r), AQUA__ERROR_CODE__ERROR_CODE_BUSY,
                     "the producer is connected: it is not silent");
        raw_free(r);
        close(pfd);
        close(cfd);
}

/* A Hello for uuid from a fresh connection: the error code (-1: welcomed), message in msg. */
static int stranger_hello(Aqua__Role role, const char *uuid, const char *peer, char *msg,
                          size_t len)
{
        struct raw r = {0};
        Aqua__Envelope *w;
        int code;

        cr_assert_eq(raw_connect(&r, aquad_endpoint(daemon_), aquad_side_path(daemon_)), 0);
        r.no_secret = true;
        w = raw_hello(&r, role, uuid, peer, NULL, 0, NULL);
        cr_assert_not_null(w);
        code = raw_error_code(w);
        snprintf(msg, len, "%s", code >= 0 ? w->error->message : "");
        raw_free(w);
        raw_close(&r);
        return code;
}

/*
 * Custody by identity, item 1: the consumer fills its lease; aquad restarts; the consumer stays
 * silent (alive, not polling). Another process that knows the uuid and even holds the custody
 * secret (a child of the holder), and the holder's own process without the secret, are refused
 * BUSY naming the holder; nothing is dropped or granted for them. The same for the producer's
 * GPU. The holder then registers again with its secret and keeps its lease.
 */
Test(restart, a_silent_holders_gpu_is_refused_to_every_other_process_after_a_restart)
{
        Aqua__Envelope *q;
        uint64_t chunk, lease;
        int pfd, cfd, status;
        char msg[256], want[64];
        pid_t child;

        lend_one_chunk("reconcile-timeout: 200ms\n", &pfd, &cfd, &lease, &chunk);
        cr_assert_eq(pwrite(cfd, "tenant A", 9, 0), 9);
        cr_assert_eq(aquad_kill(daemon_, SIGTERM), 0);
        close_all();
        cr_assert_eq(aquad_restart(daemon_), 0);
        test_connect_as(daemon_, &admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);

        snprintf(want, sizeof(want), "pid %d", (int)getpid());
        child = fork();
        cr_assert_geq(child, 0);
        if (child == 0) {
                /* Another process: the secret in its memory is not enough. */
                struct raw r = {0};
                Aqua__Envelope *w;

                if (raw_connect(&r, aquad_endpoint(daemon_), aquad_side_path(daemon_)) != 0)
                        _exit(2);
                w = raw_hello(&r, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", "GPU-P", NULL, 0, NULL);
                _exit(w && raw_error_code(w) == AQUA__ERROR_CODE__ERROR_CODE_BUSY &&
                              strstr(w->error->message, want)
                          ? 0
                          : 1);
        }
        cr_assert_eq(waitpid(child, &status, 0), child);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "another process with the secret was not refused BUSY naming %s", want);
        cr_assert_eq(stranger_hello(AQUA__ROLE__ROLE_CONSUMER, "GPU-C", "GPU-P", msg, sizeof(msg)),
                     AQUA__ERROR_CODE__ERROR_CODE_BUSY, "no secret: %s", msg);
        cr_assert(strstr(msg, want) && strstr(msg, "may still map"), "%s", msg);
        cr_assert_eq(stranger_hello(AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C", msg, sizeof(msg)),
                     AQUA__ERROR_CODE__ERROR_CODE_BUSY, "the producer's GPU: %s", msg);
        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_STATUS);
        cr_assert_eq(q->admin_reply->status->leases, 1, "nothing dropped for a stranger");
        raw_free(q);

        /* The holders, with their secrets, take up what they hold. */
        rehello(&producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C", &chunk, lease, 1, &pfd);
        rehello(&consumer, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", "GPU-P", &chunk, lease, 1, NULL);
        q = raw_admin_query(&admin, AQUA__ADMIN_QUERY__WHAT__WHAT_STATUS);
        cr_assert_eq(q->admin_reply->status->leases, 1);
        raw_free(q);
        cr_assert(chunk_is(chunk, "leased"));
        cr_assert(raw_memfd_has(cfd, "tenant A"));
        close(pfd);
        close(cfd);
}
