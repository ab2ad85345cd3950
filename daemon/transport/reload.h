/* The config applied to the running aquad (reload.c). */
#pragma once

#include "state.h"

/* reload.c: limits, budgets and pins from s->config (ops/settings.h); the SIGHUP reload. */
void server_apply_settings(struct server *s);
int server_apply_pins(struct server *s);
/* Load the config file again and apply what can change live (daemon/README.md, SIGHUP). On a
 * file with errors it keeps the running configuration and returns < 0 with the error in err;
 * on success kept names what waits for a restart ("" if nothing). err and kept may be NULL. */
int server_reload(struct server *s, char *err, size_t err_len, char *kept, size_t kept_len);
