/*
 * Between the broker core's types and the wire protocol's: the one place that knows both. The
 * core (core/broker.h) has its own roles and outcomes; the transport answers clients in the
 * protocol's.
 */
#pragma once

#include "aqua.pb-c.h"
#include "broker.h"

/* A core call's result where the transport's own codes meet it: a positive enum broker_error
 * becomes the Aqua__ErrorCode a client is answered with; 0 and negative errnos pass through. */
int translate_outcome(int r);

/* The protocol's role for a GPU's role in the pool. */
Aqua__Role translate_role_to_wire(enum gpu_role r);
/* The pool's role for a role a GPU client registers with; _GPU_ROLE_MAX for any other (admin,
 * unspecified, unknown). */
enum gpu_role translate_role_from_wire(Aqua__Role r);
/* A wire role in words, for the log. */
const char *translate_role_name(Aqua__Role r);
