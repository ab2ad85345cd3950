/* A client gone (drop.c). */
#pragma once

#include "state.h"

/* Forget a client (an unregistered one: nothing it holds is touched but its pending requests). */
void server_drop_client(struct server *s, struct client *c);
/* Forget a remote client that can no longer be heard; its GPU keeps what it holds. */
void server_detach_gpu(struct server *s, struct client *c);
