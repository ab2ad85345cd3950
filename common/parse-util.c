/* Sizes and durations in the units operators write. */
#include "parse-util.h"

#include <ctype.h>
#include <stdbool.h>
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

/* README.md, "Sizes"; tests/sizes.txt is the grammar as cases. Exact: no floating point. */
int parse_size(const char *s, uint64_t *ret_bytes)
{
        static const struct {
                const char *name;
                uint64_t factor;
        } units[] = {
                {"", 1},
                {"B", 1},
                {"K", UINT64_C(1000)},
                {"KB", UINT64_C(1000)},
                {"M", UINT64_C(1000000)},
                {"MB", UINT64_C(1000000)},
                {"G", UINT64_C(1000000000)},
                {"GB", UINT64_C(1000000000)},
                {"T", UINT64_C(1000000000000)},
                {"TB", UINT64_C(1000000000000)},
                {"P", UINT64_C(1000000000000000)},
                {"PB", UINT64_C(1000000000000000)},
                {"Ki", UINT64_C(1) << 10},
                {"KiB", UINT64_C(1) << 10},
                {"Mi", UINT64_C(1) << 20},
                {"MiB", UINT64_C(1) << 20},
                {"Gi", UINT64_C(1) << 30},
                {"GiB", UINT64_C(1) << 30},
                {"Ti", UINT64_C(1) << 40},
                {"TiB", UINT64_C(1) << 40},
                {"Pi", UINT64_C(1) << 50},
                {"PiB", UINT64_C(1) << 50},
        };
        /* whole < 2^64 and frac < 10^19 < 2^64, times a factor < 2^50: below 2^128. */
        unsigned __int128 whole = 0, frac = 0, denom = 1, bytes;
        uint64_t factor = 0;
        bool huge = false, found = false;
        const char *unit;
        size_t len;

        while (isspace((unsigned char)*s))
                s++;
        if (!isdigit((unsigned char)*s))
                return -EINVAL;
        for (; isdigit((unsigned char)*s); s++) {
                whole = whole * 10 + (unsigned)(*s - '0');
                if (whole > UINT64_MAX) {
                        huge = true;
                        whole = UINT64_MAX;
                }
        }
        if (*s == '.') {
                s++;
                if (!isdigit((unsigned char)*s))
                        return -EINVAL;
                /* Digits past the 19th fractional place are below a byte of any unit. */
                for (int places = 0; isdigit((unsigned char)*s); s++, places++)
                        if (places < 19) {
                                frac = frac * 10 + (unsigned)(*s - '0');
                                denom *= 10;
                        }
        }
        while (isspace((unsigned char)*s))
                s++;
        unit = s;
        while (isalpha((unsigned char)*s))
                s++;
        len = (size_t)(s - unit);
        while (isspace((unsigned char)*s))
                s++;
        if (*s)
                return -EINVAL;
        for (size_t i = 0; i < sizeof(units) / sizeof(units[0]) && !found; i++)
                if (strlen(units[i].name) == len && strncasecmp(unit, units[i].name, len) == 0) {
                        factor = units[i].factor;
                        found = true;
                }
        if (!found)
                return -EINVAL;
        if (huge)
                return -ERANGE;
        /* A fraction of a byte is rounded to the nearest, half up. */
        bytes = whole * factor + (frac * factor + denom / 2) / denom;
        if (bytes > UINT64_MAX)
                return -ERANGE;
        *ret_bytes = (uint64_t)bytes;
        return 0;
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
