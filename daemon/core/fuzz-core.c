/*
 * Fuzz harness for the broker core without any I/O: each input is a script of operations on a
 * fresh pool, with two producers and two consumers, doing what the transport would do between
 * them (delivering reclaim notices, answering scrub requests, undoing grants it could not
 * send). No sockets, no wire protocol: chunk handles are duplicates of one memfd. After every
 * step the pool's books must add up; once every GPU's client is gone the pool must be empty and
 * every handle it was given closed.
 *
 * Step: 3 bytes, op, a, b. op % 11 picks the operation, a & 3 the GPU (0, 1 producers GPU-P0,
 * GPU-P1; 2, 3 consumers GPU-C0, GPU-C1), b its arguments (see step()). AQUA_FUZZ_VERBOSE=1
 * logs what the core does with an input.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker-private.h"
#include "broker.h"
#include "log.h"
#include "time-util.h"

#define MiB        (UINT64_C(1) << 20)
#define GPUS       4
#define MAX_SCRUBS 64

/* The pool never looks inside a client: these only give each GPU's registration an owner. */
struct client {
        int index;
};

struct fuzz {
        struct broker *broker;
        struct client clients[GPUS];
        struct gpu *gpus[GPUS]; /* registered, NULL when its client is gone */
        uint64_t scrubs[GPUS][MAX_SCRUBS];
        size_t n_scrubs[GPUS];
        uint64_t now_ns;
};

static const char *const names[GPUS] = {"GPU-P0", "GPU-P1", "GPU-C0", "GPU-C1"};
static int memfd = -1;
static int max_fd = -1; /* the highest descriptor a chunk handle ever had */

static const struct broker_settings settings = {
    .dram_budget = 16 * MiB,
    .reclaim_deadline_ns = NSEC_PER_SEC,
    .reconcile_timeout_ns = NSEC_PER_SEC,
    .max_chunks = 64,
    .max_leases = 8,
    .max_grant_chunks = 8,
    .auto_pairing = true,
    .scrub = true,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static _Noreturn void die(const char *when, const char *why)
{
        fprintf(stderr, "fuzz-core: %s: %s\n", when, why);
        abort();
}

/* Handles of chunks still open: duplicates of memfd, less memfd itself. */
static int count_chunk_fds(void)
{
        struct stat base, st;
        int n = 0;

        if (fstat(memfd, &base) < 0)
                return -1;
        for (int fd = 0; fd <= max_fd; fd++)
                if (fd != memfd && fstat(fd, &st) == 0 && st.st_ino == base.st_ino &&
                    st.st_dev == base.st_dev)
                        n++;
        return n;
}

static bool is_producer(size_t k)
{
        return k < 2;
}

/* The n-th lease of a consumer (wrapping), or NULL when it has none. */
static struct lease *nth_lease(struct gpu *g, size_t n)
{
        size_t count = g ? list_length(&g->leases) : 0;
        struct list_node *pos;

        if (!count)
                return NULL;
        pos = g->leases.next;
        for (n %= count; n > 0; n--)
                pos = pos->next;
        return list_entry(pos, struct lease, consumer_node);
}

/* What the transport does with the notices the core queued: a reclaim notice reaches its
 * consumer (its deadline starts), a scrub request is remembered for the producer to answer. */
static void deliver_notices(struct fuzz *f)
{
        struct list_node taken = LIST_HEAD_INIT(taken), *pos, *tmp;

        broker_take_notices(f->broker, &taken);
        list_for_each(pos, tmp, &taken)
        {
                struct notice *m = list_entry(pos, struct notice, node);

                if (m->kind == NOTICE_RECLAIM && m->gpu->owner)
                        broker_reclaim_delivered(f->broker, m->lease_id, m->chunk_ids,
                                                 m->n_chunk_ids, m->deadline_ms);
                if (m->kind == NOTICE_SCRUB && m->gpu->owner) {
                        size_t k = (size_t)m->gpu->owner->index;

                        for (size_t i = 0; i < m->n_chunk_ids && f->n_scrubs[k] < MAX_SCRUBS; i++)
                                f->scrubs[k][f->n_scrubs[k]++] = m->chunk_ids[i];
                }
                notice_free(m);
        }
}

static void hello(struct fuzz *f, size_t k, uint8_t b)
{
        struct broker_link links[GPUS - 1];
        struct broker_welcome w = {0};
        struct broker_identity who = {.uid = 1000};
        struct broker_hello h = {
            .who = &who,
            .uuid = names[k],
            .role = is_producer(k) ? GPU_ROLE_PRODUCER : GPU_ROLE_CONSUMER,
            .ordinal = (uint32_t)k,
            .capacity = 64 * MiB,
            .granularity = 2 * MiB,
            .client_name = names[k],
            .pid = 1,
            .links = links,
        };
        char err[BROKER_ERR_MAX];

        if (f->gpus[k])
                return;
        if (b & 1)
                h.role = GPU_ROLE_NEUTRAL;
        for (size_t i = 0; i < GPUS; i++)
                if (i != k)
                        links[h.n_links++] =
                            (struct broker_link){.uuid = names[i], .bandwidth = (b & 2) ? 0 : 400};
        if (broker_register(f->broker, &h, &f->clients[k], &w, err) == 0)
                f->gpus[k] = w.gpu;
        free(w.lost_leases);
}

static void gone(struct fuzz *f, size_t k)
{
        if (!f->gpus[k])
                return;
        broker_gpu_gone(f->broker, f->gpus[k]);
        f->gpus[k] = NULL;
        f->n_scrubs[k] = 0;
}

static void offer(struct fuzz *f, size_t k, uint8_t b)
{
        size_t n = (b & 3) + 1;
        uint64_t sizes[4], refs[4], ids[4];
        int fds[4];
        char err[BROKER_ERR_MAX];

        if (!f->gpus[k])
                return;
        for (size_t i = 0; i < n; i++) {
                sizes[i] = (b & 4) && i == 0 ? MiB : 2 * MiB * (1 + ((b >> 3) & 1));
                refs[i] = i;
                fds[i] = dup(memfd);
                if (fds[i] < 0)
                        die("offer", "cannot dup");
                max_fd = MAX(max_fd, fds[i]);
        }
        if (broker_offer(f->broker, f->gpus[k], sizes, refs, fds, NULL, n, ids, err) != 0) {
                for (size_t i = 0; i < n; i++)
                        close(fds[i]);
                return;
        }
        /* The record could not be written: the transport takes the offer back. */
        if (b & 0x80)
                broker_undo_offer(f->broker, ids, n);
}

static void borrow(struct fuzz *f, size_t k, uint8_t b)
{
        uint64_t bytes = ((b & 7) + 1) * 2 * MiB;
        struct broker_grant g;
        char err[BROKER_ERR_MAX];

        if (!f->gpus[k])
                return;
        if (broker_borrow(f->broker, f->gpus[k], bytes, (b & 8) ? bytes : 0, b & 0x10, &g, err) !=
            0)
                return;
        /* The grant's record or descriptors could not go out: the transport undoes it. */
        if (b & 0x80)
                broker_undo_grant(f->broker, f->gpus[k], &g);
}

static void give_back(struct fuzz *f, size_t k, uint8_t b, bool unusable)
{
        struct gpu *g = f->gpus[k];
        struct lease *l = nth_lease(g, b >> 4);
        uint64_t ids[2] = {0, 999};
        size_t n = 0;
        char err[BROKER_ERR_MAX];

        if (!g)
                return;
        if (l && (b & 1) && !list_empty(&l->chunks))
                ids[n++] = list_entry(l->chunks.next, struct chunk, lease_node)->id;
        if (b & 2)
                n = 2; /* one id the lease does not have */
        if (unusable) {
                if (l)
                        (void)broker_return_unusable(f->broker, g, l->id, ids, n, err);
                return;
        }
        (void)broker_return(f->broker, g,
                            l         ? l->id
                            : (b & 4) ? 4242
                                      : 0,
                            ids, l ? n : 0, (b & 8) ? g->dram_bytes : 0, NULL, err);
}

static void reclaim(struct fuzz *f, size_t k, uint8_t b)
{
        struct broker_reclaim r = {0};
        char err[BROKER_ERR_MAX];

        if (!f->gpus[k])
                return;
        (void)broker_reclaim(f->broker, f->gpus[k], (b & 7) * 2 * MiB, b & 8, b & 0x10,
                             "producer load", &r, err);
        broker_reclaim_clear(&r);
}

static void scrub_done(struct fuzz *f, size_t k, uint8_t b)
{
        uint64_t good[MAX_SCRUBS + 1], bad[MAX_SCRUBS];
        size_t n_good = 0, n_bad = 0;
        char err[BROKER_ERR_MAX];

        if (!f->gpus[k])
                return;
        for (size_t i = 0; i < f->n_scrubs[k]; i++) {
                if ((b >> (i % 8)) & 1)
                        bad[n_bad++] = f->scrubs[k][i];
                else
                        good[n_good++] = f->scrubs[k][i];
        }
        good[n_good++] = 777; /* not asked for: ignored */
        (void)broker_scrub_done(f->broker, f->gpus[k], good, n_good, bad, n_bad, NULL, err);
        f->n_scrubs[k] = 0;
}

static void admin(struct fuzz *f, size_t k, uint8_t b)
{
        struct broker_reclaim r = {0};
        char err[BROKER_ERR_MAX];

        switch (b % 7) {
        case 0:
                (void)broker_admin_reclaim(f->broker, names[k], (b >> 3) * 2 * MiB, &r, err);
                break;
        case 1:
                (void)broker_admin_drain(f->broker, names[k], &r, err);
                break;
        case 5:
                (void)broker_admin_undrain(f->broker, names[k], err);
                break;
        case 2:
                (void)broker_admin_release(f->broker, names[k], b & 4, NULL, err);
                break;
        case 3:
                (void)broker_pin(f->broker, names[k & 1], names[2 + ((b >> 3) & 1)], err);
                break;
        case 4:
                (void)broker_unpin(f->broker, names[k], err);
                break;
        default:
                (void)broker_recompute_pairs(f->broker);
                break;
        }
        broker_reclaim_clear(&r);
}

static void step(struct fuzz *f, uint8_t op, uint8_t a, uint8_t b)
{
        size_t k = a & 3;

        switch (op % 11) {
        case 0:
                hello(f, k, b);
                break;
        case 1:
                gone(f, k);
                break;
        case 2:
                offer(f, k, b);
                break;
        case 3:
                borrow(f, k, b);
                break;
        case 4:
                give_back(f, k, b, false);
                break;
        case 5:
                give_back(f, k, b, true);
                break;
        case 6:
                reclaim(f, k, b);
                break;
        case 7:
                f->now_ns += b * 100 * NSEC_PER_MSEC;
                broker_tick(f->broker, f->now_ns);
                break;
        case 8:
                scrub_done(f, k, b);
                break;
        default:
                admin(f, k, b);
                break;
        }
        /* What the transport does before any reply: commit (here: nothing persists). */
        (void)broker_commit(f->broker);
        deliver_notices(f);
        log_debug("op %u GPU %zu arg 0x%02x: %zu GPUs, %zu chunks, %zu leases, %" PRIu64
                  " bytes of DRAM",
                  op % 11, k, b, f->broker->n_gpus, f->broker->n_chunks, f->broker->n_leases,
                  f->broker->dram_granted);
}

static void check(struct fuzz *f, const char *when)
{
        char err[BROKER_ERR_MAX];

        if (broker_check(f->broker, err) != 0)
                die(when, err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct fuzz f = {.now_ns = now_mono_ns()};
        char err[BROKER_ERR_MAX];
        int n;

        if (memfd < 0) {
                log_setup("fuzz-core",
                          getenv("AQUA_FUZZ_VERBOSE") ? LOG_LEVEL_DEBUG : LOG_LEVEL_ERROR);
                memfd = memfd_create("chunk", MFD_CLOEXEC);
                if (memfd < 0)
                        die("setup", "cannot create a memfd");
        }
        if (broker_new(&settings, &f.broker) < 0)
                die("setup", "cannot create a pool");
        for (size_t i = 0; i < GPUS; i++)
                f.clients[i].index = (int)i;
        for (; size >= 3; data += 3, size -= 3) {
                step(&f, data[0], data[1], data[2]);
                check(&f, "after a step");
        }
        /* Every deadline passes, then every client goes away. */
        f.now_ns += UINT64_C(3600) * NSEC_PER_SEC;
        broker_tick(f.broker, f.now_ns);
        deliver_notices(&f);
        check(&f, "after the deadlines");
        for (size_t i = 0; i < GPUS; i++) {
                gone(&f, i);
                deliver_notices(&f);
        }
        check(&f, "after every client left");
        if (f.broker->n_chunks || f.broker->n_leases || f.broker->dram_granted) {
                snprintf(err, sizeof(err), "%zu chunks, %zu leases, %" PRIu64 " bytes of DRAM",
                         f.broker->n_chunks, f.broker->n_leases, f.broker->dram_granted);
                die("the pool is not empty after every client left", err);
        }
        n = count_chunk_fds();
        if (n != 0) {
                snprintf(err, sizeof(err), "%d chunk handles open, none expected", n);
                die("descriptors leaked", err);
        }
        broker_free(f.broker);
        return 0;
}
