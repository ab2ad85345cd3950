/* aquad's config schema, defaults and the checks the generic loader cannot make. */
#include "config.h"

#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>
#include <zmq.h>

#include "conf.h"
#include "curve.h"
#include "log.h"
#include "parse-util.h"

static const char *const pairing_names[] = {"static", "auto", NULL};
static const char *const level_names[] = {"error", "warning", "notice", "info", "debug", NULL};

static const struct conf_field pair_fields[] = {
    CONF_FIELD_STRING(struct config_pair, producer, "producer", CONF_REQUIRED),
    CONF_FIELD_STRING(struct config_pair, consumer, "consumer", CONF_REQUIRED),
    CONF_FIELD_END,
};
static const struct conf_schema pair_schema = {"pair", pair_fields};

static const struct conf_field access_fields[] = {
    CONF_FIELD_LIST(struct config_access, users, n_users, "users", &conf_elem_string, 1024, 0),
    CONF_FIELD_LIST(struct config_access, groups, n_groups, "groups", &conf_elem_string, 1024, 0),
    CONF_FIELD_END,
};
static const struct conf_schema access_schema = {"access", access_fields};

static const struct conf_field tenant_fields[] = {
    CONF_FIELD_STRING(struct config_tenant, name, "name", CONF_REQUIRED),
    CONF_FIELD_LIST(struct config_tenant, members.users, members.n_users, "users",
                    &conf_elem_string, 1024, 0),
    CONF_FIELD_LIST(struct config_tenant, members.groups, members.n_groups, "groups",
                    &conf_elem_string, 1024, 0),
    CONF_FIELD_LIST(struct config_tenant, keys, n_keys, "keys", &conf_elem_string, 1024, 0),
    CONF_FIELD_LIST(struct config_tenant, cgroups, n_cgroups, "cgroups", &conf_elem_string, 1024,
                    0),
    CONF_FIELD_END,
};
static const struct conf_schema tenant_schema = {"tenant", tenant_fields};

static const struct conf_field limits_fields[] = {
    CONF_FIELD_INT(struct config_limits, clients, "clients", 1, 65536, 0),
    CONF_FIELD_INT(struct config_limits, clients_per_user, "clients-per-user", 1, 65536, 0),
    CONF_FIELD_INT(struct config_limits, admin_reserve, "admin-reserve", 0, 65535, 0),
    CONF_FIELD_INT(struct config_limits, unregistered, "unregistered", 1, 4096, 0),
    CONF_FIELD_INT(struct config_limits, chunks, "chunks", 1, 1 << 24, 0),
    CONF_FIELD_INT(struct config_limits, leases, "leases", 1, 1 << 24, 0),
    CONF_FIELD_INT(struct config_limits, pending_requests, "pending-requests", 1, 4096, 0),
    CONF_FIELD_SIZE(struct config_limits, message_size, "message-size", 256, 64 << 20, 0),
    CONF_FIELD_INT(struct config_limits, repeated_items, "repeated-items", 1, 1 << 20, 0),
    CONF_FIELD_INT(struct config_limits, request_rate, "request-rate", 0, 1 << 24, 0),
    CONF_FIELD_INT(struct config_limits, request_burst, "request-burst", 1, 1 << 24, 0),
    CONF_FIELD_END,
};
static const struct conf_schema limits_schema = {"limits", limits_fields};

#define SEC INT64_C(1000000000)

static const struct conf_field remote_client_fields[] = {
    CONF_FIELD_STRING(struct config_remote_client, user, "user", CONF_REQUIRED),
    CONF_FIELD_LIST(struct config_remote_client, keys, n_keys, "keys", &conf_elem_string, 1024,
                    CONF_REQUIRED),
    CONF_FIELD_LIST(struct config_remote_client, gpus, n_gpus, "gpus", &conf_elem_string, 4096, 0),
    CONF_FIELD_LIST(struct config_remote_client, hosts, n_hosts, "hosts", &conf_elem_string, 1024,
                    0),
    CONF_FIELD_END,
};
static const struct conf_schema remote_client_schema = {"remote client", remote_client_fields};

static const struct conf_field remote_fields[] = {
    CONF_FIELD_STRING(struct config_remote, endpoint, "endpoint", 0),
    CONF_FIELD_STRING(struct config_remote, key_file, "key-file", 0),
    CONF_FIELD_LIST(struct config_remote, clients, n_clients, "clients",
                    CONF_ELEM_STRUCT(&remote_client_schema), 4096, 0),
    CONF_FIELD_DURATION(struct config_remote, heartbeat_interval_ns, "heartbeat-interval",
                        SEC / 100, 600 * SEC, 0),
    CONF_FIELD_DURATION(struct config_remote, heartbeat_timeout_ns, "heartbeat-timeout", SEC / 100,
                        3600 * SEC, 0),
    CONF_FIELD_DURATION(struct config_remote, grace_ns, "grace", 0, 7 * 24 * 3600 * SEC, 0),
    CONF_FIELD_END,
};
static const struct conf_schema remote_schema = {"remote", remote_fields};

static const struct conf_field domain_fields[] = {
    CONF_FIELD_STRING(struct config_domain, name, "name", 0),
    CONF_FIELD_LIST(struct config_domain, etcd, n_etcd, "etcd", &conf_elem_string, 16, 0),
    CONF_FIELD_DURATION(struct config_domain, lease_ttl_ns, "lease-ttl", SEC, 600 * SEC, 0),
    CONF_FIELD_DURATION(struct config_domain, etcd_timeout_ns, "etcd-timeout", SEC / 100, 60 * SEC,
                        0),
    CONF_FIELD_STRING(struct config_domain, advertise, "advertise", 0),
    CONF_FIELD_STRING(struct config_domain, etcd_ca_file, "etcd-ca-file", 0),
    CONF_FIELD_STRING(struct config_domain, etcd_cert_file, "etcd-cert-file", 0),
    CONF_FIELD_STRING(struct config_domain, etcd_key_file, "etcd-key-file", 0),
    CONF_FIELD_STRING(struct config_domain, etcd_user, "etcd-user", 0),
    CONF_FIELD_STRING(struct config_domain, etcd_password_file, "etcd-password-file", 0),
    CONF_FIELD_END,
};

static const struct conf_schema domain_schema = {"domain", domain_fields};

static const struct conf_field config_fields[] = {
    CONF_FIELD_STRING(struct config, endpoint, "endpoint", 0),
    CONF_FIELD_BOOL(struct config, plain_tcp, "plain-tcp", 0),
    CONF_FIELD_STRUCT(struct config, remote, "remote", &remote_schema, 0),
    CONF_FIELD_STRING(struct config, side_socket, "side-socket", 0),
    CONF_FIELD_MODE(struct config, socket_mode, "socket-mode", 0),
    CONF_FIELD_STRING(struct config, socket_group, "socket-group", 0),
    CONF_FIELD_STRUCT(struct config, allow, "allow", &access_schema, 0),
    CONF_FIELD_STRUCT(struct config, admin, "admin", &access_schema, 0),
    CONF_FIELD_LIST(struct config, tenants, n_tenants, "tenants", CONF_ELEM_STRUCT(&tenant_schema),
                    1024, 0),
    CONF_FIELD_BOOL(struct config, gpu_evidence, "gpu-evidence", 0),
    CONF_FIELD_STRING(struct config, driver_root, "driver-root", 0),
    CONF_FIELD_SIZE(struct config, dram_budget, "dram-budget", 0, INT64_C(1) << 56, 0),
    CONF_FIELD_BOOL(struct config, scrub_chunks, "scrub-chunks", 0),
    CONF_FIELD_BOOL(struct config, colocated_lending, "colocated-lending", 0),
    CONF_FIELD_STRUCT(struct config, limits, "limits", &limits_schema, 0),
    CONF_FIELD_DURATION(struct config, reclaim_deadline_ns, "reclaim-deadline", SEC / 1000,
                        3600 * SEC, 0),
    CONF_FIELD_DURATION(struct config, reconcile_timeout_ns, "reconcile-timeout", SEC / 1000,
                        3600 * SEC, 0),
    CONF_FIELD_DURATION(struct config, request_timeout_ns, "request-timeout", SEC / 1000, 600 * SEC,
                        0),
    CONF_FIELD_ENUM(struct config, pairing, "pairing", pairing_names, 0),
    CONF_FIELD_LIST(struct config, pairs, n_pairs, "pairs", CONF_ELEM_STRUCT(&pair_schema), 1024,
                    0),
    CONF_FIELD_STRING(struct config, plan, "plan", 0),
    CONF_FIELD_STRING(struct config, topology, "topology", 0),
    CONF_FIELD_STRING(struct config, journal, "journal", 0),
    CONF_FIELD_STRUCT(struct config, domain, "domain", &domain_schema, 0),
    CONF_FIELD_SIZE(struct config, journal_compact_bytes, "journal-compact-size", 4096,
                    INT64_C(1) << 40, 0),
    CONF_FIELD_STRING(struct config, metrics, "metrics", 0),
    CONF_FIELD_ENUM(struct config, log_level, "log-level", level_names, 0),
    CONF_FIELD_END,
};
static const struct conf_schema config_schema = {"aquad", config_fields};

static void *mfree(void *p)
{
        free(p);
        return NULL;
}

static void access_free(struct config_access *a)
{
        a->uids = mfree(a->uids);
        a->gids = mfree(a->gids);
}

struct config *config_free(struct config *c)
{
        if (!c)
                return NULL;
        access_free(&c->allow);
        access_free(&c->admin);
        for (size_t i = 0; i < c->n_tenants; i++)
                access_free(&c->tenants[i].members);
        topology_free(&c->links);
        explicit_bzero(c->remote.secret_key, sizeof(c->remote.secret_key));
        if (c->domain.etcd_password)
                explicit_bzero(c->domain.etcd_password, strlen(c->domain.etcd_password));
        free(c->domain.etcd_password);
        conf_free(&config_schema, c);
        free(c);
        return NULL;
}

static int defaults(struct config *c)
{
        *c = (struct config){
            .socket_mode = 0660,
            .scrub_chunks = true,
            .gpu_evidence = true,
            .limits =
                {
                    .clients = 256,
                    .clients_per_user = 64,
                    .admin_reserve = -1, /* 8, at most a quarter of clients */
                    .unregistered = 1024,
                    .chunks = 65536,
                    .leases = 16384,
                    .pending_requests = 16,
                    .message_size = 1u << 20,
                    .repeated_items = 4096,
                    .request_rate = 2000,
                    .request_burst = 1000,
                },
            .reclaim_deadline_ns = 5 * SEC,
            .reconcile_timeout_ns = 30 * SEC,
            .request_timeout_ns = 10 * SEC,
            .pairing = CONFIG_PAIRING_AUTO,
            .remote =
                {
                    .heartbeat_interval_ns = SEC,
                    .heartbeat_timeout_ns = 5 * SEC,
                    .grace_ns = 30 * SEC,
                },
            .domain = {.lease_ttl_ns = 5 * SEC, .etcd_timeout_ns = SEC},
            .journal_compact_bytes = 4u << 20,
            .log_level = LOG_LEVEL_INFO,
        };
        c->endpoint = strdup(CONFIG_DEFAULT_ENDPOINT);
        c->side_socket = strdup(CONFIG_DEFAULT_SIDE);
        c->journal = strdup(CONFIG_DEFAULT_JOURNAL);
        c->driver_root = strdup("/");
        if (!c->endpoint || !c->side_socket || !c->journal || !c->driver_root)
                return -ENOMEM;
        return 0;
}

_printf_(3, 4) static int invalid(char **ret_error, const char *name, const char *fmt, ...)
{
        _cleanup_free_ char *msg = NULL;
        va_list ap;
        int r;

        va_start(ap, fmt);
        r = vasprintf(&msg, fmt, ap);
        va_end(ap);
        if (r < 0)
                return -ENOMEM;
        if (ret_error && asprintf(ret_error, "%s: %s", name, msg) < 0)
                *ret_error = NULL;
        return -EINVAL;
}

/* A numeric id as written, or a user or group name looked up in the system databases. */
static int resolve_id(const char *s, bool user, uint32_t *ret)
{
        int64_t v;

        if (parse_int64(s, 10, &v) == 0) {
                if (v < 0 || v > UINT32_MAX - 1)
                        return -ERANGE;
                *ret = (uint32_t)v;
                return 0;
        }
        if (user) {
                struct passwd *pw = getpwnam(s);
                if (!pw)
                        return -ENOENT;
                *ret = pw->pw_uid;
        } else {
                struct group *gr = getgrnam(s);
                if (!gr)
                        return -ENOENT;
                *ret = gr->gr_gid;
        }
        return 0;
}

static int resolve_access(struct config_access *a, const char *name, const char *key,
                          char **ret_error)
{
        a->uids = calloc(a->n_users ? a->n_users : 1, sizeof(uid_t));
        a->gids = calloc(a->n_groups ? a->n_groups : 1, sizeof(gid_t));
        if (!a->uids || !a->gids)
                return -ENOMEM;
        for (size_t i = 0; i < a->n_users; i++)
                if (resolve_id(a->users[i], true, &a->uids[i]) < 0)
                        return invalid(ret_error, name, "%s.users[%zu]: no user \"%s\"", key, i,
                                       a->users[i]);
        for (size_t i = 0; i < a->n_groups; i++)
                if (resolve_id(a->groups[i], false, &a->gids[i]) < 0)
                        return invalid(ret_error, name, "%s.groups[%zu]: no group \"%s\"", key, i,
                                       a->groups[i]);
        return 0;
}

/* aqua-place -p writes one file per server: `pairs: [{producer: N, consumer: N}]`, GPU ordinals. */
struct plan_pair {
        int64_t producer;
        int64_t consumer;
};

struct plan {
        struct plan_pair *pairs;
        size_t n_pairs;
};

static const struct conf_field plan_pair_fields[] = {
    CONF_FIELD_INT(struct plan_pair, producer, "producer", 0, 4095, CONF_REQUIRED),
    CONF_FIELD_INT(struct plan_pair, consumer, "consumer", 0, 4095, CONF_REQUIRED),
    CONF_FIELD_END,
};
static const struct conf_schema plan_pair_schema = {"plan pair", plan_pair_fields};
static const struct conf_field plan_fields[] = {
    CONF_FIELD_LIST(struct plan, pairs, n_pairs, "pairs", CONF_ELEM_STRUCT(&plan_pair_schema), 1024,
                    CONF_REQUIRED),
    CONF_FIELD_END,
};
static const struct conf_schema plan_schema = {"plan", plan_fields};

/* A path in the config relative to the config file, as operators expect; the caller frees it. */
static char *config_relative(const char *name, const char *path)
{
        const char *slash = strrchr(name, '/');
        char *s = NULL;

        if (path[0] == '/' || !slash)
                return strdup(path);
        if (asprintf(&s, "%.*s/%s", (int)(slash - name), name, path) < 0)
                return NULL;
        return s;
}

static int load_topology(struct config *c, const char *name, char **ret_error)
{
        _cleanup_free_ char *path = config_relative(name, c->topology), *error = NULL;
        int r;

        if (!path)
                return -ENOMEM;
        r = topology_load(path, &c->links, &error);
        if (r < 0)
                return invalid(ret_error, name, "topology: %s", error ? error : strerror(-r));
        return 0;
}

/* Append the plan's pairs to c->pairs as ordinals in text, which pins match like UUIDs. */
static int load_plan(struct config *c, const char *name, char **ret_error)
{
        _cleanup_free_ char *path = config_relative(name, c->plan), *error = NULL;
        struct plan plan = {0};
        struct config_pair *pairs;
        int r = 0;

        if (!path)
                return -ENOMEM;
        r = conf_load(&plan_schema, path, &plan, &error);
        if (r < 0) {
                conf_free(&plan_schema, &plan);
                return invalid(ret_error, name, "plan: %s", error ? error : strerror(-r));
        }
        pairs = reallocarray(c->pairs, c->n_pairs + plan.n_pairs + 1, sizeof(*pairs));
        if (!pairs) {
                conf_free(&plan_schema, &plan);
                return -ENOMEM;
        }
        c->pairs = pairs;
        for (size_t i = 0; i < plan.n_pairs && r == 0; i++) {
                struct config_pair *p = &c->pairs[c->n_pairs];

                *p = (struct config_pair){0};
                if (asprintf(&p->producer, "%lld", (long long)plan.pairs[i].producer) < 0 ||
                    asprintf(&p->consumer, "%lld", (long long)plan.pairs[i].consumer) < 0) {
                        free(p->producer);
                        r = -ENOMEM;
                } else
                        c->n_pairs++;
        }
        conf_free(&plan_schema, &plan);
        return r;
}

static int check_remote(struct config *c, const char *name, char **ret_error)
{
        struct config_remote *rm = &c->remote;
        _cleanup_free_ char *path = NULL;
        char err[512];
        int r;

        if (!rm->endpoint) {
                if (rm->key_file || rm->n_clients)
                        return invalid(ret_error, name,
                                       "remote: no endpoint (remote.endpoint: tcp://ADDRESS:PORT)");
                return 0;
        }
        if (strncmp(rm->endpoint, "tcp://", 6) != 0)
                return invalid(ret_error, name, "remote.endpoint: \"%s\" is not tcp://",
                               rm->endpoint);
        if (!zmq_has("curve"))
                return invalid(ret_error, name,
                               "remote: this libzmq has no CURVE support (it needs libsodium)");
        if (!rm->key_file)
                return invalid(ret_error, name,
                               "remote.key-file: required: aquad's key pair (`aquactl keygen "
                               "FILE` writes one)");
        path = config_relative(name, rm->key_file);
        if (!path)
                return -ENOMEM;
        r = curve_keyfile_load(path, rm->public_key, rm->secret_key, err, sizeof(err));
        if (r < 0)
                return invalid(ret_error, name, "remote.key-file: %s", err);
        if (rm->heartbeat_timeout_ns < rm->heartbeat_interval_ns)
                return invalid(ret_error, name,
                               "remote.heartbeat-timeout: shorter than remote.heartbeat-interval");
        for (size_t i = 0; i < rm->n_clients; i++) {
                struct config_remote_client *rc = &rm->clients[i];
                uint32_t uid;

                if (resolve_id(rc->user, true, &uid) < 0)
                        return invalid(ret_error, name, "remote.clients[%zu].user: no user \"%s\"",
                                       i, rc->user);
                rc->uid = uid;
                if (rc->n_keys == 0)
                        return invalid(ret_error, name, "remote.clients[%zu].keys: empty", i);
                for (size_t k = 0; k < rc->n_keys; k++) {
                        if (!curve_key_valid(rc->keys[k]))
                                return invalid(ret_error, name,
                                               "remote.clients[%zu].keys[%zu]: \"%s\" is not a "
                                               "Z85 CURVE public key (40 characters)",
                                               i, k, rc->keys[k]);
                        if (strcmp(rc->keys[k], rm->public_key) == 0)
                                return invalid(ret_error, name,
                                               "remote.clients[%zu].keys[%zu]: aquad's own public "
                                               "key",
                                               i, k);
                        for (size_t j = 0; j <= i; j++)
                                for (size_t l = 0; l < (j == i ? k : rm->clients[j].n_keys); l++)
                                        if (strcmp(rm->clients[j].keys[l], rc->keys[k]) == 0)
                                                return invalid(ret_error, name,
                                                               "remote.clients[%zu].keys[%zu]: "
                                                               "already remote.clients[%zu]."
                                                               "keys[%zu]; a key is one identity",
                                                               i, k, j, l);
                }
        }
        return 0;
}

static int check_domain(struct config *c, const char *name, char **ret_error)
{
        struct config_domain *d = &c->domain;

        if (d->n_etcd == 0) {
                if (d->name || d->advertise)
                        return invalid(ret_error, name,
                                       "domain: no etcd (domain.etcd: [http://HOST:2379, ...])");
                return 0;
        }
        if (!d->name || !d->name[0] || strchr(d->name, '/'))
                return invalid(ret_error, name,
                               "domain.name: required, without '/': the domain's keys in etcd "
                               "are under /aqua/NAME/");
        for (size_t i = 0; i < d->n_etcd; i++)
                if (strncmp(d->etcd[i], "http://", 7) != 0 &&
                    strncmp(d->etcd[i], "https://", 8) != 0)
                        return invalid(ret_error, name,
                                       "domain.etcd[%zu]: \"%s\" is not http:// or https://", i,
                                       d->etcd[i]);
        if (!c->remote.endpoint)
                return invalid(ret_error, name,
                               "domain: needs remote.endpoint: the clients of a domain reach "
                               "whichever aquad leads over tcp");
        if (d->lease_ttl_ns % SEC)
                return invalid(ret_error, name,
                               "domain.lease-ttl: etcd's leases are whole seconds");
        if (d->etcd_timeout_ns * 2 > d->lease_ttl_ns)
                return invalid(ret_error, name,
                               "domain.etcd-timeout: more than half domain.lease-ttl: a leader "
                               "could lose its lease waiting for one call");
        if (!!d->etcd_cert_file != !!d->etcd_key_file)
                return invalid(ret_error, name,
                               "domain: etcd-cert-file and etcd-key-file go together");
        if (!!d->etcd_user != !!d->etcd_password_file)
                return invalid(ret_error, name,
                               "domain: etcd-user and etcd-password-file go together");
        if (d->etcd_password_file) {
                _cleanup_free_ char *path = config_relative(name, d->etcd_password_file);
                FILE *f;
                size_t size = 0;
                ssize_t n;

                if (!path)
                        return -ENOMEM;
                f = fopen(path, "re");
                if (!f)
                        return invalid(ret_error, name, "domain.etcd-password-file: %s: %s", path,
                                       strerror(errno));
                n = getline(&d->etcd_password, &size, f);
                fclose(f);
                if (n <= 0)
                        return invalid(ret_error, name, "domain.etcd-password-file: %s is empty",
                                       path);
                d->etcd_password[strcspn(d->etcd_password, "\n")] = 0;
        }
        return 0;
}

/* A tenant's name: short, and without ':', so that it never reads as a default ("user:1000"). */
static bool tenant_name_valid(const char *n)
{
        size_t len = strlen(n);

        if (len == 0 || len > 48)
                return false;
        for (const char *p = n; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                      (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.'))
                        return false;
        return true;
}

static int check_tenants(struct config *c, const char *name, char **ret_error)
{
        char key[48];
        int r;

        for (size_t i = 0; i < c->n_tenants; i++) {
                struct config_tenant *t = &c->tenants[i];

                snprintf(key, sizeof(key), "tenants[%zu]", i);
                if (!tenant_name_valid(t->name))
                        return invalid(ret_error, name,
                                       "%s.name: \"%s\" must be 1 to 48 letters, digits, '-', "
                                       "'_' or '.'",
                                       key, t->name);
                for (size_t j = 0; j < i; j++)
                        if (strcmp(c->tenants[j].name, t->name) == 0)
                                return invalid(ret_error, name,
                                               "%s.name: \"%s\" is already tenants[%zu]", key,
                                               t->name, j);
                if (!t->members.n_users && !t->members.n_groups && !t->n_keys && !t->n_cgroups)
                        return invalid(ret_error, name,
                                       "%s: names nobody (give users, groups, keys or cgroups)",
                                       key);
                r = resolve_access(&t->members, name, key, ret_error);
                if (r < 0)
                        return r;
                for (size_t k = 0; k < t->n_keys; k++)
                        if (!curve_key_valid(t->keys[k]))
                                return invalid(ret_error, name,
                                               "%s.keys[%zu]: \"%s\" is not a Z85 CURVE public "
                                               "key (40 characters)",
                                               key, k, t->keys[k]);
                for (size_t k = 0; k < t->n_cgroups; k++)
                        if (t->cgroups[k][0] != '/' && t->cgroups[k][0] != '*')
                                return invalid(ret_error, name,
                                               "%s.cgroups[%zu]: \"%s\" is neither a cgroup path "
                                               "(\"/...\") nor a pattern that starts with '*'",
                                               key, k, t->cgroups[k]);
                /* A user or a key in two tenants would be in whichever is first: say so now. */
                for (size_t j = 0; j < i; j++) {
                        const struct config_tenant *o = &c->tenants[j];
                        for (size_t k = 0; k < t->members.n_users; k++)
                                for (size_t l = 0; l < o->members.n_users; l++)
                                        if (t->members.uids[k] == o->members.uids[l])
                                                return invalid(ret_error, name,
                                                               "%s.users[%zu]: \"%s\" is already "
                                                               "in tenant \"%s\"; a user is in "
                                                               "one tenant",
                                                               key, k, t->members.users[k],
                                                               o->name);
                        for (size_t k = 0; k < t->n_keys; k++)
                                for (size_t l = 0; l < o->n_keys; l++)
                                        if (strcmp(t->keys[k], o->keys[l]) == 0)
                                                return invalid(ret_error, name,
                                                               "%s.keys[%zu]: already in tenant "
                                                               "\"%s\"; a key is in one tenant",
                                                               key, k, o->name);
                }
        }
        return 0;
}

static int check(struct config *c, const char *name, char **ret_error)
{
        int r;

        if (!c->endpoint ||
            !(strncmp(c->endpoint, "ipc://", 6) == 0 || strncmp(c->endpoint, "tcp://", 6) == 0))
                return invalid(ret_error, name, "endpoint: \"%s\" is neither ipc:// nor tcp://",
                               c->endpoint ? c->endpoint : "");
        if (strncmp(c->endpoint, "tcp://", 6) == 0 && !c->plain_tcp)
                return invalid(ret_error, name,
                               "endpoint: \"%s\" is plain tcp, with no encryption and no "
                               "authentication; serve other hosts on remote.endpoint with CURVE "
                               "keys, or set plain-tcp: true to accept it",
                               c->endpoint);
        r = check_remote(c, name, ret_error);
        if (r >= 0)
                r = check_domain(c, name, ret_error);
        if (r < 0)
                return r;
        if (!c->side_socket || c->side_socket[0] != '/' ||
            strlen(c->side_socket) >= sizeof(((struct sockaddr_un *)0)->sun_path))
                return invalid(ret_error, name,
                               "side-socket: \"%s\" must be an absolute path of at most %zu bytes",
                               c->side_socket ? c->side_socket : "",
                               sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
        if (!c->journal || c->journal[0] == '\0')
                return invalid(ret_error, name, "journal: empty path");
        if (c->limits.admin_reserve < 0)
                c->limits.admin_reserve = MIN(8, c->limits.clients / 4);
        if (c->limits.admin_reserve >= c->limits.clients)
                return invalid(ret_error, name,
                               "limits.admin-reserve: %" PRId64 " leaves no client slot of "
                               "limits.clients (%" PRId64 ") to anyone but admins",
                               c->limits.admin_reserve, c->limits.clients);
        if (c->socket_mode & ~0777u)
                return invalid(ret_error, name, "socket-mode: %o has bits beyond 0777",
                               c->socket_mode);
        if (c->plan) {
                r = load_plan(c, name, ret_error);
                if (r < 0)
                        return r;
        }
        if (c->topology) {
                r = load_topology(c, name, ret_error);
                if (r < 0)
                        return r;
        }
        for (size_t i = 0; i < c->n_pairs; i++) {
                if (strcmp(c->pairs[i].producer, c->pairs[i].consumer) == 0)
                        return invalid(ret_error, name, "pairs[%zu]: a GPU cannot pair with itself",
                                       i);
                for (size_t j = 0; j < i; j++) {
                        const struct config_pair *p = &c->pairs[i], *q = &c->pairs[j];
                        const char *dup = NULL;

                        if (strcmp(p->producer, q->producer) == 0 ||
                            strcmp(p->producer, q->consumer) == 0)
                                dup = p->producer;
                        else if (strcmp(p->consumer, q->producer) == 0 ||
                                 strcmp(p->consumer, q->consumer) == 0)
                                dup = p->consumer;
                        if (dup)
                                return invalid(ret_error, name,
                                               "pairs[%zu]: %s is already in pairs[%zu]; pairs are "
                                               "one-to-one",
                                               i, dup, j);
                }
        }
        if (c->socket_group) {
                uint32_t gid;
                if (resolve_id(c->socket_group, false, &gid) < 0)
                        return invalid(ret_error, name, "socket-group: no group \"%s\"",
                                       c->socket_group);
        }
        r = resolve_access(&c->allow, name, "allow", ret_error);
        if (r < 0)
                return r;
        r = resolve_access(&c->admin, name, "admin", ret_error);
        if (r < 0)
                return r;
        return check_tenants(c, name, ret_error);
}

int config_load(const char *path, const void *data, size_t size, struct config **ret,
                char **ret_error)
{
        _cleanup_(config_freep) struct config *c = NULL;
        int r;

        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        r = defaults(c);
        if (r < 0)
                return r;
        if (data)
                r = conf_load_buffer(&config_schema, path, data, size, c, ret_error);
        else
                r = conf_load(&config_schema, path, c, ret_error);
        if (r < 0)
                return r;
        r = check(c, path, ret_error);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(c);
        return 0;
}
