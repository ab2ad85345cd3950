/* Roles and outcomes, from the broker core's types to the protocol's and back. */
#include "translate.h"

#include "util.h"

#define ECODE(name) AQUA__ERROR_CODE__ERROR_CODE_##name

int translate_outcome(int r)
{
        static const Aqua__ErrorCode wire[_BROKER_E_MAX] = {
            [BROKER_E_INVALID] = ECODE(INVALID),
            [BROKER_E_UNKNOWN_GPU] = ECODE(UNKNOWN_GPU),
            [BROKER_E_UNKNOWN_LEASE] = ECODE(UNKNOWN_LEASE),
            [BROKER_E_UNKNOWN_CHUNK] = ECODE(UNKNOWN_CHUNK),
            [BROKER_E_LIMIT] = ECODE(LIMIT),
            [BROKER_E_WRONG_ROLE] = ECODE(WRONG_ROLE),
            [BROKER_E_NO_MEMORY] = ECODE(NO_MEMORY),
            [BROKER_E_BARRED] = ECODE(BARRED),
            [BROKER_E_BUSY] = ECODE(BUSY),
            [BROKER_E_DRAINING] = ECODE(DRAINING),
            [BROKER_E_PERMISSION] = ECODE(PERMISSION),
        };

        if (r <= 0)
                return r;
        return r < _BROKER_E_MAX && wire[r] ? (int)wire[r] : (int)ECODE(INTERNAL);
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

const char *translate_role_name(Aqua__Role r)
{
        switch (r) {
        case AQUA__ROLE__ROLE_PRODUCER:
                return "producer";
        case AQUA__ROLE__ROLE_CONSUMER:
                return "consumer";
        case AQUA__ROLE__ROLE_NEUTRAL:
                return "neutral";
        case AQUA__ROLE__ROLE_ADMIN:
                return "admin";
        default:
                return "unspecified";
        }
}
