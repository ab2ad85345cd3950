/*
 * The journal's operations as values: each change of the books (a chunk, lease or GPU written or
 * deleted, a pin) appends one to the pool's list for the turn; broker-journal.c commits them.
 * Below the core's modules, which call it; it reads objects and calls none of them.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "broker-private.h"
#include "log.h"
#include "time-util.h"

static void op_push(struct broker *broker, Aquaj__JOp *op)
{
        if (broker->replaying) {
                if (op)
                        aquaj__jop__free_unpacked(op, NULL);
                return;
        }
        if (!op)
                goto oom;
        if (broker->n_ops == broker->alloc_ops) {
                size_t n = broker->alloc_ops ? broker->alloc_ops * 2 : 16;
                Aquaj__JOp **ops = reallocarray(broker->ops, n, sizeof(*ops));
                if (!ops)
                        goto oom;
                broker->ops = ops;
                broker->alloc_ops = n;
        }
        broker->ops[broker->n_ops++] = op;
        return;
oom:
        if (op)
                aquaj__jop__free_unpacked(op, NULL);
        broker->stats.journal_errors++;
        log_error("Out of memory recording a journal operation; state may not survive a restart");
}

static Aquaj__JOp *op_new(Aquaj__JOp__OpCase kind)
{
        Aquaj__JOp *op = malloc(sizeof(*op));

        if (!op)
                return NULL;
        aquaj__jop__init(op);
        op->op_case = kind;
        return op;
}

Aquaj__JChunk *jchunk_new(const struct chunk *c)
{
        Aquaj__JChunk *j = malloc(sizeof(*j));

        if (!j)
                return NULL;
        aquaj__jchunk__init(j);
        j->id = c->id;
        j->producer = strdup(c->producer->uuid);
        j->size = c->size;
        j->client_ref = c->client_ref;
        j->lease_id = c->lease ? c->lease->id : 0;
        j->reclaiming = c->state == CHUNK_RECLAIMING;
        j->orphan = c->orphan;
        j->dirty = c->dirty;
        j->deadline_ms = c->deadline_wall_ms;
        j->quarantined = c->quarantined;
        j->quarantine_back = c->quarantine_back;
        if (c->quarantined) {
                j->quarantine_pid = c->quarantine.pid > 0 ? (uint32_t)c->quarantine.pid : 0;
                j->quarantine_start_time = c->quarantine.start_time;
                if (c->quarantine.boot_id[0] &&
                    !(j->quarantine_boot_id = strdup(c->quarantine.boot_id))) {
                        free(j->producer);
                        j->producer = NULL;
                }
        }
        if (!j->producer) {
                free(j);
                return NULL;
        }
        return j;
}

Aquaj__JLease *jlease_new(const struct lease *l)
{
        Aquaj__JLease *j = malloc(sizeof(*j));

        if (!j)
                return NULL;
        aquaj__jlease__init(j);
        j->id = l->id;
        j->consumer = strdup(l->consumer->uuid);
        j->producer = strdup(l->producer->uuid);
        j->created_ms = l->created_ms;
        if (l->reason)
                j->reason = strdup(l->reason);
        if (!j->consumer || !j->producer || (l->reason && !j->reason)) {
                aquaj__jlease__free_unpacked(j, NULL);
                return NULL;
        }
        return j;
}

Aquaj__JGpu *jgpu_new(const struct gpu *g)
{
        Aquaj__JGpu *j = malloc(sizeof(*j));

        if (!j)
                return NULL;
        aquaj__jgpu__init(j);
        j->uuid = strdup(g->uuid);
        j->dram_bytes = g->dram_bytes;
        j->barred = g->barred;
        j->draining = g->draining;
        j->pid = g->process.pid > 0 ? (uint32_t)g->process.pid : 0;
        j->start_time = g->process.start_time;
        j->ordinal_known = g->ordinal_known;
        j->ordinal = g->ordinal;
        if (g->host)
                j->host = strdup(g->host);
        if (g->client_name)
                j->client_name = strdup(g->client_name);
        if ((g->host && !j->host) || (g->client_name && !j->client_name)) {
                aquaj__jgpu__free_unpacked(j, NULL);
                return NULL;
        }
        j->custody = g->custody.held;
        if (g->custody.held) {
                j->holder_remote = g->custody.who.remote;
                j->holder_uid = (uint32_t)g->custody.who.uid;
                if (g->custody.who.key[0])
                        j->holder_key = strdup(g->custody.who.key);
                if (g->custody.who.tenant[0])
                        j->holder_tenant = strdup(g->custody.who.tenant);
                j->holder_lends_to_all = g->custody.who.lends_to_all;
                if (g->custody.has_secret) {
                        j->secret_hash.data = malloc(BROKER_SECRET_HASH_LEN);
                        if (j->secret_hash.data) {
                                memcpy(j->secret_hash.data, g->custody.secret_hash,
                                       BROKER_SECRET_HASH_LEN);
                                j->secret_hash.len = BROKER_SECRET_HASH_LEN;
                        }
                }
        }
        if (g->process.boot_id[0])
                j->boot_id = strdup(g->process.boot_id);
        if (!j->uuid || (g->process.boot_id[0] && !j->boot_id) ||
            (g->custody.who.key[0] && g->custody.held && !j->holder_key) ||
            (g->custody.who.tenant[0] && g->custody.held && !j->holder_tenant) ||
            (g->custody.held && g->custody.has_secret && !j->secret_hash.data)) {
                aquaj__jgpu__free_unpacked(j, NULL);
                return NULL;
        }
        return j;
}

Aquaj__JPair *jpair_new(const char *producer, const char *consumer, const char *source)
{
        Aquaj__JPair *j = malloc(sizeof(*j));

        if (!j)
                return NULL;
        aquaj__jpair__init(j);
        j->producer = strdup(producer);
        j->consumer = strdup(consumer);
        j->source = strdup(source);
        if (!j->producer || !j->consumer || !j->source) {
                aquaj__jpair__free_unpacked(j, NULL);
                return NULL;
        }
        return j;
}

/* An op carrying payload, or NULL (counted by op_push) when either allocation failed. */
static Aquaj__JOp *op_with(Aquaj__JOp *op, const void *payload)
{
        if (op && !payload) {
                free(op);
                return NULL;
        }
        return op;
}

void journal_chunk(struct broker *broker, const struct chunk *c)
{
        Aquaj__JOp *op = op_new(AQUAJ__JOP__OP_CHUNK_SET);

        if (op)
                op->chunk_set = jchunk_new(c);
        op_push(broker, op_with(op, op ? op->chunk_set : NULL));
}

void journal_lease(struct broker *broker, const struct lease *l)
{
        Aquaj__JOp *op = op_new(AQUAJ__JOP__OP_LEASE_SET);

        if (op)
                op->lease_set = jlease_new(l);
        op_push(broker, op_with(op, op ? op->lease_set : NULL));
}

void journal_gpu(struct broker *broker, const struct gpu *g)
{
        Aquaj__JOp *op = op_new(AQUAJ__JOP__OP_GPU_SET);

        if (op)
                op->gpu_set = jgpu_new(g);
        op_push(broker, op_with(op, op ? op->gpu_set : NULL));
}

void journal_del(struct broker *broker, bool chunk, uint64_t id)
{
        Aquaj__JOp *op = op_new(chunk ? AQUAJ__JOP__OP_CHUNK_DEL : AQUAJ__JOP__OP_LEASE_DEL);

        if (op) {
                if (chunk)
                        op->chunk_del = id;
                else
                        op->lease_del = id;
        }
        op_push(broker, op);
}

void journal_pin(struct broker *broker, const char *producer, const char *consumer, bool del)
{
        Aquaj__JOp *op = op_new(del ? AQUAJ__JOP__OP_PAIR_DEL : AQUAJ__JOP__OP_PAIR_SET);

        if (!op)
                return op_push(broker, NULL);
        if (del) {
                op->pair_del = strdup(producer);
                op = op_with(op, op->pair_del);
        } else {
                op->pair_set = jpair_new(producer, consumer, "aquactl");
                op = op_with(op, op->pair_set);
        }
        op_push(broker, op);
}

void broker_ops_clear(struct broker *broker)
{
        for (size_t i = 0; i < broker->n_ops; i++)
                aquaj__jop__free_unpacked(broker->ops[i], NULL);
        broker->n_ops = 0;
}
