/*
 * ctl.churn: borrow/return cycles of PAIRS consumers at once, each paired with its own producer
 * (one 2 MiB chunk each), through raw protocol clients, for SECONDS. Prints cycles per second,
 * and with --counter the fdatasyncs aquad made meanwhile (slow-sync.c counts them) per cycle and
 * per request. With --reclaim a cycle is a reclaim instead: the consumer borrows the chunk, its
 * producer reclaims it, the consumer returns it on the notice, the producer offers it again once
 * told it is back (four requests).
 *
 *   bench-churn --endpoint E --side S [--pairs N] [--seconds S] [--counter FILE] [--reclaim]
 */
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zmq.h>

#include "rawclient.h"
#include "time-util.h"

#define CHUNK      (UINT64_C(2) << 20)
#define BODY(name) AQUA__ENVELOPE__BODY_##name

static const char *endpoint, *side_path;
static void *zctx;
static atomic_bool go, stop;
static atomic_ulong cycles, failures;
static bool reclaims;

struct pair {
        pthread_t thread;
        size_t index;
};

static bool cycle(struct raw *c)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *g, *r;
        Aqua__Return rt = AQUA__RETURN__INIT;
        int fds[4];
        size_t n = 0;
        bool ok;

        g = raw_borrow(c, CHUNK, CHUNK, false, fds, 4, &n);
        if (!g || g->body_case != BODY(GRANT) || !g->grant->lease_id) {
                raw_free(g);
                return false;
        }
        side_close_fds(fds, n);
        rt.lease_id = g->grant->lease_id;
        e.body_case = BODY(RETURN);
        e.return_ = &rt;
        r = raw_call(c, &e);
        ok = r && r->body_case == BODY(RETURN_REPLY);
        raw_free(r);
        raw_free(g);
        return ok;
}

static bool call_ok(struct raw *r, Aqua__Envelope *e, Aqua__Envelope__BodyCase want)
{
        Aqua__Envelope *reply = raw_call(r, e);
        bool ok = reply && reply->body_case == want;

        raw_free(reply);
        return ok;
}

static bool reclaim_cycle(struct raw *prod, struct raw *cons, int fd)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT, *g, *n;
        Aqua__ReclaimRequest rq = AQUA__RECLAIM_REQUEST__INIT;
        Aqua__Return rt = AQUA__RETURN__INIT;
        int fds[4];
        size_t k = 0;
        bool ok;

        g = raw_borrow(cons, CHUNK, CHUNK, false, fds, 4, &k);
        if (!g || g->body_case != BODY(GRANT) || !g->grant->lease_id) {
                raw_free(g);
                return false;
        }
        side_close_fds(fds, k);
        rq.all = true;
        e.body_case = BODY(RECLAIM_REQUEST);
        e.reclaim_request = &rq;
        ok = call_ok(prod, &e, BODY(RECLAIM_REPLY));
        n = ok ? raw_wait(cons, 0, BODY(RECLAIM_NOTICE), RAW_TIMEOUT_MS) : NULL;
        raw_free(n);
        rt.lease_id = g->grant->lease_id;
        e.body_case = BODY(RETURN);
        e.return_ = &rt;
        ok = n && call_ok(cons, &e, BODY(RETURN_REPLY));
        n = ok ? raw_wait(prod, 0, BODY(RECLAIMED), RAW_TIMEOUT_MS) : NULL;
        ok = n != NULL;
        raw_free(n);
        raw_free(g);
        if (ok) {
                n = raw_offer_fds(prod, &fd, 1, CHUNK);
                ok = n && n->body_case == BODY(OFFER_REPLY);
                raw_free(n);
        }
        return ok;
}

static void *run(void *arg)
{
        struct pair *p = arg;
        struct raw prod = {0}, cons = {0};
        char pu[32], cu[32];
        Aqua__Envelope *o;
        int fd = -1;

        snprintf(pu, sizeof(pu), "GPU-P%03zu", p->index);
        snprintf(cu, sizeof(cu), "GPU-C%03zu", p->index);
        if (raw_connect_ctx(&prod, zctx, endpoint, side_path) != 0 ||
            raw_connect_ctx(&cons, zctx, endpoint, side_path) != 0)
                goto fail;
        raw_free(raw_hello(&prod, AQUA__ROLE__ROLE_PRODUCER, pu, cu, NULL, 0, NULL));
        raw_free(raw_hello(&cons, AQUA__ROLE__ROLE_CONSUMER, cu, pu, NULL, 0, NULL));
        o = raw_offer(&prod, 1, CHUNK, &fd);
        if (!o || o->body_case != BODY(OFFER_REPLY)) {
                raw_free(o);
                goto fail;
        }
        raw_free(o);
        while (!atomic_load(&go))
                usleep(1000);
        while (!atomic_load(&stop)) {
                if (reclaims ? !reclaim_cycle(&prod, &cons, fd) : !cycle(&cons)) {
                        atomic_fetch_add(&failures, 1);
                        break;
                }
                atomic_fetch_add(&cycles, 1);
        }
        raw_close(&cons);
        raw_close(&prod);
        if (fd >= 0)
                close(fd);
        return NULL;
fail:
        atomic_fetch_add(&failures, 1);
        return NULL;
}

static volatile unsigned long *map_counter(const char *path)
{
        int fd = open(path, O_RDWR);
        void *m;

        if (fd < 0)
                return NULL;
        m = mmap(NULL, sizeof(unsigned long), PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        return m == MAP_FAILED ? NULL : m;
}

int main(int argc, char **argv)
{
        static const struct option opts[] = {{"endpoint", required_argument, NULL, 'e'},
                                             {"side", required_argument, NULL, 's'},
                                             {"pairs", required_argument, NULL, 'p'},
                                             {"seconds", required_argument, NULL, 't'},
                                             {"counter", required_argument, NULL, 'c'},
                                             {"reclaim", no_argument, NULL, 'r'},
                                             {}};
        size_t n_pairs = 32;
        double seconds = 2;
        const char *counter = NULL;
        volatile unsigned long *syncs = NULL;
        unsigned long s0 = 0, s1 = 0, c0, c1;
        struct pair *pairs;
        uint64_t t0, t1;
        int o;

        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1)
                switch (o) {
                case 'e':
                        endpoint = optarg;
                        break;
                case 's':
                        side_path = optarg;
                        break;
                case 'p':
                        n_pairs = strtoul(optarg, NULL, 10);
                        break;
                case 't':
                        seconds = atof(optarg);
                        break;
                case 'c':
                        counter = optarg;
                        break;
                case 'r':
                        reclaims = true;
                        break;
                default:
                        return 2;
                }
        if (!endpoint || !side_path || n_pairs == 0 || seconds <= 0)
                return 2;
        if (counter && !(syncs = map_counter(counter))) {
                fprintf(stderr, "bench-churn: cannot map %s\n", counter);
                return 1;
        }
        zctx = zmq_ctx_new();
        pairs = calloc(n_pairs, sizeof(*pairs));
        if (!zctx || !pairs)
                return 1;
        for (size_t i = 0; i < n_pairs; i++) {
                pairs[i].index = i;
                if (pthread_create(&pairs[i].thread, NULL, run, &pairs[i]) != 0)
                        return 1;
        }
        /* Everyone registered and offered before the clock starts. */
        usleep(500 * 1000 + 5000 * n_pairs);
        c0 = atomic_load(&cycles);
        s0 = syncs ? *syncs : 0;
        t0 = now_mono_ns();
        atomic_store(&go, true);
        usleep((useconds_t)(seconds * 1e6));
        c1 = atomic_load(&cycles);
        s1 = syncs ? *syncs : 0;
        t1 = now_mono_ns();
        atomic_store(&stop, true);
        for (size_t i = 0; i < n_pairs; i++)
                pthread_join(pairs[i].thread, NULL);
        if (atomic_load(&failures)) {
                fprintf(stderr, "bench-churn: %lu pairs failed\n", atomic_load(&failures));
                return 1;
        }
        printf("churn_pairs %zu\n", n_pairs);
        printf("churn_cycles_per_s %.0f\n", (c1 - c0) / ((t1 - t0) / 1e9));
        if (syncs && c1 > c0) {
                printf("churn_syncs_per_cycle %.3f\n", (double)(s1 - s0) / (double)(c1 - c0));
                printf("churn_syncs_per_request %.3f\n",
                       (double)(s1 - s0) / ((reclaims ? 4.0 : 2.0) * (double)(c1 - c0)));
        }
        zmq_ctx_term(zctx);
        free(pairs);
        return 0;
}
