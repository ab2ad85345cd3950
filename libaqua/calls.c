/*
 * The public calls on a context that are not a role's: open, close, info, device memory, load
 * reports, poll, fd. They drive the session (session.c), which keeps the context's life with
 * aquad; the context's small state is ctx.c's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alog.h"
#include "ctx.h"
#include "curve.h"
#include "gpunode.h"
#include "time-util.h"

#define DEFAULT_TIMEOUT_MS  5000
#define DEFAULT_CHUNK_BYTES (UINT64_C(32) << 20)

static int resolve_side_path(const char *given, const char *endpoint, char **ret)
{
        const char *env = getenv("AQUA_SIDE_PATH"), *path;
        size_t len;
        char *s;

        if (given || (env && *env)) {
                s = strdup(given ? given : env);
                if (!s)
                        return -ENOMEM;
                *ret = s;
                return 0;
        }
        /* Another host: no side channel at all, fabric handles instead. */
        if (strncmp(endpoint, "tcp://", 6) == 0) {
                *ret = NULL;
                return 0;
        }
        if (strncmp(endpoint, "ipc://", 6) != 0 || !endpoint[6])
                return -EINVAL;
        /* aquad's own default pairs aquad.sock with aquad.side. */
        path = endpoint + 6;
        len = strlen(path);
        if (len > 5 && strcmp(path + len - 5, ".sock") == 0)
                len -= 5;
        if (asprintf(&s, "%.*s.side", (int)len, path) < 0)
                return -ENOMEM;
        *ret = s;
        return 0;
}

DEFINE_TRIVIAL_CLEANUP_FUNC(aqua_ctx *, aqua_close);

/* The CURVE keys from the options, else from $AQUA_SERVER_KEY and $AQUA_KEY_FILE; none: {0}. */
static int resolve_curve(const struct aqua_options *o, char keys[3][CURVE_KEY_TEXT + 1],
                         struct transport_curve *ret)
{
        const char *server = getenv("AQUA_SERVER_KEY"), *file = getenv("AQUA_KEY_FILE");
        char err[256];

        *ret = (struct transport_curve){0};
        if (o->server_key || o->public_key || o->secret_key) {
                if (!curve_key_valid(o->server_key) || !curve_key_valid(o->public_key) ||
                    !curve_key_valid(o->secret_key)) {
                        alog_error("server_key, public_key and secret_key go together, each 40 "
                                   "characters of Z85");
                        return -EINVAL;
                }
                *ret = (struct transport_curve){o->server_key, o->public_key, o->secret_key};
                return 0;
        }
        if (!server || !*server)
                return 0;
        if (curve_public_key_load(server, keys[0], err, sizeof(err)) < 0) {
                alog_error("$AQUA_SERVER_KEY: %s", err);
                return -EINVAL;
        }
        if (!file || !*file) {
                alog_error("$AQUA_SERVER_KEY needs this client's key pair in $AQUA_KEY_FILE");
                return -EINVAL;
        }
        if (curve_keyfile_load(file, keys[1], keys[2], err, sizeof(err)) < 0) {
                alog_error("$AQUA_KEY_FILE: %s", err);
                return -EINVAL;
        }
        *ret = (struct transport_curve){keys[0], keys[1], keys[2]};
        return 0;
}

_public_ int aqua_open(int device, enum aqua_role role, const struct aqua_options *opts,
                       aqua_ctx **ret_ctx)
{
        struct aqua_options o = AQUA_OPTIONS_INIT;
        const char *endpoint, *env;
        char keys[3][CURVE_KEY_TEXT + 1];
        struct transport_curve curve;
        _cleanup_(aqua_closep) aqua_ctx *ctx = NULL;
        int r;

        if (device < 0 || !ret_ctx ||
            (role != AQUA_ROLE_PRODUCER && role != AQUA_ROLE_CONSUMER && role != AQUA_ROLE_NEUTRAL))
                return -EINVAL;
        if (opts) {
                if (opts->size < offsetof(struct aqua_options, size) + sizeof(opts->size))
                        return -EINVAL;
                /* Take what the caller's (possibly older, smaller) struct has. */
                memcpy(&o, opts, MIN(opts->size, sizeof(o)));
                o.size = sizeof(o);
        }
        if (o.timeout_ms < 0)
                return -EINVAL;
        env = getenv("AQUA_ENDPOINT");
        endpoint = o.endpoint ? o.endpoint : env && *env ? env : AQUA_DEFAULT_ENDPOINT;

        ctx = calloc(1, sizeof(*ctx));
        if (!ctx)
                return -ENOMEM;
        ctx->device = device;
        ctx->role = role;
        ctx->ops = role == AQUA_ROLE_PRODUCER   ? &producer_role
                   : role == AQUA_ROLE_CONSUMER ? &consumer_role
                                                : NULL;
        ctx->timeout_ms = o.timeout_ms ? o.timeout_ms : DEFAULT_TIMEOUT_MS;
        ctx->state = SESSION_RETRY;
        ctx->endpoint = strdup(endpoint);
        ctx->client_name = strdup(o.client_name ? o.client_name : program_invocation_short_name);
        if (gethostname(ctx->host, sizeof(ctx->host) - 1) < 0)
                ctx->host[0] = '\0';
        if (!ctx->endpoint || !ctx->client_name)
                return -ENOMEM;
        r = resolve_side_path(o.side_path, endpoint, &ctx->side_path);
        if (r < 0)
                return r;
        r = gpu_open(device, &ctx->gpu);
        if (r < 0)
                return r;
        ctx->fabric = !ctx->side_path;
        if (ctx->fabric && role != AQUA_ROLE_NEUTRAL && !gpu_info(ctx->gpu)->fabric) {
                alog_error("%s has no side channel (no side_path, no $AQUA_SIDE_PATH): lending "
                           "across hosts needs fabric handles, which device %d does not support "
                           "(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED is 0)",
                           endpoint, device);
                return -EOPNOTSUPP;
        }
        ctx->chunk_bytes = ALIGN_UP(o.chunk_bytes ? o.chunk_bytes : DEFAULT_CHUNK_BYTES,
                                    gpu_info(ctx->gpu)->granularity);
        r = resolve_curve(&o, keys, &curve);
        if (r < 0)
                return r;
        r = transport_new(ctx->endpoint, ctx->side_path, &curve, &ctx->t);
        explicit_bzero(keys, sizeof(keys));
        if (r < 0)
                return r;
        r = session_connect(ctx, ctx_deadline(ctx));
        if (r < 0)
                return r;
        *ret_ctx = TAKE_PTR(ctx);
        return 0;
}

_public_ aqua_ctx *aqua_close(aqua_ctx *ctx)
{
        if (!ctx)
                return NULL;
        /* Unmap before the side channel closes: the daemon hands chunks back on its EOF. */
        if (ctx->gpu) {
                if (ctx->ops && ctx->ops->free)
                        ctx->ops->free(ctx);
                copies_clear(ctx);
                if (ctx->fabric)
                        session_goodbye(ctx);
        }
        transport_free(ctx->t);
        gpu_free(ctx->gpu);
        free(ctx->endpoint);
        free(ctx->side_path);
        free(ctx->client_name);
        free(ctx->events);
        free(ctx->pending);
        explicit_bzero(ctx->custody_secret, sizeof(ctx->custody_secret));
        free(ctx);
        return NULL;
}

_public_ int aqua_get_info(aqua_ctx *ctx, struct aqua_info *ret)
{
        const struct gpu_info *gi;

        if (!ctx || !ret)
                return -EINVAL;
        gi = gpu_info(ctx->gpu);
        *ret = (struct aqua_info){
            .device = ctx->device,
            .role = ctx->role,
            .capacity = gi->capacity,
            .granularity = gi->granularity,
            .chunk_bytes = ctx->chunk_bytes,
            .client_id = ctx->client_id,
            .connected = ctx->state == SESSION_CONNECTED,
            .dram_budget = ctx->dram_budget,
            .reclaim_deadline_ms = ctx->reclaim_deadline_ms,
        };
        if (ctx->ops && ctx->ops->info)
                ctx->ops->info(ctx, ret);
        snprintf(ret->gpu_uuid, sizeof(ret->gpu_uuid), "%s", gi->uuid);
        snprintf(ret->paired_with, sizeof(ret->paired_with), "%s", ctx->paired_with);
        return 0;
}

_public_ int aqua_device_memory(aqua_ctx *ctx, uint64_t *ret_free, uint64_t *ret_total)
{
        uint64_t free_b, total;
        int r;

        if (!ctx || !ret_free || !ret_total)
                return -EINVAL;
        r = gpu_mem_info(ctx->gpu, &free_b, &total);
        if (r < 0)
                return r;
        *ret_free = free_b;
        *ret_total = total;
        return 0;
}

_public_ int aqua_report_load(aqua_ctx *ctx, const struct aqua_load *load)
{
        Aqua__Envelope env = AQUA__ENVELOPE__INIT;
        Aqua__LoadReport lr = AQUA__LOAD_REPORT__INIT;

        if (!ctx || !load || !(load->load >= 0.0))
                return -EINVAL;
        if (ctx->state != SESSION_CONNECTED)
                return -ENOTCONN;
        lr.load = load->load;
        lr.used_bytes = load->used_bytes;
        lr.free_bytes = load->free_bytes;
        if (ctx->ops && ctx->ops->load)
                ctx->ops->load(ctx, &lr);
        env.body_case = AQUA__ENVELOPE__BODY_LOAD;
        env.load = &lr;
        /* An id, so that the daemon's Ack is recognised and dropped. */
        env.request_id = transport_next_id(ctx->t);
        return transport_send(ctx->t, &env);
}

_public_ int aqua_poll(aqua_ctx *ctx, struct aqua_event *events, size_t n_events, size_t *ret_n)
{
        size_t n;
        int r;

        if (_unlikely_(!ctx || !ret_n || (n_events > 0 && !events)))
                return -EINVAL;
        /* The common case, every engine iteration: nothing arrived, nothing queued. */
        if (_likely_(ctx->ev_n == 0 && ctx->state == SESSION_CONNECTED && transport_idle(ctx->t) &&
                     !(ctx->ops && ctx->ops->busy && ctx->ops->busy(ctx)))) {
                *ret_n = 0;
                return 0;
        }
        transport_timer_fired(ctx->t);
        r = ctx_pump(ctx);
        if (r < 0)
                return r;
        session_step(ctx);
        session_keepalive(ctx);
        if (ctx->state == SESSION_CONNECTED && ctx->ops && ctx->ops->poll_step)
                ctx->ops->poll_step(ctx);
        n = MIN(n_events, ctx->ev_n);
        for (size_t i = 0; i < n; i++)
                events[i] = ctx->events[(ctx->ev_head + i) % ctx->ev_cap];
        if (n > 0) {
                ctx->ev_head = (ctx->ev_head + n) % ctx->ev_cap;
                ctx->ev_n -= n;
        }
        *ret_n = n;
        return 0;
}

_public_ int aqua_fd(aqua_ctx *ctx, int *ret_fd)
{
        if (!ctx || !ret_fd)
                return -EINVAL;
        *ret_fd = transport_fd(ctx->t);
        return 0;
}
