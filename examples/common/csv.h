/*
 * What the examples' file readers share: reading a whole file, walking the data lines of a
 * small CSV (comments, blank lines and a header skipped) and building "name:line: problem"
 * messages.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "example-util.h"

/* Store a heap message in *ret_error (when not NULL) and return r. */
int csv_fail(char **ret_error, int r, const char *fmt, ...) _printf_(3, 4);

/* Trim white space at both ends, in place. */
char *csv_strip(char *s);

/*
 * Grow the array *items (of n used elements of size bytes, *allocated of room) so that one more
 * fits: doubling, starting at initial. Returns -E2BIG when n has reached max, or -ENOMEM.
 */
int csv_reserve(void **items, size_t *allocated, size_t n, size_t size, size_t initial, size_t max);

/*
 * Data lines of a CSV text, one by one: blank lines and lines starting with '#' are skipped,
 * and so is a first line that starts with a letter (a header).
 */
struct csv_lines {
        const char *name; /* for messages */
        char *copy;
        char *next;
        size_t line_no; /* of the line csv_lines_next() returned last */
        bool seen_data;
};

/* Copy data (need not be NUL-terminated); -EINVAL with "name: contains a NUL byte", -ENOMEM. */
int csv_lines_init(struct csv_lines *c, const char *name, const char *data, size_t size,
                   char **ret_error);
/* The next data line, stripped and writable; NULL at the end. */
char *csv_lines_next(struct csv_lines *c);
void csv_lines_done(struct csv_lines *c);

/*
 * The next data line split at its commas into exactly n stripped fields (columns names them in
 * the message). Returns 1, 0 at the end, -EINVAL with "name:line: expected n fields (columns),
 * got m".
 */
int csv_lines_fields(struct csv_lines *c, const char *columns, char **fields, size_t n,
                     char **ret_error);

/*
 * Read the regular file path (at most max_mib MiB) into a heap buffer. Errors: -errno with
 * "path: strerror", -EINVAL "path: not a regular file", -E2BIG "path: larger than N MiB".
 */
int csv_read_file(const char *path, size_t max_mib, char **ret_data, size_t *ret_size,
                  char **ret_error);

/* Whether path names a YAML file (".yaml" or ".yml"). */
bool csv_path_is_yaml(const char *path);
