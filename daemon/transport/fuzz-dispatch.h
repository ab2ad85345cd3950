/* The script format of fuzz-dispatch.c, shared with the program that writes its seed corpus. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "side.h"

enum {
        FUZZ_PRODUCER, /* GPU-P, linked to GPU-C */
        FUZZ_CONSUMER, /* GPU-C, linked to GPU-P */
        FUZZ_ADMIN,
        FUZZ_STRANGER, /* connected, not registered: may send its own Hello */
        FUZZ_CLIENTS,
};

enum {
        FUZZ_OP_ENVELOPE,
        FUZZ_OP_SIDE_FRAME,
        FUZZ_OP_DIE,
        FUZZ_OP_TIME,
};

/* An Envelope's flags, in the bits a side frame uses for its descriptors: it came over tcp (a
 * routing id of its own), with the CURVE identity remote.clients names ("root") or another. */
#define FUZZ_TCP       1u
#define FUZZ_TCP_KNOWN 2u
/* An Envelope that leaves its turn of the loop open for the next record (turn.c). */
#define FUZZ_TURN_OPEN    8u
#define FUZZ_TCP_IDENTITY "root"
/* Its CURVE public key, as ZAP gives it (Z85). */
#define FUZZ_TCP_KEY "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"

#define FUZZ_CHUNK       (UINT64_C(2) << 20)
#define FUZZ_ROUTING_LEN 5

/* Fixed tokens, so that a Hello in the corpus names a real client. */
static inline void fuzz_token(size_t client, uint8_t token[SIDE_TOKEN_LEN])
{
        memset(token, "PCAS"[client & 3], SIDE_TOKEN_LEN);
}

static inline const void *fuzz_routing_id(size_t client)
{
        static const uint8_t ids[FUZZ_CLIENTS][FUZZ_ROUTING_LEN] = {
            {0, 0, 0, 0, 1}, {0, 0, 0, 0, 2}, {0, 0, 0, 0, 3}, {0, 0, 0, 0, 4}};

        return ids[client & 3];
}

/* The routing id of a client's connection over tcp: never one of the local ones. */
static inline const void *fuzz_tcp_routing_id(size_t client)
{
        static const uint8_t ids[FUZZ_CLIENTS][FUZZ_ROUTING_LEN] = {
            {1, 0, 0, 0, 1}, {1, 0, 0, 0, 2}, {1, 0, 0, 0, 3}, {1, 0, 0, 0, 4}};

        return ids[client & 3];
}

static inline uint8_t fuzz_header(size_t client, unsigned op, unsigned n_fds)
{
        return (uint8_t)((client & 3) | (op & 3) << 2 | (n_fds & 15) << 4);
}
