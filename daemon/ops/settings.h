/*
 * aquad's settings from its config: what the broker core and the wire decoder run by, applied
 * at start and on reload (SIGHUP, aquactl reload) where they can change live. Nothing here
 * knows the server that applies them (transport/reload.c).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "broker.h"
#include "config.h"
#include "wire.h"

struct settings {
        struct wire_limits limits;
        struct broker_settings broker;
        uint64_t compact_threshold; /* journal bytes that call for a compaction */
};

/* The settings c says (its links stay c's: c must outlive them). */
struct settings settings_from_config(const struct config *c);
/* Set the pairs c pins on p: 0 or -ENOMEM. */
int settings_apply_pins(struct broker *broker, const struct config *c);
/* Load path again for a reload. What only a restart may change (endpoints, paths, keys and
 * heartbeats bound, the socket mode) is moved from old into the new config and named in kept
 * ("" if nothing); on success *ret is the config to run by. On a file with errors: < 0, the
 * error in err, old untouched. */
int settings_reload(const char *path, struct config *old, struct config **ret, char *err,
                    size_t err_len, char *kept, size_t kept_len);
