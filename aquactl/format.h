/* aquactl's human output: tables and summaries built from the daemon's AdminReply messages. */
#pragma once

#include <stdint.h>
#include <stdio.h>

#include "aqua.pb-c.h"
#include "util.h"

/* What aquactl can show; each is one AdminQuery.What. */
enum view {
        VIEW_STATUS,
        VIEW_GPUS,
        VIEW_PAIRS,
        VIEW_LEASES,
        VIEW_CHUNKS,
        VIEW_EVENTS,
        _VIEW_MAX,
        _VIEW_INVALID = -EINVAL,
};

const char *view_to_string(enum view v);
enum view view_from_string(const char *s);
Aqua__AdminQuery__What view_query(enum view v);

/*
 * Print view v. data is the daemon's reply to v's query; gpus is its reply to a GPU query,
 * used to name GPUs by ordinal and client instead of by uuid and for per-consumer totals
 * (NULL: uuids are shown). Returns 0 or -EIO when out cannot be written.
 */
int format_view(FILE *out, enum view v, const Aqua__AdminReply *data, const Aqua__AdminReply *gpus);

/* A protobuf enum value as people read it: ROLE_PRODUCER -> "producer", 7 if unnamed. */
const char *format_enum(const ProtobufCEnumDescriptor *d, int value, char *buf, size_t len);

/* "45s", "3m07s", "2h05m", "3d04h". */
char *format_age(char *buf, size_t len, uint64_t ms);

/*
 * How a GPU appears in tables: "1 (whisper)" when gpus knows it, "GPU-1a2b3c4d" (the uuid's
 * first 12 characters) when it does not, "-" for an empty uuid.
 */
char *format_gpu_label(char *buf, size_t len, const Aqua__AdminReply *gpus, const char *uuid);
