/*
 * A domain's journal in etcd, against a real etcd on loopback (skipped without one): the state
 * stays the size of what it holds however many commits wrote it; an attempt etcd applies after
 * aquad gave up on it (a proxy that forwards it late) never lands on a newer commit; a turn too
 * large for one transaction is refused on its own and the next goes through; a domain's old log
 * of records moves to objects; a deposed writer is refused.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "etcd.h"
#include "journal.h"

#define ROOT "/aqua/t/"

static char dir[64];
static pid_t etcd_pid;
static int client_port;
static char url[64];

static int free_port(void)
{
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof(a);
        int fd = socket(AF_INET, SOCK_STREAM, 0), port;

        cr_assert_geq(fd, 0);
        cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
        cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
        port = ntohs(a.sin_port);
        close(fd);
        return port;
}

static const char *etcd_binary(void)
{
        static char path[512];
        const char *home = getenv("HOME"), *cache = getenv("XDG_CACHE_HOME");

        if (system("command -v etcd >/dev/null 2>&1") == 0)
                return "etcd";
        if (cache)
                snprintf(path, sizeof(path), "%s/aqua/tools/etcd", cache);
        else
                snprintf(path, sizeof(path), "%s/.cache/aqua/tools/etcd", home ? home : "/root");
        return access(path, X_OK) == 0 ? path : NULL;
}

static struct etcd *client(const char *u, uint64_t timeout_ms)
{
        char *urls[] = {(char *)u};
        struct etcd_options o = {.urls = urls, .n_urls = 1, .timeout_ms = timeout_ms};
        struct etcd *e = NULL;

        cr_assert_eq(etcd_new(&o, &e), 0);
        return e;
}

static struct etcd *etcd_client(void)
{
        return client(url, 2000);
}

static void setup(void)
{
        const char *bin = etcd_binary();
        char data[128], listen[64], peer[64], cluster[96];

        if (!bin)
                cr_skip_test("no etcd (Debian's etcd-server; scripts/bootstrap puts it in the tools "
                             "folder)");
        snprintf(dir, sizeof(dir), "/tmp/test-journal-etcd-XXXXXX");
        cr_assert_not_null(mkdtemp(dir));
        snprintf(data, sizeof(data), "%s/data", dir);
        client_port = free_port();
        snprintf(listen, sizeof(listen), "http://127.0.0.1:%d", client_port);
        snprintf(peer, sizeof(peer), "http://127.0.0.1:%d", free_port());
        snprintf(cluster, sizeof(cluster), "t=%s", peer);
        snprintf(url, sizeof(url), "%s", listen);
        etcd_pid = fork();
        cr_assert_geq(etcd_pid, 0);
        if (etcd_pid == 0) {
                char log[128];
                snprintf(log, sizeof(log), "%s/etcd.log", dir);
                (void)!freopen(log, "w", stderr);
                (void)!freopen("/dev/null", "w", stdout);
                execlp(bin, bin, "--name", "t", "--data-dir", data, "--listen-client-urls", listen,
                      "--advertise-client-urls", listen, "--listen-peer-urls", peer,
                      "--initial-advertise-peer-urls", peer, "--initial-cluster", cluster,
                      (char *)NULL);
                _exit(127);
        }
        struct etcd *e = etcd_client();
        int64_t lease;
        int r = -1;
        for (int i = 0; i < 200 && r < 0; i++) {
                r = etcd_lease_grant(e, 60, &lease);
                if (r < 0)
                        usleep(50000);
        }
        cr_assert_eq(r, 0, "etcd did not start: %s", etcd_error(e));
        etcd_free(e);
}

static void teardown(void)
{
        char cmd[160];

        if (etcd_pid > 0) {
                kill(etcd_pid, SIGKILL);
                waitpid(etcd_pid, NULL, 0);
                etcd_pid = 0;
        }
        if (dir[0]) {
                snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
                (void)!system(cmd);
        }
}

TestSuite(journal_etcd, .init = setup, .fini = teardown, .timeout = 120);

/* ------------------------------------------------------------------------------ the state */

/* What a replay saw: leases and chunks (their lease), and how many records. */
struct state {
        uint64_t leases[64];
        size_t n_leases;
        uint64_t chunk_lease[4096]; /* by chunk id; UINT64_MAX: absent */
        uint64_t records;
};

static void state_init(struct state *st)
{
        memset(st, 0, sizeof(*st));
        for (size_t i = 0; i < 4096; i++)
                st->chunk_lease[i] = UINT64_MAX;
}

static int collect(const Aquaj__JournalRecord *rec, void *userdata)
{
        struct state *st = userdata;

        st->records++;
        for (size_t i = 0; i < rec->n_ops; i++) {
                const Aquaj__JOp *op = rec->ops[i];
                if (op->op_case == AQUAJ__JOP__OP_LEASE_SET && st->n_leases < 64)
                        st->leases[st->n_leases++] = op->lease_set->id;
                if (op->op_case == AQUAJ__JOP__OP_CHUNK_SET && op->chunk_set->id < 4096)
                        st->chunk_lease[op->chunk_set->id] = op->chunk_set->lease_id;
                if (op->op_case == AQUAJ__JOP__OP_CHUNK_DEL && op->chunk_del < 4096)
                        st->chunk_lease[op->chunk_del] = UINT64_MAX;
        }
        return 0;
}

static bool has_lease(const struct state *st, uint64_t id)
{
        for (size_t i = 0; i < st->n_leases; i++)
                if (st->leases[i] == id)
                        return true;
        return false;
}

/* A leader: its election key with a lease of its own, and the fence that makes. */
static struct journal_fence lead(struct etcd *e, int64_t *ret_lease)
{
        struct etcd_kv *kv = NULL;
        size_t n = 0;

        cr_assert_eq(etcd_lease_grant(e, 60, ret_lease), 0);
        const struct etcd_op put = {.kind = ETCD_OP_PUT, .key = ROOT "leader", .value = "me",
                                    .len = 2, .lease = *ret_lease};
        cr_assert_eq(etcd_txn(e, NULL, 0, &put, 1, NULL), 1);
        cr_assert_eq(etcd_range(e, ROOT "leader", false, &kv, &n, NULL), 0);
        cr_assert_eq(n, 1);
        struct journal_fence f = {.key = ROOT "leader", .revision = kv[0].create_revision,
                                  .lease = *ret_lease};
        etcd_kvs_free(kv, n);
        return f;
}

/* A record of ops built on the stack. */
struct rec {
        Aquaj__JournalRecord r;
        Aquaj__JOp ops[1100], *ptrs[1100];
        Aquaj__JChunk chunks[1100];
        Aquaj__JLease leases[8];
        size_t n_leases;
};

static void rec_init(struct rec *x)
{
        aquaj__journal_record__init(&x->r);
        x->r.ops = x->ptrs;
        x->n_leases = 0;
}

static Aquaj__JOp *rec_op(struct rec *x, Aquaj__JOp__OpCase kind)
{
        Aquaj__JOp *op = &x->ops[x->r.n_ops];

        aquaj__jop__init(op);
        op->op_case = kind;
        x->ptrs[x->r.n_ops++] = op;
        return op;
}

static void rec_chunk(struct rec *x, uint64_t id, uint64_t lease)
{
        Aquaj__JChunk *c = &x->chunks[x->r.n_ops];
        Aquaj__JOp *op = rec_op(x, AQUAJ__JOP__OP_CHUNK_SET);

        aquaj__jchunk__init(c);
        c->id = id;
        c->producer = "GPU-p";
        c->size = 2u << 20;
        c->client_ref = 1000 + id;
        c->lease_id = lease;
        op->chunk_set = c;
}

static void rec_chunk_del(struct rec *x, uint64_t id)
{
        rec_op(x, AQUAJ__JOP__OP_CHUNK_DEL)->chunk_del = id;
}

static void rec_lease(struct rec *x, uint64_t id)
{
        Aquaj__JLease *l = &x->leases[x->n_leases++];
        Aquaj__JOp *op = rec_op(x, AQUAJ__JOP__OP_LEASE_SET);

        aquaj__jlease__init(l);
        l->id = id;
        l->consumer = "GPU-c";
        l->producer = "GPU-p";
        op->lease_set = l;
}

static void rec_lease_del(struct rec *x, uint64_t id)
{
        rec_op(x, AQUAJ__JOP__OP_LEASE_DEL)->lease_del = id;
}

static size_t count_keys(struct etcd *e, const char *prefix)
{
        struct etcd_kv *kv = NULL;
        size_t n = 0;

        cr_assert_eq(etcd_range(e, prefix, true, &kv, &n, NULL), 0);
        etcd_kvs_free(kv, n);
        return n;
}

static struct journal *open_as(struct etcd *e, const struct journal_fence *f, struct state *st)
{
        struct journal *j = NULL;

        state_init(st);
        cr_assert_eq(journal_open_etcd(e, ROOT, f, collect, st, &j, NULL), 0, "%s",
                     etcd_error(e));
        return j;
}

Test(journal_etcd, a_busy_domain_keeps_the_size_of_what_it_holds)
{
        struct etcd *e = etcd_client();
        static struct rec x;
        struct state st;
        int64_t lease;
        struct journal_fence f = lead(e, &lease);
        struct journal *j = open_as(e, &f, &st);

        /* A lender's 512 chunks, then a consumer borrowing 64 of them and returning them,
         * 1000 times: 2001 commits. A log would hold 2001 records. */
        rec_init(&x);
        for (uint64_t id = 1; id <= 512; id++)
                rec_chunk(&x, id, 0);
        cr_assert_eq(journal_append(j, &x.r), 0, "%s", journal_error(j));
        for (uint64_t l = 1; l <= 1000; l++) {
                rec_init(&x);
                rec_lease(&x, l);
                for (uint64_t id = 1; id <= 64; id++)
                        rec_chunk(&x, id, l);
                cr_assert_eq(journal_append(j, &x.r), 0, "%s", journal_error(j));
                rec_init(&x);
                rec_lease_del(&x, l);
                for (uint64_t id = 1; id <= 64; id++)
                        rec_chunk(&x, id, l == 1000 ? l : 0);
                if (l == 1000)
                        rec_lease(&x, l); /* the last one kept */
                cr_assert_eq(journal_append(j, &x.r), 0, "%s", journal_error(j));
        }
        journal_free(j);
        /* seq, meta, one lease, two pages (ids 1-511, 512) */
        cr_assert_leq(count_keys(e, ROOT "state/"), 5);
        j = open_as(e, &f, &st);
        cr_assert_leq(st.records, 5);
        cr_assert(has_lease(&st, 1000));
        cr_assert_eq(st.n_leases, 1);
        cr_assert_eq(st.chunk_lease[64], 1000);
        cr_assert_eq(st.chunk_lease[65], 0);
        cr_assert_eq(st.chunk_lease[512], 0);
        journal_free(j);
        etcd_free(e);
}

/* ------------------------------------------------------------------------------ late writes */

/* A proxy in front of etcd that, while late is set, forwards each request only after the client
 * gave up on it (and throws the answer away): what a slow raft leader or link does. */
static atomic_bool late;
static int proxy_fd;

static void *proxy_conn(void *arg)
{
        int c = (int)(intptr_t)arg, u;
        char buf[1 << 16];
        ssize_t n, got = 0;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                                .sin_port = htons((uint16_t)client_port)};

        /* One request (headers and body) per connection as libcurl sends it. */
        for (;;) {
                n = read(c, buf + got, sizeof(buf) - 1 - (size_t)got);
                if (n <= 0)
                        break;
                got += n;
                buf[got] = 0;
                char *end = strstr(buf, "\r\n\r\n"), *cl = strcasestr(buf, "Content-Length:");
                if (end && (!cl || got >= (end + 4 - buf) + atol(cl + 15)))
                        break;
        }
        bool delay = atomic_load(&late);
        if (delay)
                usleep(400000);
        /* Asked to close after its answer, so that the answer's end is the stream's. */
        char *eol = got > 0 ? strstr(buf, "\r\n") : NULL;
        static const char close_hdr[] = "\r\nConnection: close";
        if (eol && (size_t)got + sizeof(close_hdr) < sizeof(buf)) {
                memmove(eol + sizeof(close_hdr) - 1, eol, (size_t)(got - (eol - buf)));
                memcpy(eol, close_hdr, sizeof(close_hdr) - 1);
                got += (ssize_t)sizeof(close_hdr) - 1;
        }
        u = socket(AF_INET, SOCK_STREAM, 0);
        if (got > 0 && connect(u, (struct sockaddr *)&a, sizeof(a)) == 0 &&
            write(u, buf, (size_t)got) == got)
                while ((n = read(u, buf, sizeof(buf))) > 0)
                        if (!delay && write(c, buf, (size_t)n) != n)
                                break;
        close(u);
        close(c);
        return NULL;
}

static void *proxy_main(void *arg)
{
        for (;;) {
                int c = accept(proxy_fd, NULL, NULL);
                pthread_t t;
                if (c < 0)
                        return NULL;
                pthread_create(&t, NULL, proxy_conn, (void *)(intptr_t)c);
                pthread_detach(t);
        }
}

static int proxy_start(void)
{
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof(a);
        pthread_t t;

        signal(SIGPIPE, SIG_IGN); /* a client that gave up is not the proxy's end */
        proxy_fd = socket(AF_INET, SOCK_STREAM, 0);
        cr_assert_eq(bind(proxy_fd, (struct sockaddr *)&a, sizeof(a)), 0);
        cr_assert_eq(listen(proxy_fd, 16), 0);
        cr_assert_eq(getsockname(proxy_fd, (struct sockaddr *)&a, &len), 0);
        pthread_create(&t, NULL, proxy_main, NULL);
        pthread_detach(t);
        return ntohs(a.sin_port);
}

Test(journal_etcd, an_attempt_applied_late_never_lands_on_a_newer_commit)
{
        struct etcd *e = etcd_client(), *slow;
        static struct rec x;
        struct state st;
        char purl[64];
        int64_t lease;
        struct journal_fence f = lead(e, &lease);
        struct journal *j;

        snprintf(purl, sizeof(purl), "http://127.0.0.1:%d", proxy_start());
        slow = client(purl, 150);
        j = open_as(slow, &f, &st);
        rec_init(&x);
        rec_lease(&x, 1);
        rec_chunk(&x, 1, 1);
        rec_chunk(&x, 2, 0);
        cr_assert_eq(journal_append(j, &x.r), 0, "%s", journal_error(j));

        /* A borrow whose commit times out here but reaches etcd later: refused, undone. */
        atomic_store(&late, true);
        rec_init(&x);
        rec_lease(&x, 2);
        rec_chunk(&x, 2, 2);
        cr_assert_lt(journal_append(j, &x.r), 0);
        usleep(700000); /* it lands now */
        atomic_store(&late, false);
        cr_assert_eq(count_keys(e, ROOT "state/lease/"), 2, "the late attempt landed");

        /* The next commit: the core resends the failed turn's operations with its undo, and a
         * return of lease 1. */
        rec_init(&x);
        rec_lease(&x, 2);
        rec_chunk(&x, 2, 2);
        rec_lease_del(&x, 2);
        rec_chunk(&x, 2, 0);
        rec_lease_del(&x, 1);
        rec_chunk(&x, 1, 0);
        cr_assert_eq(journal_append(j, &x.r), 0, "%s", journal_error(j));

        /* Again, but the late attempt lands after the commit that follows it. */
        atomic_store(&late, true);
        rec_init(&x);
        rec_lease(&x, 3);
        rec_chunk(&x, 2, 3);
        cr_assert_lt(journal_append(j, &x.r), 0);
        atomic_store(&late, false);
        rec_init(&x);
        rec_lease(&x, 3);
        rec_chunk(&x, 2, 3);
        rec_lease_del(&x, 3);
        rec_chunk(&x, 2, 0);
        cr_assert_eq(journal_append(j, &x.r), 0, "%s", journal_error(j));
        usleep(700000); /* the late one reaches etcd now */
        journal_free(j);

        j = open_as(e, &f, &st);
        cr_assert_eq(st.n_leases, 0, "a refused or returned lease came back");
        cr_assert_eq(st.chunk_lease[1], 0);
        cr_assert_eq(st.chunk_lease[2], 0);
        journal_free(j);
        etcd_free(slow);
        etcd_free(e);
}

Test(journal_etcd, a_turn_too_large_is_refused_alone)
{
        struct etcd *e = etcd_client();
        static struct rec x;
        struct state st;
        int64_t lease;
        struct journal_fence f = lead(e, &lease);
        struct journal *j = open_as(e, &f, &st);

        /* 200 chunks 512 ids apart: 200 pages, more keys than one transaction takes. */
        rec_init(&x);
        for (uint64_t k = 0; k < 200; k++)
                rec_chunk(&x, 1 + k * 512, 0);
        cr_assert_eq(journal_append(j, &x.r), -E2BIG);
        cr_assert(strstr(journal_error(j), "more than one etcd transaction carries"), "%s",
                  journal_error(j));
        /* Its undo and another request's change: committed at once. */
        rec_init(&x);
        for (uint64_t k = 0; k < 200; k++)
                rec_chunk_del(&x, 1 + k * 512);
        rec_lease(&x, 7);
        cr_assert_eq(journal_append(j, &x.r), 0, "%s", journal_error(j));
        journal_free(j);
        j = open_as(e, &f, &st);
        cr_assert(has_lease(&st, 7));
        cr_assert_eq(st.chunk_lease[1], UINT64_MAX);
        journal_free(j);
        etcd_free(e);
}

Test(journal_etcd, a_deposed_writer_is_refused)
{
        struct etcd *e = etcd_client();
        static struct rec x;
        struct state st;
        int64_t lease;
        struct journal_fence f = lead(e, &lease);
        struct journal *j = open_as(e, &f, &st);

        cr_assert_eq(etcd_lease_revoke(e, lease), 0);
        rec_init(&x);
        rec_lease(&x, 3);
        cr_assert_eq(journal_append(j, &x.r), -ESTALE);
        cr_assert(strstr(journal_error(j), "no longer this leader's"), "%s", journal_error(j));
        journal_free(j);
        etcd_free(e);
}

Test(journal_etcd, an_old_log_moves_to_objects)
{
        struct etcd *e = etcd_client();
        static struct rec x;
        struct state st;
        int64_t lease;
        struct journal_fence f = lead(e, &lease);
        struct journal *j;
        uint8_t buf[4096];
        size_t len;

        /* Two records as the log kept them: TERM-SEQ keys. */
        rec_init(&x);
        rec_lease(&x, 4);
        rec_chunk(&x, 9, 4);
        len = aquaj__journal_record__pack(&x.r, buf);
        const struct etcd_op put1 = {.kind = ETCD_OP_PUT,
                                     .key = ROOT "journal/0000000000000005-0000000000000001",
                                     .value = buf, .len = len};
        cr_assert_eq(etcd_txn(e, NULL, 0, &put1, 1, NULL), 1);
        rec_init(&x);
        rec_chunk(&x, 10, 0);
        len = aquaj__journal_record__pack(&x.r, buf);
        const struct etcd_op put2 = {.kind = ETCD_OP_PUT,
                                     .key = ROOT "journal/0000000000000005-0000000000000002",
                                     .value = buf, .len = len};
        cr_assert_eq(etcd_txn(e, NULL, 0, &put2, 1, NULL), 1);

        j = open_as(e, &f, &st);
        cr_assert(has_lease(&st, 4));
        journal_free(j);
        cr_assert_eq(count_keys(e, ROOT "journal/"), 0);
        j = open_as(e, &f, &st);
        cr_assert(has_lease(&st, 4));
        cr_assert_eq(st.chunk_lease[9], 4);
        cr_assert_eq(st.chunk_lease[10], 0);
        journal_free(j);
        etcd_free(e);
}
