/* Operators' requests (aquactl): the GPU they name is looked up and checked, then acted on. */
#include <string.h>

#include "broker-private.h"
#include "broker.h"

#define E(name) BROKER_E_##name

int broker_admin_reclaim(struct broker *broker, const char *gpu, uint64_t bytes,
                         struct broker_reclaim *ret, char err[BROKER_ERR_MAX])
{
        struct gpu *g = NULL;
        int r;

        r = broker_lookup_gpu(broker, gpu, "admin-reclaim", &g, err);
        if (r != 0)
                return r;
        if (g->role != GPU_ROLE_PRODUCER)
                return broker_fail(err, E(WRONG_ROLE), "admin-reclaim: %s is not a producer",
                                   g->uuid);
        return broker_reclaim(broker, g, bytes, bytes == 0, true, "aquactl reclaim", ret, err);
}

int broker_admin_drain(struct broker *broker, const char *gpu, struct broker_reclaim *ret,
                       char err[BROKER_ERR_MAX])
{
        struct gpu *g = NULL;
        int r;

        r = broker_lookup_gpu(broker, gpu, "admin-drain", &g, err);
        if (r != 0)
                return r;
        return broker_drain(broker, g, ret, err);
}

int broker_admin_undrain(struct broker *broker, const char *gpu, char err[BROKER_ERR_MAX])
{
        struct gpu *g = NULL;
        int r;

        r = broker_lookup_gpu(broker, gpu, "admin-undrain", &g, err);
        if (r != 0)
                return r;
        return broker_undrain(broker, g, err);
}

int broker_admin_release(struct broker *broker, const char *gpu, bool force,
                         size_t *ret_quarantined, char err[BROKER_ERR_MAX])
{
        struct gpu *g = NULL;
        int r;

        r = broker_lookup_gpu(broker, gpu, "admin-release", &g, err);
        if (r != 0)
                return r;
        return broker_release(broker, g, force, ret_quarantined, err);
}
