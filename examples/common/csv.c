/* What the examples' file readers share: whole-file reads, CSV data lines and error messages. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "csv.h"

int csv_fail(char **ret_error, int r, const char *fmt, ...)
{
        if (ret_error) {
                va_list ap;
                va_start(ap, fmt);
                if (vasprintf(ret_error, fmt, ap) < 0)
                        *ret_error = NULL;
                va_end(ap);
        }
        return r;
}

char *csv_strip(char *s)
{
        while (isspace((unsigned char)*s))
                s++;
        char *e = s + strlen(s);
        while (e > s && isspace((unsigned char)e[-1]))
                *--e = 0;
        return s;
}

int csv_reserve(void **items, size_t *allocated, size_t n, size_t size, size_t initial, size_t max)
{
        if (n >= max)
                return -E2BIG;
        if (n == *allocated) {
                size_t k = MAX(*allocated * 2, initial);
                void *v = reallocarray(*items, k, size);
                if (!v)
                        return -ENOMEM;
                *items = v;
                *allocated = k;
        }
        return 0;
}

int csv_lines_init(struct csv_lines *c, const char *name, const char *data, size_t size,
                   char **ret_error)
{
        /* The input need not be NUL-terminated: copy it before splitting it in place. */
        if (memchr(data, 0, size))
                return csv_fail(ret_error, -EINVAL, "%s: contains a NUL byte", name);
        char *copy = malloc(size + 1);
        if (!copy)
                return -ENOMEM;
        memcpy(copy, data, size);
        copy[size] = 0;
        *c = (struct csv_lines){.name = name, .copy = copy, .next = copy};
        return 0;
}

char *csv_lines_next(struct csv_lines *c)
{
        while (c->next) {
                char *line = c->next, *nl = strchr(line, '\n');
                c->next = nl ? nl + 1 : NULL;
                if (nl)
                        *nl = 0;
                c->line_no++;

                line = csv_strip(line);
                if (!*line || *line == '#')
                        continue;
                if (!c->seen_data && isalpha((unsigned char)*line)) {
                        c->seen_data = true; /* the header */
                        continue;
                }
                c->seen_data = true;
                return line;
        }
        return NULL;
}

static size_t count_fields(const char *line)
{
        size_t n = 1;
        for (const char *c = line; (c = strchr(c, ',')); c++)
                n++;
        return n;
}

int csv_lines_fields(struct csv_lines *c, const char *columns, char **fields, size_t n,
                     char **ret_error)
{
        char *line = csv_lines_next(c);
        if (!line)
                return 0;
        size_t got = count_fields(line);
        if (got != n)
                return csv_fail(ret_error, -EINVAL, "%s:%zu: expected %zu fields (%s), got %zu",
                                c->name, c->line_no, n, columns, got);
        for (size_t i = 0; i < n; i++) {
                char *comma = strchr(line, ',');
                if (comma)
                        *comma = 0;
                fields[i] = csv_strip(line);
                line = comma ? comma + 1 : NULL;
        }
        return 1;
}

void csv_lines_done(struct csv_lines *c)
{
        free(c->copy);
        *c = (struct csv_lines){};
}

int csv_read_file(const char *path, size_t max_mib, char **ret_data, size_t *ret_size,
                  char **ret_error)
{
        _cleanup_close_ int fd = -1;
        _cleanup_free_ char *buf = NULL;
        struct stat st;
        size_t done = 0;

        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &st) < 0)
                return csv_fail(ret_error, -errno, "%s: %s", path, strerror(errno));
        if (!S_ISREG(st.st_mode))
                return csv_fail(ret_error, -EINVAL, "%s: not a regular file", path);
        if ((uint64_t)st.st_size > (uint64_t)max_mib << 20)
                return csv_fail(ret_error, -E2BIG, "%s: larger than %zu MiB", path, max_mib);
        buf = malloc((size_t)st.st_size + 1);
        if (!buf)
                return -ENOMEM;
        while (done < (size_t)st.st_size) {
                ssize_t k = read(fd, buf + done, (size_t)st.st_size - done);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return csv_fail(ret_error, -errno, "%s: %s", path, strerror(errno));
                if (k == 0)
                        break;
                done += (size_t)k;
        }
        *ret_data = TAKE_PTR(buf);
        *ret_size = done;
        return 0;
}

static bool has_suffix(const char *s, const char *suffix)
{
        size_t n = strlen(s), m = strlen(suffix);
        return n >= m && strcmp(s + n - m, suffix) == 0;
}

bool csv_path_is_yaml(const char *path)
{
        return has_suffix(path, ".yaml") || has_suffix(path, ".yml");
}
