/* aquad's event loop (server.c): the ZeroMQ ROUTER, the side-channel listener and every client's
 * side socket, a signalfd and the pool's deadlines, all in one zmq_poll(). Single-threaded:
 * nothing here locks. What main.c runs. */
#pragma once

#include "state.h"

/* Set up from config (taken on success): sockets' locks, journal replay, sockets, signals. */
int server_new(struct config *config, const char *config_path, unsigned flags, struct server **ret);
struct server *server_free(struct server *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct server *, server_free);
void server_set_ready(struct server *s, server_ready_fn fn, void *userdata);
/* Serve until SIGTERM or SIGINT; returns 0 after a clean stop. */
int server_run(struct server *s);
