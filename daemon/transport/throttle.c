/* Each client's request rate (limits.request-rate, request-burst): a token bucket per client. */
#include <inttypes.h>
#include <math.h>

#include "state.h"
#include "throttle.h"
#include "time-util.h"
#include "turn.h"
#include "util.h"

#define ECODE(name) AQUA__ERROR_CODE__ERROR_CODE_##name

/*
 * A client may send limits.request-burst requests at once and limits.request-rate per second
 * after that (a token bucket); one that sends more gets ERROR_CODE_THROTTLED for the excess,
 * which costs the daemon no more than the decoding. A client that waits for each reply stays
 * far below any sensible rate.
 */
bool throttle_take(struct server *s, struct client *c, uint64_t request_id)
{
        const struct config_limits *l = &s->config->limits;
        uint64_t now;

        if (l->request_rate <= 0)
                return true;
        now = now_mono_ns();
        if (!c->credit_ns)
                c->credit = (double)l->request_burst;
        else
                c->credit =
                    MIN((double)l->request_burst,
                        c->credit + (double)(now - c->credit_ns) * (double)l->request_rate / 1e9);
        c->credit_ns = now;
        if (c->credit >= 1.0) {
                c->credit -= 1.0;
                return true;
        }
        s->stats.throttled++;
        server_queue_error(s, c->routing_id, c->routing_id_len, request_id, ECODE(THROTTLED),
                           "over %" PRId64 " requests per second (bursts of %" PRId64
                           "); retry in %.0f ms",
                           l->request_rate, l->request_burst,
                           ceil((1.0 - c->credit) * 1e3 / (double)l->request_rate));
        return false;
}
