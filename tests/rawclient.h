/*
 * A raw protocol client for aquad's integration tests: a ZeroMQ DEALER and the side channel,
 * driven message by message, with memfds standing in for chunk handles.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "aqua.pb-c.h"
#include "side.h"

#define RAW_MAX_NOTICES 64
#define RAW_TIMEOUT_MS  10000

struct raw {
        void *ctx;
        void *dealer;
        int side;
        uint8_t token[SIDE_TOKEN_LEN];
        char reject[256]; /* the reason when the daemon refused us */
        uint64_t next_id;
        Aqua__Envelope *notices[RAW_MAX_NOTICES]; /* unsolicited messages, oldest first */
        size_t n_notices;
        bool own_ctx;
        const char *host; /* sent as Hello.host when set (after connecting); NULL: not told */
        /* A stranger: present no custody secret. Otherwise raw_hello presents the one the last
         * Welcome for the uuid gave in this process, as libaqua keeps it in memory. */
        bool no_secret;
        /* Pass device_fd as the GPU's device node with the next Hello (Hello.device_node). */
        bool device_node;
        int device_fd;
};

/* Forget every custody secret this process was given (a new process, as far as aquad can tell
 * from secrets alone). */
void raw_forget_secrets(void);

/* Connect both channels. Returns 0, 1 when refused (reason in r->reject), or a negative errno. */
int raw_connect(struct raw *r, const char *endpoint, const char *side_path);
/* The same on a ZeroMQ context shared with other clients (many clients, one set of threads). */
int raw_connect_ctx(struct raw *r, void *ctx, const char *endpoint, const char *side_path);
void raw_close(struct raw *r);

/* Send e with a fresh request id and wait for the reply to it (notices are kept aside). */
Aqua__Envelope *raw_call(struct raw *r, Aqua__Envelope *e);
/* Send raw bytes (anything at all) and wait for the reply with request id id (0: an Error). */
Aqua__Envelope *raw_call_bytes(struct raw *r, const void *data, size_t len, uint64_t id);
/* Send e (request id e->request_id as set) without waiting. */
int raw_send(struct raw *r, Aqua__Envelope *e);
/* The next message that arrives, whatever it is (NULL after timeout_ms). */
Aqua__Envelope *raw_recv(struct raw *r, int timeout_ms);
/* The next message with request id id (0: the next notice of kind body). */
Aqua__Envelope *raw_wait(struct raw *r, uint64_t id, Aqua__Envelope__BodyCase body, int timeout_ms);

Aqua__Envelope *raw_hello(struct raw *r, Aqua__Role role, const char *uuid, const char *peer,
                          Aqua__HeldChunk **held, size_t n_held, const int *fds);
/* Offer n chunks of size bytes, each a memfd filled with "chunk <i>"; fds_out keeps them. */
Aqua__Envelope *raw_offer(struct raw *r, size_t n, uint64_t size, int *fds_out);
/* Offer n chunks of size bytes with these descriptors (which stay the caller's). */
Aqua__Envelope *raw_offer_fds(struct raw *r, const int *fds, size_t n, uint64_t size);
/* Borrow; on a grant with a lease, the chunk fds arrive in fds (room for max). */
Aqua__Envelope *raw_borrow(struct raw *r, uint64_t bytes, uint64_t min, bool dram, int *fds,
                           size_t max, size_t *ret_n);
Aqua__Envelope *raw_admin_query(struct raw *r, Aqua__AdminQuery__What what);

/* Error code of a reply, or -1 when it is not an Error. */
int raw_error_code(const Aqua__Envelope *e);
void raw_free(Aqua__Envelope *e);

/* Create a memfd of size bytes holding text at its start. */
int raw_memfd(uint64_t size, const char *text);
/* Whether fd holds text at its start. */
bool raw_memfd_has(int fd, const char *text);
