/* Text tables: widths from the widest cell, alignment, placeholders, no trailing blanks. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "table.h"

/* Print t into a heap string for comparison. */
static char *render(const struct table *t)
{
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);

        cr_assert_not_null(f);
        cr_assert_eq(table_print(t, f), 0);
        fclose(f);
        return buf;
}

Test(table, aligns_columns_to_the_widest_cell)
{
        static const char *const headers[] = {"NAME", "SIZE", "STATE"};
        _cleanup_(table_freep) struct table *t = table_new(headers, 3);
        _cleanup_free_ char *out = NULL;

        cr_assert_not_null(t);
        table_align_right(t, 1);
        cr_assert_eq(table_add_row(t, (const char *const[]){"whisper", "4 GiB", "ok"}), 0);
        cr_assert_eq(table_add_row(t, (const char *const[]){"x", "512 MiB", "draining"}), 0);
        out = render(t);
        cr_assert_str_eq(out, "NAME        SIZE  STATE\n"
                              "whisper    4 GiB  ok\n"
                              "x        512 MiB  draining\n");
        cr_assert_eq(table_rows(t), 2);
}

Test(table, prints_a_dash_for_a_missing_cell)
{
        static const char *const headers[] = {"A", "B"};
        _cleanup_(table_freep) struct table *t = table_new(headers, 2);
        _cleanup_free_ char *out = NULL;

        cr_assert_eq(table_add_row(t, (const char *const[]){NULL, "b"}), 0);
        out = render(t);
        cr_assert_str_eq(out, "A  B\n-  b\n");
}

Test(table, leaves_no_trailing_blanks_on_a_short_last_cell)
{
        static const char *const headers[] = {"A", "LONG HEADER"};
        _cleanup_(table_freep) struct table *t = table_new(headers, 2);
        _cleanup_free_ char *out = NULL;

        cr_assert_eq(table_add_row(t, (const char *const[]){"a", "b"}), 0);
        out = render(t);
        cr_assert_str_eq(out, "A  LONG HEADER\na  b\n");
}

Test(table, grows_past_its_first_allocation)
{
        static const char *const headers[] = {"N"};
        _cleanup_(table_freep) struct table *t = table_new(headers, 1);
        char cell[16];

        for (int i = 0; i < 1000; i++) {
                snprintf(cell, sizeof(cell), "%d", i);
                cr_assert_eq(table_add_row(t, (const char *const[]){cell}), 0);
        }
        cr_assert_eq(table_rows(t), 1000);
}

Test(table, refuses_zero_or_too_many_columns)
{
        static const char *const headers[TABLE_MAX_COLUMNS + 1] = {0};

        cr_assert_null(table_new(headers, 0));
        cr_assert_null(table_new(headers, TABLE_MAX_COLUMNS + 1));
}
