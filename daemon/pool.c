/* The pool's objects (gpu, chunk, lease), their journal records, notices, replay and snapshot. */
#include "pool-private.h"

#include <search.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "parse-util.h"
#include "time-util.h"

static int cmp_id(const void *a, const void *b)
{
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

        return x < y ? -1 : x > y;
}

static void *tree_find(void *const *root, uint64_t id)
{
        void **n = tfind(&id, root, cmp_id);

        return n ? *n : NULL;
}

int pool_fail(char *err, int code, const char *fmt, ...)
{
        va_list ap;

        if (err) {
                va_start(ap, fmt);
                vsnprintf(err, POOL_ERR_MAX, fmt, ap);
                va_end(ap);
        }
        return code;
}

const char *chunk_state_to_string(enum chunk_state s)
{
        static const char *const names[_CHUNK_STATE_MAX] = {"free", "leased", "reclaiming"};

        return s < _CHUNK_STATE_MAX ? names[s] : "invalid";
}

const char *lease_state_to_string(enum lease_state s)
{
        static const char *const names[_LEASE_STATE_MAX] = {"granted", "reclaiming", "returned",
                                                            "lost"};

        return s < _LEASE_STATE_MAX ? names[s] : "invalid";
}

void pool_note_deadline(struct pool *p, uint64_t deadline_ns)
{
        if (deadline_ns && (!p->next_deadline_ns || deadline_ns < p->next_deadline_ns))
                p->next_deadline_ns = deadline_ns;
}

/* ------------------------------------------------------------------------------ journal ops */

static void op_push(struct pool *p, Aquaj__JOp *op)
{
        if (p->replaying) {
                if (op)
                        aquaj__jop__free_unpacked(op, NULL);
                return;
        }
        if (!op)
                goto oom;
        if (p->n_ops == p->alloc_ops) {
                size_t n = p->alloc_ops ? p->alloc_ops * 2 : 16;
                Aquaj__JOp **ops = reallocarray(p->ops, n, sizeof(*ops));
                if (!ops)
                        goto oom;
                p->ops = ops;
                p->alloc_ops = n;
        }
        p->ops[p->n_ops++] = op;
        return;
oom:
        if (op)
                aquaj__jop__free_unpacked(op, NULL);
        p->stats.journal_errors++;
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

static Aquaj__JChunk *jchunk_new(const struct chunk *c)
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
        j->deadline_ms = c->deadline_ms;
        if (!j->producer) {
                free(j);
                return NULL;
        }
        return j;
}

static Aquaj__JLease *jlease_new(const struct lease *l)
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

static Aquaj__JGpu *jgpu_new(const struct gpu *g)
{
        Aquaj__JGpu *j = malloc(sizeof(*j));

        if (!j)
                return NULL;
        aquaj__jgpu__init(j);
        j->uuid = strdup(g->uuid);
        j->dram_bytes = g->dram_bytes;
        j->barred = g->barred;
        j->draining = g->draining;
        if (!j->uuid) {
                free(j);
                return NULL;
        }
        return j;
}

static Aquaj__JPair *jpair_new(const char *producer, const char *consumer, const char *source)
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

void journal_chunk(struct pool *p, const struct chunk *c)
{
        Aquaj__JOp *op = op_new(AQUAJ__JOP__OP_CHUNK_SET);

        if (op)
                op->chunk_set = jchunk_new(c);
        op_push(p, op_with(op, op ? op->chunk_set : NULL));
}

void journal_lease(struct pool *p, const struct lease *l)
{
        Aquaj__JOp *op = op_new(AQUAJ__JOP__OP_LEASE_SET);

        if (op)
                op->lease_set = jlease_new(l);
        op_push(p, op_with(op, op ? op->lease_set : NULL));
}

void journal_gpu(struct pool *p, const struct gpu *g)
{
        Aquaj__JOp *op = op_new(AQUAJ__JOP__OP_GPU_SET);

        if (op)
                op->gpu_set = jgpu_new(g);
        op_push(p, op_with(op, op ? op->gpu_set : NULL));
}

void journal_del(struct pool *p, bool chunk, uint64_t id)
{
        Aquaj__JOp *op = op_new(chunk ? AQUAJ__JOP__OP_CHUNK_DEL : AQUAJ__JOP__OP_LEASE_DEL);

        if (op) {
                if (chunk)
                        op->chunk_del = id;
                else
                        op->lease_del = id;
        }
        op_push(p, op);
}

void journal_pin(struct pool *p, const char *producer, const char *consumer, bool del)
{
        Aquaj__JOp *op = op_new(del ? AQUAJ__JOP__OP_PAIR_DEL : AQUAJ__JOP__OP_PAIR_SET);

        if (!op)
                return op_push(p, NULL);
        if (del) {
                op->pair_del = strdup(producer);
                op = op_with(op, op->pair_del);
        } else {
                op->pair_set = jpair_new(producer, consumer, "aquactl");
                op = op_with(op, op->pair_set);
        }
        op_push(p, op);
}

static void ops_clear(struct pool *p)
{
        for (size_t i = 0; i < p->n_ops; i++)
                aquaj__jop__free_unpacked(p->ops[i], NULL);
        p->n_ops = 0;
}

int pool_commit(struct pool *p)
{
        Aquaj__JournalRecord rec = AQUAJ__JOURNAL_RECORD__INIT;
        int r = 0;

        if (p->n_ops == 0)
                return 0;
        if (p->journal) {
                rec.n_ops = p->n_ops;
                rec.ops = p->ops;
                r = journal_append(p->journal, &rec);
                if (r < 0) {
                        p->stats.journal_errors++;
                        log_error_errno(r, "Failed to write the journal: %m; the last change may "
                                           "not survive a restart");
                }
        }
        ops_clear(p);
        if (r == 0 && p->journal && journal_wants_compaction(p->journal, p->compact_threshold)) {
                Aquaj__JournalRecord *snap = NULL;

                r = pool_snapshot(p, &snap);
                if (r >= 0)
                        r = journal_compact(p->journal, snap);
                if (snap)
                        aquaj__journal_record__free_unpacked(snap, NULL);
                if (r < 0) {
                        p->stats.journal_errors++;
                        log_warning_errno(r, "Failed to compact the journal: %m");
                        r = 0; /* the log itself is intact */
                }
        }
        return r;
}

/* ------------------------------------------------------------------------------ notices */

void notice_queue(struct pool *p, enum notice_kind kind, struct gpu *to, uint64_t lease_id,
                  const uint64_t *ids, size_t n, uint64_t deadline_ms, const char *text)
{
        struct notice *m;

        if (!to || !to->owner || p->replaying)
                return;
        m = calloc(1, sizeof(*m));
        if (!m)
                goto oom;
        m->kind = kind;
        m->gpu = to;
        m->lease_id = lease_id;
        m->deadline_ms = deadline_ms;
        if (n > 0) {
                m->chunk_ids = malloc(n * sizeof(*ids));
                if (!m->chunk_ids)
                        goto oom;
                memcpy(m->chunk_ids, ids, n * sizeof(*ids));
                m->n_chunk_ids = n;
        }
        if (text && !(m->text = strdup(text)))
                goto oom;
        list_append(&p->notices, &m->node);
        return;
oom:
        notice_free(m);
        log_error("Out of memory queueing a notice for %s", to->uuid);
}

struct notice *notice_free(struct notice *n)
{
        if (!n)
                return NULL;
        list_unlink(&n->node);
        free(n->chunk_ids);
        free(n->text);
        free(n);
        return NULL;
}

void pool_take_notices(struct pool *p, struct list_node *into)
{
        struct list_node *pos, *tmp;

        list_for_each(pos, tmp, &p->notices)
        {
                list_unlink(pos);
                list_append(into, pos);
        }
}

/* ------------------------------------------------------------------------------ objects */

struct gpu *pool_find_gpu(struct pool *p, const char *key)
{
        struct list_node *pos, *tmp;
        struct gpu *by_ordinal = NULL;
        int64_t ordinal = -1;

        if (!key || !key[0])
                return NULL;
        (void)parse_int64(key, 10, &ordinal);
        list_for_each(pos, tmp, &p->gpus)
        {
                struct gpu *g = list_entry(pos, struct gpu, node);
                if (strcmp(g->uuid, key) == 0)
                        return g;
                /* Prefer a connected GPU when an ordinal is ambiguous across restarts. */
                if (ordinal >= 0 && g->ordinal == ordinal && (!by_ordinal || g->owner))
                        by_ordinal = g;
        }
        return by_ordinal;
}

struct chunk *pool_find_chunk(struct pool *p, uint64_t id)
{
        return tree_find(&p->chunks_by_id, id);
}

struct lease *pool_find_lease(struct pool *p, uint64_t id)
{
        return tree_find(&p->leases_by_id, id);
}

struct gpu *gpu_ensure(struct pool *p, const char *uuid)
{
        struct gpu *g;

        for (struct list_node *n = p->gpus.next; n != &p->gpus; n = n->next) {
                g = list_entry(n, struct gpu, node);
                if (strcmp(g->uuid, uuid) == 0)
                        return g;
        }
        g = calloc(1, sizeof(*g));
        if (!g)
                return NULL;
        g->uuid = strdup(uuid);
        if (!g->uuid) {
                free(g);
                return NULL;
        }
        g->role = AQUA__ROLE__ROLE_UNSPECIFIED;
        list_init(&g->chunks);
        list_init(&g->free_chunks);
        list_init(&g->leases);
        list_append(&p->gpus, &g->node);
        p->n_gpus++;
        return g;
}

static void gpu_free_links(struct gpu *g)
{
        for (size_t i = 0; i < g->n_links; i++)
                free(g->links[i].uuid);
        free(g->links);
        g->links = NULL;
        g->n_links = 0;
}

static void gpu_destroy(struct pool *p, struct gpu *g)
{
        list_unlink(&g->node);
        p->n_gpus--;
        gpu_free_links(g);
        free(g->client_name);
        free(g->uuid);
        free(g);
}

static bool pinned(const struct pool *p, const struct gpu *g)
{
        for (size_t i = 0; i < p->n_pins; i++)
                if (strcmp(p->pins[i].producer, g->uuid) == 0 ||
                    strcmp(p->pins[i].consumer, g->uuid) == 0)
                        return true;
        return false;
}

void gpu_gc(struct pool *p, struct gpu *g)
{
        struct list_node *pos, *tmp;

        if (!g || g->owner || g->restored || !list_empty(&g->chunks) || !list_empty(&g->leases) ||
            g->dram_bytes || g->barred || g->draining || g->paired || pinned(p, g))
                return;
        list_for_each(pos, tmp, &p->notices)
        {
                if (list_entry(pos, struct notice, node)->gpu == g)
                        return;
        }
        gpu_destroy(p, g);
}

void gpu_set_pair(struct pool *p, struct gpu *g, struct gpu *mate, const char *source,
                  double bandwidth)
{
        if (g->paired == mate)
                return;
        g->paired = mate;
        g->pair_source = mate ? source : NULL;
        g->pair_bandwidth = mate ? bandwidth : 0;
        notice_queue(p, NOTICE_PAIR_CHANGED, g, 0, NULL, 0, 0, mate ? mate->uuid : "");
}

bool chunk_grantable(const struct chunk *c)
{
        return c->state == CHUNK_FREE && c->fd >= 0 && !c->orphan && c->producer->owner &&
               !c->producer->draining;
}

void chunk_set_free_listed(struct chunk *c)
{
        list_unlink(&c->free_node);
        if (chunk_grantable(c))
                list_append(&c->producer->free_chunks, &c->free_node);
}

struct chunk *chunk_new(struct pool *p, struct gpu *producer, uint64_t id, uint64_t size,
                        uint64_t client_ref, int fd)
{
        struct chunk *c = calloc(1, sizeof(*c));

        if (!c)
                return NULL;
        *c = (struct chunk){.id = id, .producer = producer, .size = size,
                            .client_ref = client_ref, .fd = fd, .state = CHUNK_FREE};
        list_init(&c->producer_node);
        list_init(&c->free_node);
        list_init(&c->lease_node);
        if (!tsearch(c, &p->chunks_by_id, cmp_id)) {
                free(c);
                return NULL;
        }
        list_append(&producer->chunks, &c->producer_node);
        producer->offered_bytes += size;
        p->pool_bytes += size;
        p->n_chunks++;
        if (id >= p->next_chunk_id)
                p->next_chunk_id = id + 1;
        chunk_set_free_listed(c);
        return c;
}

static void chunk_unlink_lease(struct pool *p, struct chunk *c)
{
        struct lease *l = c->lease;

        if (!l)
                return;
        list_unlink(&c->lease_node);
        l->n_chunks--;
        l->bytes -= c->size;
        l->consumer->borrowed_bytes -= c->size;
        c->producer->lent_bytes -= c->size;
        p->lent_bytes -= c->size;
        c->lease = NULL;
        c->deadline_ns = 0;
        c->deadline_ms = 0;
        lease_update_state(l);
}

static void chunk_destroy(struct pool *p, struct chunk *c)
{
        chunk_unlink_lease(p, c);
        list_unlink(&c->free_node);
        list_unlink(&c->producer_node);
        tdelete(c, &p->chunks_by_id, cmp_id);
        c->producer->offered_bytes -= c->size;
        p->pool_bytes -= c->size;
        p->n_chunks--;
        safe_close(c->fd);
        free(c);
}

void chunk_drop(struct pool *p, struct chunk *c)
{
        journal_del(p, true, c->id);
        chunk_destroy(p, c);
}

void chunk_lease(struct pool *p, struct chunk *c, struct lease *l)
{
        list_unlink(&c->free_node);
        c->state = CHUNK_LEASED;
        c->lease = l;
        list_append(&l->chunks, &c->lease_node);
        l->n_chunks++;
        l->bytes += c->size;
        l->consumer->borrowed_bytes += c->size;
        c->producer->lent_bytes += c->size;
        p->lent_bytes += c->size;
}

void chunk_release(struct pool *p, struct chunk *c)
{
        chunk_unlink_lease(p, c);
        c->state = CHUNK_FREE;
        chunk_set_free_listed(c);
}

void lease_update_state(struct lease *l)
{
        struct list_node *pos, *tmp;

        if (l->state == LEASE_LOST)
                return;
        if (l->n_chunks == 0) {
                l->state = LEASE_RETURNED;
                return;
        }
        l->state = LEASE_GRANTED;
        list_for_each(pos, tmp, &l->chunks)
        {
                if (list_entry(pos, struct chunk, lease_node)->state == CHUNK_RECLAIMING) {
                        l->state = LEASE_RECLAIMING;
                        return;
                }
        }
}

struct lease *lease_new(struct pool *p, uint64_t id, struct gpu *consumer, struct gpu *producer)
{
        struct lease *l = calloc(1, sizeof(*l));

        if (!l)
                return NULL;
        *l = (struct lease){.id = id, .consumer = consumer, .producer = producer,
                            .state = LEASE_GRANTED, .created_ms = now_real_ns() / NSEC_PER_MSEC,
                            .created_ns = now_mono_ns()};
        list_init(&l->chunks);
        list_init(&l->consumer_node);
        list_init(&l->pool_node);
        if (!tsearch(l, &p->leases_by_id, cmp_id)) {
                free(l);
                return NULL;
        }
        list_append(&consumer->leases, &l->consumer_node);
        list_append(&p->leases, &l->pool_node);
        p->n_leases++;
        if (id >= p->next_lease_id)
                p->next_lease_id = id + 1;
        return l;
}

static void lease_destroy(struct pool *p, struct lease *l)
{
        while (!list_empty(&l->chunks))
                chunk_release(p, list_entry(l->chunks.next, struct chunk, lease_node));
        tdelete(l, &p->leases_by_id, cmp_id);
        list_unlink(&l->consumer_node);
        list_unlink(&l->pool_node);
        p->n_leases--;
        free(l->reason);
        free(l);
}

void lease_free(struct pool *p, struct lease *l)
{
        if (!l)
                return;
        journal_del(p, false, l->id);
        lease_destroy(p, l);
}

/* ------------------------------------------------------------------------------ lifecycle */

int pool_new(const struct pool_settings *settings, struct pool **ret)
{
        struct pool *p = calloc(1, sizeof(*p));
        int r;

        if (!p)
                return -ENOMEM;
        p->settings = *settings;
        list_init(&p->gpus);
        list_init(&p->leases);
        list_init(&p->notices);
        p->next_chunk_id = p->next_lease_id = 1;
        r = events_init(&p->events, EVENTS_DEFAULT_SIZE);
        if (r < 0) {
                free(p);
                return r;
        }
        *ret = p;
        return 0;
}

static void pins_clear(struct pool *p, bool config_only)
{
        size_t k = 0;

        for (size_t i = 0; i < p->n_pins; i++) {
                if (!config_only || strcmp(p->pins[i].source, "config") != 0) {
                        p->pins[k++] = p->pins[i];
                        continue;
                }
                free(p->pins[i].producer);
                free(p->pins[i].consumer);
        }
        if (!config_only) {
                for (size_t i = 0; i < k; i++) {
                        free(p->pins[i].producer);
                        free(p->pins[i].consumer);
                }
                k = 0;
        }
        p->n_pins = k;
}

/* Forget all state (a snapshot replaces it, or the pool goes away). */
static void pool_clear(struct pool *p)
{
        while (!list_empty(&p->leases))
                lease_destroy(p, list_entry(p->leases.next, struct lease, pool_node));
        for (struct list_node *n = p->gpus.next; n != &p->gpus; n = n->next) {
                struct gpu *g = list_entry(n, struct gpu, node);
                while (!list_empty(&g->chunks))
                        chunk_destroy(p, list_entry(g->chunks.next, struct chunk, producer_node));
                p->dram_granted -= g->dram_bytes;
                g->dram_bytes = 0;
                g->barred = g->draining = false;
        }
}

struct pool *pool_free(struct pool *p)
{
        struct list_node *pos, *tmp;

        if (!p)
                return NULL;
        pool_clear(p);
        list_for_each(pos, tmp, &p->notices)
        {
                notice_free(list_entry(pos, struct notice, node));
        }
        list_for_each(pos, tmp, &p->gpus)
        {
                gpu_destroy(p, list_entry(pos, struct gpu, node));
        }
        ops_clear(p);
        free(p->ops);
        pins_clear(p, false);
        free(p->pins);
        events_deinit(&p->events);
        journal_free(p->journal);
        free(p);
        return NULL;
}

static int pin_add(struct pool *p, const char *producer, const char *consumer, const char *source)
{
        struct pool_pin *pins = reallocarray(p->pins, p->n_pins + 1, sizeof(*pins));

        if (!pins)
                return -ENOMEM;
        p->pins = pins;
        pins[p->n_pins] = (struct pool_pin){strdup(producer), strdup(consumer), source};
        if (!pins[p->n_pins].producer || !pins[p->n_pins].consumer) {
                free(pins[p->n_pins].producer);
                free(pins[p->n_pins].consumer);
                return -ENOMEM;
        }
        p->n_pins++;
        return 0;
}

/* Remove every pin that names uuid on either side; returns how many. */
size_t pool_pins_remove(struct pool *p, const char *uuid)
{
        size_t k = 0, removed = 0;

        for (size_t i = 0; i < p->n_pins; i++) {
                if (strcmp(p->pins[i].producer, uuid) == 0 ||
                    strcmp(p->pins[i].consumer, uuid) == 0) {
                        free(p->pins[i].producer);
                        free(p->pins[i].consumer);
                        removed++;
                        continue;
                }
                p->pins[k++] = p->pins[i];
        }
        p->n_pins = k;
        return removed;
}

int pool_pins_add(struct pool *p, const char *producer, const char *consumer, const char *source)
{
        if (producer[0])
                pool_pins_remove(p, producer);
        if (consumer[0])
                pool_pins_remove(p, consumer);
        return pin_add(p, producer, consumer, source);
}

int pool_set_config_pins(struct pool *p, const char *const *producers,
                         const char *const *consumers, size_t n)
{
        int r;

        pins_clear(p, true);
        for (size_t i = 0; i < n; i++) {
                /* An operator's pin on either GPU wins over the config. */
                bool taken = false;
                for (size_t k = 0; k < p->n_pins; k++)
                        if (strcmp(p->pins[k].producer, producers[i]) == 0 ||
                            strcmp(p->pins[k].consumer, consumers[i]) == 0 ||
                            strcmp(p->pins[k].producer, consumers[i]) == 0 ||
                            strcmp(p->pins[k].consumer, producers[i]) == 0)
                                taken = true;
                if (taken)
                        continue;
                r = pin_add(p, producers[i], consumers[i], "config");
                if (r < 0)
                        return r;
        }
        return 0;
}

/* ------------------------------------------------------------------------------ replay */

static struct gpu *restored_gpu(struct pool *p, const char *uuid, Aqua__Role role)
{
        struct gpu *g;

        if (!uuid || !uuid[0])
                return NULL;
        g = gpu_ensure(p, uuid);
        if (!g)
                return NULL;
        if (!g->owner)
                g->restored = true;
        if (g->role == AQUA__ROLE__ROLE_UNSPECIFIED)
                g->role = role;
        return g;
}

static int apply_lease(struct pool *p, const Aquaj__JLease *j)
{
        struct lease *l = pool_find_lease(p, j->id);
        struct gpu *consumer, *producer;

        if (!l) {
                consumer = restored_gpu(p, j->consumer, AQUA__ROLE__ROLE_CONSUMER);
                producer = restored_gpu(p, j->producer, AQUA__ROLE__ROLE_PRODUCER);
                if (!consumer || !producer || j->id == 0)
                        return -EBADMSG;
                l = lease_new(p, j->id, consumer, producer);
                if (!l)
                        return -ENOMEM;
        }
        l->created_ms = j->created_ms;
        free(l->reason);
        l->reason = j->reason && j->reason[0] ? strdup(j->reason) : NULL;
        return 0;
}

static int apply_chunk(struct pool *p, const Aquaj__JChunk *j)
{
        struct chunk *c = pool_find_chunk(p, j->id);
        struct lease *l = j->lease_id ? pool_find_lease(p, j->lease_id) : NULL;
        uint64_t now_ms = now_real_ns() / NSEC_PER_MSEC;

        if (!c) {
                struct gpu *producer = restored_gpu(p, j->producer, AQUA__ROLE__ROLE_PRODUCER);
                if (!producer || j->id == 0)
                        return -EBADMSG;
                c = chunk_new(p, producer, j->id, j->size, j->client_ref, -1);
                if (!c)
                        return -ENOMEM;
        }
        if (c->lease != l) {
                chunk_release(p, c);
                if (l)
                        chunk_lease(p, c, l);
        }
        c->orphan = j->orphan;
        c->state = !l ? CHUNK_FREE : j->reclaiming ? CHUNK_RECLAIMING : CHUNK_LEASED;
        c->deadline_ms = l ? j->deadline_ms : 0;
        c->deadline_ns = 0;
        if (c->deadline_ms) {
                /* Deadlines survive a restart as wall-clock times. */
                uint64_t left = c->deadline_ms > now_ms ? c->deadline_ms - now_ms : 0;
                c->deadline_ns = now_mono_ns() + left * NSEC_PER_MSEC;
        }
        if (l)
                lease_update_state(l);
        chunk_set_free_listed(c);
        return 0;
}

static int apply_gpu(struct pool *p, const Aquaj__JGpu *j)
{
        struct gpu *g = restored_gpu(p, j->uuid, AQUA__ROLE__ROLE_UNSPECIFIED);

        if (!g)
                return -EBADMSG;
        p->dram_granted = p->dram_granted - g->dram_bytes + j->dram_bytes;
        g->dram_bytes = j->dram_bytes;
        g->barred = j->barred;
        g->draining = j->draining;
        return 0;
}

static int apply_op(struct pool *p, const Aquaj__JOp *op)
{
        struct chunk *c;
        struct lease *l;
        int r;

        switch (op->op_case) {
        case AQUAJ__JOP__OP_SNAPSHOT: {
                const Aquaj__JSnapshot *s = op->snapshot;
                /* A snapshot replaces all state; config pins are set again after replay. */
                pool_clear(p);
                pins_clear(p, false);
                for (size_t i = 0; i < s->n_leases; i++)
                        if ((r = apply_lease(p, s->leases[i])) < 0)
                                return r;
                for (size_t i = 0; i < s->n_chunks; i++)
                        if ((r = apply_chunk(p, s->chunks[i])) < 0)
                                return r;
                for (size_t i = 0; i < s->n_gpus; i++)
                        if ((r = apply_gpu(p, s->gpus[i])) < 0)
                                return r;
                for (size_t i = 0; i < s->n_pairs; i++)
                        if ((r = pool_pins_add(p, s->pairs[i]->producer, s->pairs[i]->consumer,
                                               "aquactl")) < 0)
                                return r;
                p->next_chunk_id = MAX(p->next_chunk_id, s->next_chunk_id);
                p->next_lease_id = MAX(p->next_lease_id, s->next_lease_id);
                return 0;
        }
        case AQUAJ__JOP__OP_CHUNK_SET:
                return apply_chunk(p, op->chunk_set);
        case AQUAJ__JOP__OP_CHUNK_DEL:
                c = pool_find_chunk(p, op->chunk_del);
                if (c)
                        chunk_destroy(p, c);
                return 0;
        case AQUAJ__JOP__OP_LEASE_SET:
                return apply_lease(p, op->lease_set);
        case AQUAJ__JOP__OP_LEASE_DEL:
                l = pool_find_lease(p, op->lease_del);
                if (l)
                        lease_destroy(p, l);
                return 0;
        case AQUAJ__JOP__OP_GPU_SET:
                return apply_gpu(p, op->gpu_set);
        case AQUAJ__JOP__OP_PAIR_SET:
                return pool_pins_add(p, op->pair_set->producer, op->pair_set->consumer, "aquactl");
        case AQUAJ__JOP__OP_PAIR_DEL:
                pool_pins_remove(p, op->pair_del);
                return 0;
        default:
                /* An operation a newer aquad wrote: skipping it is safer than refusing to start. */
                return 0;
        }
}

int pool_apply(const Aquaj__JournalRecord *rec, void *userdata)
{
        struct pool *p = userdata;
        int r = 0;

        p->replaying = true;
        for (size_t i = 0; i < rec->n_ops && r >= 0; i++)
                r = apply_op(p, rec->ops[i]);
        p->replaying = false;
        return r;
}

void pool_attach_journal(struct pool *p, struct journal *j, uint64_t compact_threshold)
{
        bool any = false;

        p->journal = j;
        p->compact_threshold = compact_threshold;
        for (struct list_node *n = p->gpus.next; n != &p->gpus; n = n->next) {
                struct gpu *g = list_entry(n, struct gpu, node);
                if (g->restored)
                        any = true;
        }
        for (struct list_node *n = p->leases.next; n != &p->leases; n = n->next) {
                struct lease *l = list_entry(n, struct lease, pool_node);
                for (struct list_node *k = l->chunks.next; k != &l->chunks; k = k->next)
                        pool_note_deadline(p, list_entry(k, struct chunk, lease_node)->deadline_ns);
        }
        if (any) {
                p->reconcile_deadline_ns = now_mono_ns() + p->settings.reconcile_timeout_ns;
                pool_note_deadline(p, p->reconcile_deadline_ns);
        }
}

/* ------------------------------------------------------------------------------ snapshot */

int pool_snapshot(struct pool *p, Aquaj__JournalRecord **ret)
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

        s->next_chunk_id = p->next_chunk_id;
        s->next_lease_id = p->next_lease_id;
        s->chunks = calloc(p->n_chunks ? p->n_chunks : 1, sizeof(*s->chunks));
        s->leases = calloc(p->n_leases ? p->n_leases : 1, sizeof(*s->leases));
        s->gpus = calloc(p->n_gpus ? p->n_gpus : 1, sizeof(*s->gpus));
        s->pairs = calloc(p->n_pins ? p->n_pins : 1, sizeof(*s->pairs));
        if (!s->chunks || !s->leases || !s->gpus || !s->pairs)
                goto oom;
        for (struct list_node *n = p->leases.next; n != &p->leases; n = n->next)
                if (!(s->leases[s->n_leases++] =
                              jlease_new(list_entry(n, struct lease, pool_node))))
                        goto oom;
        for (struct list_node *n = p->gpus.next; n != &p->gpus; n = n->next) {
                struct gpu *g = list_entry(n, struct gpu, node);
                for (struct list_node *k = g->chunks.next; k != &g->chunks; k = k->next)
                        if (!(s->chunks[s->n_chunks++] =
                                      jchunk_new(list_entry(k, struct chunk, producer_node))))
                                goto oom;
                if ((g->dram_bytes || g->barred || g->draining) && n_gpus < p->n_gpus) {
                        if (!(s->gpus[s->n_gpus++] = jgpu_new(g)))
                                goto oom;
                        n_gpus++;
                }
        }
        for (size_t i = 0; i < p->n_pins; i++) {
                if (strcmp(p->pins[i].source, "aquactl") != 0)
                        continue;
                if (!(s->pairs[s->n_pairs++] = jpair_new(p->pins[i].producer,
                                                         p->pins[i].consumer, "aquactl")))
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
