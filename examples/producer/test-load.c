/* Load traces: parsing, the message for each kind of bad input, and stepping through time. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "load.h"
#include "example-util.h"

static struct load_trace t;

static void fini(void)
{
        load_trace_clear(&t);
}

TestSuite(load, .fini = fini);

static void expect_error(const char *text, const char *message)
{
        _cleanup_free_ char *error = NULL;
        cr_assert_eq(load_parse_csv("l.csv", text, strlen(text), &t, &error), -EINVAL);
        cr_assert_str_eq(error, message);
}

Test(load, reads_points_and_steps_between_them)
{
        const char *text = "time_s,load\n# steady\n0,0.2\n10,0.8\n12.5, 0.3\n";
        _cleanup_free_ char *error = NULL;
        cr_assert_eq(load_parse_csv("l.csv", text, strlen(text), &t, &error), 0, "%s", error);
        cr_assert_eq(t.n, 3);
        cr_assert_float_eq(load_at(&t, 0), 0.2, 1e-12);
        cr_assert_float_eq(load_at(&t, 9999 * NSEC_PER_MSEC), 0.2, 1e-12);
        cr_assert_float_eq(load_at(&t, 10 * NSEC_PER_SEC), 0.8, 1e-12);
        cr_assert_float_eq(load_at(&t, 12500 * NSEC_PER_MSEC), 0.3, 1e-12);
        cr_assert_float_eq(load_at(&t, 1000 * NSEC_PER_SEC), 0.3, 1e-12);
}

Test(load, names_each_kind_of_bad_line)
{
        expect_error("0,0.2,1\n", "l.csv:1: expected 2 fields (time_s,load), got 3");
        expect_error("0\n", "l.csv:1: expected 2 fields (time_s,load), got 1");
        expect_error("0,0.2\n-1,0.5\n", "l.csv:2: time_s: expected seconds >= 0, got \"-1\"");
        expect_error("0,1.5\n", "l.csv:1: load: expected a number in [0, 1], got \"1.5\"");
        expect_error("0,high\n", "l.csv:1: load: expected a number in [0, 1], got \"high\"");
        expect_error(
            "5,0.1\n4,0.1\n",
            "l.csv:2: time_s 4 is earlier than the previous point's; times must not decrease");
        expect_error("time_s,load\n", "l.csv: no load points");
}

Test(load, reads_yaml_and_names_bad_values)
{
        const char *ok = "load:\n  - {time: 0, load: 0.1}\n  - {time: 2s, load: 0.9}\n";
        _cleanup_free_ char *error = NULL;
        cr_assert_eq(load_parse_yaml("l.yaml", ok, strlen(ok), &t, &error), 0, "%s", error);
        cr_assert_eq(t.n, 2);
        cr_assert_eq(t.p[1].time_ns, 2 * NSEC_PER_SEC);
        load_trace_clear(&t);

        const char *bad = "load:\n  - {time: 0, load: 2}\n";
        _cleanup_free_ char *error2 = NULL;
        cr_assert_eq(load_parse_yaml("l.yaml", bad, strlen(bad), &t, &error2), -EINVAL);
        cr_assert_not_null(strstr(error2, "load[0].load"), "%s", error2);
}

Test(load, the_shipped_example_trace_loads)
{
        _cleanup_free_ char *error = NULL;
        cr_assert_eq(load_trace_load("load-burst.csv", &t, &error), 0, "%s", error);
        cr_assert_gt(t.n, 3);
}
