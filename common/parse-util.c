/* Sizes and durations in the units operators write. */
#include "parse-util.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct unit {
        const char *name;
        double factor;
};

/* Split "1.5 GiB" into a finite, non-negative number and the unit text after it. */
static int split_number(const char *s, double *ret_value, const char **ret_unit)
{
        char *end;
        double v;

        while (isspace((unsigned char)*s))
                s++;
        if (!isdigit((unsigned char)*s) && *s != '.')
                return -EINVAL;
        errno = 0;
        v = strtod(s, &end);
        if (end == s || errno || !isfinite(v) || v < 0)
                return -EINVAL;
        while (isspace((unsigned char)*end))
                end++;
        *ret_value = v;
        *ret_unit = end;
        return 0;
}

static int scale(const char *s, const struct unit *units, size_t n_units, const char *bare,
                 uint64_t *ret)
{
        const char *unit;
        double v, factor = -1;
        size_t len;
        int r;

        r = split_number(s, &v, &unit);
        if (r < 0)
                return r;
        len = strlen(unit);
        while (len > 0 && isspace((unsigned char)unit[len - 1]))
                len--;
        if (len == 0)
                unit = bare;
        for (size_t i = 0; i < n_units; i++)
                if ((len == 0 && strcmp(unit, units[i].name) == 0) ||
                    (len > 0 && strlen(units[i].name) == len && strncmp(unit, units[i].name, len) == 0))
                        factor = units[i].factor;
        if (factor < 0)
                return -EINVAL;
        v *= factor;
        if (v >= 18446744073709551616.0)
                return -ERANGE;
        *ret = (uint64_t)llround(v);
        return 0;
}

int parse_size(const char *s, uint64_t *ret_bytes)
{
        static const struct unit units[] = {
                {"B", 1},
                {"KiB", 1024.0},
                {"MiB", 1024.0 * 1024},
                {"GiB", 1024.0 * 1024 * 1024},
                {"TiB", 1024.0 * 1024 * 1024 * 1024},
                {"PiB", 1024.0 * 1024 * 1024 * 1024 * 1024},
                {"KB", 1e3},
                {"MB", 1e6},
                {"GB", 1e9},
                {"TB", 1e12},
                {"PB", 1e15},
        };
        return scale(s, units, sizeof(units) / sizeof(units[0]), "B", ret_bytes);
}

int parse_duration(const char *s, uint64_t *ret_ns)
{
        static const struct unit units[] = {
                {"ns", 1},     {"us", 1e3},   {"ms", 1e6},    {"s", 1e9},
                {"m", 60e9},   {"min", 60e9}, {"h", 3600e9},
        };
        return scale(s, units, sizeof(units) / sizeof(units[0]), "s", ret_ns);
}

int parse_int64(const char *s, int base, int64_t *ret)
{
        char *end;
        long long v;

        while (isspace((unsigned char)*s))
                s++;
        if (*s == '\0')
                return -EINVAL;
        errno = 0;
        v = strtoll(s, &end, base);
        if (errno == ERANGE)
                return -ERANGE;
        if (errno || end == s)
                return -EINVAL;
        while (isspace((unsigned char)*end))
                end++;
        if (*end)
                return -EINVAL;
        *ret = v;
        return 0;
}

int parse_double(const char *s, double *ret)
{
        char *end;
        double v;

        while (isspace((unsigned char)*s))
                s++;
        if (*s == '\0')
                return -EINVAL;
        errno = 0;
        v = strtod(s, &end);
        if (errno == ERANGE)
                return -ERANGE;
        if (end == s || !isfinite(v))
                return -EINVAL;
        while (isspace((unsigned char)*end))
                end++;
        if (*end)
                return -EINVAL;
        *ret = v;
        return 0;
}

char *format_size(char *buf, size_t len, uint64_t bytes)
{
        static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
        double v = (double)bytes;
        size_t i = 0;

        while (v >= 1024.0 && i + 1 < sizeof(names) / sizeof(names[0])) {
                v /= 1024.0;
                i++;
        }
        if (i == 0 || v == floor(v))
                snprintf(buf, len, "%.0f %s", v, names[i]);
        else
                snprintf(buf, len, "%.2f %s", v, names[i]);
        return buf;
}

char *format_duration(char *buf, size_t len, uint64_t ns)
{
        if (ns >= 60000000000ULL)
                snprintf(buf, len, "%.1f min", (double)ns / 60e9);
        else if (ns >= 1000000000ULL)
                snprintf(buf, len, "%.2f s", (double)ns / 1e9);
        else if (ns >= 1000000ULL)
                snprintf(buf, len, "%.2f ms", (double)ns / 1e6);
        else if (ns >= 1000ULL)
                snprintf(buf, len, "%.2f us", (double)ns / 1e3);
        else
                snprintf(buf, len, "%llu ns", (unsigned long long)ns);
        return buf;
}
