/* aquad's settings from its config (settings.h). */
#include "settings.h"

#include <stdio.h>
#include <string.h>

#include "log.h"

struct settings settings_from_config(const struct config *c)
{
        struct settings st = {0};

        st.limits = (struct wire_limits){
            .max_message = c->limits.message_size,
            .max_repeated = (size_t)c->limits.repeated_items,
            .max_string = 4096,
        };
        st.broker = (struct broker_settings){
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
        st.compact_threshold = c->journal_compact_bytes;
        return st;
}

int settings_apply_pins(struct broker *broker, const struct config *c)
{
        _cleanup_free_ const char **prod = calloc(c->n_pairs + 1, sizeof(char *));
        _cleanup_free_ const char **cons = calloc(c->n_pairs + 1, sizeof(char *));

        if (!prod || !cons)
                return -ENOMEM;
        for (size_t i = 0; i < c->n_pairs; i++) {
                prod[i] = c->pairs[i].producer;
                cons[i] = c->pairs[i].consumer;
        }
        return broker_set_config_pins(broker, prod, cons, c->n_pairs);
}

static bool str_changed(const char *a, const char *b)
{
        return (a || b) && (!a || !b || strcmp(a, b) != 0);
}

int settings_reload(const char *path, struct config *old, struct config **ret, char *err,
                    size_t err_len, char *kept, size_t kept_len)
{
        _cleanup_(config_freep) struct config *n = NULL;
        _cleanup_free_ char *error = NULL;
        int r;

        kept[0] = '\0';
        r = config_load(path, NULL, 0, &n, &error);
        if (r < 0) {
                snprintf(err, err_len, "%s", error ? error : strerror(-r));
                return r;
        }
#define KEEP(cond, name, field)                                                                    \
        do {                                                                                       \
                if (cond) {                                                                        \
                        strncat(kept, kept[0] ? ", " name : name, kept_len - strlen(kept) - 1);    \
                        free(n->field);                                                            \
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
                        kept_len - strlen(kept) - 1);
        if ((n->remote.heartbeat_interval_ns != old->remote.heartbeat_interval_ns ||
             n->remote.heartbeat_timeout_ns != old->remote.heartbeat_timeout_ns) &&
            old->remote.endpoint)
                strncat(kept, kept[0] ? ", remote heartbeats" : "remote heartbeats",
                        kept_len - strlen(kept) - 1);
        memcpy(n->remote.public_key, old->remote.public_key, sizeof(n->remote.public_key));
        memcpy(n->remote.secret_key, old->remote.secret_key, sizeof(n->remote.secret_key));
        n->remote.heartbeat_interval_ns = old->remote.heartbeat_interval_ns;
        n->remote.heartbeat_timeout_ns = old->remote.heartbeat_timeout_ns;
        if (n->socket_mode != old->socket_mode) {
                strncat(kept, kept[0] ? ", socket-mode" : "socket-mode",
                        kept_len - strlen(kept) - 1);
                n->socket_mode = old->socket_mode;
        }
        *ret = TAKE_PTR(n);
        return 0;
}
