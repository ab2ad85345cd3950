/*
 * What ends leases from outside the state machine (lease.c): a GPU's client gone (either side),
 * one that cannot be heard, an operator's release, and the tick: reclaim deadlines, the
 * reconcile window after a restart, quarantine.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "broker-private.h"
#include "broker.h"
#include "log.h"
#include "time-util.h"

#define E(name) BROKER_E_##name

/* A consumer's client is gone: its mappings died with it. */
static void consumer_gone(struct broker *broker, struct gpu *g)
{
        while (!list_empty(&g->leases)) {
                struct lease *l = list_entry(g->leases.next, struct lease, consumer_node);
                struct reclaimed back = {.producer = l->producer};

                while (!list_empty(&l->chunks))
                        chunk_unmapped(broker, list_entry(l->chunks.next, struct chunk, lease_node),
                                       &back);
                reclaimed_flush(broker, &back);
                events_add(&broker->events, "lease",
                           "lease %" PRIu64 " back in the pool: %s is gone", l->id, g->uuid);
                lease_free(broker, l);
        }
        if (g->dram_bytes || g->barred) {
                broker->dram_granted -= MIN(g->dram_bytes, broker->dram_granted);
                g->dram_bytes = 0;
                g->barred = false;
                journal_gpu(broker, g);
        }
}

/*
 * A producer's client is gone: free chunks die with it, leased ones stay alive where consumers
 * map them; consumers are asked to move off at their own pace.
 */
static void producer_gone(struct broker *broker, struct gpu *g)
{
        struct list_node *pos, *tmp;

        list_for_each(pos, tmp, &g->chunks)
        {
                struct chunk *c = list_entry(pos, struct chunk, producer_node);
                if (c->state == CHUNK_FREE) {
                        chunk_drop(broker, c);
                        continue;
                }
                if (c->orphan)
                        continue;
                c->orphan = true;
                chunk_drop_handle(c);
                /* Deadlines of an earlier reclaim no longer matter: nobody waits for it. */
                c->state = CHUNK_LEASED;
                c->deadline_ns = c->deadline_wall_ms = 0;
                c->deadline_pending = false;
        }
        list_for_each(pos, tmp, &broker->leases)
        {
                struct lease *l = list_entry(pos, struct lease, broker_node);
                struct broker_reclaim res = {0};
                uint64_t got = 0;

                if (l->producer != g)
                        continue;
                if (reclaim_lease(broker, l, UINT64_MAX, &got, "producer gone", 0, &res) < 0)
                        log_error("Out of memory telling %s that %s is gone", l->consumer->uuid,
                                  g->uuid);
                broker_reclaim_clear(&res);
        }
        /* A drain outlives the producer's client: its next client (a restart, a supervisor's
         * new process) must not lend again until an operator ends it (aquactl undrain). */
}

void broker_gpu_gone(struct broker *broker, struct gpu *g)
{
        consumer_gone(broker, g);
        producer_gone(broker, g);
        events_add(&broker->events, "client", "%s %s (%s, pid %d) gone",
                   g->restored ? "restored GPU" : "GPU", g->uuid,
                   g->client_name ? g->client_name : "?", (int)g->pid);
        g->owner = NULL;
        g->serial = 0;
        g->restored = false;
        g->silent = false;
        g->pid = 0;
        if (g->process.pid || g->custody.held) {
                g->process = (struct proc_id){0};
                custody_clear(g);
                journal_gpu(broker, g);
        }
        /* Repairing also asks producers to scrub what a departed consumer left. */
        broker_recompute_pairs(broker);
        gpu_gc(broker, g);
}

void broker_gpu_detach(struct broker *broker, struct gpu *g)
{
        for (struct list_node *n = g->chunks.next; n != &g->chunks; n = n->next) {
                struct chunk *c = list_entry(n, struct chunk, producer_node);
                if (!c->orphan)
                        chunk_drop_handle(c);
                chunk_set_free_listed(c);
        }
        g->owner = NULL;
        g->restored = true;
        /* Nobody can tell whether its process runs: the rule for pid 0 after a restart. */
        g->process = (struct proc_id){0};
        g->silent = !list_empty(&g->leases);
        events_add(&broker->events, "client", "%s (%s) cannot be heard: what it holds is kept",
                   g->uuid, g->client_name ? g->client_name : "?");
        /* Its own reconcile window, as a restart gives every client. */
        g->detached_until_ns = now_mono_ns() + broker->settings.reconcile_timeout_ns;
        if (!broker->reconcile_deadline_ns || g->detached_until_ns < broker->reconcile_deadline_ns)
                broker->reconcile_deadline_ns = g->detached_until_ns;
        broker_note_deadline(broker, broker->reconcile_deadline_ns);
}

int broker_release(struct broker *broker, struct gpu *g, bool force, size_t *ret_quarantined,
                   char err[BROKER_ERR_MAX])
{
        size_t leases = list_length(&g->leases), quarantined = 0;
        enum proc_liveness live;
        char who[192];

        if (g->owner)
                return broker_fail(
                    err, E(BUSY),
                    "release: GPU %s has a connected client (pid %d); it returns what "
                    "it holds itself",
                    g->uuid, (int)g->pid);
        if (!g->restored)
                return broker_fail(err, E(INVALID), "release: GPU %s holds nothing to release",
                                   g->uuid);
        live = custody_liveness(broker, g);
        gpu_holder(g, who, sizeof(who));
        if (live == PROC_ALIVE && !force)
                return broker_fail(err, E(BUSY),
                                   "release: GPU %s: its holder %s still runs and may map what it "
                                   "holds; --force ends its leases and quarantines their chunks "
                                   "until that process is gone",
                                   g->uuid, who);
        if (live == PROC_UNKNOWN && !force)
                return broker_fail(err, E(BUSY),
                                   "release: GPU %s: nothing tells whether its holder %s still "
                                   "maps what it holds (%s); --force is your word that it is gone",
                                   g->uuid, who,
                                   g->custody.who.remote ? "it is on another host"
                                                         : "its process is not known");
        if (live == PROC_ALIVE) {
                /* Its leases end; their chunks go to nobody until its process is gone. */
                while (!list_empty(&g->leases)) {
                        struct lease *l = list_entry(g->leases.next, struct lease, consumer_node);
                        while (!list_empty(&l->chunks)) {
                                chunk_quarantine(
                                    broker, list_entry(l->chunks.next, struct chunk, lease_node),
                                    &g->process);
                                quarantined++;
                        }
                        lease_free(broker, l);
                }
                log_warning("Operator releases GPU %s whose holder %s still runs: %zu leases end, "
                            "%zu chunks quarantined until pid %d is gone (their producers are not "
                            "told; a reclaim of them waits for that)",
                            g->uuid, who, leases, quarantined, (int)g->process.pid);
                events_add(&broker->events, "client",
                           "%s released by an operator (--force): %zu leases, %zu chunks "
                           "quarantined while pid %d runs",
                           g->uuid, leases, quarantined, (int)g->process.pid);
        } else {
                log_warning("Operator releases what GPU %s held (%zu leases, holder %s%s)", g->uuid,
                            leases, who,
                            live == PROC_GONE ? ", gone" : ", gone on the operator's word");
                events_add(&broker->events, "client", "%s released by an operator: %zu leases%s",
                           g->uuid, leases,
                           live == PROC_GONE ? "" : " (--force: holder taken to be gone)");
        }
        broker->stats.leases_lost += leases;
        broker_gpu_gone(broker, g);
        if (ret_quarantined)
                *ret_quarantined = quarantined;
        return 0;
}

/*
 * Silence is not death: after a restart aquad hears nothing from a consumer until it calls
 * aqua_poll(), however long an idle engine takes. A consumer that has not re-registered keeps
 * its leases (their chunks granted to nobody else) while its process may still map them: it
 * runs, or nobody can tell. Checked again every BROKER_LIVENESS_RECHECK_NS; the first check
 * after the process is gone releases them.
 */
static bool holder_may_map(struct broker *broker, struct gpu *g)
{
        enum proc_liveness l;

        if (list_empty(&g->leases))
                return false;
        l = broker->settings.liveness ? broker->settings.liveness(&g->process)
                                      : proc_liveness(&g->process);
        if (l == PROC_GONE)
                return false;
        if (!g->silent) {
                g->silent = true;
                log_warning("Consumer %s did not re-register after the restart, but its process "
                            "%s: its %zu leases stay reserved until it does or is gone",
                            g->uuid, l == PROC_ALIVE ? "still runs" : "cannot be proven gone",
                            list_length(&g->leases));
                events_add(&broker->events, "client",
                           "%s silent after the restart, pid %d %s: leases kept", g->uuid,
                           (int)g->process.pid, l == PROC_ALIVE ? "alive" : "unknown");
        }
        /* Look again soon: the window closing again is what makes the next check. */
        broker->reconcile_deadline_ns = now_mono_ns() + BROKER_LIVENESS_RECHECK_NS;
        return true;
}

void broker_tick(struct broker *broker, uint64_t now_ns)
{
        struct list_node *pos, *tmp;

        if (!broker->next_deadline_ns || now_ns < broker->next_deadline_ns)
                return;
        broker->next_deadline_ns = 0;
        quarantine_tick(broker, now_ns);
        list_for_each(pos, tmp, &broker->leases)
        {
                struct lease *l = list_entry(pos, struct lease, broker_node);
                for (struct list_node *k = l->chunks.next; k != &l->chunks; k = k->next) {
                        struct chunk *c = list_entry(k, struct chunk, lease_node);
                        if (c->state != CHUNK_RECLAIMING || !c->deadline_ns)
                                continue;
                        if (c->deadline_ns > now_ns) {
                                broker_note_deadline(broker, c->deadline_ns);
                                continue;
                        }
                        /* Missed: report once per lease; the chunk stays mapped, so it stays
                         * out of the producer's hands until the consumer returns it or dies. */
                        c->deadline_ns = 0;
                        if (l->overdue)
                                continue;
                        l->overdue = true;
                        broker->stats.deadline_misses++;
                        events_add(&broker->events, "deadline-miss",
                                   "%s missed the reclaim deadline of lease %" PRIu64
                                   "; barred from new leases",
                                   l->consumer->uuid, l->id);
                        log_warning("Consumer %s (%s) missed the reclaim deadline of lease %" PRIu64
                                    "; it gets no new leases",
                                    l->consumer->uuid,
                                    l->consumer->client_name ? l->consumer->client_name : "?",
                                    l->id);
                        if (!l->consumer->barred) {
                                l->consumer->barred = true;
                                journal_gpu(broker, l->consumer);
                        }
                }
        }
        if (broker->reconcile_deadline_ns && now_ns >= broker->reconcile_deadline_ns) {
                broker->reconcile_deadline_ns = 0;
                list_for_each(pos, tmp, &broker->gpus)
                {
                        struct gpu *g = list_entry(pos, struct gpu, node);
                        if (!g->restored || g->owner)
                                continue;
                        /* Detached later than the window that closes now: its own is open. */
                        if (g->detached_until_ns > now_ns) {
                                if (!broker->reconcile_deadline_ns ||
                                    g->detached_until_ns < broker->reconcile_deadline_ns)
                                        broker->reconcile_deadline_ns = g->detached_until_ns;
                                continue;
                        }
                        if (holder_may_map(broker, g))
                                continue;
                        log_notice("GPU %s did not re-register after the restart%s; releasing "
                                   "what it held",
                                   g->uuid, g->silent ? " and its process is gone" : "");
                        broker->stats.leases_lost +=
                            g->role == GPU_ROLE_CONSUMER ? list_length(&g->leases) : 0;
                        broker_gpu_gone(broker, g);
                        /* broker_gpu_gone may free GPUs other than g: start over. */
                        tmp = broker->gpus.next;
                }
                broker_note_deadline(broker, broker->reconcile_deadline_ns);
        } else
                broker_note_deadline(broker, broker->reconcile_deadline_ns);
}
