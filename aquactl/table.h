/* Column-aligned text tables for aquactl's human output: cells are copied, widths computed at
 * print. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "util.h"

#define TABLE_MAX_COLUMNS 16

struct table;

/* A table with n_columns headers (copied). Returns NULL when out of memory. */
struct table *table_new(const char *const *headers, size_t n_columns);
struct table *table_free(struct table *t);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct table *, table_free);

/* Numbers read best right-aligned; text stays left-aligned (the default). */
void table_align_right(struct table *t, size_t column);

/*
 * Append one row of exactly n_columns cells (copied; NULL prints as "-"; control characters and
 * bytes that are not UTF-8 as "\xNN"). 0 or -ENOMEM.
 */
int table_add_row(struct table *t, const char *const *cells);

size_t table_rows(const struct table *t);

/*
 * Print headers and rows, columns two spaces apart, no trailing blanks. Cells are never
 * truncated: a long name widens its column rather than hiding what the operator needs to see.
 */
int table_print(const struct table *t, FILE *out);
