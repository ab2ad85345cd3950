/* A client gone: its turn's custody changes settled and sent, its outbox cleared, what it waits
 * for closed, its GPU released (or detached, kept as after a restart). Above the turn and the
 * outboxes; what drops a client (the loop, admission, registration) calls it. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "clients.h"
#include "drop.h"
#include "log.h"
#include "outbox.h"
#include "state.h"
#include "time-util.h"
#include "translate.h"
#include "turn.h"

static void client_free(struct server *s, struct client *c)
{
        /* Its custody changes of this turn are settled (and their replies sent) first. */
        server_turn_barrier(s);
        server_outbox_clear(s, c);
        client_free_held(s, c);
        while (!list_empty(&c->pending))
                client_free_pending(c, list_entry(c->pending.next, struct pending, node));
        if (c->remote)
                log_info("Remote client %" PRIu64 " (%s at %s) gone", c->id, c->remote_user,
                         c->remote_addr);
        else if (c->gpu) {
                log_info("Client %" PRIu64 " (pid %d) gone; releasing GPU %s", c->id,
                         (int)c->cred.pid, broker_gpu_uuid(c->gpu));
                broker_gpu_gone(s->broker, c->gpu);
                c->gpu = NULL;
        } else if (c->registered)
                log_debug("Client %" PRIu64 " (pid %d) gone", c->id, (int)c->cred.pid);
        list_unlink(&c->node);
        s->n_clients--;
        safe_close(c->side_fd);
        free(c);
}

void server_drop_client(struct server *s, struct client *c)
{
        client_free(s, c);
}

void server_detach_gpu(struct server *s, struct client *c)
{
        server_turn_barrier(s);
        if (c->gpu)
                broker_gpu_detach(s->broker, c->gpu);
        c->gpu = NULL;
        client_free(s, c);
}
