/* Requests from clients (dispatch.c): decoding, role checks, the core, the replies. */
#pragma once

#include "state.h"

/* dispatch.c */
void dispatch_envelope(struct server *s, const struct origin *o, const void *data, size_t size);
/* A request whose descriptors have all arrived (p is freed). */
void dispatch_complete(struct server *s, struct client *c, struct pending *p);
/* A frame of descriptors from the client's side channel: its request runs once they are all
 * there (descriptors.c matches them). */
void dispatch_side_frame(struct server *s, struct client *c, Aqua__SideFrame *frame, int *fds,
                         size_t n_fds);
