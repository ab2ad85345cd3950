/* One turn of the loop (turn.c): what it says waits for its one commit. */
#pragma once

#include "state.h"

/* turn.c: what a turn says waits until the turn's one commit (server_end_turn); nothing here
 * touches the disk. Queue e to client c (-ENOTCONN before its Hello). */
int server_queue(struct server *s, struct client *c, Aqua__Envelope *e);
/* Queue e as the reply to request_id. */
void server_reply(struct server *s, struct client *c, uint64_t request_id, Aqua__Envelope *e);
/* Queue to a routing id (a peer that may not be registered). */
int server_queue_to(struct server *s, const void *routing_id, size_t len, Aqua__Envelope *e);
int server_queue_error(struct server *s, const void *routing_id, size_t len, uint64_t request_id,
                       int code, const char *fmt, ...) _printf_(6, 7);
/* An error to a client: "what: err", or err alone when what is NULL. */
int client_queue_error(struct server *s, struct client *c, uint64_t request_id, int code,
                       const char *what, const char *err);

/* A change that hands out custody, undone if its turn's commit is refused or its reply cannot
 * be sent. The caller fills kind and what it handed out; server_queue_custody the rest. */
enum custody_kind { CUSTODY_OFFER, CUSTODY_GRANT };
struct turn_change {
        struct list_node node;
        enum custody_kind kind;
        struct client *client;
        uint64_t request_id;
        struct broker_grant grant; /* CUSTODY_GRANT */
        /* CUSTODY_GRANT: its chunks as the request described them once, for the reply and then
         * for their descriptors (owned) */
        struct broker_granted_chunk *granted;
        size_t n_granted;
        uint64_t *ids;             /* CUSTODY_OFFER: the chunks taken (owned) */
        size_t n;
        struct queued *reply;
};
/* Queue e, the reply that acknowledges k (taken on success). */
int server_queue_custody(struct server *s, struct client *c, Aqua__Envelope *e,
                         struct turn_change *k);
void turn_change_free(struct turn_change *k);
/* Whether this turn granted lease_id (its return must wait for the turn's end). */
bool server_turn_granted(const struct server *s, uint64_t lease_id);
/* End the turn now if it holds a custody change: before what could touch that state. */
void server_turn_barrier(struct server *s);
/* Commit once (a degraded journal only when its probe is due), undo the turn's custody changes
 * if that was refused, then send: replies and grants' descriptors in order, then notices. */
void server_end_turn(struct server *s);
/* When the loop must end a turn with nothing to read (the probe, what sends journaled); 0: none. */
uint64_t server_turn_deadline(const struct server *s);
/* Forget what the turn holds, unsent (aquad is going). */
void server_turn_clear(struct server *s);
/* Send now, bypassing the turn: for the notices and deferred replies of server_flush_outboxes.
 * -EAGAIN: the ROUTER's queue to c is full (ZeroMQ's high-water mark); try again later. */
