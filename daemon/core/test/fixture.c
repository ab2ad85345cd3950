/* The broker core's tests' common ground (test/fixture.h): a pool with a producer and a consumer
 * paired, the custody secrets their holders were given, and the steps every test takes. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "fixture.h"

struct broker *broker;
struct gpu *producer, *consumer;
struct client producer_client, consumer_client;
char err[BROKER_ERR_MAX];
char dir[64], journal_path[128];

const struct broker_settings settings = {
    .dram_budget = 8 * MiB,
    .reclaim_deadline_ns = 100 * NSEC_PER_MSEC,
    .reconcile_timeout_ns = NSEC_PER_SEC,
    .max_chunks = 64,
    .max_leases = 4,
    .max_grant_chunks = 32,
    .auto_pairing = true,
};

/* The custody secret each GPU's holder was given, presented when it registers again. */
static struct {
        char uuid[32];
        uint8_t secret[BROKER_SECRET_LEN];
} secrets[8];
const struct broker_identity tenant = {.uid = 1000};

static uint8_t *secret_of(const char *uuid, bool add)
{
        for (size_t i = 0; i < 8; i++)
                if (strcmp(secrets[i].uuid, uuid) == 0 || (add && !secrets[i].uuid[0])) {
                        snprintf(secrets[i].uuid, sizeof(secrets[i].uuid), "%s", uuid);
                        return secrets[i].secret;
                }
        return NULL;
}

struct gpu *hello(const char *uuid, enum gpu_role role, const char *peer,
                         struct client *owner, const struct broker_held *held, size_t n_held,
                         int *fds, struct broker_welcome *ret)
{
        struct broker_link links[] = {{.uuid = peer, .bandwidth = 400}};
        struct broker_hello h = {.who = &tenant,
                                 .secret = secret_of(uuid, false),
                                 .uuid = uuid,
                                 .role = role,
                                 .granularity = 2 * MiB,
                                 .links = links,
                                 .n_links = 1,
                                 .held = held,
                                 .n_held = n_held,
                                 .held_fds = fds,
                                 .client_name = uuid};
        struct broker_welcome w = {0};

        cr_assert_eq(broker_register(broker, &h, owner, &w, err), 0, "%s", err);
        if (w.new_secret)
                memcpy(secret_of(uuid, true), w.secret, BROKER_SECRET_LEN);
        if (ret)
                *ret = w;
        else
                free(w.lost_leases);
        return w.gpu;
}

void setup(void)
{
        memset(secrets, 0, sizeof(secrets));
        cr_assert_eq(broker_new(&settings, &broker), 0);
        producer =
            hello("GPU-P", GPU_ROLE_PRODUCER, "GPU-C", &producer_client, NULL, 0, NULL, NULL);
        consumer =
            hello("GPU-C", GPU_ROLE_CONSUMER, "GPU-P", &consumer_client, NULL, 0, NULL, NULL);
        cr_assert_eq(consumer->paired, producer);
        dir[0] = '\0';
}

void teardown(void)
{
        drain_notices();
        broker = broker_free(broker);
        if (dir[0]) {
                char cmd[128];
                snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
                cr_assert_eq(system(cmd), 0);
        }
}

void offer(size_t n, uint64_t *ret_ids)
{
        uint64_t sizes[16], refs[16], ids[16];
        int fds[16];

        for (size_t i = 0; i < n; i++) {
                sizes[i] = 2 * MiB;
                refs[i] = 100 + i;
                fds[i] = memfd_create("chunk", MFD_CLOEXEC);
                cr_assert_geq(fds[i], 0);
        }
        cr_assert_eq(
            broker_offer(broker, producer, sizes, refs, fds, NULL, n, ret_ids ? ret_ids : ids, err),
            0, "%s", err);
        for (size_t i = 0; i < n; i++)
                cr_assert_eq(fds[i], -1, "the pool takes the descriptors");
}

/* Take queued notices, delivered as the transport would (a reclaim's deadline starts); count
 * those of kind for gpu (and copy the first one's ids). */
size_t notices(enum notice_kind kind, struct gpu *to, uint64_t *ids, size_t *n_ids,
                      char *text, size_t text_len)
{
        struct list_node list = LIST_HEAD_INIT(list), *pos, *tmp;
        size_t count = 0;

        broker_take_notices(broker, &list);
        list_for_each(pos, tmp, &list)
        {
                struct notice *m = list_entry(pos, struct notice, node);
                if (m->kind == NOTICE_RECLAIM)
                        broker_reclaim_delivered(broker, m->lease_id, m->chunk_ids, m->n_chunk_ids,
                                                 m->deadline_ms);
                if (m->kind == kind && m->gpu == to) {
                        if (count == 0 && ids) {
                                memcpy(ids, m->chunk_ids, m->n_chunk_ids * sizeof(*ids));
                                *n_ids = m->n_chunk_ids;
                        }
                        if (count == 0 && text)
                                snprintf(text, text_len, "%s", m->text ? m->text : "");
                        count++;
                }
                notice_free(m);
        }
        return count;
}

void drain_notices(void)
{
        if (broker)
                notices(_NOTICE_KIND_MAX, NULL, NULL, NULL, NULL, 0);
}

struct lease *borrow(uint64_t bytes, uint64_t min, bool dram, struct broker_grant *g)
{
        cr_assert_eq(broker_borrow(broker, consumer, bytes, min, dram, g, err), 0, "%s", err);
        return g->lease;
}

struct broker *restart(void)
{
        struct journal *j = NULL;
        struct broker *p = NULL;

        cr_assert_eq(broker_new(&settings, &p), 0);
        cr_assert_eq(journal_open(journal_path, broker_apply, p, &j, NULL), 0);
        broker_attach_journal(p, j, 1 << 20);
        return p;
}

void with_journal(void)
{
        struct journal *j = NULL;

        snprintf(dir, sizeof(dir), "/tmp/test-lease-XXXXXX");
        cr_assert_not_null(mkdtemp(dir));
        snprintf(journal_path, sizeof(journal_path), "%s/journal", dir);
        cr_assert_eq(journal_open(journal_path, NULL, NULL, &j, NULL), 0);
        broker_attach_journal(broker, j, 1 << 20);
}

/* Pins from a placer plan name GPUs by ordinal; they must win over automatic pairing. */
/* A fabric producer's chunks: handles of BROKER_FABRIC_HANDLE_SIZE bytes, no descriptors. */
void offer_fabric(size_t n, uint8_t *ret_handles)
{
        uint64_t sizes[16], refs[16], ids[16];

        for (size_t i = 0; i < n; i++) {
                sizes[i] = 2 * MiB;
                refs[i] = 200 + i;
                memset(ret_handles + i * BROKER_FABRIC_HANDLE_SIZE, 0xa0 + (int)i,
                       BROKER_FABRIC_HANDLE_SIZE);
        }
        cr_assert_eq(broker_offer(broker, producer, sizes, refs, NULL, ret_handles, n, ids, err), 0,
                     "%s", err);
}

/* Registers uuid on host with links to the uuids in peers (no bandwidth reported). */
struct gpu *hello_on(const char *host, const char *uuid, enum gpu_role role,
                            const char *const *peers, size_t n_peers, struct client *owner)
{
        struct broker_link links[4] = {{0}};
        struct broker_hello h = {.who = &tenant,
                                 .uuid = uuid,
                                 .role = role,
                                 .granularity = 2 * MiB,
                                 .links = links,
                                 .n_links = n_peers,
                                 .host = host,
                                 .client_name = uuid};
        struct broker_welcome w = {0};

        for (size_t i = 0; i < n_peers; i++)
                links[i] = (struct broker_link){.uuid = peers[i]};
        cr_assert_eq(broker_register(broker, &h, owner, &w, err), 0, "%s", err);
        free(w.lost_leases);
        return w.gpu;
}

/* Registers uuid with an ordinal and no links. */
struct gpu *hello_ordinal(const char *uuid, uint32_t ordinal, enum gpu_role role,
                                 struct client *owner)
{
        struct broker_hello h = {.who = &tenant,
                                 .uuid = uuid,
                                 .ordinal = ordinal,
                                 .role = role,
                                 .granularity = 2 * MiB,
                                 .client_name = uuid};
        struct broker_welcome w = {0};

        cr_assert_eq(broker_register(broker, &h, owner, &w, err), 0, "%s", err);
        free(w.lost_leases);
        return w.gpu;
}
