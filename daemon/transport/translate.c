/* Roles and outcomes, from the broker core's types to the protocol's and back. */
#include "translate.h"

#include "util.h"

#define E(name) AQUA__ERROR_CODE__ERROR_CODE_##name

int translate_outcome(int r)
{
        static const Aqua__ErrorCode wire[_BROKER_E_MAX] = {
            [BROKER_E_INVALID] = E(INVALID),
            [BROKER_E_UNKNOWN_GPU] = E(UNKNOWN_GPU),
            [BROKER_E_UNKNOWN_LEASE] = E(UNKNOWN_LEASE),
            [BROKER_E_UNKNOWN_CHUNK] = E(UNKNOWN_CHUNK),
            [BROKER_E_LIMIT] = E(LIMIT),
            [BROKER_E_WRONG_ROLE] = E(WRONG_ROLE),
            [BROKER_E_NO_MEMORY] = E(NO_MEMORY),
            [BROKER_E_BARRED] = E(BARRED),
            [BROKER_E_BUSY] = E(BUSY),
            [BROKER_E_DRAINING] = E(DRAINING),
        };

        if (r <= 0)
                return r;
        return r < _BROKER_E_MAX && wire[r] ? (int)wire[r] : (int)E(INTERNAL);
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
