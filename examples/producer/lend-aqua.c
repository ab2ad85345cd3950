/* The producer's lending backend on libaqua: offer, reclaim and load reports through aquad. */
#include <inttypes.h>
#include <stdlib.h>

#include "aqua-log.h"
#include "aqua/aqua.h"
#include "lend.h"
#include "example-log.h"
#include "example-parse.h"
#include "example-util.h"

struct lend_aqua {
        struct lend_aqua_config cfg;
        struct lend_config policy;
        aqua_ctx *ctx;
        uint64_t late_reclaimed;
        bool drained; /* told so once: an operator drained the GPU */
};

static int la_offer(void *ctx, uint64_t bytes, uint64_t *ret_bytes)
{
        struct lend_aqua *l = ctx;
        uint64_t offered = 0;
        int r;

        r = aqua_offer(l->ctx, bytes, &offered);
        if (r == AQUA_DRAINING) {
                /* Not this producer's decision to undo: it lends nothing, keeps running and
                 * tries again at its pace, until an operator ends the drain. */
                if (!l->drained)
                        log_warning("aqua: an operator drained this GPU: offering nothing until "
                                    "'aquactl undrain' (%s)",
                                    aqua_strerror(r));
                l->drained = true;
                *ret_bytes = 0;
                return 0;
        }
        if (r == 0 && l->drained) {
                log_info("aqua: the drain of this GPU ended; offering again");
                l->drained = false;
        }
        if (r == -ENOMEM || r == AQUA_LIMIT) {
                /* The GPU or aquad has no room for more: nothing went in, try again later. */
                log_warning("aqua: offer of %" PRIu64 " bytes refused: %s", bytes,
                            aqua_strerror(r));
                *ret_bytes = 0;
                return 0;
        }
        if (r != 0)
                return r < 0 ? r : -EIO;
        *ret_bytes = offered;
        return 0;
}

static int la_reclaim(void *ctx, uint64_t bytes, uint64_t *ret_bytes)
{
        struct lend_aqua *l = ctx;
        uint64_t freed = 0;
        char b[32];
        int r;

        r = aqua_reclaim(l->ctx, bytes, (int)(l->cfg.reclaim_timeout_ns / NSEC_PER_MSEC), &freed);
        if (r < 0)
                return r;
        if (r == AQUA_TIMEOUT)
                log_warning("aqua: reclaim: %s free so far; the rest follows when consumers have "
                            "moved off",
                            format_size(b, sizeof(b), freed));
        /* Reclaiming chunks have left the pool even while a consumer still moves off them. */
        *ret_bytes = r == AQUA_TIMEOUT ? bytes : freed;
        return 0;
}

static int la_report_load(void *ctx, double load)
{
        struct lend_aqua *l = ctx;
        struct aqua_load in = {.load = load};
        int r;

        in.used_bytes = lend_working_set(&l->policy, load);
        in.free_bytes = l->policy.capacity - in.used_bytes;
        r = aqua_report_load(l->ctx, &in);
        /* Away or busy: the next report carries the load anyway. */
        return r == -ENOTCONN || r == -EAGAIN ? 0 : r;
}

static int la_poll(void *ctx)
{
        struct lend_aqua *l = ctx;
        struct aqua_event ev[16];
        size_t n;
        int r;

        do {
                r = aqua_poll(l->ctx, ev, ARRAY_SIZE(ev), &n);
                if (r < 0)
                        return r;
                for (size_t i = 0; i < n; i++)
                        switch (ev[i].type) {
                        case AQUA_EVENT_RECLAIMED:
                                l->late_reclaimed += ev[i].bytes;
                                log_info("aqua: %" PRIu64 " more reclaimed bytes are free",
                                         ev[i].bytes);
                                break;
                        case AQUA_EVENT_DISCONNECTED:
                                log_warning("aqua: lost aquad; lent memory stays lent");
                                break;
                        case AQUA_EVENT_RECONNECTED:
                                log_info("aqua: connected to aquad again");
                                break;
                        case AQUA_EVENT_DAEMON_STOPPING:
                                log_info("aqua: aquad is stopping");
                                break;
                        default:
                                break;
                        }
        } while (n == ARRAY_SIZE(ev));
        return 0;
}

static void la_free(void *ctx)
{
        struct lend_aqua *l = ctx;
        struct aqua_info in;

        if (!l)
                return;
        /* Take everything back first so that consumers move off in time, not after our exit. */
        if (aqua_get_info(l->ctx, &in) == 0 && in.connected && in.offered_bytes > 0)
                aqua_reclaim(l->ctx, AQUA_ALL, (int)(l->cfg.reclaim_timeout_ns / NSEC_PER_MSEC),
                             NULL);
        aqua_close(l->ctx);
        free(l);
}

static const struct lend_ops aqua_ops = {
    .name = "aqua",
    .offer = la_offer,
    .reclaim = la_reclaim,
    .report_load = la_report_load,
    .poll = la_poll,
    .free = la_free,
};

int lend_aqua_new(const struct lend_aqua_config *c, struct lend_backend *ret)
{
        struct aqua_options o = AQUA_OPTIONS_INIT;
        struct lend_aqua *l;
        int r;

        if (!c || !c->policy || !ret || lend_config_check(c->policy) < 0)
                return -EINVAL;
        l = calloc(1, sizeof(*l));
        if (!l)
                return -ENOMEM;
        l->cfg = *c;
        l->policy = *c->policy;
        l->cfg.policy = &l->policy;
        if (l->cfg.reclaim_timeout_ns == 0)
                l->cfg.reclaim_timeout_ns = 30 * NSEC_PER_SEC;
        examples_aqua_log_setup();
        o.endpoint = c->endpoint;
        o.client_name = "aqua-producer";
        o.chunk_bytes = c->policy->chunk;
        r = aqua_open(c->device, AQUA_ROLE_PRODUCER, &o, &l->ctx);
        if (r < 0) {
                free(l);
                return r;
        }
        *ret = (struct lend_backend){&aqua_ops, l};
        return 0;
}

uint64_t lend_aqua_late_reclaimed(const struct lend_backend *b)
{
        return b && b->ops == &aqua_ops ? ((const struct lend_aqua *)b->ctx)->late_reclaimed : 0;
}
