/* aquactl's requests (admin.c). */
#pragma once

#include "state.h"

/* admin.c */
void admin_handle(struct server *s, struct client *c, const Aqua__Envelope *e);
