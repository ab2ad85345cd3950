/* Clients on other hosts (remote.c): remote.endpoint, tcp:// with CURVE. */
#pragma once

#include "state.h"

/* remote.c: ZAP, the handshake monitor and the CURVE bind of remote.endpoint (none: 0). */
int server_open_remote(struct server *s);
/* ZAP requests and handshake failures on remote.endpoint (server.c's loop calls these). */
void server_handle_zap(struct server *s);
void server_handle_monitor(struct server *s);
/* A client that registered over tcp:// (dispatch.c); NULL after an error was sent. */
struct client *server_add_remote(struct server *s, const struct origin *o, uint64_t request_id);
