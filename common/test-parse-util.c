/* Sizes and durations as operators write them. */
#include <criterion/criterion.h>

#include "parse-util.h"
#include "util.h"

Test(parse_util, parses_sizes_in_binary_and_decimal_units)
{
        uint64_t v;

        cr_assert_eq(parse_size("4096", &v), 0);
        cr_assert_eq(v, 4096);
        cr_assert_eq(parse_size("2MiB", &v), 0);
        cr_assert_eq(v, 2u << 20);
        cr_assert_eq(parse_size("1.5 GiB", &v), 0);
        cr_assert_eq(v, 3ull << 29);
        cr_assert_eq(parse_size("3GB", &v), 0);
        cr_assert_eq(v, 3000000000ull);
}

Test(parse_util, rejects_malformed_and_huge_sizes)
{
        uint64_t v = 7;

        cr_assert_eq(parse_size("", &v), -EINVAL);
        cr_assert_eq(parse_size("-1GiB", &v), -EINVAL);
        cr_assert_eq(parse_size("12 parsecs", &v), -EINVAL);
        cr_assert_eq(parse_size("GiB", &v), -EINVAL);
        cr_assert_eq(parse_size("99999999EiB", &v), -EINVAL);
        cr_assert_eq(parse_size("999999999PiB", &v), -ERANGE);
        cr_assert_eq(v, 7, "outputs are written only on success");
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
