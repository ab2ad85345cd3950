/* Descriptor headroom for ZeroMQ's listeners (fdguard.c). */
#pragma once

#include "state.h"

/* fdguard.c: the ROUTER's monitor, and descriptor headroom for its listeners. */
int fdguard_open(struct server *s);
/* A monitor event: its kind, value (a descriptor) and endpoint. */
void fdguard_event(struct server *s, uint16_t event, uint32_t value, const char *endpoint);
/* Pause or resume the listeners by the descriptors free at now. */
void fdguard_check(struct server *s, uint64_t now);
/* Before the ROUTER closes: the ipc:// socket under its own name again. */
void fdguard_close(struct server *s);
/* Whether a listener is paused (the loop then looks again soon). */
static inline bool fdguard_paused(const struct server *s)
{
        return s->fdg.ipc_paused || s->fdg.tcp_paused;
}
