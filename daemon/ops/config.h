/* aquad's configuration: the YAML schema, its defaults, cross-field checks, and name resolution. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "topology.h"
#include "util.h"

#define CONFIG_DEFAULT_PATH     "/etc/aqua/aquad.yaml"
#define CONFIG_DEFAULT_ENDPOINT "ipc:///run/aqua/aquad.sock"
#define CONFIG_DEFAULT_SIDE     "/run/aqua/aquad.side"
#define CONFIG_DEFAULT_JOURNAL  "/var/lib/aqua/journal"

enum config_pairing {
        CONFIG_PAIRING_STATIC,
        CONFIG_PAIRING_AUTO,
        _CONFIG_PAIRING_MAX,
        _CONFIG_PAIRING_INVALID = -EINVAL,
};

struct config_pair {
        char *producer; /* gpu uuid, or its ordinal in decimal */
        char *consumer;
};

/* Who may do something: user and group names (or numeric ids) as written, and as resolved. */
struct config_access {
        char **users;
        size_t n_users;
        char **groups;
        size_t n_groups;
        uid_t *uids; /* resolved from users by config_load() */
        gid_t *gids;
};

struct config_limits {
        int64_t clients;          /* connected clients, admin tools included */
        int64_t clients_per_user; /* the share of one user (root and aquad's user have none) */
        int64_t admin_reserve;    /* the last slots of `clients`: only admins take them */
        int64_t unregistered;     /* side channels that have not sent Hello yet */
        int64_t chunks;           /* chunks in the lending pool, all producers together */
        int64_t leases;           /* live leases */
        int64_t pending_requests; /* per client: requests waiting for their side-channel fds */
        uint64_t message_size;    /* bytes of one Envelope */
        int64_t repeated_items;   /* items in any repeated field */
        int64_t request_rate;     /* per client: requests per second sustained; 0: no limit */
        int64_t request_burst;    /* per client: requests at once above the rate */
};

/* A remote identity: a user (name or uid, as in allow.users) and the CURVE keys that are it. */
struct config_remote_client {
        char *user;
        char **keys; /* Z85 public keys */
        size_t n_keys;
        uid_t uid; /* resolved from user by config_load() */
        /* What its keys may register: GPU uuids, and hosts (Hello.host) whose every GPU;
         * fnmatch(3) patterns. Neither: any GPU not of aquad's host. */
        char **gpus;
        size_t n_gpus;
        char **hosts;
        size_t n_hosts;
};

/*
 * A tenant (daemon/README.md, "Who may hold what"): identities whose consumers may borrow what
 * each other lends. A local process is one by its user, its groups or its cgroup (a container's,
 * a Kubernetes pod's); a remote client by its key or the user remote.clients maps it to.
 */
struct config_tenant {
        char *name;
        struct config_access members; /* users (local, and remote keys of them) and groups */
        char **keys;                  /* Z85 CURVE public keys */
        size_t n_keys;
        char **cgroups; /* fnmatch(3) patterns ('*' spans '/') for a cgroup v2 path or an ancestor */
        size_t n_cgroups;
};

/* What aquad knows of a peer that a tenant may name. */
struct config_peer {
        bool remote;
        uid_t uid; /* local: SO_PEERCRED's; remote: the user remote.clients maps its key to */
        gid_t gid;
        const gid_t *groups;
        size_t n_groups;
        const char *cgroup; /* local: its cgroup v2 path ("/system.slice/x.service"), or NULL */
        const char *key;    /* remote: its CURVE key in Z85 */
};

/* tcp:// with CURVE for clients on other hosts; endpoint NULL: none. */
struct config_remote {
        char *endpoint;
        char *key_file; /* aquactl keygen's pair file: aquad's own keys */
        struct config_remote_client *clients;
        size_t n_clients;
        uint64_t heartbeat_interval_ns; /* ZMQ_HEARTBEAT_IVL */
        uint64_t heartbeat_timeout_ns;  /* ZMQ_HEARTBEAT_TIMEOUT and _TTL */
        uint64_t grace_ns; /* a silent remote client keeps its registration this long */
        char public_key[41], secret_key[41]; /* read from key_file by config_load() */
};

/* A domain with failover (daemon/README.md, "A domain on etcd"); n_etcd 0: a single aquad with
 * its journal file. */
struct config_domain {
        char *name;
        char **etcd; /* etcd's client URLs */
        size_t n_etcd;
        uint64_t lease_ttl_ns;    /* of the leader's etcd lease; a whole number of seconds */
        uint64_t etcd_timeout_ns; /* of one etcd call */
        char *advertise;          /* what the leader key says: default remote.endpoint */
        char *etcd_ca_file, *etcd_cert_file, *etcd_key_file;
        char *etcd_user, *etcd_password_file;
        char *etcd_password; /* read from etcd_password_file by config_load() */
};

struct config {
        char *endpoint;
        bool plain_tcp; /* endpoint may be tcp:// without CURVE: unauthenticated, unencrypted */
        struct config_remote remote;
        char *side_socket;
        uint32_t socket_mode;
        char *socket_group; /* NULL: leave the group as created */
        struct config_access allow;
        struct config_access admin;
        struct config_tenant *tenants; /* none: each user (or remote key) a tenant of its own */
        bool gpu_evidence; /* a GPU of this host registers only with its device node */
        char *driver_root; /* where the driver's files are: "/" (a test's root for simcuda) */
        size_t n_tenants;
        uint64_t dram_budget;
        bool scrub_chunks;      /* chunks a consumer mapped are scrubbed before another gets them */
        bool colocated_lending; /* a producer and a consumer on one GPU may be paired */
        struct config_limits limits;
        uint64_t reclaim_deadline_ns;
        uint64_t reconcile_timeout_ns; /* after a restart: how long holders have to re-register */
        uint64_t
            request_timeout_ns; /* a request waiting for its fds, a side channel without Hello */
        int pairing;            /* enum config_pairing */
        struct config_pair *pairs;
        size_t n_pairs;
        char *plan;            /* aqua-place's pairs file for this server; its pairs join `pairs` */
        char *topology;        /* aqua-profile probe's file: link bandwidths for auto pairing */
        struct topology links; /* loaded from `topology`; empty without it */
        char *journal;
        struct config_domain domain;
        uint64_t journal_compact_bytes; /* rewrite the journal as a snapshot past this size */
        char *metrics;                  /* reserved: address of the metrics endpoint */
        int log_level;                  /* enum log_level */
};

/*
 * Load and validate a config from path (or from data when data is not NULL, path naming it in
 * messages). Returns 0, -EINVAL with *ret_error "file:line:col: key: problem" (or "file: key:
 * problem" for checks that span keys), or another negative errno for an unreadable file.
 */
int config_load(const char *path, const void *data, size_t size, struct config **ret,
                char **ret_error);
struct config *config_free(struct config *c);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct config *, config_free);

/*
 * Whether a peer with these credentials is admitted by a. groups are the peer's supplementary
 * groups (may be NULL). An access list with no users and no groups admits root and the user
 * aquad runs as.
 */
/* The remote client a CURVE public key (32 bytes) authenticates, or NULL. */
const struct config_remote_client *config_remote_find(const struct config *c,
                                                      const uint8_t key[32]);
/*
 * Whether the socket paths aquad binds may be bound: each absent or a socket (an aquad's), its
 * lock absent or holding a pid, none of them the journal. aquad never replaces anything else;
 * -EINVAL with *ret_error naming the path and what it is.
 */
int config_check_paths(const struct config *c, char **ret_error);
/* The same by the key's Z85 text (ZeroMQ's User-Id of a CURVE connection, as aquad's ZAP sets it).
 */
const struct config_remote_client *config_remote_find_text(const struct config *c, const char *z85);
/* Whether rc's gpus or hosts name gpu_uuid or host (NULL: not told). */
bool config_remote_may_register(const struct config_remote_client *rc, const char *gpu_uuid,
                                const char *host);

bool config_access_allows(const struct config_access *a, uid_t uid, gid_t gid, const gid_t *groups,
                          size_t n_groups);
/*
 * The name of the first tenant in the config that names peer (by key, cgroup, user or group),
 * or NULL: the peer is a tenant of its own (its user, or its key).
 */
const char *config_tenant_of(const struct config *c, const struct config_peer *peer);
