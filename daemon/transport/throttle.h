/* Each client's request rate (throttle.c). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct server;
struct client;

/* Whether c may send a request now (limits.request-rate); it has had THROTTLED otherwise. */
bool throttle_take(struct server *s, struct client *c, uint64_t request_id);
