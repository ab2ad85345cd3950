/* The table of connected clients (clients.c). */
#pragma once

#include "state.h"

struct client *server_find_by_routing(struct server *s, const void *routing_id, size_t len);
struct client *server_find_by_token(struct server *s, const void *token, size_t len);
void client_free_pending(struct client *c, struct pending *p);
/* Forget what c's HelloHeld parts said it holds (its Hello came, or it went). */
void client_free_held(struct server *s, struct client *c);
/* The process on the other end of the ZeroMQ connection a request came on (ipc:// only);
 * -ENOENT or another negative errno when that is not known. */
int origin_peer(const struct origin *o, struct side_cred *ret);
bool client_is_admin(const struct server *s, const struct client *c);
/* The role c registered as: its GPU's (the core keeps it), admin, or UNSPECIFIED before Hello. */
Aqua__Role client_role(const struct client *c);
/* Whether c may make aquad hold n more descriptors (its budget, the process's headroom). */
bool server_may_take_fds(struct server *s, const struct client *c, size_t n);
