/* Operators' requests (aquactl): the GPU they name is looked up and checked, then acted on. */
#include <string.h>

#include "pool.h"

#define E(name) POOL_E_##name

static int need_gpu(struct pool *p, const char *key, const char *what, struct gpu **ret, char *err)
{
        struct gpu *g = p->n_gpus ? pool_find_gpu(p, key) : NULL;

        if (!g)
                return pool_fail(err, E(UNKNOWN_GPU), "%s: no GPU \"%s\"", what, key ? key : "");
        *ret = g;
        return 0;
}

int pool_admin_reclaim(struct pool *p, const char *gpu, uint64_t bytes, struct pool_reclaim *ret,
                       char *err)
{
        struct gpu *g = NULL;
        int r;

        r = need_gpu(p, gpu, "admin-reclaim", &g, err);
        if (r != 0)
                return r;
        if (g->role != GPU_ROLE_PRODUCER)
                return pool_fail(err, E(WRONG_ROLE), "admin-reclaim: %s is not a producer",
                                 g->uuid);
        return pool_reclaim(p, g, bytes, bytes == 0, true, "aquactl reclaim", ret, err);
}

int pool_admin_drain(struct pool *p, const char *gpu, struct pool_reclaim *ret, char *err)
{
        struct gpu *g = NULL;
        int r;

        r = need_gpu(p, gpu, "admin-drain", &g, err);
        if (r != 0)
                return r;
        return pool_drain(p, g, ret, err);
}

int pool_admin_release(struct pool *p, const char *gpu, char *err)
{
        struct gpu *g = NULL;
        int r;

        r = need_gpu(p, gpu, "admin-release", &g, err);
        if (r != 0)
                return r;
        return pool_release(p, g, err);
}
