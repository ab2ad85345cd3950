/* aquactl --json: daemon replies as JSON documents for scripts, field names as in aqua.proto. */
#pragma once

#include <stdio.h>

#include "aqua.pb-c.h"
#include "format.h"

struct json_object;

/*
 * Any protobuf-c message as a JSON object: every field under its .proto name (proto3 zeros
 * included, so scripts never test for absence), 64-bit integers exact, enums as the names
 * format_enum() gives, bytes as hex, repeated fields as arrays. NULL when out of memory.
 */
struct json_object *json_from_message(const ProtobufCMessage *m);

/*
 * Print view v as one JSON object: {"gpus": [...], "truncated": false}, {"leases": [...],
 * "truncated": false}, ... (truncated: aquad cut the list at its limits); the status view is
 * {"status": {...}, "gpus": [...]} (gpus may be NULL). Returns 0, -ENOMEM or -EIO.
 */
int json_print_view(FILE *out, enum view v, const Aqua__AdminReply *data,
                    const Aqua__AdminReply *gpus);

/* Print any message (the reply to a changing command) as one JSON object. */
int json_print_message(FILE *out, const ProtobufCMessage *m);
