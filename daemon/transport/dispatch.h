/* Between dispatch.c (requests) and hello.c (registration): what each uses of the other. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server.h"

/* dispatch.c */
const char *dispatch_role_name(Aqua__Role r);
/* Queue e as the reply to request_id. */
void dispatch_reply(struct server *s, struct client *c, uint64_t request_id, Aqua__Envelope *e);
/* Whether c may send a request now (limits.request-rate); it has had THROTTLED otherwise. */
bool dispatch_take_credit(struct server *s, struct client *c, uint64_t request_id);

/* hello.c */
/* A fabric handle's length where one may come (0, or an outcome with err filled). */
int dispatch_fabric_check(size_t len, bool fabric, const char *what, size_t i, char *err);
void dispatch_hello(struct server *s, const struct origin *o, Aqua__Envelope *e);
/* c's tenant as the config says now (its `tenants:`), into who->tenant and who->lends_to_all. */
void dispatch_identify_tenant(const struct server *s, const struct client *c,
                              struct broker_identity *who);
void dispatch_hello_held(struct server *s, const struct origin *o, const Aqua__Envelope *e);
void dispatch_goodbye(struct server *s, struct client *c, const Aqua__Envelope *e);
/* A Hello whose held chunks' descriptors have all arrived (fds: those, or NULL). */
void dispatch_finish_hello(struct server *s, struct client *c, Aqua__Envelope *e, int *fds,
                           size_t n_fds);
