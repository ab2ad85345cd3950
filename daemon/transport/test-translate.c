/* Between the core's types and the protocol's: every outcome has its own wire code, roles go
 * both ways, and what the core has no name for stays out of it. */
#include <criterion/criterion.h>
#include <errno.h>

#include "translate.h"

#define ECODE(name) AQUA__ERROR_CODE__ERROR_CODE_##name

Test(translate, every_core_outcome_has_its_own_wire_code)
{
        bool seen[64] = {false};

        for (int r = 1; r < _BROKER_E_MAX; r++) {
                int code = translate_outcome(r);

                cr_assert(code > 0 && code < 64, "outcome %d", r);
                cr_assert_neq(code, ECODE(INTERNAL), "outcome %d", r);
                cr_assert_not(seen[code], "outcome %d shares wire code %d", r, code);
                seen[code] = true;
        }
        cr_assert_eq(translate_outcome(BROKER_E_NO_MEMORY), ECODE(NO_MEMORY));
        cr_assert_eq(translate_outcome(BROKER_E_BUSY), ECODE(BUSY));
}

Test(translate, success_and_errnos_pass_through_and_unknown_outcomes_are_internal)
{
        cr_assert_eq(translate_outcome(0), 0);
        cr_assert_eq(translate_outcome(-ENOMEM), -ENOMEM);
        cr_assert_eq(translate_outcome(_BROKER_E_MAX), ECODE(INTERNAL));
}

Test(translate, gpu_roles_go_both_ways_and_admins_are_no_gpu_role)
{
        for (int r = GPU_ROLE_PRODUCER; r <= GPU_ROLE_NEUTRAL; r++)
                cr_assert_eq(translate_role_from_wire(translate_role_to_wire(r)), r);
        cr_assert_eq(translate_role_to_wire(GPU_ROLE_UNSPECIFIED), AQUA__ROLE__ROLE_UNSPECIFIED);
        cr_assert_eq(translate_role_from_wire(AQUA__ROLE__ROLE_ADMIN), _GPU_ROLE_MAX);
        cr_assert_eq(translate_role_from_wire(AQUA__ROLE__ROLE_UNSPECIFIED), _GPU_ROLE_MAX);
        cr_assert_eq(translate_role_from_wire((Aqua__Role)42), _GPU_ROLE_MAX);
}
