/*
 * An admin session with aquad: the side channel connected first (it carries the token and
 * the credentials aquad checks), then a ZeroMQ DEALER registered with role ADMIN, then
 * request/reply with a timeout.
 */
#pragma once

#include <stdint.h>

#include "aqua.pb-c.h"
#include "util.h"

#define ADMIN_ENDPOINT_DEFAULT "ipc:///run/aqua/aquad.sock"

/* Expected outcomes, each a different message and exit code in aquactl. */
enum {
        ADMIN_E_NOT_RUNNING = 1, /* nothing listens at the side channel path */
        ADMIN_E_DENIED,          /* no permission on the socket, or aquad refused our credentials */
        ADMIN_E_TIMEOUT,         /* aquad did not answer in time */
        ADMIN_E_STOPPING,        /* aquad said it is shutting down */
        ADMIN_E_REFUSED,         /* aquad answered Hello with an Error */
        ADMIN_E_PROTOCOL,        /* aquad answered something this aquactl cannot read */
};

struct admin;

/*
 * The side channel's path for endpoint: an ipc:// endpoint's path with a ".sock" suffix replaced
 * by (or else followed by) ".side" (ipc:///run/aqua/aquad.sock -> /run/aqua/aquad.side), as
 * libaqua derives it; for any other transport, aquad's default /run/aqua/aquad.side. Returns a
 * malloc'd string or NULL when out of memory.
 */
char *admin_side_path(const char *endpoint);

/*
 * Connect to aquad at endpoint (side channel at side_path) and register as ADMIN under
 * client_name. On an expected outcome or a negative errno, err (when not NULL) says what went
 * wrong in words that name the endpoint or path.
 */
int admin_connect(const char *endpoint, const char *side_path, const char *client_name,
                  int timeout_ms, struct admin **ret, char *err, size_t err_len);

/*
 * Connect to aquad's remote.endpoint (tcp://) with CURVE and register as ADMIN: server_key is
 * aquad's public key, public_key and secret_key this client's (Z85). No side channel.
 */
int admin_connect_remote(const char *endpoint, const char *server_key, const char *public_key,
                         const char *secret_key, const char *client_name, int timeout_ms,
                         struct admin **ret, char *err, size_t err_len);

struct admin *admin_free(struct admin *a);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct admin *, admin_free);

/*
 * Send request (its request_id is set here) and wait for the reply with the same id; the
 * reply may be an Error for the caller to interpret. Unsolicited notices are skipped, except
 * DaemonStopping (ADMIN_E_STOPPING). Free the reply with aqua__envelope__free_unpacked().
 */
int admin_call(struct admin *a, Aqua__Envelope *request, Aqua__Envelope **ret_reply, char *err,
               size_t err_len);
