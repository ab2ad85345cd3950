/*
 * Custody as an invariant. Six identities (two processes of one uid, a producer's, uid nobody
 * that never had a GPU, two CURVE keys of one user) register GPUs at random, with and without
 * the secrets they were given; they borrow, return, answer reclaims or stay silent, die and come
 * back as new processes; links are cut; an operator releases, with --force only where it is
 * true; aquad restarts from its journal. After every step no chunk that one identity maps is
 * granted to, scrubbed for or handed back to anyone, and the books add up.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "broker-private.h"
#include "time-util.h"

#define MiB      (UINT64_C(1) << 20)
#define IDS      6
#define GPUS     3 /* GPU-P (a producer), GPU-A and GPU-B (consumers) */
#define MAX_MAPS 512
#define E(name)  BROKER_E_##name

struct client {
        int ident, gpu;
};

struct ident {
        struct broker_identity who;
        bool alive;                           /* its process runs (a remote one: its host) */
        bool has_secret[GPUS];                /* what Welcomes gave this process */
        uint8_t secret[GPUS][BROKER_SECRET_LEN];
        bool reclaim_asked[GPUS];             /* a reclaim notice it has not answered */
};

/* What an identity maps: a chunk of a lease it was granted through a GPU. */
struct map {
        uint64_t chunk, lease;
        int ident, gpu;
};

static const char *const names[GPUS] = {"GPU-P", "GPU-A", "GPU-B"};
static struct ident ids[IDS];
static struct client clients[IDS][GPUS];
static struct gpu *reg[GPUS]; /* connected registration, NULL: none */
static int owner_of[GPUS];
static struct map maps[MAX_MAPS];
static size_t n_maps;
static struct broker *pool;
static char dir[64], journal_path[128];
static int memfd = -1;
static uint64_t rng, clock_ns, violations, steps, next_pid = 100;
static char why[512];

static const struct broker_settings settings = {
    .dram_budget = 8 * MiB,
    .reclaim_deadline_ns = NSEC_PER_SEC,
    .reconcile_timeout_ns = NSEC_PER_SEC,
    .max_chunks = 64,
    .max_leases = 16,
    .max_grant_chunks = 8,
    .auto_pairing = true,
    .scrub = true,
};

static uint64_t next(void)
{
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
}

static void violation(const char *fmt, const char *detail, uint64_t id)
{
        if (!violations++)
                snprintf(why, sizeof(why), "step %llu: %s %s %llu", (unsigned long long)steps, fmt,
                         detail, (unsigned long long)id);
}

/* Whether w names identity k as it is now (its current process). */
static bool is_ident(const struct broker_identity *w, int k)
{
        const struct broker_identity *x = &ids[k].who;

        if (w->remote != x->remote)
                return false;
        if (w->remote)
                return strcmp(w->key, x->key) == 0;
        return w->uid == x->uid && w->process.pid == x->process.pid &&
               w->process.start_time == x->process.start_time;
}

static enum proc_liveness liveness(const struct proc_id *id)
{
        if (!id->pid)
                return PROC_UNKNOWN;
        for (int k = 0; k < IDS; k++)
                if (!ids[k].who.remote && ids[k].who.process.pid == id->pid)
                        return ids[k].alive ? PROC_ALIVE : PROC_GONE;
        return PROC_GONE; /* a process that was and is no more */
}

static void new_process(int k)
{
        struct ident *i = &ids[k];

        memset(i->has_secret, 0, sizeof(i->has_secret));
        memset(i->reclaim_asked, 0, sizeof(i->reclaim_asked));
        i->alive = true;
        if (!i->who.remote)
                i->who.process = (struct proc_id){.pid = (pid_t)next_pid++,
                                                  .start_time = next_pid * 7,
                                                  .boot_id = "00000000-0000-0000-0000-000000000001"};
}

static void setup_idents(void)
{
        static const uid_t uids[4] = {1000, 1001, 1001, 65534};

        memset(ids, 0, sizeof(ids));
        for (int k = 0; k < IDS; k++) {
                if (k < 4)
                        ids[k].who.uid = uids[k];
                else {
                        ids[k].who.remote = true;
                        ids[k].who.uid = 0;
                        snprintf(ids[k].who.key, sizeof(ids[k].who.key), "%s",
                                 k == 4 ? "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"
                                        : "D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%wOTJ%JR%cs");
                }
                new_process(k);
                for (int g = 0; g < GPUS; g++)
                        clients[k][g] = (struct client){k, g};
        }
}

static void map_drop(size_t i)
{
        maps[i] = maps[--n_maps];
}

/* The GPU registration whose serial is s, or NULL. */
static struct gpu *by_serial(uint64_t s)
{
        for (int g = 0; g < GPUS; g++)
                if (reg[g] && reg[g]->serial == s)
                        return reg[g];
        return NULL;
}

static void check_invariant(void)
{
        char err[BROKER_ERR_MAX];

        if (broker_check(pool, err))
                violation("books:", err, 0);
        for (size_t i = 0; i < n_maps; i++) {
                struct chunk *c = broker_find_chunk(pool, maps[i].chunk);
                int k = maps[i].ident;

                if (!c)
                        continue; /* out of the pool: nobody can be given it */
                if (c->lease) {
                        const struct gpu *g = c->lease->consumer;
                        if (!g->custody.held || !is_ident(&g->custody.who, k))
                                violation("a mapped chunk is leased to another identity:",
                                          g->uuid, c->id);
                        continue;
                }
                if (c->scrubbing)
                        violation("a mapped chunk is being scrubbed:", names[maps[i].gpu], c->id);
                if (chunk_grantable(c)) {
                        const struct gpu *last = c->dirty ? by_serial(c->dirty_for) : NULL;
                        if (!c->dirty)
                                violation("a mapped chunk is clean and grantable:", "", c->id);
                        else if (last && !(last->custody.held && is_ident(&last->custody.who, k)))
                                violation("a mapped chunk is grantable to another as its own:",
                                          last->uuid, c->id);
                }
        }
}

static bool mapped(uint64_t chunk)
{
        for (size_t i = 0; i < n_maps; i++)
                if (maps[i].chunk == chunk)
                        return true;
        return false;
}

/* Notices: a scrub request or a hand-back of a chunk someone maps is a violation; a scrub
 * request is done at once by the producer that got it; a reclaim is remembered. */
static void deliver(void)
{
        struct list_node taken = LIST_HEAD_INIT(taken), *pos, *tmp;

        broker_take_notices(pool, &taken);
        list_for_each(pos, tmp, &taken)
        {
                struct notice *m = list_entry(pos, struct notice, node);

                for (size_t i = 0; i < m->n_chunk_ids; i++) {
                        if (m->kind == NOTICE_SCRUB && mapped(m->chunk_ids[i]))
                                violation("a scrub of a mapped chunk asked of", m->gpu->uuid,
                                          m->chunk_ids[i]);
                        if (m->kind == NOTICE_RECLAIMED && mapped(m->chunk_ids[i]))
                                violation("a mapped chunk handed back to", m->gpu->uuid,
                                          m->chunk_ids[i]);
                }
                if (m->kind == NOTICE_RECLAIM && m->gpu->owner) {
                        broker_reclaim_delivered(pool, m->lease_id, m->chunk_ids, m->n_chunk_ids,
                                                 m->deadline_ms);
                        ids[m->gpu->owner->ident].reclaim_asked[m->gpu->owner->gpu] = true;
                }
                if (m->kind == NOTICE_SCRUB && m->gpu->owner && m->gpu->owner->gpu == 0)
                        (void)broker_scrub_done(pool, m->gpu, m->chunk_ids, m->n_chunk_ids, NULL,
                                                0, NULL, NULL);
                notice_free(m);
        }
        (void)broker_commit(pool);
}

static void hello(int k, int g, bool with_secret)
{
        struct broker_held held[64];
        int fds[64];
        size_t n = 0;
        struct broker_welcome w = {0};
        struct broker_link links[GPUS];
        struct broker_hello h = {
            .who = &ids[k].who,
            .secret = with_secret && ids[k].has_secret[g] ? ids[k].secret[g] : NULL,
            .uuid = names[g],
            .role = g == 0 ? GPU_ROLE_PRODUCER : GPU_ROLE_CONSUMER,
            .granularity = 2 * MiB,
            .client_name = names[g],
            .pid = ids[k].who.process.pid,
            .process = ids[k].who.remote ? NULL : &ids[k].who.process,
            .links = links,
            .fabric = ids[k].who.remote,
        };
        struct gpu *known = broker_find_gpu(pool, names[g]);
        char err[BROKER_ERR_MAX];

        if (!ids[k].alive || (reg[g] && owner_of[g] == k && reg[g]->owner == &clients[k][g]))
                return;
        for (int i = 0; i < GPUS; i++)
                if (i != g)
                        links[h.n_links++] = (struct broker_link){.uuid = names[i], .bandwidth = 400};
        /* What it says it holds: a consumer what it maps through this GPU; a producer the
         * chunks aquad has of it (their handles again). */
        if (g != 0)
                for (size_t i = 0; i < n_maps && n < 64; i++)
                        if (maps[i].ident == k && maps[i].gpu == g)
                                held[n++] = (struct broker_held){
                                    .chunk_id = maps[i].chunk, .size = 2 * MiB,
                                    .lease_id = maps[i].lease};
        if (g == 0 && known && h.secret)
                for (struct list_node *x = known->chunks.next; x != &known->chunks && n < 64;
                     x = x->next) {
                        struct chunk *c = list_entry(x, struct chunk, producer_node);
                        if (c->orphan)
                                continue;
                        fds[n] = dup(memfd);
                        held[n++] = (struct broker_held){.chunk_id = c->id, .size = c->size};
                }
        h.held = held;
        h.n_held = n;
        h.held_fds = g == 0 && !ids[k].who.remote ? fds : NULL;
        if (g == 0 && ids[k].who.remote)
                h.n_held = 0; /* no fabric handles here */
        if (broker_register(pool, &h, &clients[k][g], &w, err) == 0) {
                /* An earlier connection it replaced (w.replaced) is simply forgotten. */
                reg[g] = w.gpu;
                owner_of[g] = k;
                if (w.new_secret) {
                        memcpy(ids[k].secret[g], w.secret, BROKER_SECRET_LEN);
                        ids[k].has_secret[g] = true;
                }
        } else if (reg[g] && reg[g]->owner == NULL)
                reg[g] = NULL;
        for (size_t i = 0; g == 0 && !ids[k].who.remote && i < n; i++)
                if (fds[i] >= 0)
                        close(fds[i]);
        free(w.lost_leases);
}

static void offer(void)
{
        uint64_t sizes[4], refs[4], out[4];
        int fds[4];
        size_t n = 1 + next() % 4;
        char err[BROKER_ERR_MAX];

        if (!reg[0] || reg[0]->fabric)
                return;
        for (size_t i = 0; i < n; i++) {
                sizes[i] = 2 * MiB;
                refs[i] = i;
                fds[i] = dup(memfd);
        }
        if (broker_offer(pool, reg[0], sizes, refs, fds, NULL, n, out, err) != 0)
                for (size_t i = 0; i < n; i++)
                        close(fds[i]);
}

static void borrow(int g)
{
        struct broker_grant grant;
        char err[BROKER_ERR_MAX];
        int k = owner_of[g];

        if (!reg[g])
                return;
        if (broker_borrow(pool, reg[g], (1 + next() % 4) * 2 * MiB, 0, false, &grant, err) != 0 ||
            !grant.lease)
                return;
        for (struct list_node *x = grant.lease->chunks.next; x != &grant.lease->chunks;
             x = x->next) {
                struct chunk *c = list_entry(x, struct chunk, lease_node);
                for (size_t i = 0; i < n_maps; i++)
                        if (maps[i].chunk == c->id && maps[i].ident != k)
                                violation("granted a chunk another identity maps to",
                                          reg[g]->uuid, c->id);
                if (n_maps < MAX_MAPS)
                        maps[n_maps++] =
                            (struct map){.chunk = c->id, .lease = grant.lease->id, .ident = k,
                                         .gpu = g};
        }
}

/* The holder gives back what it maps through g: all of it, or what it was asked for. */
static void give_back(int g, bool asked_only)
{
        char err[BROKER_ERR_MAX];
        int k = owner_of[g];

        if (!reg[g] || (asked_only && !ids[k].reclaim_asked[g]))
                return;
        ids[k].reclaim_asked[g] = false;
        for (size_t i = n_maps; i-- > 0;) {
                struct chunk *c;

                if (maps[i].ident != k || maps[i].gpu != g)
                        continue;
                c = broker_find_chunk(pool, maps[i].chunk);
                if (asked_only && c && c->state != CHUNK_RECLAIMING)
                        continue;
                /* Unmapped first, then returned: the order libaqua keeps. */
                uint64_t lease = maps[i].lease, chunk = maps[i].chunk;
                map_drop(i);
                (void)broker_return(pool, reg[g], lease, &chunk, 1, 0, NULL, err);
        }
}

static void restart(void)
{
        struct journal *j = NULL;

        (void)broker_commit(pool);
        pool = broker_free(pool);
        memset(reg, 0, sizeof(reg));
        cr_assert_eq(broker_new(&settings, &pool), 0);
        pool->settings.liveness = liveness;
        cr_assert_eq(journal_open(journal_path, broker_apply, pool, &j, NULL), 0);
        broker_attach_journal(pool, j, 1 << 16);
}

/* k's process dies (a remote one: its host): its connections close, its mappings go. */
static void die(int k)
{
        for (int g = 0; g < GPUS; g++)
                if (reg[g] && owner_of[g] == k && reg[g]->owner == &clients[k][g]) {
                        if (ids[k].who.remote)
                                broker_gpu_detach(pool, reg[g]); /* no EOF across hosts */
                        else
                                broker_gpu_gone(pool, reg[g]);
                        reg[g] = NULL;
                }
        for (size_t i = n_maps; i-- > 0;)
                if (maps[i].ident == k)
                        map_drop(i);
        ids[k].alive = false;
}

static void cut(int g)
{
        if (reg[g] && ids[owner_of[g]].who.remote) {
                broker_gpu_detach(pool, reg[g]);
                reg[g] = NULL;
        }
}

/* An operator releases g; --force only where it is true (a remote holder that is gone) or where
 * aquad quarantines (a local holder that runs). */
static void release(int g)
{
        struct gpu *x = broker_find_gpu(pool, names[g]);
        char err[BROKER_ERR_MAX];
        bool force = next() & 1;

        if (!x || x->owner)
                return;
        if (force && x->custody.held && x->custody.who.remote)
                for (int k = 0; k < IDS; k++)
                        if (is_ident(&x->custody.who, k) && ids[k].alive)
                                force = false; /* the operator's word would be wrong */
        (void)broker_release(pool, x, force, NULL, err);
}

static void step(void)
{
        int k = (int)(next() % IDS), g = (int)(next() % GPUS);

        switch (next() % 14) {
        case 0:
        case 1:
        case 2:
                hello(k, g, next() % 4 != 0);
                break;
        case 3:
                offer();
                break;
        case 4:
        case 5:
                borrow(1 + (int)(next() % 2));
                break;
        case 6:
                give_back(g, false);
                break;
        case 7:
                give_back(g, true);
                break;
        case 8:
                if (next() % 3 == 0)
                        restart();
                break;
        case 9:
                cut(g);
                break;
        case 10:
                if (next() % 3 == 0)
                        die(k);
                else if (!ids[k].alive)
                        new_process(k);
                break;
        case 11:
                release(g);
                break;
        case 12: {
                struct broker_reclaim r = {0};
                char err[BROKER_ERR_MAX];
                if (reg[0])
                        (void)broker_reclaim(pool, reg[0], 2 * MiB * (1 + next() % 4), false,
                                             false, "load", &r, err);
                broker_reclaim_clear(&r);
                break;
        }
        default:
                clock_ns += NSEC_PER_SEC / 2;
                broker_tick(pool, now_mono_ns() + clock_ns);
                break;
        }
        deliver();
        check_invariant();
        steps++;
}

Test(custody, no_identity_ever_gets_what_another_maps, .timeout = 300)
{
        const char *env = getenv("AQUA_CUSTODY_RUNS");
        int runs = env ? atoi(env) : 60;
        struct journal *j = NULL;

        memfd = memfd_create("chunk", MFD_CLOEXEC);
        cr_assert_geq(memfd, 0);
        cr_assert_eq(ftruncate(memfd, 2 * MiB), 0);
        for (int run = 0; run < runs; run++) {
                snprintf(dir, sizeof(dir), "/tmp/test-custody-XXXXXX");
                cr_assert_not_null(mkdtemp(dir));
                snprintf(journal_path, sizeof(journal_path), "%s/journal", dir);
                rng = 0x9e3779b97f4a7c15ull * (uint64_t)(run + 1);
                setup_idents();
                memset(reg, 0, sizeof(reg));
                n_maps = 0;
                clock_ns = 0;
                cr_assert_eq(broker_new(&settings, &pool), 0);
                pool->settings.liveness = liveness;
                cr_assert_eq(journal_open(journal_path, NULL, NULL, &j, NULL), 0);
                broker_attach_journal(pool, j, 1 << 16);
                for (int s = 0; s < 400; s++)
                        step();
                pool = broker_free(pool);
                char cmd[128];
                snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
                cr_assert_eq(system(cmd), 0);
        }
        cr_log_info("custody: %llu steps over %d runs, %llu violations",
                    (unsigned long long)steps, runs, (unsigned long long)violations);
        cr_assert_eq(violations, 0, "%llu violations; the first: %s",
                     (unsigned long long)violations, why);
        close(memfd);
}
