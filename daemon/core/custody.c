/*
 * Custody: who a GPU's state belongs to, whether a Hello may take it up again, and the quarantine
 * of chunks an operator took from a holder whose process still runs (daemon/README.md, "Who may
 * hold what").
 */
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "broker-private.h"
#include "broker.h"
#include "log.h"
#include "time-util.h"

static void secret_hash(const uint8_t secret[BROKER_SECRET_LEN],
                        uint8_t ret[BROKER_SECRET_HASH_LEN])
{
        crypto_generichash(ret, BROKER_SECRET_HASH_LEN, secret, BROKER_SECRET_LEN, NULL, 0);
}

void custody_issue(struct gpu *g, const struct broker_identity *who,
                   uint8_t ret_secret[BROKER_SECRET_LEN])
{
        randombytes_buf(ret_secret, BROKER_SECRET_LEN);
        g->custody = (struct custody){.held = true, .who = *who, .has_secret = true};
        secret_hash(ret_secret, g->custody.secret_hash);
}

void custody_clear(struct gpu *g)
{
        sodium_memzero(&g->custody, sizeof(g->custody));
}

static bool proc_same(const struct proc_id *a, const struct proc_id *b)
{
        return a->pid == b->pid && a->start_time == b->start_time &&
               strcmp(a->boot_id, b->boot_id) == 0;
}

/*
 * Whether b is the identity a holds: the same CURVE key; or the same uid (where a knows it) and,
 * where a knows its process, the same process, which b must then know too.
 */
static bool identity_same(const struct broker_identity *a, const struct broker_identity *b)
{
        if (a->remote != b->remote)
                return false;
        if (a->remote)
                return a->key[0] && strcmp(a->key, b->key) == 0;
        if (a->uid != CUSTODY_UID_UNKNOWN && a->uid != b->uid)
                return false;
        if (a->process.pid)
                return b->process.pid && proc_same(&a->process, &b->process);
        return true;
}

bool custody_matches(const struct custody *c, const struct broker_identity *who,
                     const uint8_t *secret)
{
        uint8_t hash[BROKER_SECRET_HASH_LEN];

        if (!c->held || !identity_same(&c->who, who))
                return false;
        /* Journaled before secrets existed: only the very process that held it. */
        if (!c->has_secret)
                return !c->who.remote && c->who.process.pid;
        if (!secret)
                return false;
        secret_hash(secret, hash);
        return sodium_memcmp(hash, c->secret_hash, sizeof(hash)) == 0;
}

bool gpu_holds_state(const struct gpu *g)
{
        if (!list_empty(&g->leases) || g->dram_bytes)
                return true;
        for (const struct list_node *n = g->chunks.next; n != &g->chunks; n = n->next)
                if (!list_entry(n, struct chunk, producer_node)->orphan)
                        return true;
        return false;
}

enum proc_liveness custody_liveness(const struct broker *broker, const struct gpu *g)
{
        /* No process table across hosts: a remote holder is never provably gone. */
        if (g->custody.held && g->custody.who.remote)
                return PROC_UNKNOWN;
        return broker->settings.liveness ? broker->settings.liveness(&g->process)
                                         : proc_liveness(&g->process);
}

const char *gpu_holder(const struct gpu *g, char *buf, size_t size)
{
        const char *name = g->client_name ? g->client_name : "a client";
        const struct broker_identity *w = &g->custody.who;

        if (!g->custody.held)
                snprintf(buf, size, "%s (pid %d)", name, (int)g->process.pid);
        else if (w->remote)
                snprintf(buf, size, "%s (CURVE key %.8s...)", name, w->key);
        else if (w->uid == CUSTODY_UID_UNKNOWN)
                snprintf(buf, size, "%s (pid %d)", name, (int)w->process.pid);
        else
                snprintf(buf, size, "%s (uid %u, pid %d)", name, (unsigned)w->uid,
                         (int)w->process.pid);
        return buf;
}

/* ---------------------------------------------------------------------------- tenants */

const char *gpu_tenant(const struct gpu *g, char *buf, size_t size)
{
        const struct broker_identity *w = &g->custody.who;

        if (!g->custody.held || (!w->remote && w->uid == CUSTODY_UID_UNKNOWN && !w->tenant[0]))
                snprintf(buf, size, "%s", "");
        else if (w->tenant[0])
                snprintf(buf, size, "%s", w->tenant);
        else if (w->remote)
                snprintf(buf, size, "key:%s", w->key);
        else
                snprintf(buf, size, "user:%u", (unsigned)w->uid);
        return buf;
}

bool custody_may_lend(const struct gpu *producer, const struct gpu *consumer, char *why,
                      size_t size)
{
        char p[BROKER_TENANT_TEXT + 48], c[BROKER_TENANT_TEXT + 48];
        const struct broker_identity *w = &producer->custody.who;

        if (producer->custody.held && !w->remote && w->lends_to_all)
                return true;
        gpu_tenant(producer, p, sizeof(p));
        gpu_tenant(consumer, c, sizeof(c));
        if (p[0] && strcmp(p, c) == 0)
                return true;
        if (why)
                snprintf(why, size, "%s lends as %s and %s borrows as %s: tenants never share memory",
                         producer->uuid, p[0] ? p : "an unknown tenant", consumer->uuid,
                         c[0] ? c : "an unknown tenant");
        return false;
}

/* ------------------------------------------------------------------------- quarantine */

void chunk_quarantine(struct broker *broker, struct chunk *c, const struct proc_id *holder)
{
        bool back = c->state == CHUNK_RECLAIMING || c->producer->draining;

        if (c->orphan) {
                /* Its producer is gone and aquad holds no handle: nobody can get it again. */
                chunk_drop(broker, c);
                return;
        }
        c->quarantined = true;
        c->quarantine = *holder;
        c->quarantine_back = back;
        broker->n_quarantined++;
        chunk_release(broker, c);
        journal_chunk(broker, c);
        if (!broker->quarantine_check_ns)
                broker->quarantine_check_ns = now_mono_ns() + BROKER_LIVENESS_RECHECK_NS;
        broker_note_deadline(broker, broker->quarantine_check_ns);
}

/* The process that may map c is gone: c goes back to its producer if it asked, else is scrubbed. */
static void quarantine_end(struct broker *broker, struct chunk *c)
{
        struct gpu *producer = c->producer;
        uint64_t id = c->id;

        c->quarantined = false;
        broker->n_quarantined--;
        events_add(&broker->events, "quarantine",
                   "chunk %" PRIu64 " of %s out of quarantine: pid %d gone", c->id, producer->uuid,
                   (int)c->quarantine.pid);
        c->quarantine = (struct proc_id){0};
        if (c->quarantine_back) {
                c->quarantine_back = false;
                chunk_drop(broker, c);
                notice_queue(broker, NOTICE_RECLAIMED, producer, 0, &id, 1, 0, NULL);
                return;
        }
        chunk_dirty(broker, c, NULL);
        chunk_set_free_listed(c);
        journal_chunk(broker, c);
        scrub_check(broker, producer);
}

void quarantine_tick(struct broker *broker, uint64_t now_ns)
{
        struct list_node *gp, *gtmp, *cp, *ctmp;

        if (!broker->n_quarantined) {
                broker->quarantine_check_ns = 0;
                return;
        }
        if (now_ns < broker->quarantine_check_ns) {
                broker_note_deadline(broker, broker->quarantine_check_ns);
                return;
        }
        list_for_each(gp, gtmp, &broker->gpus)
        {
                struct gpu *g = list_entry(gp, struct gpu, node);
                list_for_each(cp, ctmp, &g->chunks)
                {
                        struct chunk *c = list_entry(cp, struct chunk, producer_node);
                        enum proc_liveness l;

                        if (!c->quarantined)
                                continue;
                        l = broker->settings.liveness ? broker->settings.liveness(&c->quarantine)
                                                      : proc_liveness(&c->quarantine);
                        if (l == PROC_GONE)
                                quarantine_end(broker, c);
                }
        }
        broker->quarantine_check_ns =
            broker->n_quarantined ? now_ns + BROKER_LIVENESS_RECHECK_NS : 0;
        broker_note_deadline(broker, broker->quarantine_check_ns);
}
