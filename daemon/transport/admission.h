/* Who may connect and what a side channel may cost (admission.c). */
#pragma once

#include "state.h"

/* admission.c: a side channel that connects (accepted or refused), and one that is readable;
 * false: that client is gone. */
void admission_accept_side(struct server *s);
bool admission_read_side(struct server *s, struct client *c);
