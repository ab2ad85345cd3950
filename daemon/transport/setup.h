/* Setting aquad up (setup.c), for server_new(). */
#pragma once

#include "state.h"

/* setup.c, for server_new(): each 0 or a negative errno, logged. */
int server_lock_sockets(struct server *s);
int server_open_journal(struct server *s, bool repair);
/* As many descriptors as aquad may hold; returns the limit (0: none it can tell). */
uint64_t server_raise_fd_limit(void);
int server_open_signals(struct server *s);
int server_open_side(struct server *s);
int server_open_router(struct server *s);
