/* Whom a loaded config lets in, and as what: access lists, tenants, remote clients' keys. */
#include "config.h"

#include <fnmatch.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "curve.h"

const struct config_remote_client *config_remote_find(const struct config *c, const uint8_t key[32])
{
        char z85[CURVE_KEY_TEXT + 1];

        if (!zmq_z85_encode(z85, key, 32))
                return NULL;
        return config_remote_find_text(c, z85);
}

bool config_remote_may_register(const struct config_remote_client *rc, const char *gpu_uuid,
                                const char *host)
{
        for (size_t i = 0; gpu_uuid && i < rc->n_gpus; i++)
                if (fnmatch(rc->gpus[i], gpu_uuid, FNM_CASEFOLD) == 0)
                        return true;
        for (size_t i = 0; host && *host && i < rc->n_hosts; i++)
                if (fnmatch(rc->hosts[i], host, 0) == 0)
                        return true;
        return false;
}

const struct config_remote_client *config_remote_find_text(const struct config *c, const char *z85)
{
        if (!z85)
                return NULL;
        for (size_t i = 0; i < c->remote.n_clients; i++)
                for (size_t k = 0; k < c->remote.clients[i].n_keys; k++)
                        if (strcmp(c->remote.clients[i].keys[k], z85) == 0)
                                return &c->remote.clients[i];
        return NULL;
}

bool config_access_allows(const struct config_access *a, uid_t uid, gid_t gid, const gid_t *groups,
                          size_t n_groups)
{
        if (a->n_users == 0 && a->n_groups == 0)
                return uid == 0 || uid == geteuid();
        for (size_t i = 0; i < a->n_users; i++)
                if (a->uids[i] == uid)
                        return true;
        for (size_t i = 0; i < a->n_groups; i++) {
                if (a->gids[i] == gid)
                        return true;
                for (size_t k = 0; k < n_groups; k++)
                        if (a->gids[i] == groups[k])
                                return true;
        }
        return false;
}

/*
 * Whether pattern matches the cgroup path or one of its ancestors (a pod's, a slice's). '*'
 * matches across '/': "*pod<uid>*" finds a pod wherever the cgroup driver put it, and also in
 * a path read from inside another cgroup namespace ("/../../kubepods-...").
 */
static bool cgroup_matches(const char *pattern, const char *path)
{
        char buf[4096];
        size_t n;

        if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
                return false;
        for (n = strlen(buf); n > 0; n--) {
                if (n < strlen(path) && buf[n] != '/')
                        continue;
                buf[n] = '\0';
                if (fnmatch(pattern, buf, 0) == 0)
                        return true;
        }
        return false;
}

const char *config_tenant_of(const struct config *c, const struct config_peer *peer)
{
        for (size_t i = 0; i < c->n_tenants; i++) {
                const struct config_tenant *t = &c->tenants[i];

                for (size_t k = 0; peer->remote && peer->key && k < t->n_keys; k++)
                        if (strcmp(t->keys[k], peer->key) == 0)
                                return t->name;
                for (size_t k = 0; !peer->remote && peer->cgroup && k < t->n_cgroups; k++)
                        if (cgroup_matches(t->cgroups[k], peer->cgroup))
                                return t->name;
                for (size_t k = 0; k < t->members.n_users; k++)
                        if (t->members.uids[k] == peer->uid)
                                return t->name;
                if (!peer->remote && t->members.n_groups &&
                    config_access_allows(&(struct config_access){.groups = t->members.groups,
                                                                 .n_groups = t->members.n_groups,
                                                                 .gids = t->members.gids},
                                         peer->uid, peer->gid, peer->groups, peer->n_groups))
                        return t->name;
        }
        return NULL;
}
