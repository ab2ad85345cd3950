/* Roles and outcomes, from the broker core's types to the protocol's and back. */
#include "translate.h"

#include "util.h"

#define E(name) AQUA__ERROR_CODE__ERROR_CODE_##name

int translate_outcome(int r)
{
        static const Aqua__ErrorCode wire[_POOL_E_MAX] = {
            [POOL_E_INVALID] = E(INVALID),
            [POOL_E_UNKNOWN_GPU] = E(UNKNOWN_GPU),
            [POOL_E_UNKNOWN_LEASE] = E(UNKNOWN_LEASE),
            [POOL_E_UNKNOWN_CHUNK] = E(UNKNOWN_CHUNK),
            [POOL_E_LIMIT] = E(LIMIT),
            [POOL_E_WRONG_ROLE] = E(WRONG_ROLE),
            [POOL_E_NO_MEMORY] = E(NO_MEMORY),
            [POOL_E_BARRED] = E(BARRED),
            [POOL_E_BUSY] = E(BUSY),
        };

        if (r <= 0)
                return r;
        return r < _POOL_E_MAX && wire[r] ? (int)wire[r] : (int)E(INTERNAL);
}

Aqua__Role translate_role_to_wire(enum gpu_role r)
{
        switch (r) {
        case GPU_ROLE_PRODUCER:
                return AQUA__ROLE__ROLE_PRODUCER;
        case GPU_ROLE_CONSUMER:
                return AQUA__ROLE__ROLE_CONSUMER;
        case GPU_ROLE_NEUTRAL:
                return AQUA__ROLE__ROLE_NEUTRAL;
        default:
                return AQUA__ROLE__ROLE_UNSPECIFIED;
        }
}

enum gpu_role translate_role_from_wire(Aqua__Role r)
{
        switch (r) {
        case AQUA__ROLE__ROLE_PRODUCER:
                return GPU_ROLE_PRODUCER;
        case AQUA__ROLE__ROLE_CONSUMER:
                return GPU_ROLE_CONSUMER;
        case AQUA__ROLE__ROLE_NEUTRAL:
                return GPU_ROLE_NEUTRAL;
        default:
                return _GPU_ROLE_MAX;
        }
}
