/* Encoding and bounded decoding of Envelopes, the messages of the aqua control protocol. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "aqua.pb-c.h"

/* major * 100 + minor. Peers with a different major number cannot talk. */
#define AQUA_PROTOCOL_VERSION 100
#define AQUA_PROTOCOL_MAJOR(v) ((v) / 100)

/* Positive outcomes of wire_decode(); each maps to the ErrorCode the reply carries. */
enum {
        WIRE_E_MALFORMED = 1, /* not an Envelope */
        WIRE_E_TOO_LARGE,     /* the whole message, a repeated field or a string over its limit */
        WIRE_E_VERSION,       /* incompatible major version */
        WIRE_E_EMPTY,         /* an Envelope with no body */
};

struct wire_limits {
        size_t max_message;  /* bytes of one encoded Envelope */
        size_t max_repeated; /* items in any repeated field */
        size_t max_string;   /* bytes of any string or bytes field */
};

#define WIRE_LIMITS_DEFAULT {.max_message = 1u << 20, .max_repeated = 4096, .max_string = 4096}

/*
 * Decode buf into a new Envelope (free it with aqua__envelope__free_unpacked(e, NULL)).
 * Returns 0, a WIRE_E_* outcome with a message naming the problem in err (when not NULL),
 * or -ENOMEM.
 */
int wire_decode(const void *buf, size_t len, const struct wire_limits *limits,
                Aqua__Envelope **ret, char *err, size_t err_len);

/* Check every repeated field and string of any protobuf-c message against limits (recursively). */
int wire_check_limits(const ProtobufCMessage *m, const struct wire_limits *limits, char *err,
                      size_t err_len);

/* Encode e (its version is set to AQUA_PROTOCOL_VERSION) into a malloc'd buffer. */
int wire_encode(Aqua__Envelope *e, void **ret_buf, size_t *ret_len);

/* The ErrorCode a reply carries for a WIRE_E_* outcome. */
Aqua__ErrorCode wire_error_code(int outcome);

/* Short name of the Envelope's body for logs and errors: "borrow", "offer", ... */
const char *wire_body_name(const Aqua__Envelope *e);
