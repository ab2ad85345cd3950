/* Column-aligned text tables: rows of copied strings, printed with computed widths. */
#include "table.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "text.h"

struct table {
        size_t n_columns;
        bool right[TABLE_MAX_COLUMNS];
        char **cells; /* n_lines * n_columns; line 0 is the header */
        size_t n_lines;
        size_t allocated_lines;
};

static int table_append(struct table *t, const char *const *cells)
{
        if (t->n_lines == t->allocated_lines) {
                size_t n = t->allocated_lines ? t->allocated_lines * 2 : 16;
                size_t bytes;
                char **c;

                if (size_mul_overflows(n, t->n_columns * sizeof(char *), &bytes))
                        return -ENOMEM;
                c = realloc(t->cells, bytes);
                if (!c)
                        return -ENOMEM;
                t->cells = c;
                t->allocated_lines = n;
        }
        char **row = t->cells + t->n_lines * t->n_columns;
        for (size_t i = 0; i < t->n_columns; i++) {
                /* Cells quote what clients chose (names, event texts): never a terminal's
                 * control sequence. */
                row[i] = text_printable(cells[i] ? cells[i] : "-");
                if (!row[i]) {
                        for (size_t j = 0; j < i; j++)
                                free(row[j]);
                        return -ENOMEM;
                }
        }
        t->n_lines++;
        return 0;
}

struct table *table_new(const char *const *headers, size_t n_columns)
{
        struct table *t;

        if (n_columns == 0 || n_columns > TABLE_MAX_COLUMNS)
                return NULL;
        t = calloc(1, sizeof(*t));
        if (!t)
                return NULL;
        t->n_columns = n_columns;
        if (table_append(t, headers) < 0)
                return table_free(t);
        return t;
}

struct table *table_free(struct table *t)
{
        if (!t)
                return NULL;
        if (t->cells)
                for (size_t i = 0; i < t->n_lines * t->n_columns; i++)
                        free(t->cells[i]);
        free(t->cells);
        free(t);
        return NULL;
}

void table_align_right(struct table *t, size_t column)
{
        if (column < t->n_columns)
                t->right[column] = true;
}

int table_add_row(struct table *t, const char *const *cells)
{
        return table_append(t, cells);
}

size_t table_rows(const struct table *t)
{
        return t->n_lines - 1;
}

int table_print(const struct table *t, FILE *out)
{
        size_t width[TABLE_MAX_COLUMNS] = {0};

        for (size_t r = 0; r < t->n_lines; r++)
                for (size_t c = 0; c < t->n_columns; c++)
                        width[c] = MAX(width[c], strlen(t->cells[r * t->n_columns + c]));

        for (size_t r = 0; r < t->n_lines; r++) {
                for (size_t c = 0; c < t->n_columns; c++) {
                        const char *cell = t->cells[r * t->n_columns + c];
                        bool last = c + 1 == t->n_columns;
                        int w = (int)width[c];

                        if (c > 0)
                                fputs("  ", out);
                        if (t->right[c])
                                fprintf(out, "%*s", w, cell);
                        else if (last)
                                fputs(cell, out);
                        else
                                fprintf(out, "%-*s", w, cell);
                }
                fputc('\n', out);
        }
        return ferror(out) ? -EIO : 0;
}
