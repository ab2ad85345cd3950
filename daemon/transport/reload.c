/* The config applied to the running aquad: at start, and on reload (ops/settings.h decides). */
#include <stdio.h>
#include <string.h>

#include "hello.h"
#include "log.h"
#include "reload.h"
#include "settings.h"
#include "state.h"

void server_apply_settings(struct server *s)
{
        struct settings st = settings_from_config(s->config);

        s->limits = st.limits;
        broker_set_settings(s->broker, &st.broker, st.compact_threshold);
        /* A client is a side channel and one ipc:// connection; twice for reconnects. */
        if (s->fdg.share)
                s->fdg.share((long)s->config->limits.clients_per_user * 2);
}

int server_apply_pins(struct server *s)
{
        return settings_apply_pins(s->broker, s->config);
}

/* Every registered client's tenant as the new config says; what now crosses tenants is
 * reclaimed, and pairs follow. */
static void retenant(struct server *s)
{
        for (struct list_node *n = s->clients.next; n != &s->clients; n = n->next) {
                struct client *c = list_entry(n, struct client, node);
                struct broker_identity who = {0};

                if (!c->registered || !c->gpu)
                        continue;
                hello_identify_tenant(s, c, &who);
                if (broker_set_tenant(s->broker, c->gpu, who.tenant, who.lends_to_all))
                        log_notice("GPU %s is now of tenant %s", broker_gpu_uuid(c->gpu),
                                   who.tenant[0] ? who.tenant : "of its own user");
        }
}

int server_reload(struct server *s, char *err, size_t err_len, char *kept_out, size_t kept_len)
{
        struct config *n = NULL;
        char why[512], kept[256];
        int r;

        r = settings_reload(s->config_path, s->config, &n, why, sizeof(why), kept, sizeof(kept));
        if (r < 0) {
                log_error("Reload failed, keeping the running configuration: %s", why);
                if (err)
                        snprintf(err, err_len, "%s", why);
                return r;
        }
        config_free(s->config);
        s->config = n;
        server_apply_settings(s);
        retenant(s);
        if (server_apply_pins(s) < 0 || broker_recompute_pairs(s->broker) < 0)
                log_error("Out of memory applying the pairs of the new configuration");
        log_set_max_level(s->verbose ? LOG_LEVEL_DEBUG : s->config->log_level);
        events_add(broker_events(s->broker), "config", "reloaded%s%s",
                   kept[0] ? "; unchanged: " : "", kept);
        log_notice("Reloaded %s: allow lists, remote clients, limits, reclaim deadline, DRAM "
                   "budget, pairs and log level apply now%s%s",
                   s->config_path, kept[0] ? "; not changed until restart: " : "", kept);
        if (kept_out)
                snprintf(kept_out, kept_len, "%s", kept);
        return 0;
}
