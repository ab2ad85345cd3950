/* The pool's objects (gpu, chunk, lease, pins), their lifecycle, and the notices they queue. */
#include <sodium.h>

#include "broker-private.h"
#include "broker.h"

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

int broker_fail(char err[BROKER_ERR_MAX], int code, const char *fmt, ...)
{
        va_list ap;

        if (err) {
                va_start(ap, fmt);
                vsnprintf(err, BROKER_ERR_MAX, fmt, ap);
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

const char *gpu_role_to_string(enum gpu_role r)
{
        static const char *const names[_GPU_ROLE_MAX] = {"unspecified", "producer", "consumer",
                                                         "neutral"};

        return r < _GPU_ROLE_MAX ? names[r] : "invalid";
}

void broker_note_deadline(struct broker *broker, uint64_t deadline_ns)
{
        if (deadline_ns && (!broker->next_deadline_ns || deadline_ns < broker->next_deadline_ns))
                broker->next_deadline_ns = deadline_ns;
}

/* ------------------------------------------------------------------------------ notices */

void notice_queue(struct broker *broker, enum notice_kind kind, struct gpu *to, uint64_t lease_id,
                  const uint64_t *ids, size_t n, uint64_t deadline_ms, const char *text)
{
        struct notice *m;

        if (!to || !to->owner || broker->replaying)
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
        list_append(&broker->notices, &m->node);
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

void broker_take_notices(struct broker *broker, struct list_node *into)
{
        struct list_node *pos, *tmp;

        list_for_each(pos, tmp, &broker->notices)
        {
                list_unlink(pos);
                list_append(into, pos);
        }
}

/* ------------------------------------------------------------------------------ objects */

bool gpu_is(const struct gpu *g, const char *key)
{
        const char *colon = strrchr(key, ':');
        int64_t ordinal;

        if (strcmp(g->uuid, key) == 0 || strcmp(g->device, key) == 0)
                return true;
        if (!g->ordinal_known)
                return false;
        /* HOST:ORDINAL: the ordinal on that host. */
        if (colon) {
                size_t n = (size_t)(colon - key);
                if (!g->host || strlen(g->host) != n || strncmp(g->host, key, n) != 0)
                        return false;
                key = colon + 1;
        }
        return parse_int64(key, 10, &ordinal) == 0 && ordinal >= 0 && g->ordinal == ordinal;
}

int broker_lookup_gpu(struct broker *broker, const char *key, const char *what, struct gpu **ret,
                      char err[BROKER_ERR_MAX])
{
        struct gpu *found = NULL;
        char names[160] = "";
        size_t n = 0, len = 0;

        for (struct list_node *x = key && key[0] ? broker->gpus.next : &broker->gpus;
             x != &broker->gpus; x = x->next) {
                struct gpu *g = list_entry(x, struct gpu, node);
                if (strcmp(g->uuid, key) == 0) {
                        *ret = g;
                        return 0;
                }
                if (!gpu_is(g, key))
                        continue;
                found = g;
                if (len < sizeof(names))
                        len += (size_t)snprintf(names + len, sizeof(names) - len, "%s%s%s%s%s",
                                                n ? ", " : "", g->uuid, g->host ? " (" : "",
                                                g->host ? g->host : "", g->host ? ")" : "");
                n++;
        }
        if (n == 0)
                return broker_fail(err, BROKER_E_UNKNOWN_GPU, "%s: no GPU \"%s\"", what,
                                   key ? key : "");
        if (n > 1)
                return broker_fail(err, BROKER_E_INVALID,
                                   "%s: \"%s\" names %zu GPUs: %s%s; name one by its uuid or "
                                   "HOST:ORDINAL",
                                   what, key, n, names, len >= sizeof(names) ? "..." : "");
        *ret = found;
        return 0;
}

struct gpu *broker_find_gpu(struct broker *broker, const char *key)
{
        struct list_node *pos, *tmp;
        struct gpu *other = NULL;

        if (!key || !key[0])
                return NULL;
        list_for_each(pos, tmp, &broker->gpus)
        {
                struct gpu *g = list_entry(pos, struct gpu, node);
                if (strcmp(g->uuid, key) == 0)
                        return g;
                /* Prefer a connected GPU when an ordinal (across restarts) or a device with a
                 * registration per role is ambiguous. */
                if (gpu_is(g, key) && (!other || g->owner))
                        other = g;
        }
        return other;
}

struct chunk *broker_find_chunk(struct broker *broker, uint64_t id)
{
        return tree_find(&broker->chunks_by_id, id);
}

struct lease *broker_find_lease(struct broker *broker, uint64_t id)
{
        return tree_find(&broker->leases_by_id, id);
}

struct gpu *gpu_find(struct broker *broker, const char *uuid)
{
        for (struct list_node *n = broker->gpus.next; n != &broker->gpus; n = n->next) {
                struct gpu *g = list_entry(n, struct gpu, node);
                if (strcmp(g->uuid, uuid) == 0)
                        return g;
        }
        return NULL;
}

struct gpu *gpu_ensure(struct broker *broker, const char *uuid)
{
        struct gpu *g = gpu_find(broker, uuid);

        if (g)
                return g;
        g = calloc(1, sizeof(*g));
        if (!g)
                return NULL;
        g->uuid = strdup(uuid);
        /* A name "UUID/ROLE" is one role's registration of the device UUID. */
        g->device = g->uuid ? strndup(uuid, strcspn(uuid, "/")) : NULL;
        if (!g->uuid || !g->device) {
                free(g->uuid);
                free(g);
                return NULL;
        }
        g->role = GPU_ROLE_UNSPECIFIED;
        list_init(&g->chunks);
        list_init(&g->free_chunks);
        list_init(&g->leases);
        list_append(&broker->gpus, &g->node);
        broker->n_gpus++;
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

static void gpu_destroy(struct broker *broker, struct gpu *g)
{
        list_unlink(&g->node);
        broker->n_gpus--;
        gpu_free_links(g);
        free(g->client_name);
        free(g->host);
        free(g->uuid);
        free(g->device);
        sodium_memzero(&g->custody, sizeof(g->custody));
        free(g);
}

static bool pinned(const struct broker *broker, const struct gpu *g)
{
        for (size_t i = 0; i < broker->n_pins; i++)
                if (gpu_is(g, broker->pins[i].producer) || gpu_is(g, broker->pins[i].consumer))
                        return true;
        return false;
}

void gpu_gc(struct broker *broker, struct gpu *g)
{
        struct list_node *pos, *tmp;

        if (!g || g->owner || g->restored || !list_empty(&g->chunks) || !list_empty(&g->leases) ||
            g->dram_bytes || g->barred || g->draining || g->paired || pinned(broker, g))
                return;
        list_for_each(pos, tmp, &broker->notices)
        {
                if (list_entry(pos, struct notice, node)->gpu == g)
                        return;
        }
        /* A lease names its producer even with none of its chunks left (all came back
         * unusable): the consumer's Return still reaches it. */
        list_for_each(pos, tmp, &broker->leases)
        {
                if (list_entry(pos, struct lease, broker_node)->producer == g)
                        return;
        }
        gpu_destroy(broker, g);
}

void gpu_set_pair(struct broker *broker, struct gpu *g, struct gpu *mate, const char *source,
                  double bandwidth)
{
        if (g->paired == mate)
                return;
        g->paired = mate;
        g->pair_source = mate ? source : NULL;
        g->pair_bandwidth = mate ? bandwidth : 0;
        notice_queue(broker, NOTICE_PAIR_CHANGED, g, 0, NULL, 0, 0, mate ? mate->device : "");
}

bool chunk_has_handle(const struct chunk *c)
{
        return c->fd >= 0 || c->fabric;
}

void chunk_drop_handle(struct chunk *c)
{
        c->fd = safe_close(c->fd);
        free(c->fabric);
        c->fabric = NULL;
}

bool chunk_grantable(const struct chunk *c)
{
        return c->state == CHUNK_FREE && chunk_has_handle(c) && !c->orphan && !c->scrubbing &&
               !c->quarantined && c->producer->owner && !c->producer->draining;
}

void chunk_set_free_listed(struct chunk *c)
{
        list_unlink(&c->free_node);
        if (chunk_grantable(c))
                list_append(&c->producer->free_chunks, &c->free_node);
}

struct chunk *chunk_new(struct broker *broker, struct gpu *producer, uint64_t id, uint64_t size,
                        uint64_t client_ref, int fd)
{
        struct chunk *c = calloc(1, sizeof(*c));

        if (!c)
                return NULL;
        *c = (struct chunk){.id = id,
                            .producer = producer,
                            .size = size,
                            .client_ref = client_ref,
                            .fd = fd,
                            .state = CHUNK_FREE};
        list_init(&c->producer_node);
        list_init(&c->free_node);
        list_init(&c->lease_node);
        if (!tsearch(c, &broker->chunks_by_id, cmp_id)) {
                free(c);
                return NULL;
        }
        list_append(&producer->chunks, &c->producer_node);
        producer->offered_bytes += size;
        broker->pool_bytes += size;
        broker->n_chunks++;
        if (id >= broker->next_chunk_id)
                broker->next_chunk_id = id + 1;
        chunk_set_free_listed(c);
        return c;
}

static void chunk_unlink_lease(struct broker *broker, struct chunk *c)
{
        struct lease *l = c->lease;

        if (!l)
                return;
        list_unlink(&c->lease_node);
        l->n_chunks--;
        l->bytes -= c->size;
        l->consumer->borrowed_bytes -= c->size;
        c->producer->lent_bytes -= c->size;
        broker->lent_bytes -= c->size;
        c->lease = NULL;
        c->deadline_ns = 0;
        c->deadline_wall_ms = 0;
        c->deadline_pending = false;
        lease_update_state(l);
}

void chunk_destroy(struct broker *broker, struct chunk *c)
{
        chunk_unlink_lease(broker, c);
        list_unlink(&c->free_node);
        list_unlink(&c->producer_node);
        tdelete(c, &broker->chunks_by_id, cmp_id);
        c->producer->offered_bytes -= c->size;
        broker->pool_bytes -= c->size;
        broker->n_chunks--;
        broker->n_quarantined -= c->quarantined;
        chunk_drop_handle(c);
        free(c);
}

void chunk_drop(struct broker *broker, struct chunk *c)
{
        journal_del(broker, true, c->id);
        chunk_destroy(broker, c);
}

void chunk_lease(struct broker *broker, struct chunk *c, struct lease *l)
{
        list_unlink(&c->free_node);
        c->state = CHUNK_LEASED;
        c->lease = l;
        list_append(&l->chunks, &c->lease_node);
        l->n_chunks++;
        l->bytes += c->size;
        l->consumer->borrowed_bytes += c->size;
        c->producer->lent_bytes += c->size;
        broker->lent_bytes += c->size;
}

void chunk_release(struct broker *broker, struct chunk *c)
{
        chunk_unlink_lease(broker, c);
        c->state = CHUNK_FREE;
        chunk_set_free_listed(c);
}

bool lease_was_returned(const struct lease *l)
{
        for (const struct list_node *k = l->chunks.next; k != &l->chunks; k = k->next) {
                const struct chunk *c = list_entry(k, struct chunk, lease_node);
                if (!c->orphan && c->state != CHUNK_RECLAIMING)
                        return false;
        }
        return true;
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

struct lease *lease_new(struct broker *broker, uint64_t id, struct gpu *consumer,
                        struct gpu *producer)
{
        struct lease *l = calloc(1, sizeof(*l));

        if (!l)
                return NULL;
        *l = (struct lease){.id = id,
                            .consumer = consumer,
                            .producer = producer,
                            .state = LEASE_GRANTED,
                            .created_ms = now_real_ns() / NSEC_PER_MSEC,
                            .created_ns = now_mono_ns()};
        list_init(&l->chunks);
        list_init(&l->consumer_node);
        list_init(&l->broker_node);
        if (!tsearch(l, &broker->leases_by_id, cmp_id)) {
                free(l);
                return NULL;
        }
        list_append(&consumer->leases, &l->consumer_node);
        list_append(&broker->leases, &l->broker_node);
        broker->n_leases++;
        if (id >= broker->next_lease_id)
                broker->next_lease_id = id + 1;
        return l;
}

void lease_destroy(struct broker *broker, struct lease *l)
{
        while (!list_empty(&l->chunks))
                chunk_release(broker, list_entry(l->chunks.next, struct chunk, lease_node));
        tdelete(l, &broker->leases_by_id, cmp_id);
        list_unlink(&l->consumer_node);
        list_unlink(&l->broker_node);
        broker->n_leases--;
        free(l->reason);
        free(l);
}

void lease_free(struct broker *broker, struct lease *l)
{
        if (!l)
                return;
        journal_del(broker, false, l->id);
        lease_destroy(broker, l);
}

/* ------------------------------------------------------------------------------ lifecycle */

void pin_free(struct broker_pin *p)
{
        free(p->producer);
        free(p->consumer);
        free(p->refused);
}

void pins_clear(struct broker *broker, const char *source)
{
        size_t k = 0;

        for (size_t i = 0; i < broker->n_pins; i++) {
                if (source && strcmp(broker->pins[i].source, source) != 0) {
                        broker->pins[k++] = broker->pins[i];
                        continue;
                }
                pin_free(&broker->pins[i]);
        }
        broker->n_pins = k;
}

int broker_new(const struct broker_settings *settings, struct broker **ret)
{
        struct broker *broker = calloc(1, sizeof(*broker));
        int r;

        if (!broker)
                return -ENOMEM;
        /* Custody secrets (custody.c) are libsodium's: idempotent, thread-safe, and it opens
         * no descriptor that outlives the call on Linux. */
        if (sodium_init() < 0) {
                free(broker);
                return -EIO;
        }
        broker->settings = *settings;
        list_init(&broker->gpus);
        list_init(&broker->leases);
        list_init(&broker->notices);
        broker->next_chunk_id = broker->next_lease_id = 1;
        r = events_init(&broker->events, EVENTS_DEFAULT_SIZE);
        if (r < 0) {
                free(broker);
                return r;
        }
        *ret = broker;
        return 0;
}

/* Forget all state (a snapshot replaces it, or the pool goes away). */
void broker_clear(struct broker *broker)
{
        while (!list_empty(&broker->leases))
                lease_destroy(broker, list_entry(broker->leases.next, struct lease, broker_node));
        for (struct list_node *n = broker->gpus.next; n != &broker->gpus; n = n->next) {
                struct gpu *g = list_entry(n, struct gpu, node);
                while (!list_empty(&g->chunks))
                        chunk_destroy(broker,
                                      list_entry(g->chunks.next, struct chunk, producer_node));
                broker->dram_granted -= g->dram_bytes;
                g->dram_bytes = 0;
                g->barred = g->draining = false;
        }
}

struct broker *broker_free(struct broker *broker)
{
        struct list_node *pos, *tmp;

        if (!broker)
                return NULL;
        broker_clear(broker);
        list_for_each(pos, tmp, &broker->notices)
        {
                notice_free(list_entry(pos, struct notice, node));
        }
        list_for_each(pos, tmp, &broker->gpus)
        {
                gpu_destroy(broker, list_entry(pos, struct gpu, node));
        }
        broker_ops_clear(broker);
        free(broker->ops);
        pins_clear(broker, NULL);
        free(broker->pins);
        events_deinit(&broker->events);
        journal_free(broker->journal);
        free(broker);
        return NULL;
}
