/*
 * The journal: an append-only file of JournalRecords, each one batch of state changes written
 * and fsync'd before the daemon acknowledges them; compacted into a single snapshot record when
 * it grows, and replayed at start. A torn tail (a crash mid-append) is cut off; damage before
 * the tail is refused, or cut on request after a copy of the file is kept.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "journal.pb-c.h"
#include "util.h"

struct journal;

/* Called for each intact record in order; a negative return stops the replay with that error. */
typedef int (*journal_replay_fn)(const Aquaj__JournalRecord *record, void *userdata);

struct journal_replay_stats {
        uint64_t records;       /* replayed */
        uint64_t bytes;         /* of the records replayed */
        uint64_t dropped_bytes; /* cut off: a torn tail, or by a repair all from bad_offset on */
        uint64_t bad_offset;    /* where the damaged record starts; 0: none */
        uint64_t records_after; /* intact records found after it (0: the search was cut short) */
};

/*
 * Open (creating it and its parent folder when missing) and lock the journal at path, and replay
 * it through fn. A bad record with no intact one anywhere after it is a torn tail (only the last
 * append can be incomplete, each one is fsync'd before the next) and is cut off. A bad record
 * that intact ones follow, or an intact one that does not decode, is damage no crash makes: the
 * file is left as it is and -EUCLEAN returned, with ret_stats (also written then) saying where.
 * Records before it have gone through fn by then. Returns 0, -EBUSY when another process holds
 * the journal, -EBADMSG when the file is not a journal, -EUCLEAN, or another negative errno.
 */
int journal_open(const char *path, journal_replay_fn fn, void *userdata, struct journal **ret,
                 struct journal_replay_stats *ret_stats);

/*
 * journal_open(), except that a journal damaged before its tail is repaired instead of refused:
 * the whole file is first copied to copy_path (a new file; -EEXIST when one is there), then cut
 * at the damaged record, keeping every record before it. A sound journal is opened as it is and
 * no copy is made.
 */
int journal_open_repair(const char *path, const char *copy_path, journal_replay_fn fn,
                        void *userdata, struct journal **ret,
                        struct journal_replay_stats *ret_stats);

/* What makes a domain's journal writable only by its leader: the election key, the create
 * revision and the lease it was won with. unfenced: write without the condition (tests only). */
struct journal_fence {
        const char *key;
        int64_t revision, lease;
        bool unfenced;
};

struct etcd;
/*
 * Open a domain's journal, kept in etcd under root as objects (daemon/journal/journal-etcd.c),
 * and replay it through fn. Every append is then a transaction over the keys it changes that
 * holds only while fence does, else refused with -ESTALE: a leader that lost its election writes
 * nothing. An append too large for one transaction is refused with -E2BIG, on its own. A key
 * that does not decode: -EUCLEAN, ret_stats->bad_offset its position (1 is the first).
 * Compaction is etcd's own: journal_compact() does nothing there.
 */
int journal_open_etcd(struct etcd *e, const char *root, const struct journal_fence *fence,
                      journal_replay_fn fn, void *userdata, struct journal **ret,
                      struct journal_replay_stats *ret_stats);
struct journal *journal_free(struct journal *j);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct journal *, journal_free);

/* Append one record and fsync it (in etcd: commit it). */
int journal_append(struct journal *j, const Aquaj__JournalRecord *record);

/*
 * Replace the whole journal by one record (a snapshot of the state): written to a temporary file,
 * fsync'd, renamed over the journal, and the folder fsync'd, so a crash leaves either the old
 * journal or the new one.
 */
int journal_compact(struct journal *j, const Aquaj__JournalRecord *snapshot);

/* Bytes in the journal now. */
uint64_t journal_size(const struct journal *j);

/* Whether the log has grown enough past its last snapshot to be worth compacting. */
bool journal_wants_compaction(const struct journal *j, uint64_t threshold);

/* What etcd said of the last append or open that failed ("" if nothing, or a file). */
const char *journal_error(const struct journal *j);
