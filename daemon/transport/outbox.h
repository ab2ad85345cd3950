/* Each client's outbox and the ROUTER's sends (outbox.c). */
#pragma once

#include "state.h"

/* outbox.c: the ROUTER's sends (through s->sink in tests); a drop is counted and logged. */
int outbox_router_send(struct server *s, const void *rid, size_t rlen, const void *buf, size_t len,
                       const char *body);
void outbox_log_dropped(struct server *s, const void *rid, size_t len, const char *body,
                        const char *why);
/* Who a routing id names, for the log. */
const char *outbox_peer_text(struct server *s, const void *rid, size_t len, char *buf, size_t size);
int server_send_now(struct server *s, struct client *c, Aqua__Envelope *e);
int server_send_encoded(struct server *s, struct client *c, const void *buf, size_t len,
                        const char *body);
/* outbox.c: put the notices the core queued into their clients' outboxes; send what the
 * ROUTER takes of them now (at the end of a turn, after its commit). */
void server_stage_notices(struct server *s);
void server_flush_outboxes(struct server *s);
/* Keep a custody reply (encoded: buf is taken) the ROUTER could not take for c, in front of its
 * notices. Returns 0, or -ENOMEM (buf is the caller's still). */
int server_defer_reply(struct server *s, struct client *c, void *buf, size_t len, const char *body);
/* Drop what c's outbox holds (c is going away). */
void server_outbox_clear(struct server *s, struct client *c);
