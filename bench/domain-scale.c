/*
 * A rack's domain in etcd (bench/run domain-scale): the journal aquad keeps there, driven with
 * the operations aquad's core journals for GPUS lenders of CHUNKS 2 MiB chunks each and LEASES
 * leases over them, one commit per turn as aquad makes them. Prints, as name=value lines:
 *   offer_commit_ms_p99, borrow_commit_ms_p50/_p99   commits of a lender's offer, of a borrow
 *   largest_request_bytes                            the largest body sent to etcd
 *   state_keys, state_bytes                          what etcd holds for the domain
 *   read_s                                           a new leader's read of it, by pages
 *   cycle_etcd_us, cycle_file_us                     a borrow+return, median, etcd and file
 * Usage: bench-domain-scale ETCD_URL FOLDER [GPUS CHUNKS LEASES CYCLES]
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "etcd.h"
#include "journal.h"

static uint64_t now_ns(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

        return x < y ? -1 : x > y;
}

static uint64_t pct(uint64_t *v, size_t n, double p)
{
        qsort(v, n, sizeof(*v), cmp_u64);
        return n ? v[(size_t)((double)(n - 1) * p)] : 0;
}

/* A record of up to cap operations. */
struct rec {
        Aquaj__JournalRecord r;
        Aquaj__JOp *ops, **ptrs;
        Aquaj__JChunk *chunks;
        Aquaj__JLease lease;
        Aquaj__JGpu gpu;
};

static void rec_new(struct rec *x, size_t cap)
{
        x->ops = calloc(cap, sizeof(*x->ops));
        x->ptrs = calloc(cap, sizeof(*x->ptrs));
        x->chunks = calloc(cap, sizeof(*x->chunks));
        if (!x->ops || !x->ptrs || !x->chunks) {
                fprintf(stderr, "bench-domain-scale: out of memory\n");
                exit(1);
        }
}

static void rec_reset(struct rec *x)
{
        aquaj__journal_record__init(&x->r);
        x->r.ops = x->ptrs;
}

static Aquaj__JOp *op(struct rec *x, Aquaj__JOp__OpCase kind)
{
        Aquaj__JOp *o = &x->ops[x->r.n_ops];

        aquaj__jop__init(o);
        o->op_case = kind;
        x->ptrs[x->r.n_ops++] = o;
        return o;
}

static char uuids[1024][48];

static void chunk(struct rec *x, uint64_t id, unsigned gpu, uint64_t lease)
{
        Aquaj__JChunk *c = &x->chunks[x->r.n_ops];

        aquaj__jchunk__init(c);
        c->id = id;
        c->producer = uuids[gpu];
        c->size = 2u << 20;
        c->client_ref = id;
        c->lease_id = lease;
        op(x, AQUAJ__JOP__OP_CHUNK_SET)->chunk_set = c;
}

static void lease(struct rec *x, uint64_t id, unsigned producer)
{
        aquaj__jlease__init(&x->lease);
        x->lease.id = id;
        x->lease.consumer = uuids[1023];
        x->lease.producer = uuids[producer];
        x->lease.created_ms = 1;
        op(x, AQUAJ__JOP__OP_LEASE_SET)->lease_set = &x->lease;
}

static void gpu(struct rec *x, unsigned g)
{
        aquaj__jgpu__init(&x->gpu);
        x->gpu.uuid = uuids[g];
        x->gpu.custody = true;
        x->gpu.holder_uid = 1000;
        op(x, AQUAJ__JOP__OP_GPU_SET)->gpu_set = &x->gpu;
}

static void commit(struct journal *j, struct rec *x, uint64_t *ret_ns)
{
        uint64_t t = now_ns();
        int r = journal_append(j, &x->r);

        if (r < 0) {
                fprintf(stderr, "bench-domain-scale: a commit failed: %s (%s)\n", strerror(-r),
                        journal_error(j));
                exit(1);
        }
        if (ret_ns)
                *ret_ns = now_ns() - t;
}

static struct journal_fence lead(struct etcd *e)
{
        struct etcd_kv *kv = NULL;
        int64_t l;
        size_t n = 0;

        if (etcd_lease_grant(e, 600, &l) < 0) {
                fprintf(stderr, "bench-domain-scale: etcd: %s\n", etcd_error(e));
                exit(1);
        }
        const struct etcd_op put = {.kind = ETCD_OP_PUT, .key = "/aqua/scale/leader",
                                    .value = "bench", .len = 5, .lease = l};
        if (etcd_txn(e, NULL, 0, &put, 1, NULL) != 1 ||
            etcd_range(e, "/aqua/scale/leader", false, &kv, &n, NULL) < 0 || n != 1) {
                fprintf(stderr, "bench-domain-scale: etcd: %s\n", etcd_error(e));
                exit(1);
        }
        struct journal_fence f = {.key = "/aqua/scale/leader", .revision = kv[0].create_revision,
                                  .lease = l};
        etcd_kvs_free(kv, n);
        return f;
}

/* Median ns of cycles borrow+return turns of per chunks against j. */
static uint64_t cycles(struct journal *j, struct rec *x, unsigned cycles, unsigned per,
                       uint64_t first_chunk, uint64_t lease_id)
{
        uint64_t *t = calloc(cycles, sizeof(*t)), m;

        for (unsigned k = 0; k < cycles; k++) {
                uint64_t a, b;
                rec_reset(x);
                lease(x, lease_id, 0);
                for (unsigned i = 0; i < per; i++)
                        chunk(x, first_chunk + i, 0, lease_id);
                commit(j, x, &a);
                rec_reset(x);
                op(x, AQUAJ__JOP__OP_LEASE_DEL)->lease_del = lease_id;
                for (unsigned i = 0; i < per; i++)
                        chunk(x, first_chunk + i, 0, 0);
                commit(j, x, &b);
                t[k] = a + b;
        }
        m = pct(t, cycles, 0.5);
        free(t);
        return m;
}

static int count(const Aquaj__JournalRecord *rec, void *userdata)
{
        (*(uint64_t *)userdata) += rec->n_ops;
        return 0;
}

int main(int argc, char **argv)
{
        unsigned gpus = 72, per_gpu = 10240, leases = 10000, n_cycles = 500;
        char *urls[1];
        struct etcd *e;
        struct journal *j, *file;
        struct journal_replay_stats st;
        struct etcd_stats es;
        struct rec x;
        char path[512];
        uint64_t *t, ops = 0, t0;

        if (argc < 3) {
                fprintf(stderr, "usage: bench-domain-scale ETCD_URL FOLDER [GPUS CHUNKS LEASES "
                                "CYCLES]\n");
                return 2;
        }
        if (argc >= 7) {
                gpus = (unsigned)atoi(argv[3]);
                per_gpu = (unsigned)atoi(argv[4]);
                leases = (unsigned)atoi(argv[5]);
                n_cycles = (unsigned)atoi(argv[6]);
        }
        if (gpus == 0 || gpus > 1000 || per_gpu == 0 || leases == 0) {
                fprintf(stderr, "bench-domain-scale: 1-1000 GPUs, and chunks and leases\n");
                return 2;
        }
        for (unsigned g = 0; g < 1024; g++)
                snprintf(uuids[g], sizeof(uuids[g]), "GPU-%08x-0000-0000-0000-%012x", g, g);
        urls[0] = argv[1];
        struct etcd_options o = {.urls = urls, .n_urls = 1, .timeout_ms = 5000};
        if (etcd_new(&o, &e) < 0)
                return 1;
        struct journal_fence f = lead(e);
        if (journal_open_etcd(e, "/aqua/scale/", &f, NULL, NULL, &j, NULL) < 0) {
                fprintf(stderr, "bench-domain-scale: etcd: %s\n", etcd_error(e));
                return 1;
        }
        rec_new(&x, per_gpu + 8);

        /* Every lender registers and offers all it lends, one turn each. */
        t = calloc(gpus > leases ? gpus : leases, sizeof(*t));
        for (unsigned g = 0; g < gpus; g++) {
                rec_reset(&x);
                gpu(&x, g);
                for (unsigned i = 0; i < per_gpu; i++)
                        chunk(&x, 1 + (uint64_t)g * per_gpu + i, g, 0);
                commit(j, &x, &t[g]);
        }
        printf("offer_commit_ms_p99=%.2f\n", (double)pct(t, gpus, 0.99) / 1e6);

        /* Leases over every lender's chunks, one borrow per turn. */
        uint64_t total = (uint64_t)gpus * per_gpu, per_lease = total / leases, next = 1;
        for (unsigned l = 0; l < leases; l++) {
                unsigned g = (unsigned)((next - 1) / per_gpu);
                rec_reset(&x);
                lease(&x, 1 + l, g);
                for (uint64_t i = 0; i < per_lease; i++)
                        chunk(&x, next + i, (unsigned)((next + i - 1) / per_gpu), 1 + l);
                next += per_lease;
                commit(j, &x, &t[l]);
        }
        printf("borrow_commit_ms_p50=%.2f\n", (double)pct(t, leases, 0.5) / 1e6);
        printf("borrow_commit_ms_p99=%.2f\n", (double)pct(t, leases, 0.99) / 1e6);
        etcd_stats(e, &es);
        printf("largest_request_bytes=%" PRIu64 "\n", es.largest_request);
        printf("state_bytes=%" PRIu64 "\n", journal_size(j));
        journal_free(j);

        /* A new leader's read of all of it. */
        t0 = now_ns();
        if (journal_open_etcd(e, "/aqua/scale/", &f, count, &ops, &j, &st) < 0) {
                fprintf(stderr, "bench-domain-scale: reading back: %s\n", etcd_error(e));
                return 1;
        }
        printf("read_s=%.2f\n", (double)(now_ns() - t0) / 1e9);
        printf("state_keys=%" PRIu64 "\n", st.records);
        printf("state_chunks_and_objects=%" PRIu64 "\n", ops);

        /* A borrow+return of one chunk, etcd against the file journal, same run. */
        snprintf(path, sizeof(path), "%s/journal", argv[2]);
        if (journal_open(path, NULL, NULL, &file, NULL) < 0) {
                fprintf(stderr, "bench-domain-scale: cannot open %s\n", path);
                return 1;
        }
        uint64_t free_chunk = (uint64_t)gpus * per_gpu + 1;
        rec_reset(&x);
        chunk(&x, free_chunk, 0, 0);
        commit(j, &x, NULL);
        commit(file, &x, NULL);
        printf("cycle_etcd_us=%.0f\n",
               (double)cycles(j, &x, n_cycles, 1, free_chunk, leases + 1) / 1e3);
        printf("cycle_file_us=%.0f\n",
               (double)cycles(file, &x, n_cycles, 1, free_chunk, leases + 1) / 1e3);
        etcd_stats(e, &es);
        printf("largest_request_bytes_all=%" PRIu64 "\n", es.largest_request);
        journal_free(file);
        journal_free(j);
        etcd_free(e);
        free(t);
        return 0;
}
