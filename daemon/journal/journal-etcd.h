/*
 * The journal of a domain, kept in etcd (journal.h's journal_open_etcd()): each record a key
 * under the domain's prefix, named by the term that wrote it and its sequence number, each commit
 * a transaction that holds only while the writer leads. Used by journal.c alone.
 */
#pragma once

#include "etcd.h"
#include "journal.h"

struct etcd_journal;

int etcd_journal_open(struct etcd *e, const char *prefix, const struct journal_fence *fence,
                      journal_replay_fn fn, void *userdata, struct etcd_journal **ret,
                      struct journal_replay_stats *ret_stats);
struct etcd_journal *etcd_journal_free(struct etcd_journal *j);
int etcd_journal_append(struct etcd_journal *j, const uint8_t *rec, size_t len);
int etcd_journal_compact(struct etcd_journal *j, const uint8_t *snap, size_t len);
