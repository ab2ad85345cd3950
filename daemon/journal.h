/*
 * The journal: an append-only file of JournalRecords, each one batch of state changes written
 * and fsync'd before the daemon acknowledges them; compacted into a single snapshot record when
 * it grows, and replayed at start. A torn or corrupt tail (a crash mid-write) is cut off.
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
        uint64_t records;
        uint64_t bytes;         /* of intact records */
        uint64_t dropped_bytes; /* cut off as a torn or corrupt tail */
};

/*
 * Open (creating it and its parent folder when missing) and lock the journal at path, and replay
 * it through fn. Returns 0, -EBUSY when another process holds it, -EBADMSG when the file is not a
 * journal, or another negative errno.
 */
int journal_open(const char *path, journal_replay_fn fn, void *userdata, struct journal **ret,
                 struct journal_replay_stats *ret_stats);
struct journal *journal_free(struct journal *j);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct journal *, journal_free);

/* Append one record and fsync it. */
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
