/* The pool in the journal: commit (the turn's operations, journal-ops.c), replay, snapshot and
 * compaction. Above the core's modules: replay applies records through them. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "broker-private.h"
#include "broker.h"
#include "log.h"
#include "time-util.h"

/* Compaction that fails is retried after a back-off, not on every commit. */
#define COMPACT_BACKOFF_MIN_NS (UINT64_C(1) * NSEC_PER_SEC)
#define COMPACT_BACKOFF_MAX_NS (UINT64_C(300) * NSEC_PER_SEC)
/* Operations queued while the journal cannot be written, before one snapshot replaces them. */
#define MAX_QUEUED_OPS 65536

static void compact(struct broker *broker)
{
        Aquaj__JournalRecord *snap = NULL;
        uint64_t now = now_mono_ns();
        int r;

        if (!journal_wants_compaction(broker->journal, broker->compact_threshold) ||
            now < broker->compact_retry_ns)
                return;
        r = broker_snapshot(broker, &snap);
        if (r >= 0)
                r = journal_compact(broker->journal, snap);
        if (snap)
                aquaj__journal_record__free_unpacked(snap, NULL);
        if (r < 0) {
                /* The log itself is intact: only its size grows. */
                broker->stats.compaction_failures++;
                broker->compact_backoff_ns =
                    broker->compact_backoff_ns
                        ? MIN(broker->compact_backoff_ns * 2, COMPACT_BACKOFF_MAX_NS)
                        : COMPACT_BACKOFF_MIN_NS;
                broker->compact_retry_ns = now + broker->compact_backoff_ns;
                if (!broker->compact_error)
                        log_warning_errno(r,
                                          "Failed to compact the journal: %m; retrying with "
                                          "back-off (at most every %" PRIu64 " s)",
                                          COMPACT_BACKOFF_MAX_NS / NSEC_PER_SEC);
                broker->compact_error = r;
                return;
        }
        if (broker->compact_error)
                log_notice("Compacted the journal again");
        broker->compact_error = 0;
        broker->compact_backoff_ns = 0;
        broker->compact_retry_ns = 0;
}

/* Too many operations waiting for a writable journal: one snapshot says all they say. */
static void fold_queued_ops(struct broker *broker)
{
        Aquaj__JournalRecord *snap = NULL;

        if (broker->n_ops < MAX_QUEUED_OPS || broker_snapshot(broker, &snap) < 0)
                return;
        broker_ops_clear(broker);
        broker->ops[broker->n_ops++] = snap->ops[0];
        snap->n_ops = 0;
        aquaj__journal_record__free_unpacked(snap, NULL);
}

int broker_commit(struct broker *broker)
{
        Aquaj__JournalRecord rec = AQUAJ__JOURNAL_RECORD__INIT;
        int r;

        if (!broker->journal) {
                broker_ops_clear(broker);
                return 0;
        }
        if (broker->n_ops == 0 && !broker->journal_error)
                return 0;
        rec.n_ops = broker->n_ops;
        rec.ops = broker->ops;
        r = journal_append(broker->journal, &rec);
        if (r < 0) {
                broker->stats.journal_errors++;
                const char *why = journal_error(broker->journal);
                if (r == -ESTALE)
                        log_error("The journal refused the commit: this aquad no longer leads "
                                  "its domain (%s)",
                                  why[0] ? why : "its election key or lease changed in etcd");
                else if (r == -E2BIG)
                        log_error("Refusing a turn's requests: %s", why);
                else if (!broker->journal_error)
                        log_error_errno(r, "Failed to write the journal: %m%s%s; refusing offers "
                                           "and grants until it can be written",
                                        why[0] ? ": " : "", why);
                broker->journal_error = r;
                fold_queued_ops(broker);
                return r;
        }
        broker->stats.journal_commits++;
        if (broker->journal_error)
                log_notice("The journal can be written again");
        broker->journal_error = 0;
        broker_ops_clear(broker);
        compact(broker);
        return 0;
}

const char *broker_degraded(const struct broker *broker, char *buf, size_t size)
{
        if (broker->journal_error)
                snprintf(buf, size, "the journal cannot be written: %s",
                         strerror(-broker->journal_error));
        else if (broker->compact_error)
                snprintf(buf, size, "the journal cannot be compacted: %s",
                         strerror(-broker->compact_error));
        else
                return NULL;
        return buf;
}

/* ------------------------------------------------------------------------------ replay */

static struct gpu *restored_gpu(struct broker *broker, const char *uuid, enum gpu_role role)
{
        struct gpu *g;

        if (!uuid || !uuid[0])
                return NULL;
        g = gpu_ensure(broker, uuid);
        if (!g)
                return NULL;
        if (!g->owner)
                g->restored = true;
        if (g->role == GPU_ROLE_UNSPECIFIED)
                g->role = role;
        return g;
}

static int apply_lease(struct broker *broker, const Aquaj__JLease *j)
{
        struct lease *l = broker_find_lease(broker, j->id);
        struct gpu *consumer, *producer;

        if (!l) {
                consumer = restored_gpu(broker, j->consumer, GPU_ROLE_CONSUMER);
                producer = restored_gpu(broker, j->producer, GPU_ROLE_PRODUCER);
                if (!consumer || !producer || j->id == 0)
                        return -EBADMSG;
                l = lease_new(broker, j->id, consumer, producer);
                if (!l)
                        return -ENOMEM;
        }
        l->created_ms = j->created_ms;
        free(l->reason);
        l->reason = j->reason && j->reason[0] ? strdup(j->reason) : NULL;
        return 0;
}

static int apply_chunk(struct broker *broker, const Aquaj__JChunk *j)
{
        struct chunk *c = broker_find_chunk(broker, j->id);
        struct lease *l = j->lease_id ? broker_find_lease(broker, j->lease_id) : NULL;
        uint64_t now_ms = now_real_ns() / NSEC_PER_MSEC;

        if (!c) {
                struct gpu *producer = restored_gpu(broker, j->producer, GPU_ROLE_PRODUCER);
                if (!producer || j->id == 0)
                        return -EBADMSG;
                c = chunk_new(broker, producer, j->id, j->size, j->client_ref, -1);
                if (!c)
                        return -ENOMEM;
        }
        if (c->lease != l) {
                chunk_release(broker, c);
                if (l)
                        chunk_lease(broker, c, l);
        }
        c->orphan = j->orphan;
        bool quarantined = j->quarantined && !l;
        if (c->quarantined != quarantined)
                broker->n_quarantined += quarantined ? 1 : (size_t)-1;
        c->quarantined = quarantined;
        c->quarantine_back = c->quarantined && j->quarantine_back;
        c->quarantine = (struct proc_id){0};
        if (c->quarantined) {
                c->quarantine.pid = (pid_t)j->quarantine_pid;
                c->quarantine.start_time = j->quarantine_start_time;
                if (j->quarantine_boot_id && strlen(j->quarantine_boot_id) == PROC_BOOT_ID_LEN - 1)
                        memcpy(c->quarantine.boot_id, j->quarantine_boot_id, PROC_BOOT_ID_LEN);
        }
        /* Whose data a dirty chunk holds does not survive a restart: it is scrubbed for all. */
        c->dirty = j->dirty;
        c->dirty_for = 0;
        c->scrubbing = false;
        c->state = !l ? CHUNK_FREE : j->reclaiming ? CHUNK_RECLAIMING : CHUNK_LEASED;
        c->deadline_wall_ms = l ? j->deadline_ms : 0;
        c->deadline_ns = 0;
        /* Reclaiming with no deadline yet: its notice was never delivered. */
        c->deadline_pending = c->state == CHUNK_RECLAIMING && !c->orphan && !c->deadline_wall_ms;
        if (c->deadline_wall_ms) {
                /* Deadlines survive a restart as wall-clock times. */
                uint64_t left = c->deadline_wall_ms > now_ms ? c->deadline_wall_ms - now_ms : 0;
                c->deadline_ns = now_mono_ns() + left * NSEC_PER_MSEC;
        }
        if (l)
                lease_update_state(l);
        chunk_set_free_listed(c);
        return 0;
}

static int apply_gpu(struct broker *broker, const Aquaj__JGpu *j)
{
        struct gpu *g = restored_gpu(broker, j->uuid, GPU_ROLE_UNSPECIFIED);

        if (!g)
                return -EBADMSG;
        broker->dram_granted = broker->dram_granted - g->dram_bytes + j->dram_bytes;
        g->dram_bytes = j->dram_bytes;
        g->barred = j->barred;
        g->draining = j->draining;
        g->process = (struct proc_id){.pid = (pid_t)j->pid, .start_time = j->start_time};
        if (j->boot_id && strlen(j->boot_id) == PROC_BOOT_ID_LEN - 1)
                memcpy(g->process.boot_id, j->boot_id, PROC_BOOT_ID_LEN);
        if (j->ordinal_known && !g->owner) {
                g->ordinal_known = true;
                g->ordinal = j->ordinal;
                free(g->host);
                g->host = j->host && j->host[0] ? strndup(j->host, 255) : NULL;
                free(g->client_name);
                g->client_name =
                    j->client_name && j->client_name[0] ? strndup(j->client_name, 255) : NULL;
        }
        custody_clear(g);
        if (j->custody) {
                g->custody.held = true;
                g->custody.who.remote = j->holder_remote;
                g->custody.who.uid = (uid_t)j->holder_uid;
                snprintf(g->custody.who.key, sizeof(g->custody.who.key), "%s",
                         j->holder_key ? j->holder_key : "");
                snprintf(g->custody.who.tenant, sizeof(g->custody.who.tenant), "%s",
                         j->holder_tenant ? j->holder_tenant : "");
                g->custody.who.lends_to_all = j->holder_lends_to_all && !j->holder_remote;
                g->custody.has_secret = j->secret_hash.len == BROKER_SECRET_HASH_LEN;
                if (g->custody.has_secret)
                        memcpy(g->custody.secret_hash, j->secret_hash.data, BROKER_SECRET_HASH_LEN);
        } else if (j->pid) {
                /* Journaled before custody existed: the process that held it, uid unknown. */
                g->custody.held = true;
                g->custody.who.uid = CUSTODY_UID_UNKNOWN;
        }
        if (g->custody.held && !g->custody.who.remote)
                g->custody.who.process = g->process;
        return 0;
}

static int apply_op(struct broker *broker, const Aquaj__JOp *op)
{
        struct chunk *c;
        struct lease *l;
        int r;

        switch (op->op_case) {
        case AQUAJ__JOP__OP_SNAPSHOT: {
                const Aquaj__JSnapshot *s = op->snapshot;
                /* A snapshot replaces all journaled state: the operator's pins, not the
                 * config's. */
                broker_clear(broker);
                pins_clear(broker, "aquactl");
                for (size_t i = 0; i < s->n_leases; i++)
                        if ((r = apply_lease(broker, s->leases[i])) < 0)
                                return r;
                for (size_t i = 0; i < s->n_chunks; i++)
                        if ((r = apply_chunk(broker, s->chunks[i])) < 0)
                                return r;
                for (size_t i = 0; i < s->n_gpus; i++)
                        if ((r = apply_gpu(broker, s->gpus[i])) < 0)
                                return r;
                for (size_t i = 0; i < s->n_pairs; i++)
                        if ((r = broker_pins_add(broker, s->pairs[i]->producer,
                                                 s->pairs[i]->consumer, "aquactl")) < 0)
                                return r;
                broker->next_chunk_id = MAX(broker->next_chunk_id, s->next_chunk_id);
                broker->next_lease_id = MAX(broker->next_lease_id, s->next_lease_id);
                return 0;
        }
        case AQUAJ__JOP__OP_CHUNK_SET:
                return apply_chunk(broker, op->chunk_set);
        case AQUAJ__JOP__OP_CHUNK_DEL:
                c = broker_find_chunk(broker, op->chunk_del);
                if (c)
                        chunk_destroy(broker, c);
                return 0;
        case AQUAJ__JOP__OP_LEASE_SET:
                return apply_lease(broker, op->lease_set);
        case AQUAJ__JOP__OP_LEASE_DEL:
                l = broker_find_lease(broker, op->lease_del);
                if (l)
                        lease_destroy(broker, l);
                return 0;
        case AQUAJ__JOP__OP_GPU_SET:
                return apply_gpu(broker, op->gpu_set);
        case AQUAJ__JOP__OP_PAIR_SET:
                return broker_pins_add(broker, op->pair_set->producer, op->pair_set->consumer,
                                       "aquactl");
        case AQUAJ__JOP__OP_PAIR_DEL:
                broker_pins_remove(broker, op->pair_del);
                return 0;
        default:
                /* An operation a newer aquad wrote: skipping it is safer than refusing to start. */
                return 0;
        }
}

int broker_apply(const Aquaj__JournalRecord *rec, void *userdata)
{
        struct broker *broker = userdata;
        int r = 0;

        broker->replaying = true;
        for (size_t i = 0; i < rec->n_ops && r >= 0; i++)
                r = apply_op(broker, rec->ops[i]);
        broker->replaying = false;
        return r;
}

void broker_attach_journal(struct broker *broker, struct journal *j, uint64_t compact_threshold)
{
        bool any = false;

        broker->journal = j;
        broker->compact_threshold = compact_threshold;
        for (struct list_node *n = broker->gpus.next; n != &broker->gpus; n = n->next) {
                struct gpu *g = list_entry(n, struct gpu, node);
                if (g->restored)
                        any = true;
        }
        for (struct list_node *n = broker->leases.next; n != &broker->leases; n = n->next) {
                struct lease *l = list_entry(n, struct lease, broker_node);
                for (struct list_node *k = l->chunks.next; k != &l->chunks; k = k->next)
                        broker_note_deadline(broker,
                                             list_entry(k, struct chunk, lease_node)->deadline_ns);
        }
        if (broker->n_quarantined) {
                broker->quarantine_check_ns = now_mono_ns();
                broker_note_deadline(broker, broker->quarantine_check_ns);
        }
        if (any) {
                broker->reconcile_deadline_ns =
                    now_mono_ns() + broker->settings.reconcile_timeout_ns;
                broker_note_deadline(broker, broker->reconcile_deadline_ns);
        }
}

/* ------------------------------------------------------------------------------ snapshot */

int broker_snapshot(struct broker *broker, Aquaj__JournalRecord **ret)
{
        Aquaj__JournalRecord *rec;
        Aquaj__JSnapshot *s;
        Aquaj__JOp *op;
        size_t n_gpus = 0;

        rec = malloc(sizeof(*rec));
        op = malloc(sizeof(*op));
        s = malloc(sizeof(*s));
        if (!rec || !op || !s) {
                free(rec);
                free(op);
                free(s);
                return -ENOMEM;
        }
        aquaj__journal_record__init(rec);
        aquaj__jop__init(op);
        aquaj__jsnapshot__init(s);
        op->op_case = AQUAJ__JOP__OP_SNAPSHOT;
        op->snapshot = s;
        rec->ops = malloc(sizeof(*rec->ops));
        if (!rec->ops)
                goto oom;
        rec->ops[0] = op;
        rec->n_ops = 1;
        op = NULL;

        s->next_chunk_id = broker->next_chunk_id;
        s->next_lease_id = broker->next_lease_id;
        s->chunks = calloc(broker->n_chunks ? broker->n_chunks : 1, sizeof(*s->chunks));
        s->leases = calloc(broker->n_leases ? broker->n_leases : 1, sizeof(*s->leases));
        s->gpus = calloc(broker->n_gpus ? broker->n_gpus : 1, sizeof(*s->gpus));
        s->pairs = calloc(broker->n_pins ? broker->n_pins : 1, sizeof(*s->pairs));
        if (!s->chunks || !s->leases || !s->gpus || !s->pairs)
                goto oom;
        for (struct list_node *n = broker->leases.next; n != &broker->leases; n = n->next)
                if (!(s->leases[s->n_leases++] =
                          jlease_new(list_entry(n, struct lease, broker_node))))
                        goto oom;
        for (struct list_node *n = broker->gpus.next; n != &broker->gpus; n = n->next) {
                struct gpu *g = list_entry(n, struct gpu, node);
                for (struct list_node *k = g->chunks.next; k != &g->chunks; k = k->next)
                        if (!(s->chunks[s->n_chunks++] =
                                  jchunk_new(list_entry(k, struct chunk, producer_node))))
                                goto oom;
                if ((g->dram_bytes || g->barred || g->draining || g->process.pid ||
                     g->custody.held) &&
                    n_gpus < broker->n_gpus) {
                        if (!(s->gpus[s->n_gpus++] = jgpu_new(g)))
                                goto oom;
                        n_gpus++;
                }
        }
        for (size_t i = 0; i < broker->n_pins; i++) {
                if (strcmp(broker->pins[i].source, "aquactl") != 0)
                        continue;
                if (!(s->pairs[s->n_pairs++] =
                          jpair_new(broker->pins[i].producer, broker->pins[i].consumer, "aquactl")))
                        goto oom;
        }
        *ret = rec;
        return 0;
oom:
        /* Counted entries may include a NULL last one; free_unpacked skips NULL submessages. */
        free(op);
        aquaj__journal_record__free_unpacked(rec, NULL);
        return -ENOMEM;
}
