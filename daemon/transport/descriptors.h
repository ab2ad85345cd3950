/* Matching side-channel descriptors to their requests (descriptors.c). */
#pragma once

#include "state.h"

/* descriptors.c: requests and the descriptors they wait for */
/* How many descriptors a waiting request needs. */
size_t pending_fds_needed(const Aqua__Envelope *e);
struct pending *pending_find(struct client *c, uint64_t request_id);
/* NULL over the client's pending limit (before its Hello: one), or out of memory. */
struct pending *pending_add(struct server *s, struct client *c, uint64_t request_id);
/* Take a side frame's descriptors for the request they belong to (a bad frame closes them and
 * says why); that request's pending entry when it now has every descriptor it needs, else NULL. */
struct pending *pending_take_fds(struct server *s, struct client *c, Aqua__SideFrame *frame,
                                 int *fds, size_t n_fds);
/* A request still waiting at now_ns past its deadline is answered with an error. */
void pending_expire(struct server *s, struct client *c, uint64_t now_ns);
