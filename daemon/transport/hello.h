/* Registration (hello.c): Hello, HelloHeld, the Welcome, Goodbye, as dispatch.c hands them on. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "state.h"

/* A fabric handle's length where one may come (0, or an outcome with err filled). */
int hello_fabric_check(size_t len, bool fabric, const char *what, size_t i, char *err);
void hello_handle(struct server *s, const struct origin *o, Aqua__Envelope *e);
/* c's tenant as the config says now (its `tenants:`), into who->tenant and who->lends_to_all. */
void hello_identify_tenant(const struct server *s, const struct client *c,
                           struct broker_identity *who);
void hello_handle_held(struct server *s, const struct origin *o, const Aqua__Envelope *e);
void hello_goodbye(struct server *s, struct client *c, const Aqua__Envelope *e);
/* A Hello whose held chunks' descriptors have all arrived (fds: those, or NULL). */
void hello_finish(struct server *s, struct client *c, Aqua__Envelope *e, int *fds, size_t n_fds);
