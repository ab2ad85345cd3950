/*
 * A client of etcd's v3 API through its JSON gateway (POST /v3/...), over libcurl with json-c:
 * the few calls a domain needs (leases, ranges, transactions). Keys and values are bytes; the
 * gateway's base64 and its 64-bit integers written as strings stay in here. Each call blocks
 * for at most the timeout given at creation; with several endpoints a call that cannot reach
 * one tries the next, starting from the one that answered last.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

struct etcd;

struct etcd_options {
        char *const *urls; /* http://HOST:PORT or https://HOST:PORT */
        size_t n_urls;
        const char *ca_file, *cert_file, *key_file; /* TLS; NULL: none */
        const char *user, *password;                /* etcd's auth; NULL: none */
        uint64_t timeout_ms;                        /* of one call, all endpoints together */
};

struct etcd_kv {
        char *key;
        uint8_t *value;
        size_t len;
        int64_t create_revision, mod_revision, version, lease;
};

enum etcd_cmp_target { ETCD_CMP_CREATE, ETCD_CMP_LEASE, ETCD_CMP_VERSION };

/* One condition of a transaction: the key's create revision (0: absent), lease or version (the
 * number of writes since it was created; 0: absent) equals value. */
struct etcd_cmp {
        const char *key;
        enum etcd_cmp_target target;
        int64_t value;
};

enum etcd_op_kind { ETCD_OP_PUT, ETCD_OP_DELETE, ETCD_OP_DELETE_RANGE };

struct etcd_op {
        enum etcd_op_kind kind;
        const char *key; /* PUT, DELETE: the key; DELETE_RANGE: the first key of the range */
        const char *end; /* DELETE_RANGE: the key after it; NULL: every key starting with key */
        const void *value;
        size_t len;
        int64_t lease; /* PUT: 0 for none */
};

/* What the client sent, for metrics and the bench: requests, and the largest one's body. */
struct etcd_stats {
        uint64_t requests;
        uint64_t largest_request; /* bytes */
};

int etcd_new(const struct etcd_options *o, struct etcd **ret);
struct etcd *etcd_free(struct etcd *e);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct etcd *, etcd_free);

/* What went wrong in the last call that failed, for a log line ("" if none). */
const char *etcd_error(const struct etcd *e);
void etcd_stats(const struct etcd *e, struct etcd_stats *ret);

int etcd_lease_grant(struct etcd *e, int64_t ttl_s, int64_t *ret_id);
/* Renew a lease: 0, -ENOENT when etcd no longer has it (it expired), or another error. */
int etcd_lease_keepalive(struct etcd *e, int64_t id);
int etcd_lease_revoke(struct etcd *e, int64_t id);

/*
 * The keys from key (prefix false: that key alone; true: every key that starts with it), in key
 * order, and the store's revision. Free with etcd_kvs_free().
 */
int etcd_range(struct etcd *e, const char *key, bool prefix, struct etcd_kv **ret, size_t *ret_n,
               int64_t *ret_revision);
void etcd_kvs_free(struct etcd_kv *kvs, size_t n);

/*
 * One page of a paged read: at most limit keys of those that start with prefix, from the key
 * from on (NULL: the first), as of revision (0: now; *ret_revision says which, for the next
 * page). *ret_more: keys follow the last one returned.
 */
int etcd_range_page(struct etcd *e, const char *prefix, const char *from, int64_t revision,
                    size_t limit, struct etcd_kv **ret, size_t *ret_n, int64_t *ret_revision,
                    bool *ret_more);

/*
 * Wait, for at most timeout_ms, until key is written or deleted after revision (etcd's Watch,
 * one stream, no polling): 1 when it was, 0 when the time passed first, or a negative errno.
 */
int etcd_watch(struct etcd *e, const char *key, int64_t revision, uint64_t timeout_ms);

/*
 * If every condition holds, do every operation, all as one revision: 1 (done, *ret_revision
 * the new revision), 0 (a condition failed: nothing done), or a negative errno.
 */
int etcd_txn(struct etcd *e, const struct etcd_cmp *cmp, size_t n_cmp, const struct etcd_op *ops,
             size_t n_ops, int64_t *ret_revision);
