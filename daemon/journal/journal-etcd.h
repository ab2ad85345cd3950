/*
 * A domain's journal kept in etcd (journal.h's journal_open_etcd()): the state as objects, one
 * key per GPU, lease, pin and page of chunks, each commit a transaction over the keys it changes
 * that holds only while the writer leads. Used by journal.c alone.
 */
#pragma once

#include "etcd.h"
#include "journal.h"

struct etcd_journal;

int etcd_journal_open(struct etcd *e, const char *root, const struct journal_fence *fence,
                      journal_replay_fn fn, void *userdata, struct etcd_journal **ret,
                      struct journal_replay_stats *ret_stats);
struct etcd_journal *etcd_journal_free(struct etcd_journal *j);
int etcd_journal_append(struct etcd_journal *j, const Aquaj__JournalRecord *rec);
/* Bytes of the state in etcd, as of the last commit. */
uint64_t etcd_journal_size(const struct etcd_journal *j);
const char *etcd_journal_error(const struct etcd_journal *j);
