/* The id map: insert, find, remove with probe runs intact, growth. */
#include <criterion/criterion.h>
#include <errno.h>

#include "idmap.h"

Test(idmap, finds_what_was_put_and_forgets_what_was_removed)
{
        struct idmap m = {0};
        int a, b;

        cr_assert_eq(idmap_put(&m, 7, &a), 0);
        cr_assert_eq(idmap_put(&m, 9, &b), 0);
        cr_assert_eq(idmap_get(&m, 7), &a);
        cr_assert_eq(idmap_get(&m, 9), &b);
        cr_assert_null(idmap_get(&m, 8));
        cr_assert_eq(idmap_remove(&m, 7), &a);
        cr_assert_null(idmap_get(&m, 7));
        cr_assert_eq(idmap_get(&m, 9), &b);
        cr_assert_eq(m.n, 1);
        idmap_clear(&m);
}

Test(idmap, refuses_the_zero_id)
{
        struct idmap m = {0};
        int a;

        cr_assert_eq(idmap_put(&m, 0, &a), -EINVAL);
        cr_assert_null(idmap_get(&m, 0));
        idmap_clear(&m);
}

Test(idmap, keeps_every_key_through_growth_and_interleaved_removals)
{
        static char v[20000];
        struct idmap m = {0};

        for (uint64_t k = 1; k <= 20000; k++)
                cr_assert_eq(idmap_put(&m, k * 3, &v[k - 1]), 0);
        /* Removing every other key exercises the backward shift inside long probe runs. */
        for (uint64_t k = 1; k <= 20000; k += 2)
                cr_assert_eq(idmap_remove(&m, k * 3), &v[k - 1]);
        for (uint64_t k = 1; k <= 20000; k++)
                cr_assert_eq(idmap_get(&m, k * 3), k % 2 ? NULL : &v[k - 1], "key %lu",
                             (unsigned long)k * 3);
        cr_assert_eq(m.n, 10000);
        idmap_clear(&m);
}
