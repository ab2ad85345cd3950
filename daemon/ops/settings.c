/* aquad's settings from its config: applied at start, and on reload (SIGHUP, aquactl reload)
 * where they can change live. */
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "server.h"

void server_apply_settings(struct server *s)
{
        const struct config *c = s->config;

        s->limits = (struct wire_limits){
            .max_message = c->limits.message_size,
            .max_repeated = (size_t)c->limits.repeated_items,
            .max_string = 4096,
        };
        s->broker->settings = (struct broker_settings){
            .dram_budget = c->dram_budget,
            .reclaim_deadline_ns = c->reclaim_deadline_ns,
            .reconcile_timeout_ns = c->reconcile_timeout_ns,
            .max_chunks = (uint64_t)c->limits.chunks,
            .max_leases = (uint64_t)c->limits.leases,
            .max_grant_chunks = (uint64_t)c->limits.repeated_items,
            .auto_pairing = c->pairing == CONFIG_PAIRING_AUTO,
            .links = c->topology ? &c->links : NULL,
            .scrub = c->scrub_chunks,
            .colocate = c->colocated_lending,
        };
        s->broker->compact_threshold = c->journal_compact_bytes;
}

int server_apply_pins(struct server *s)
{
        const struct config *c = s->config;
        _cleanup_free_ const char **prod = calloc(c->n_pairs + 1, sizeof(char *));
        _cleanup_free_ const char **cons = calloc(c->n_pairs + 1, sizeof(char *));

        if (!prod || !cons)
                return -ENOMEM;
        for (size_t i = 0; i < c->n_pairs; i++) {
                prod[i] = c->pairs[i].producer;
                cons[i] = c->pairs[i].consumer;
        }
        return broker_set_config_pins(s->broker, prod, cons, c->n_pairs);
}

static bool str_changed(const char *a, const char *b)
{
        return (a || b) && (!a || !b || strcmp(a, b) != 0);
}

int server_reload(struct server *s, char *err, size_t err_len, char *kept_out,
                  size_t kept_len)
{
        _cleanup_(config_freep) struct config *n = NULL;
        _cleanup_free_ char *error = NULL;
        struct config *old = s->config;
        char kept[256] = "";
        int r;

        r = config_load(s->config_path, NULL, 0, &n, &error);
        if (r < 0) {
                log_error("Reload failed, keeping the running configuration: %s",
                          error ? error : strerror(-r));
                if (err)
                        snprintf(err, err_len, "%s", error ? error : strerror(-r));
                return r;
        }
#define KEEP(cond, name, field)                                                                    \
        do {                                                                                       \
                if (cond) {                                                                        \
                        strncat(kept, kept[0] ? ", " name : name,                                  \
                                sizeof(kept) - strlen(kept) - 1);                                  \
                        n->field = old->field;                                                     \
                        old->field = NULL;                                                         \
                }                                                                                  \
        } while (0)
        KEEP(str_changed(n->endpoint, old->endpoint), "endpoint", endpoint);
        KEEP(str_changed(n->side_socket, old->side_socket), "side-socket", side_socket);
        KEEP(str_changed(n->socket_group, old->socket_group), "socket-group", socket_group);
        KEEP(str_changed(n->journal, old->journal), "journal", journal);
        KEEP(str_changed(n->metrics, old->metrics), "metrics", metrics);
        KEEP(str_changed(n->remote.endpoint, old->remote.endpoint), "remote.endpoint",
             remote.endpoint);
        KEEP(str_changed(n->remote.key_file, old->remote.key_file), "remote.key-file",
             remote.key_file);
#undef KEEP
        /* The ROUTER keeps the keys and heartbeats it bound with; remote.clients and
         * remote.grace apply at once. */
        if (strcmp(n->remote.public_key, old->remote.public_key) != 0 && old->remote.endpoint)
                strncat(kept, kept[0] ? ", remote key pair" : "remote key pair",
                        sizeof(kept) - strlen(kept) - 1);
        if ((n->remote.heartbeat_interval_ns != old->remote.heartbeat_interval_ns ||
             n->remote.heartbeat_timeout_ns != old->remote.heartbeat_timeout_ns) &&
            old->remote.endpoint)
                strncat(kept, kept[0] ? ", remote heartbeats" : "remote heartbeats",
                        sizeof(kept) - strlen(kept) - 1);
        memcpy(n->remote.public_key, old->remote.public_key, sizeof(n->remote.public_key));
        memcpy(n->remote.secret_key, old->remote.secret_key, sizeof(n->remote.secret_key));
        n->remote.heartbeat_interval_ns = old->remote.heartbeat_interval_ns;
        n->remote.heartbeat_timeout_ns = old->remote.heartbeat_timeout_ns;
        if (n->socket_mode != old->socket_mode) {
                strncat(kept, kept[0] ? ", socket-mode" : "socket-mode",
                        sizeof(kept) - strlen(kept) - 1);
                n->socket_mode = old->socket_mode;
        }
        s->config = TAKE_PTR(n);
        config_free(old);
        server_apply_settings(s);
        if (server_apply_pins(s) < 0 || broker_repair(s->broker) < 0)
                log_error("Out of memory applying the pairs of the new configuration");
        log_set_max_level(s->verbose ? LOG_LEVEL_DEBUG : s->config->log_level);
        events_add(&s->broker->events, "config", "reloaded%s%s", kept[0] ? "; unchanged: " : "",
                   kept);
        log_notice("Reloaded %s: allow lists, remote clients, limits, reclaim deadline, DRAM "
                   "budget, pairs and log level apply now%s%s",
                   s->config_path, kept[0] ? "; not changed until restart: " : "", kept);
        if (kept_out)
                snprintf(kept_out, kept_len, "%s", kept);
        return 0;
}
