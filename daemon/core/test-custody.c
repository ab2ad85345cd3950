/*
 * Custody as an invariant. Eight identities (two processes of one uid, a producer's, uid nobody
 * that never had a GPU, two CURVE keys of one user, a stranger of another tenant, root) register
 * GPUs at random, with and without the secrets they were given; they borrow, return, answer
 * reclaims or stay silent, die and come back as new processes; one claims a GPU it may not use;
 * links are cut; an operator releases, with --force only where it is true; pins are set between
 * whoever holds the GPUs;
 * aquad restarts from its journal. After every step no chunk that one identity maps is granted
 * to, scrubbed for or handed back to anyone, no chunk leased to a consumer is memory a lender of
 * another tenant offered (root lends to all), and the books add up.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "broker-private.h"
#include "broker.h"
#include "time-util.h"

#define MiB      (UINT64_C(1) << 20)
#define IDS      8
#define GPUS     3 /* GPU-P (a producer), GPU-A and GPU-B (consumers) */
#define MAX_MAPS 512
#define E(name)  BROKER_E_##name

struct client {
        int ident, gpu;
};

/* The identities by role. */
enum {
        PRODUCER,
        TENANT,
        NEIGHBOUR /* same uid, another process */,
        NOBODY,
        KEY,
        OTHER_KEY,
        STRANGER /* a tenant of its own (uid 1002), which would read what it lends */,
        ROOT /* reads any memory already: lends to every tenant */,
};

/* The config's tenant "team": the producer's user, the tenant's uid and both keys. The others
 * are tenants of their own. */
static const char *tenant_of_ident(int k)
{
        static const char *const t[IDS] = {"team",     "team",     "team",      "user:65534",
                                           "team",     "team",     "user:1002", "user:0"};
        return t[k];
}

/* Whether identity k may use GPU g on its host (the device node the host lets it open): nobody
 * may not use the producer's GPU, and claims it all the same (an impostor). */
static bool may_use(int k, int g)
{
        return !(k == NOBODY && g == 0);
}

#define MAX_OFFERED 4096
/* Who offered each chunk (by id, which the pool never reuses): whose memory it is. */
static int offered_by[MAX_OFFERED];

struct ident {
        struct broker_identity who;
        bool alive;            /* its process runs (a remote one: its host) */
        bool has_secret[GPUS]; /* what Welcomes gave this process */
        uint8_t secret[GPUS][BROKER_SECRET_LEN];
        bool reclaim_asked[GPUS]; /* a reclaim notice it has not answered */
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
static struct broker *broker;
static char dir[64], journal_path[128];
static int memfd = -1;
static uint64_t rng, clock_ns, violations, steps, next_pid = 100;
static char why[512];
static uint8_t fabric_handles[4 * BROKER_FABRIC_HANDLE_SIZE]; /* a remote producer's */
static size_t scrubs_asked, handed_back; /* chunks in ScrubRequests and Reclaimed notices */
/* What the random runs did, so that a run that tries nothing shows. */
static struct {
        uint64_t hellos, refused, impostors, grants, remote_grants, restarts, cuts, deaths,
            releases, quarantined;
} tally;

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
        if (getenv("AQUA_CUSTODY_TRACE"))
                fprintf(stderr, "step %llu: violation: %s %s %llu\n", (unsigned long long)steps,
                        fmt, detail, (unsigned long long)id);
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
                i->who.process =
                    (struct proc_id){.pid = (pid_t)next_pid++,
                                     .start_time = next_pid * 7,
                                     .boot_id = "00000000-0000-0000-0000-000000000001"};
}

static void setup_idents(void)
{
        static const uid_t uids[IDS] = {1000, 1001, 1001, 65534, 0, 0, 1002, 0};

        memset(ids, 0, sizeof(ids));
        for (int k = 0; k < IDS; k++) {
                /* As the transport gives them: a tenant the config names, else none. */
                if (strcmp(tenant_of_ident(k), "team") == 0)
                        snprintf(ids[k].who.tenant, sizeof(ids[k].who.tenant), "team");
                ids[k].who.lends_to_all = k == ROOT;
                if (k != KEY && k != OTHER_KEY)
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

/* The identity w names as it is now, or -1. */
static int ident_of(const struct broker_identity *w)
{
        for (int k = 0; k < IDS; k++)
                if (is_ident(w, k))
                        return k;
        return -1;
}

static void check_invariant(void)
{
        char err[BROKER_ERR_MAX];

        if (broker_check(broker, err))
                violation("books:", err, 0);
        /* Tenancy: what a consumer is leased is memory of a lender of its tenant, or root's. */
        for (struct list_node *x = broker->leases.next; x != &broker->leases; x = x->next) {
                struct lease *l = list_entry(x, struct lease, broker_node);
                int c = l->consumer->custody.held ? ident_of(&l->consumer->custody.who) : -1;

                for (struct list_node *y = l->chunks.next; y != &l->chunks; y = y->next) {
                        struct chunk *ch = list_entry(y, struct chunk, lease_node);
                        int p = ch->id < MAX_OFFERED ? offered_by[ch->id] : -1;

                        if (c < 0 || p < 0)
                                continue; /* a holder gone: nobody maps it through this lease */
                        if (p != ROOT && strcmp(tenant_of_ident(p), tenant_of_ident(c)) != 0)
                                violation("a chunk in another tenant's memory is leased to",
                                          l->consumer->uuid, ch->id);
                }
        }
        for (size_t i = 0; i < n_maps; i++) {
                struct chunk *c = broker_find_chunk(broker, maps[i].chunk);
                int k = maps[i].ident;

                if (!c)
                        continue; /* out of the pool: nobody can be given it */
                if (c->lease) {
                        const struct gpu *g = c->lease->consumer;
                        if (!g->custody.held || !is_ident(&g->custody.who, k))
                                violation("a mapped chunk is leased to another identity:", g->uuid,
                                          c->id);
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

        broker_take_notices(broker, &taken);
        list_for_each(pos, tmp, &taken)
        {
                struct notice *m = list_entry(pos, struct notice, node);

                scrubs_asked += m->kind == NOTICE_SCRUB ? m->n_chunk_ids : 0;
                handed_back += m->kind == NOTICE_RECLAIMED ? m->n_chunk_ids : 0;
                for (size_t i = 0; i < m->n_chunk_ids; i++) {
                        if (m->kind == NOTICE_SCRUB && mapped(m->chunk_ids[i]))
                                violation("a scrub of a mapped chunk asked of", m->gpu->uuid,
                                          m->chunk_ids[i]);
                        if (m->kind == NOTICE_RECLAIMED && mapped(m->chunk_ids[i]))
                                violation("a mapped chunk handed back to", m->gpu->uuid,
                                          m->chunk_ids[i]);
                }
                if (m->kind == NOTICE_RECLAIM && m->gpu->owner) {
                        broker_reclaim_delivered(broker, m->lease_id, m->chunk_ids, m->n_chunk_ids,
                                                 m->deadline_ms);
                        ids[m->gpu->owner->ident].reclaim_asked[m->gpu->owner->gpu] = true;
                }
                if (m->kind == NOTICE_SCRUB && m->gpu->owner && m->gpu->owner->gpu == 0)
                        (void)broker_scrub_done(broker, m->gpu, m->chunk_ids, m->n_chunk_ids, NULL,
                                                0, NULL, NULL);
                notice_free(m);
        }
        (void)broker_commit(broker);
}

static char last_err[BROKER_ERR_MAX];

/* k registers GPU g (presenting its secret if with_secret); the core's outcome. */
static int hello(int k, int g, bool with_secret)
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
            .evidence = may_use(k, g) ? BROKER_EVIDENCE_SHOWN : BROKER_EVIDENCE_MISSING,
            .evidence_why = "it passed no device node",
        };
        struct gpu *known = broker_find_gpu(broker, names[g]);
        int r;

        if (!ids[k].alive || (reg[g] && owner_of[g] == k && reg[g]->owner == &clients[k][g]))
                return -EALREADY;
        for (int i = 0; i < GPUS; i++)
                if (i != g)
                        links[h.n_links++] =
                            (struct broker_link){.uuid = names[i], .bandwidth = 400};
        /* What it says it holds: a consumer what it maps through this GPU; a producer the
         * chunks aquad has of it (their handles again). */
        if (g != 0)
                for (size_t i = 0; i < n_maps && n < 64; i++)
                        if (maps[i].ident == k && maps[i].gpu == g)
                                held[n++] = (struct broker_held){.chunk_id = maps[i].chunk,
                                                                 .size = 2 * MiB,
                                                                 .lease_id = maps[i].lease};
        if (g == 0 && known && h.secret)
                for (struct list_node *x = known->chunks.next; x != &known->chunks && n < 64;
                     x = x->next) {
                        struct chunk *c = list_entry(x, struct chunk, producer_node);
                        if (c->orphan)
                                continue;
                        fds[n] = ids[k].who.remote ? -1 : dup(memfd);
                        held[n++] = (struct broker_held){
                            .chunk_id = c->id,
                            .size = c->size,
                            .fabric = ids[k].who.remote ? fabric_handles : NULL};
                }
        h.held = held;
        h.n_held = n;
        h.held_fds = g == 0 && !ids[k].who.remote ? fds : NULL;
        r = broker_register(broker, &h, &clients[k][g], &w, last_err);
        tally.hellos++;
        tally.refused += r == E(BUSY);
        tally.impostors += r == E(PERMISSION);
        if (r == 0 && !may_use(k, g))
                violation("registered a GPU it may not use:", names[g], (uint64_t)k);
        if (r == 0) {
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
        return r;
}

static void offered(size_t n, const uint64_t *out)
{
        for (size_t i = 0; i < n; i++)
                if (out[i] < MAX_OFFERED)
                        offered_by[out[i]] = owner_of[0];
}

static void offer_n(size_t n)
{
        uint64_t sizes[4], refs[4], out[4];
        int fds[4];
        char err[BROKER_ERR_MAX];

        if (!reg[0])
                return;
        if (reg[0]->fabric) {
                for (size_t i = 0; i < n; i++)
                        sizes[i] = 2 * MiB, refs[i] = i;
                if (broker_offer(broker, reg[0], sizes, refs, NULL, fabric_handles, n, out, err) ==
                    0)
                        offered(n, out);
                return;
        }
        for (size_t i = 0; i < n; i++) {
                sizes[i] = 2 * MiB;
                refs[i] = i;
                fds[i] = dup(memfd);
        }
        if (broker_offer(broker, reg[0], sizes, refs, fds, NULL, n, out, err) != 0)
                for (size_t i = 0; i < n; i++)
                        close(fds[i]);
        else
                offered(n, out);
}

static void offer_one(void)
{
        offer_n(1);
}

static void borrow_some(int g, uint64_t bytes)
{
        struct broker_grant grant;
        char err[BROKER_ERR_MAX];
        int k = owner_of[g];

        if (!reg[g])
                return;
        if (broker_borrow(broker, reg[g], bytes, 0, false, &grant, err) != 0 || !grant.lease)
                return;
        for (struct list_node *x = grant.lease->chunks.next; x != &grant.lease->chunks;
             x = x->next) {
                struct chunk *c = list_entry(x, struct chunk, lease_node);
                for (size_t i = 0; i < n_maps; i++)
                        if (maps[i].chunk == c->id && maps[i].ident != k)
                                violation("granted a chunk another identity maps to", reg[g]->uuid,
                                          c->id);
                tally.grants++;
                tally.remote_grants += ids[k].who.remote;
                if (n_maps < MAX_MAPS)
                        maps[n_maps++] = (struct map){
                            .chunk = c->id, .lease = grant.lease->id, .ident = k, .gpu = g};
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
                c = broker_find_chunk(broker, maps[i].chunk);
                if (asked_only && c && c->state != CHUNK_RECLAIMING)
                        continue;
                /* Unmapped first, then returned: the order libaqua keeps. */
                uint64_t lease = maps[i].lease, chunk = maps[i].chunk;
                map_drop(i);
                (void)broker_return(broker, reg[g], lease, &chunk, 1, 0, NULL, err);
        }
}

static void restart(void)
{
        struct journal *j = NULL;

        (void)broker_commit(broker);
        broker = broker_free(broker);
        tally.restarts++;
        memset(reg, 0, sizeof(reg));
        cr_assert_eq(broker_new(&settings, &broker), 0);
        broker->settings.liveness = liveness;
        cr_assert_eq(journal_open(journal_path, broker_apply, broker, &j, NULL), 0);
        broker_attach_journal(broker, j, 1 << 16);
}

/* k's process dies (a remote one: its host): its connections close, its mappings go. */
static void die(int k)
{
        for (int g = 0; g < GPUS; g++)
                if (reg[g] && owner_of[g] == k && reg[g]->owner == &clients[k][g]) {
                        if (ids[k].who.remote)
                                broker_gpu_detach(broker, reg[g]); /* no EOF across hosts */
                        else
                                broker_gpu_gone(broker, reg[g]);
                        reg[g] = NULL;
                }
        for (size_t i = n_maps; i-- > 0;)
                if (maps[i].ident == k)
                        map_drop(i);
        ids[k].alive = false;
        tally.deaths++;
}

static void cut(int g)
{
        if (reg[g] && ids[owner_of[g]].who.remote) {
                tally.cuts++;
                broker_gpu_detach(broker, reg[g]);
                reg[g] = NULL;
        }
}

/* An operator releases g; --force only where it is true (a remote holder that is gone) or where
 * aquad quarantines (a local holder that runs). */
static void release_random(int g)
{
        struct gpu *x = broker_find_gpu(broker, names[g]);
        char err[BROKER_ERR_MAX];
        bool force = next() & 1;

        if (!x || x->owner)
                return;
        if (force && x->custody.held && x->custody.who.remote)
                for (int k = 0; k < IDS; k++)
                        if (is_ident(&x->custody.who, k) && ids[k].alive)
                                force = false; /* the operator's word would be wrong */
        size_t q = 0;
        if (broker_release(broker, x, force, &q, err) == 0)
                tally.releases++;
        tally.quarantined += q;
}

static void step(void)
{
        int k = (int)(next() % IDS), g = (int)(next() % GPUS);
        unsigned op = (unsigned)(next() % 14);

        if (getenv("AQUA_CUSTODY_TRACE"))
                fprintf(stderr, "step %llu: op %u identity %d gpu %d\n", (unsigned long long)steps,
                        op, k, g);
        switch (op) {
        case 0:
        case 1:
        case 2:
                (void)hello(k, g, next() % 4 != 0);
                break;
        case 3:
                offer_n(1 + next() % 4);
                break;
        case 4:
        case 5:
                borrow_some(1 + (int)(next() % 2), (1 + next() % 4) * 2 * MiB);
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
                else if (next() % 2 == 0) {
                        /* The tenant forks: its child, another process of its uid, has the
                         * secrets in its memory; they do not make it the holder. */
                        memcpy(ids[NEIGHBOUR].secret, ids[TENANT].secret,
                               sizeof(ids[TENANT].secret));
                        memcpy(ids[NEIGHBOUR].has_secret, ids[TENANT].has_secret,
                               sizeof(ids[TENANT].has_secret));
                }
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
                if (next() % 4 == 0) {
                        /* An operator pins whoever holds the two GPUs now. */
                        char err[BROKER_ERR_MAX];
                        (void)broker_pin(broker, names[0], names[1 + next() % 2], err);
                } else
                        release_random(g);
                break;
        case 12: {
                struct broker_reclaim r = {0};
                char err[BROKER_ERR_MAX];
                if (reg[0])
                        (void)broker_reclaim(broker, reg[0], 2 * MiB * (1 + next() % 4), false,
                                             false, "load", &r, err);
                broker_reclaim_clear(&r);
                break;
        }
        default:
                clock_ns += NSEC_PER_SEC / 2;
                broker_tick(broker, now_mono_ns() + clock_ns);
                break;
        }
        deliver();
        check_invariant();
        steps++;
}

/* A fresh pool with a journal, and every identity a fresh process. */
static void begin(uint64_t seed)
{
        struct journal *j = NULL;

        if (memfd < 0) {
                memfd = memfd_create("chunk", MFD_CLOEXEC);
                cr_assert_geq(memfd, 0);
                cr_assert_eq(ftruncate(memfd, 2 * MiB), 0);
        }
        snprintf(dir, sizeof(dir), "/tmp/test-custody-XXXXXX");
        cr_assert_not_null(mkdtemp(dir));
        snprintf(journal_path, sizeof(journal_path), "%s/journal", dir);
        rng = seed;
        setup_idents();
        memset(reg, 0, sizeof(reg));
        n_maps = 0;
        clock_ns = 0;
        scrubs_asked = handed_back = 0;
        for (size_t i = 0; i < MAX_OFFERED; i++)
                offered_by[i] = -1;
        cr_assert_eq(broker_new(&settings, &broker), 0);
        broker->settings.liveness = liveness;
        cr_assert_eq(journal_open(journal_path, NULL, NULL, &j, NULL), 0);
        broker_attach_journal(broker, j, 1 << 16);
}

static void end(void)
{
        char cmd[128];

        deliver();
        broker = broker_free(broker);
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        cr_assert_eq(system(cmd), 0);
}

Test(custody, no_identity_ever_gets_what_another_maps, .timeout = 300)
{
        const char *env = getenv("AQUA_CUSTODY_RUNS");
        int runs = env ? atoi(env) : 150;

        /* AQUA_CUSTODY_FIRST=N: start at run N (to look at one with AQUA_CUSTODY_RUNS=N+1). */
        const char *first = getenv("AQUA_CUSTODY_FIRST");

        for (int run = first ? atoi(first) : 0; run < runs; run++) {
                begin(0x9e3779b97f4a7c15ull * (uint64_t)(run + 1));
                for (int s = 0; s < 400; s++)
                        step();
                end();
        }
        cr_log_info("custody: %llu steps over %d runs, %llu violations", (unsigned long long)steps,
                    runs, (unsigned long long)violations);
        cr_log_info("custody: %llu claims without evidence refused", (unsigned long long)tally.impostors);
        cr_assert_gt(tally.impostors, 0, "no impostor tried");
        cr_log_info("custody: %llu hellos (%llu refused BUSY), %llu chunks granted (%llu to "
                    "remote identities), %llu restarts, %llu cut links, %llu deaths, %llu "
                    "releases (%llu chunks quarantined)",
                    (unsigned long long)tally.hellos, (unsigned long long)tally.refused,
                    (unsigned long long)tally.grants, (unsigned long long)tally.remote_grants,
                    (unsigned long long)tally.restarts, (unsigned long long)tally.cuts,
                    (unsigned long long)tally.deaths, (unsigned long long)tally.releases,
                    (unsigned long long)tally.quarantined);
        cr_assert_eq(violations, 0, "%llu violations; the first: %s",
                     (unsigned long long)violations, why);
}

enum { P, A, B };

/* The producer lends 4 chunks (a remote one to a remote tenant: fabric handles); the tenant
 * borrows and maps all of them through GPU-A. */
static void tenant_borrows(int tenant)
{
        int producer = ids[tenant].who.remote ? OTHER_KEY : PRODUCER;

        cr_assert_eq(hello(producer, P, true), 0, "%s", last_err);
        for (int i = 0; i < 4; i++)
                offer_one();
        cr_assert_eq(hello(tenant, A, true), 0, "%s", last_err);
        borrow_some(A, 8 * MiB);
        cr_assert_eq(n_maps, 4);
        deliver();
}

static size_t leases_of(int g)
{
        struct gpu *x = broker_find_gpu(broker, names[g]);
        return x ? list_length(&x->leases) : 0;
}

/* Item 1 of 'Custody by identity': the takeover after a restart. */
Test(custody, after_a_restart_nobody_but_the_silent_holder_with_its_secret_registers_its_gpu)
{
        begin(1);
        tenant_borrows(TENANT);
        restart();
        cr_assert_eq(hello(PRODUCER, P, true), 0, "%s", last_err);
        /* The tenant stays silent; everyone else who knows the uuid tries. */
        for (int k = NEIGHBOUR; k <= OTHER_KEY; k++) {
                cr_assert_eq(hello(k, A, true), E(BUSY), "identity %d: %s", k, last_err);
                cr_assert(strstr(last_err, "uid 1001") && strstr(last_err, "may still map"), "%s",
                          last_err);
        }
        cr_assert_eq(hello(TENANT, A, false), E(BUSY), "its own process, without the secret");
        cr_assert_eq(leases_of(A), 1, "nothing was dropped for them");
        cr_assert_eq(hello(TENANT, A, true), 0, "%s", last_err);
        cr_assert_eq(leases_of(A), 1, "the holder takes up its lease");
        check_invariant();
        cr_assert_eq(violations, 0, "%s", why);
        end();
}

Test(custody, a_newcomer_gets_a_gone_holders_gpu_empty_and_its_chunks_only_scrubbed)
{
        begin(2);
        tenant_borrows(TENANT);
        restart();
        cr_assert_eq(hello(PRODUCER, P, true), 0, "%s", last_err);
        die(TENANT);
        deliver();
        cr_assert_eq(hello(NOBODY, A, true), 0, "%s", last_err);
        cr_assert_eq(leases_of(A), 0, "no lease is inherited");
        deliver();
        cr_assert_eq(scrubs_asked, 4, "what the holder left is scrubbed before anyone gets it");
        cr_assert_eq(violations, 0, "%s", why);
        end();
}

/* Item 2: across hosts, by CURVE key. */
Test(custody, another_key_neither_ends_a_live_remote_registration_nor_takes_a_silent_one)
{
        begin(3);
        tenant_borrows(KEY);
        cr_assert_eq(hello(OTHER_KEY, A, true), E(BUSY), "live: %s", last_err);
        cr_assert_eq(reg[A]->owner, &clients[KEY][A], "the live registration stands");
        cut(A); /* silent past remote.grace */
        cr_assert_eq(hello(OTHER_KEY, A, true), E(BUSY), "silent: %s", last_err);
        cr_assert(strstr(last_err, "CURVE"), "%s", last_err);
        cr_assert_eq(hello(KEY, A, false), E(BUSY), "the key without the secret");
        cr_assert_eq(hello(KEY, A, true), 0, "%s", last_err);
        cr_assert_eq(leases_of(A), 1);
        /* Its own new connection, with the secret, replaces a live one. */
        reg[A]->owner = &clients[OTHER_KEY][A]; /* as if another connection of it held it */
        cr_assert_eq(hello(KEY, A, true), 0, "%s", last_err);
        cr_assert_eq(reg[A]->owner, &clients[KEY][A]);
        cr_assert_eq(leases_of(A), 1);
        cr_assert_eq(violations, 0, "%s", why);
        end();
}

/* Item 3: an operator's release of a holder whose process runs. */
Test(custody, a_release_of_a_live_holder_is_refused_and_force_quarantines_until_it_is_gone)
{
        struct broker_reclaim r = {0};
        struct gpu *a;
        char err[BROKER_ERR_MAX];
        size_t q = 0;

        begin(4);
        tenant_borrows(TENANT);
        restart();
        cr_assert_eq(hello(PRODUCER, P, true), 0, "%s", last_err);
        a = broker_find_gpu(broker, "GPU-A");
        cr_assert_eq(broker_release(broker, a, false, NULL, err), E(BUSY));
        cr_assert(strstr(err, "still runs") && strstr(err, "pid"), "%s", err);
        cr_assert_eq(broker_release(broker, a, true, &q, err), 0, "%s", err);
        cr_assert_eq(q, 4);
        deliver();
        cr_assert_eq(scrubs_asked, 0, "nothing the tenant maps is scrubbed");
        /* Lent to nobody, handed back to nobody. */
        cr_assert_eq(hello(NOBODY, A, true), 0, "%s", last_err);
        borrow_some(A, 2 * MiB);
        cr_assert_eq(leases_of(A), 0);
        cr_assert_eq(broker_reclaim(broker, reg[P], 0, true, false, "load", &r, err), 0, "%s", err);
        cr_assert_eq(r.n_free, 0);
        cr_assert_eq(r.n_pending, 4, "they come back once the process is gone");
        broker_reclaim_clear(&r);
        deliver();
        cr_assert_eq(handed_back, 0);
        check_invariant();
        die(TENANT);
        broker_tick(broker, now_mono_ns() + 5 * NSEC_PER_SEC);
        deliver();
        cr_assert_eq(handed_back, 4, "its producer gets them back now");
        cr_assert_eq(broker->n_quarantined, 0);
        cr_assert_eq(violations, 0, "%s", why);
        end();
}

/* Tenancy: a consumer borrows only from a lender of its tenant (root lends to all); no pairing
 * joins two tenants, nor a pin, which says why. */
Test(custody, a_consumer_borrows_only_from_a_lender_of_its_own_tenant)
{
        struct broker_refused_pin refused[4];
        char err[BROKER_ERR_MAX];

        begin(5);
        cr_assert_eq(hello(STRANGER, P, true), 0, "%s", last_err);
        offer_n(4);
        cr_assert_eq(hello(TENANT, A, true), 0, "%s", last_err);
        cr_assert_null(reg[A]->paired, "automatic pairing joined two tenants");
        borrow_some(A, 8 * MiB);
        cr_assert_eq(n_maps, 0, "the consumer was granted a stranger's memory");
        /* An operator's pin across tenants stands as a pin but pairs nobody, and says why. */
        cr_assert_eq(broker_pin(broker, "GPU-P", "GPU-A", err), 0, "%s", err);
        cr_assert_null(reg[A]->paired, "a pin joined two tenants");
        cr_assert_eq(broker_view_refused_pins(broker, refused, 4), 1);
        cr_assert(strstr(refused[0].why, "user:1002") && strstr(refused[0].why, "team"), "%s",
                  refused[0].why);
        borrow_some(A, 8 * MiB);
        cr_assert_eq(n_maps, 0);
        /* Root's producer lends to anyone, nobody included. */
        die(STRANGER);
        deliver();
        cr_assert_eq(hello(ROOT, P, true), 0, "%s", last_err);
        offer_n(4);
        cr_assert_eq(reg[A]->paired, reg[P], "the pin stands now");
        cr_assert_eq(broker_view_refused_pins(broker, refused, 4), 0);
        borrow_some(A, 4 * MiB);
        cr_assert_eq(n_maps, 2);
        check_invariant();
        cr_assert_eq(violations, 0, "%s", why);
        end();
}

/* A lender's tenant is journaled: after a restart the pool still keeps tenants apart. */
Test(custody, tenants_hold_across_a_restart_from_the_journal)
{
        begin(6);
        cr_assert_eq(hello(STRANGER, P, true), 0, "%s", last_err);
        offer_n(4);
        restart();
        cr_assert_eq(hello(NOBODY, B, true), 0, "%s", last_err);
        cr_assert_null(reg[B]->paired, "a restored stranger's GPU paired with nobody's");
        borrow_some(B, 8 * MiB);
        cr_assert_eq(n_maps, 0);
        cr_assert_eq(hello(STRANGER, P, true), 0, "%s", last_err);
        borrow_some(B, 8 * MiB);
        cr_assert_eq(n_maps, 0);
        check_invariant();
        cr_assert_eq(violations, 0, "%s", why);
        end();
}

/* A name is not a proof: a GPU claimed without the host's evidence is refused, saying why,
 * however free it is; its holder registers it after. */
Test(custody, a_gpu_claimed_without_evidence_is_refused_naming_it)
{
        begin(7);
        cr_assert_eq(hello(NOBODY, P, true), E(PERMISSION));
        cr_assert(strstr(last_err, "GPU-P") && strstr(last_err, "uid 65534") &&
                      strstr(last_err, "no device node"),
                  "%s", last_err);
        cr_assert_null(broker_find_gpu(broker, "GPU-P"), "the claim left a GPU behind");
        cr_assert_eq(hello(PRODUCER, P, true), 0, "%s", last_err);
        cr_assert_eq(violations, 0, "%s", why);
        end();
}
