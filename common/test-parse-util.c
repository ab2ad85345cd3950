/* Sizes and durations as operators write them. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parse-util.h"
#include "util.h"

/* Every line of tests/sizes.txt (the grammar README.md's "Sizes" describes, which the Python
 * package reads too): "TEXT<tab>BYTES", or EINVAL or ERANGE. The test runs in common/. */
Test(parse_util, parses_every_size_of_the_shared_table)
{
        FILE *f = fopen("../tests/sizes.txt", "re");
        char line[256];
        size_t n = 0;

        cr_assert_not_null(f, "../tests/sizes.txt: %s", strerror(errno));
        while (fgets(line, sizeof(line), f)) {
                char *tab = strchr(line, '\t'), *want;
                uint64_t v = 7;
                int r;

                if (line[0] == '#' || !tab)
                        continue;
                *tab = '\0';
                want = tab + 1;
                want[strcspn(want, "\n")] = '\0';
                r = parse_size(line, &v);
                n++;
                if (strcmp(want, "EINVAL") == 0 || strcmp(want, "ERANGE") == 0) {
                        cr_expect_eq(r, strcmp(want, "EINVAL") == 0 ? -EINVAL : -ERANGE,
                                     "\"%s\": %d, not %s", line, r, want);
                        cr_expect_eq(v, 7, "\"%s\": an output written on failure", line);
                } else {
                        cr_expect_eq(r, 0, "\"%s\": %d, not %s", line, r, want);
                        cr_expect_eq(v, strtoull(want, NULL, 10), "\"%s\": %" PRIu64 ", not %s",
                                     line, v, want);
                }
        }
        fclose(f);
        cr_assert_gt(n, 50, "only %zu cases read", n);
}

Test(parse_util, parses_durations)
{
        uint64_t ns;

        cr_assert_eq(parse_duration("500ms", &ns), 0);
        cr_assert_eq(ns, 500000000ull);
        cr_assert_eq(parse_duration("2", &ns), 0);
        cr_assert_eq(ns, 2000000000ull);
        cr_assert_eq(parse_duration("1.5m", &ns), 0);
        cr_assert_eq(ns, 90000000000ull);
        cr_assert_eq(parse_duration("10 fortnights", &ns), -EINVAL);
}

Test(parse_util, formats_sizes_and_durations_for_people)
{
        char buf[32];

        cr_assert_str_eq(format_size(buf, sizeof(buf), 100), "100 B");
        cr_assert_str_eq(format_size(buf, sizeof(buf), 2u << 20), "2 MiB");
        cr_assert_str_eq(format_size(buf, sizeof(buf), 3ull << 29), "1.50 GiB");
        cr_assert_str_eq(format_duration(buf, sizeof(buf), 1500000), "1.50 ms");
}

Test(parse_util, parses_whole_integers_only)
{
        int64_t v;

        cr_assert_eq(parse_int64("42", 10, &v), 0);
        cr_assert_eq(v, 42);
        cr_assert_eq(parse_int64("42x", 10, &v), -EINVAL);
        cr_assert_eq(parse_int64("0x10", 0, &v), 0);
        cr_assert_eq(v, 16);
}
