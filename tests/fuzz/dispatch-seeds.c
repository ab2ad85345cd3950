/*
 * Writes the seed corpus of fuzz-dispatch: for every Envelope body one short, valid script that
 * reaches it, plus the flows around side frames, deaths and deadlines. Usage: DIR.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-dispatch.h"
#include "wire.h"

#define BODY(name) AQUA__ENVELOPE__BODY_##name
#define MiB        (UINT64_C(1) << 20)

struct script {
        uint8_t buf[16384];
        size_t n;
};

static const char *out_dir;

static void put(struct script *s, const void *p, size_t n)
{
        if (s->n + n > sizeof(s->buf)) {
                fprintf(stderr, "script too long\n");
                exit(1);
        }
        memcpy(s->buf + s->n, p, n);
        s->n += n;
}

static void record(struct script *s, size_t who, unsigned op, unsigned n_fds, const void *p,
                   size_t n)
{
        uint8_t h[3] = {fuzz_header(who, op, n_fds), (uint8_t)n, (uint8_t)(n >> 8)};

        put(s, h, 3);
        put(s, p, n);
}

/* An Envelope from who; flags FUZZ_TCP, FUZZ_TCP_KNOWN: as if over tcp (0: locally). */
static void env_flags(struct script *s, size_t who, unsigned flags, uint64_t id, Aqua__Envelope *e)
{
        void *buf;
        size_t n;

        e->request_id = id;
        if (wire_encode(e, &buf, &n) < 0)
                exit(1);
        record(s, who, FUZZ_OP_ENVELOPE, flags, buf, n);
        free(buf);
}

static void env(struct script *s, size_t who, uint64_t id, Aqua__Envelope *e)
{
        env_flags(s, who, 0, id, e);
}

static void side(struct script *s, size_t who, Aqua__SideFrame__Kind kind, uint64_t id,
                 unsigned n_fds)
{
        Aqua__SideFrame f = AQUA__SIDE_FRAME__INIT;
        uint8_t buf[256];

        f.kind = kind;
        f.request_id = id;
        record(s, who, FUZZ_OP_SIDE_FRAME, n_fds, buf, aqua__side_frame__pack(&f, buf));
}

static void die_(struct script *s, size_t who)
{
        uint8_t h = fuzz_header(who, FUZZ_OP_DIE, 0);

        put(s, &h, 1);
}

static void time_(struct script *s, uint8_t steps)
{
        uint8_t h[2] = {fuzz_header(0, FUZZ_OP_TIME, 0), steps};

        put(s, h, 2);
}

static void save(const struct script *s, const char *name)
{
        char path[4096];
        FILE *f;

        snprintf(path, sizeof(path), "%s/%s", out_dir, name);
        f = fopen(path, "we");
        if (!f || fwrite(s->buf, 1, s->n, f) != s->n || fclose(f) != 0) {
                fprintf(stderr, "%s: %s\n", path, strerror(errno));
                exit(1);
        }
}

/* ------------------------------------------------------------------ the requests */

static void offer(struct script *s, uint64_t id, size_t n, bool fds_first)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Offer o = AQUA__OFFER__INIT;
        Aqua__ChunkOffer co[8], *cop[8];

        for (size_t i = 0; i < n; i++) {
                aqua__chunk_offer__init(&co[i]);
                co[i].client_ref = i;
                co[i].size = FUZZ_CHUNK;
                cop[i] = &co[i];
        }
        o.chunks = cop;
        o.n_chunks = n;
        e.body_case = BODY(OFFER);
        e.offer = &o;
        if (fds_first)
                side(s, FUZZ_PRODUCER, AQUA__SIDE_FRAME__KIND__KIND_OFFER_FDS, id, (unsigned)n);
        env(s, FUZZ_PRODUCER, id, &e);
        if (!fds_first)
                side(s, FUZZ_PRODUCER, AQUA__SIDE_FRAME__KIND__KIND_OFFER_FDS, id, (unsigned)n);
}

static void borrow(struct script *s, size_t who, uint64_t id, uint64_t bytes, uint64_t min,
                   bool dram)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Borrow b = AQUA__BORROW__INIT;

        b.bytes = bytes;
        b.min_bytes = min;
        b.allow_dram = dram;
        e.body_case = BODY(BORROW);
        e.borrow = &b;
        env(s, who, id, &e);
}

static void give_back(struct script *s, uint64_t id, uint64_t lease, uint64_t *chunks, size_t n,
                      uint64_t dram)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Return r = AQUA__RETURN__INIT;

        r.lease_id = lease;
        r.chunk_ids = chunks;
        r.n_chunk_ids = n;
        r.dram_bytes = dram;
        e.body_case = BODY(RETURN);
        e.return_ = &r;
        env(s, FUZZ_CONSUMER, id, &e);
}

static void reclaim(struct script *s, uint64_t id, uint64_t bytes, bool all)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__ReclaimRequest r = AQUA__RECLAIM_REQUEST__INIT;

        r.bytes = bytes;
        r.all = all;
        e.body_case = BODY(RECLAIM_REQUEST);
        e.reclaim_request = &r;
        env(s, FUZZ_PRODUCER, id, &e);
}

static void hello(struct script *s, size_t who, Aqua__Role role, const char *uuid, const char *peer,
                  Aqua__HeldChunk **held, size_t n_held)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Hello h = AQUA__HELLO__INIT;
        Aqua__PeerLink link = AQUA__PEER_LINK__INIT, *links[] = {&link};
        uint8_t token[SIDE_TOKEN_LEN];

        fuzz_token(who, token);
        h.token = (ProtobufCBinaryData){.len = sizeof(token), .data = token};
        h.role = role;
        h.gpu_uuid = (char *)(uuid ? uuid : "");
        h.gpu_capacity = UINT64_C(80) << 30;
        h.granularity = FUZZ_CHUNK;
        h.client_name = (char *)"seed";
        h.held = held;
        h.n_held = n_held;
        if (peer) {
                link.gpu_uuid = (char *)peer;
                link.bandwidth_gbps = 450;
                h.links = links;
                h.n_links = 1;
        }
        e.body_case = BODY(HELLO);
        e.hello = &h;
        env(s, who, 77, &e);
}

/* A body a client never sends: it must get an Error, nothing else. */
static void stray(const char *name, Aqua__Envelope__BodyCase body, void *msg)
{
        struct script s = {0};
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;

        e.body_case = body;
        e.welcome = msg; /* any member of the oneof: they share the storage */
        env(&s, FUZZ_CONSUMER, 5, &e);
        env(&s, FUZZ_STRANGER, 6, &e);
        save(&s, name);
}

static void admin(struct script *s, uint64_t id, Aqua__Envelope__BodyCase body, void *msg)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;

        e.body_case = body;
        e.admin_query = msg;
        env(s, FUZZ_ADMIN, id, &e);
}

int main(int argc, char **argv)
{
        struct script s;

        if (argc != 2) {
                fprintf(stderr, "Usage: %s DIR\n", argv[0]);
                return 2;
        }
        out_dir = argv[1];

        /* hello: a second consumer, a neutral GPU, and a producer re-registering after a
         * restart with two chunks and their handles. */
        s = (struct script){0};
        hello(&s, FUZZ_STRANGER, AQUA__ROLE__ROLE_CONSUMER, "GPU-D", "GPU-P", NULL, 0);
        save(&s, "hello");
        s = (struct script){0};
        hello(&s, FUZZ_STRANGER, AQUA__ROLE__ROLE_NEUTRAL, "GPU-N", NULL, NULL, 0);
        save(&s, "hello-neutral");
        {
                Aqua__HeldChunk held[2], *heldp[2];
                for (size_t i = 0; i < 2; i++) {
                        aqua__held_chunk__init(&held[i]);
                        held[i].chunk_id = i + 1;
                        held[i].size = FUZZ_CHUNK;
                        heldp[i] = &held[i];
                }
                held[1].lease_id = 1;
                s = (struct script){0};
                side(&s, FUZZ_STRANGER, AQUA__SIDE_FRAME__KIND__KIND_REREGISTER_FDS, 77, 2);
                hello(&s, FUZZ_STRANGER, AQUA__ROLE__ROLE_PRODUCER, "GPU-Q", "GPU-D", heldp, 2);
                save(&s, "hello-reregister-producer");
                s = (struct script){0};
                hello(&s, FUZZ_STRANGER, AQUA__ROLE__ROLE_CONSUMER, "GPU-D", "GPU-Q", heldp, 2);
                save(&s, "hello-reregister-consumer");
        }

        /* offer, both orders of fds and request */
        s = (struct script){0};
        offer(&s, 1, 4, true);
        save(&s, "offer");
        s = (struct script){0};
        offer(&s, 1, 2, false);
        save(&s, "offer-fds-after");

        /* borrow: chunks, then DRAM on top */
        s = (struct script){0};
        offer(&s, 1, 4, true);
        borrow(&s, FUZZ_CONSUMER, 2, 4 * MiB, 2 * MiB, false);
        borrow(&s, FUZZ_CONSUMER, 3, 32 * MiB, 0, true);
        save(&s, "borrow");

        /* return: one chunk, then the rest and the DRAM */
        s = (struct script){0};
        offer(&s, 1, 4, true);
        borrow(&s, FUZZ_CONSUMER, 2, 6 * MiB, 2 * MiB, true);
        give_back(&s, 3, 1, (uint64_t[]){2}, 1, 0);
        give_back(&s, 4, 1, NULL, 0, 0);
        borrow(&s, FUZZ_CONSUMER, 5, 80 * MiB, 0, true);
        give_back(&s, 6, 0, NULL, 0, 16 * MiB);
        save(&s, "return");

        /* one turn of the loop: an offer, borrows, the return of a lease granted before it and
         * of one granted in it, then a reclaim that ends it */
        s = (struct script){0};
        offer(&s, 1, 4, true);
        borrow(&s, FUZZ_CONSUMER, 2, 2 * MiB, 2 * MiB, false);
        {
                Aqua__Envelope e = AQUA__ENVELOPE__INIT;
                Aqua__Borrow b = AQUA__BORROW__INIT;
                Aqua__Return r = AQUA__RETURN__INIT;
                Aqua__ReclaimRequest rq = AQUA__RECLAIM_REQUEST__INIT;

                b.bytes = 2 * MiB;
                e.body_case = BODY(BORROW);
                e.borrow = &b;
                env_flags(&s, FUZZ_CONSUMER, FUZZ_TURN_OPEN, 3, &e);
                r.lease_id = 1;
                e.body_case = BODY(RETURN);
                e.return_ = &r;
                env_flags(&s, FUZZ_CONSUMER, FUZZ_TURN_OPEN, 4, &e);
                r.lease_id = 2;
                env_flags(&s, FUZZ_CONSUMER, FUZZ_TURN_OPEN, 5, &e);
                e.body_case = BODY(BORROW);
                env_flags(&s, FUZZ_CONSUMER, FUZZ_TURN_OPEN, 6, &e);
                rq.all = true;
                e.body_case = BODY(RECLAIM_REQUEST);
                e.reclaim_request = &rq;
                env_flags(&s, FUZZ_PRODUCER, FUZZ_TURN_OPEN, 7, &e);
        }
        save(&s, "turn");

        /* reclaim: free chunks at once, leased ones returned after the notice */
        s = (struct script){0};
        offer(&s, 1, 4, true);
        borrow(&s, FUZZ_CONSUMER, 2, 4 * MiB, 2 * MiB, false);
        reclaim(&s, 3, 0, true);
        give_back(&s, 4, 1, (uint64_t[]){1, 2}, 2, 0);
        save(&s, "reclaim_request");

        /* a consumer that misses its deadline, then borrows again (barred) */
        s = (struct script){0};
        offer(&s, 1, 4, true);
        borrow(&s, FUZZ_CONSUMER, 2, 4 * MiB, 2 * MiB, false);
        reclaim(&s, 3, 2 * MiB, false);
        time_(&s, 20);
        borrow(&s, FUZZ_CONSUMER, 4, 2 * MiB, 0, false);
        save(&s, "deadline-miss");

        /* deaths: the consumer with a lease, then the producer with one */
        s = (struct script){0};
        offer(&s, 1, 4, true);
        borrow(&s, FUZZ_CONSUMER, 2, 4 * MiB, 2 * MiB, false);
        die_(&s, FUZZ_CONSUMER);
        hello(&s, FUZZ_CONSUMER, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", "GPU-P", NULL, 0);
        borrow(&s, FUZZ_CONSUMER, 3, 4 * MiB, 2 * MiB, false);
        die_(&s, FUZZ_PRODUCER);
        give_back(&s, 4, 2, NULL, 0, 0);
        save(&s, "death");

        /* scrub: the consumer dies leaving data; one chunk scrubbed, one failed, one not asked */
        {
                Aqua__Envelope e = AQUA__ENVELOPE__INIT;
                Aqua__ScrubDone d = AQUA__SCRUB_DONE__INIT;
                uint64_t done[] = {1, 7}, failed[] = {2};

                s = (struct script){0};
                offer(&s, 1, 3, true);
                borrow(&s, FUZZ_CONSUMER, 2, 4 * MiB, 2 * MiB, false);
                give_back(&s, 3, 1, NULL, 0, 0);
                d.chunk_ids = done;
                d.n_chunk_ids = 2;
                d.failed_chunk_ids = failed;
                d.n_failed_chunk_ids = 1;
                e.body_case = BODY(SCRUB_DONE);
                e.scrub_done = &d;
                env(&s, FUZZ_CONSUMER, 5, &e);
                die_(&s, FUZZ_CONSUMER);
                env(&s, FUZZ_PRODUCER, 4, &e);
                hello(&s, FUZZ_STRANGER, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", "GPU-P", NULL, 0);
                borrow(&s, FUZZ_STRANGER, 6, 4 * MiB, 0, false);
                save(&s, "scrub_done");
        }

        /* descriptors that never get their request, and a request whose never come */
        s = (struct script){0};
        side(&s, FUZZ_PRODUCER, AQUA__SIDE_FRAME__KIND__KIND_OFFER_FDS, 9, 3);
        offer(&s, 1, 2, false);
        side(&s, FUZZ_PRODUCER, AQUA__SIDE_FRAME__KIND__KIND_GRANT_FDS, 1, 1);
        time_(&s, 100);
        save(&s, "side-frames");

        /* load */
        {
                Aqua__Envelope e = AQUA__ENVELOPE__INIT;
                Aqua__LoadReport l = AQUA__LOAD_REPORT__INIT;
                l.load = 0.5;
                l.used_bytes = 10 * MiB;
                e.body_case = BODY(LOAD);
                e.load = &l;
                s = (struct script){0};
                env(&s, FUZZ_PRODUCER, 1, &e);
                env(&s, FUZZ_ADMIN, 2, &e);
                save(&s, "load");
        }

        /* admin: every query, then reclaim, drain, undrain, pair, unpair, release and reload */
        {
                Aqua__AdminQuery q = AQUA__ADMIN_QUERY__INIT;
                Aqua__AdminReclaim rc = AQUA__ADMIN_RECLAIM__INIT;
                Aqua__AdminDrain d = AQUA__ADMIN_DRAIN__INIT;
                Aqua__AdminPair p = AQUA__ADMIN_PAIR__INIT;
                Aqua__AdminUnpair u = AQUA__ADMIN_UNPAIR__INIT;
                Aqua__AdminRelease rl = AQUA__ADMIN_RELEASE__INIT;
                Aqua__AdminReload rd = AQUA__ADMIN_RELOAD__INIT;
                Aqua__AdminUndrain ud = AQUA__ADMIN_UNDRAIN__INIT;

                s = (struct script){0};
                offer(&s, 1, 4, true);
                borrow(&s, FUZZ_CONSUMER, 2, 4 * MiB, 2 * MiB, false);
                for (int w = 0; w <= AQUA__ADMIN_QUERY__WHAT__WHAT_EVENTS; w++) {
                        q.what = w;
                        admin(&s, 10 + w, BODY(ADMIN_QUERY), &q);
                }
                save(&s, "admin_query");

                s = (struct script){0};
                offer(&s, 1, 4, true);
                borrow(&s, FUZZ_CONSUMER, 2, 4 * MiB, 2 * MiB, false);
                rc.gpu = (char *)"GPU-P";
                admin(&s, 3, BODY(ADMIN_RECLAIM), &rc);
                save(&s, "admin_reclaim");

                s = (struct script){0};
                offer(&s, 1, 4, true);
                borrow(&s, FUZZ_CONSUMER, 2, 4 * MiB, 2 * MiB, false);
                d.gpu = (char *)"GPU-P";
                admin(&s, 3, BODY(ADMIN_DRAIN), &d);
                give_back(&s, 4, 1, NULL, 0, 0);
                save(&s, "admin_drain");

                /* Drained, refused an offer, undrained, then offering again. */
                s = (struct script){0};
                offer(&s, 1, 2, true);
                d.gpu = (char *)"GPU-P";
                admin(&s, 3, BODY(ADMIN_DRAIN), &d);
                offer(&s, 4, 1, true);
                ud.gpu = (char *)"GPU-P";
                admin(&s, 5, BODY(ADMIN_UNDRAIN), &ud);
                offer(&s, 6, 1, true);
                save(&s, "admin_undrain");

                s = (struct script){0};
                u.gpu = (char *)"GPU-C";
                admin(&s, 3, BODY(ADMIN_UNPAIR), &u);
                save(&s, "admin_unpair");

                s = (struct script){0};
                offer(&s, 1, 4, true);
                borrow(&s, FUZZ_CONSUMER, 2, 4 * MiB, 2 * MiB, false);
                rl.gpu = (char *)"GPU-C";
                admin(&s, 3, BODY(ADMIN_RELEASE), &rl);
                save(&s, "admin_release");

                /* The harness's config path names no file: the reload is refused. */
                s = (struct script){0};
                admin(&s, 3, BODY(ADMIN_RELOAD), &rd);
                save(&s, "admin_reload");

                s = (struct script){0};
                hello(&s, FUZZ_STRANGER, AQUA__ROLE__ROLE_CONSUMER, "GPU-D", NULL, NULL, 0);
                p.producer = (char *)"GPU-P";
                p.consumer = (char *)"GPU-D";
                admin(&s, 3, BODY(ADMIN_PAIR), &p);
                offer(&s, 1, 2, true);
                borrow(&s, FUZZ_STRANGER, 4, 2 * MiB, 0, false);
                save(&s, "admin_pair");
        }

        /* Bodies only the daemon sends. */
        {
                Aqua__Welcome w = AQUA__WELCOME__INIT;
                Aqua__HelloHeld hh = AQUA__HELLO_HELD__INIT;
                Aqua__OfferReply orp = AQUA__OFFER_REPLY__INIT;
                Aqua__Grant g = AQUA__GRANT__INIT;
                Aqua__ReturnReply rr = AQUA__RETURN_REPLY__INIT;
                Aqua__ReclaimReply rcr = AQUA__RECLAIM_REPLY__INIT;
                Aqua__ReclaimNotice rn = AQUA__RECLAIM_NOTICE__INIT;
                Aqua__Reclaimed rd = AQUA__RECLAIMED__INIT;
                Aqua__PairChanged pc = AQUA__PAIR_CHANGED__INIT;
                Aqua__DaemonStopping st = AQUA__DAEMON_STOPPING__INIT;
                Aqua__Ack ack = AQUA__ACK__INIT;
                Aqua__Error err = AQUA__ERROR__INIT;
                Aqua__AdminReply ar = AQUA__ADMIN_REPLY__INIT;
                Aqua__ScrubRequest sr = AQUA__SCRUB_REQUEST__INIT;

                stray("welcome", BODY(WELCOME), &w);
                stray("offer_reply", BODY(OFFER_REPLY), &orp);
                stray("grant", BODY(GRANT), &g);
                stray("return_reply", BODY(RETURN_REPLY), &rr);
                stray("reclaim_reply", BODY(RECLAIM_REPLY), &rcr);
                stray("reclaim_notice", BODY(RECLAIM_NOTICE), &rn);
                stray("reclaimed", BODY(RECLAIMED), &rd);
                stray("pair_changed", BODY(PAIR_CHANGED), &pc);
                stray("stopping", BODY(STOPPING), &st);
                stray("ack", BODY(ACK), &ack);
                /* A part of a re-registration from nobody's token: refused. */
                stray("hello_held", BODY(HELLO_HELD), &hh);
                stray("error", BODY(ERROR), &err);
                stray("admin_reply", BODY(ADMIN_REPLY), &ar);
                stray("scrub_request", BODY(SCRUB_REQUEST), &sr);
        }

        /* Over tcp: an admin with a known identity (status), a producer (refused), one whose
         * identity remote.clients does not list, and the known one's routing id from another. */
        {
                Aqua__Envelope hello_e = AQUA__ENVELOPE__INIT, query_e = AQUA__ENVELOPE__INIT;
                Aqua__Hello h = AQUA__HELLO__INIT;
                Aqua__AdminQuery q = AQUA__ADMIN_QUERY__INIT;
                const unsigned known = FUZZ_TCP | FUZZ_TCP_KNOWN;

                s = (struct script){0};
                h.role = AQUA__ROLE__ROLE_ADMIN;
                h.client_name = (char *)"remote-seed";
                h.host = (char *)"node-b";
                hello_e.body_case = BODY(HELLO);
                hello_e.hello = &h;
                query_e.body_case = BODY(ADMIN_QUERY);
                query_e.admin_query = &q;
                env_flags(&s, FUZZ_STRANGER, known, 1, &hello_e);
                env_flags(&s, FUZZ_ADMIN, FUZZ_TCP, 1, &hello_e);
                env_flags(&s, FUZZ_STRANGER, known, 2, &query_e);
                env_flags(&s, FUZZ_STRANGER, FUZZ_TCP, 2, &query_e);
                h.role = AQUA__ROLE__ROLE_PRODUCER;
                h.gpu_uuid = (char *)"GPU-R";
                env_flags(&s, FUZZ_CONSUMER, known, 3, &hello_e);
                time_(&s, 200);
                save(&s, "remote");
        }

        /* Not an Envelope at all, and an Envelope of an unknown major version. */
        s = (struct script){0};
        record(&s, FUZZ_CONSUMER, FUZZ_OP_ENVELOPE, 0, "\xff\xff\xff\xff\x0f", 5);
        record(&s, FUZZ_CONSUMER, FUZZ_OP_ENVELOPE, 0, "\x08\xc8\x01\x10\x01\xd2\x01\x00", 8);
        save(&s, "malformed");
        return 0;
}
