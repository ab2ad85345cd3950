/* What the broker core's tests share (test/fixture.c): a pool (broker) with a producer and a
 * consumer registered and paired by setup(), and the steps the tests take on it. */
#pragma once

#include "broker-private.h"
#include "broker.h"
#include "time-util.h"
#include "topology.h"

#define MiB     (UINT64_C(1) << 20)
#define E(name) BROKER_E_##name

/* The pool never looks inside the transport's clients: any object stands in for one. */
struct client {
        int unused;
};

extern struct broker *broker;
extern struct gpu *producer, *consumer;
extern struct client producer_client, consumer_client;
extern char err[BROKER_ERR_MAX];
/* A journal folder with_journal() made ("": none), removed by teardown(). */
extern char dir[64], journal_path[128];
extern const struct broker_settings settings;
extern const struct broker_identity tenant;

/* A fresh pool with GPU-P lending and GPU-C borrowing, paired; teardown() frees it. */
void setup(void);
void teardown(void);
/* Register uuid (with a link to peer), presenting the custody secret its holder was given. */
struct gpu *hello(const char *uuid, enum gpu_role role, const char *peer, struct client *owner,
                  const struct broker_held *held, size_t n_held, int *fds,
                  struct broker_welcome *ret);
/* Registers uuid on host with links to the uuids in peers (no bandwidth reported). */
struct gpu *hello_on(const char *host, const char *uuid, enum gpu_role role,
                     const char *const *peers, size_t n_peers, struct client *owner);
/* Registers uuid with an ordinal and no links. */
struct gpu *hello_ordinal(const char *uuid, uint32_t ordinal, enum gpu_role role,
                          struct client *owner);
/* The producer offers n chunks of 2 MiB (memfds); their ids in ret_ids if not NULL. */
void offer(size_t n, uint64_t *ret_ids);
/* A fabric producer's chunks: handles of BROKER_FABRIC_HANDLE_SIZE bytes, no descriptors. */
void offer_fabric(size_t n, uint8_t *ret_handles);
/* Take queued notices, delivered as the transport would (a reclaim's deadline starts); count
 * those of kind for gpu (and copy the first one's ids). */
size_t notices(enum notice_kind kind, struct gpu *to, uint64_t *ids, size_t *n_ids, char *text,
               size_t text_len);
void drain_notices(void);
/* The consumer borrows; the grant in *g, its lease returned. */
struct lease *borrow(uint64_t bytes, uint64_t min, bool dram, struct broker_grant *g);
/* A journal for the pool, in a fresh folder; restart() replays it into a new pool. */
void with_journal(void);
struct broker *restart(void);
