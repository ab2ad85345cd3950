/*
 * What journal-etcd.c (the commits) and journal-etcd-open.c (the reading, and the move from a
 * log of records) share. Included by those two alone.
 */
#pragma once

#include "journal-etcd.h"
#include "objects.h"

/* One transaction: etcd refuses more than 128 operations (--max-txn-ops) and requests over
 * 1.5 MiB (--max-request-bytes) by default; well inside both. */
#define TXN_MAX_OPS   120
#define TXN_MAX_BYTES (192u << 10)
/* Keys per page of a read: chunk pages are larger than the other objects. */
#define READ_PAGE_KEYS       1000
#define READ_PAGE_CHUNK_KEYS 64

struct etcd_journal {
        struct etcd *etcd; /* the caller's */
        char *state, *log; /* ROOT/state/, ROOT/journal/ */
        char *fence_key, *seq_key;
        int64_t fence_revision, fence_lease;
        bool unfenced;
        int64_t seq_version; /* seq's version as this leader last wrote it */
        struct map mirror, pending;
        uint64_t bytes; /* of the mirror's values */
        char error[320];
};


struct write {
        struct etcd_op *ops;
        struct entry **entries;
        size_t n, bytes;
};

/* ROOT/state/ followed by what fmt says; NULL: out of memory. */
char *key_of(const struct etcd_journal *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* r, with j's error text what fmt says. */
int fail(struct etcd_journal *j, int r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A record's operations into the pending changes. */
int apply_record(struct etcd_journal *j, const Aquaj__JournalRecord *rec);
/* What the pending changes write: each key whose value differs from etcd's, or may. */
int plan(struct etcd_journal *j, struct write *w);
void write_done(struct write *w);
/* seq's next value into buf, and the put that writes it. */
int seq_put(struct etcd_journal *j, char *buf, size_t size, struct etcd_op *op);
/* One fenced, ordered transaction: 1 done, 0 a condition failed, or a negative errno. */
int txn(struct etcd_journal *j, const struct etcd_op *ops, size_t n);
/* The mirror after a write: its values (landed), or each of its keys unknown. */
void forget_written(struct etcd_journal *j, const struct write *w, bool landed);
