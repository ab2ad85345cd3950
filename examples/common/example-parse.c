#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "example-parse.h"

struct unit {
        const char *name;
        double factor;
};

/* A non-negative number and a unit from units[] after it (none: the first unit). */
static int with_unit(const char *s, const struct unit *units, size_t n, uint64_t *ret)
{
        char *end;
        double v;

        while (isspace((unsigned char)*s))
                s++;
        if (!isdigit((unsigned char)*s) && *s != '.')
                return -EINVAL;
        errno = 0;
        v = strtod(s, &end);
        if (errno || end == s || !isfinite(v))
                return -EINVAL;
        while (isspace((unsigned char)*end))
                end++;
        size_t len = strlen(end);
        while (len > 0 && isspace((unsigned char)end[len - 1]))
                len--;
        for (size_t i = 0; i < n; i++)
                if ((len == 0 && i == 0) ||
                    (len == strlen(units[i].name) && strncmp(end, units[i].name, len) == 0)) {
                        v *= units[i].factor;
                        if (v >= 18446744073709551616.0)
                                return -ERANGE;
                        *ret = (uint64_t)llround(v);
                        return 0;
                }
        return -EINVAL;
}

int parse_size(const char *s, uint64_t *ret_bytes)
{
        static const struct unit u[] = {
            {"B", 1},    {"KiB", 0x1p10}, {"MiB", 0x1p20}, {"GiB", 0x1p30}, {"TiB", 0x1p40},
            {"KB", 1e3}, {"MB", 1e6},     {"GB", 1e9},     {"TB", 1e12},
        };
        return with_unit(s, u, sizeof(u) / sizeof(u[0]), ret_bytes);
}

int parse_duration(const char *s, uint64_t *ret_ns)
{
        static const struct unit u[] = {
            {"s", 1e9},  {"ns", 1},     {"us", 1e3},   {"ms", 1e6},
            {"m", 60e9}, {"min", 60e9}, {"h", 3600e9},
        };
        return with_unit(s, u, sizeof(u) / sizeof(u[0]), ret_ns);
}

/* The rest of s after *end is only white space. */
static int whole(const char *s, const char *end)
{
        if (end == s)
                return -EINVAL;
        while (isspace((unsigned char)*end))
                end++;
        return *end ? -EINVAL : 0;
}

int parse_int64(const char *s, int base, int64_t *ret)
{
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, base);
        if (errno)
                return errno == ERANGE ? -ERANGE : -EINVAL;
        if (whole(s, end) < 0 || !*s)
                return -EINVAL;
        *ret = v;
        return 0;
}

int parse_double(const char *s, double *ret)
{
        char *end;
        errno = 0;
        double v = strtod(s, &end);
        if (errno == ERANGE)
                return -ERANGE;
        if (whole(s, end) < 0 || !isfinite(v))
                return -EINVAL;
        *ret = v;
        return 0;
}

char *format_size(char *buf, size_t len, uint64_t bytes)
{
        static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
        double v = (double)bytes;
        size_t i = 0;

        for (; v >= 1024 && i + 1 < sizeof(names) / sizeof(names[0]); i++)
                v /= 1024;
        if (i == 0 || v == floor(v))
                snprintf(buf, len, "%.0f %s", v, names[i]);
        else
                snprintf(buf, len, "%.2f %s", v, names[i]);
        return buf;
}
