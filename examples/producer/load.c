/* A producer's load over time, read from a file: (time, load 0..1) steps. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "conf.h"
#include "load.h"
#include "parse-util.h"
#include "time-util.h"
#include "util.h"

void load_trace_clear(struct load_trace *t)
{
        free(t->p);
        *t = (struct load_trace){};
}

static int fail(char **ret_error, int r, const char *fmt, ...) _printf_(3, 4);
static int fail(char **ret_error, int r, const char *fmt, ...)
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

static int push(struct load_trace *t, size_t *allocated, const struct load_point *p)
{
        if (t->n >= LOAD_MAX_POINTS)
                return -E2BIG;
        if (t->n == *allocated) {
                size_t n = MAX(*allocated * 2, (size_t)64);
                struct load_point *v = reallocarray(t->p, n, sizeof(*v));
                if (!v)
                        return -ENOMEM;
                t->p = v;
                *allocated = n;
        }
        t->p[t->n++] = *p;
        return 0;
}

static char *strip(char *s)
{
        while (isspace((unsigned char)*s))
                s++;
        char *e = s + strlen(s);
        while (e > s && isspace((unsigned char)e[-1]))
                *--e = 0;
        return s;
}

int load_parse_csv(const char *name, const char *data, size_t size, struct load_trace *ret,
                   char **ret_error)
{
        _cleanup_free_ char *copy = NULL;
        struct load_trace t = {};
        size_t allocated = 0, line_no = 0;
        bool seen = false;
        int r = 0;

        /* The input need not be NUL-terminated: copy it before splitting it in place. */
        if (memchr(data, 0, size))
                return fail(ret_error, -EINVAL, "%s: contains a NUL byte", name);
        copy = malloc(size + 1);
        if (!copy)
                return -ENOMEM;
        memcpy(copy, data, size);
        copy[size] = 0;

        for (char *next = copy; next;) {
                char *line = next, *nl = strchr(line, '\n');
                next = nl ? nl + 1 : NULL;
                if (nl)
                        *nl = 0;
                line_no++;
                line = strip(line);
                if (!*line || *line == '#')
                        continue;
                if (!seen && isalpha((unsigned char)*line)) {
                        seen = true;
                        continue;
                }
                seen = true;

                char *comma = strchr(line, ',');
                if (!comma || strchr(comma + 1, ',')) {
                        size_t fields = 1;
                        for (const char *c = line; (c = strchr(c, ',')); c++)
                                fields++;
                        r = fail(ret_error, -EINVAL,
                                 "%s:%zu: expected 2 fields (time_s,load), got %zu", name, line_no,
                                 fields);
                        goto out;
                }
                *comma = 0;
                const char *ts = strip(line), *ls = strip(comma + 1);
                struct load_point p;
                double secs;
                if (parse_double(ts, &secs) < 0 || !(secs >= 0) || secs > 1e9) {
                        r = fail(ret_error, -EINVAL,
                                 "%s:%zu: time_s: expected seconds >= 0, got \"%s\"", name, line_no,
                                 ts);
                        goto out;
                }
                p.time_ns = (uint64_t)llround(secs * (double)NSEC_PER_SEC);
                if (parse_double(ls, &p.load) < 0 || !(p.load >= 0 && p.load <= 1)) {
                        r = fail(ret_error, -EINVAL,
                                 "%s:%zu: load: expected a number in [0, 1], got \"%s\"", name,
                                 line_no, ls);
                        goto out;
                }
                if (t.n > 0 && p.time_ns < t.p[t.n - 1].time_ns) {
                        r = fail(ret_error, -EINVAL,
                                 "%s:%zu: time_s %s is earlier than the previous point's; "
                                 "times must not decrease",
                                 name, line_no, ts);
                        goto out;
                }
                r = push(&t, &allocated, &p);
                if (r == -E2BIG)
                        r = fail(ret_error, r, "%s:%zu: more than %d points", name, line_no,
                                 LOAD_MAX_POINTS);
                if (r < 0)
                        goto out;
        }
        if (t.n == 0) {
                r = fail(ret_error, -EINVAL, "%s: no load points", name);
                goto out;
        }
        *ret = t;
        return 0;
out:
        load_trace_clear(&t);
        return r;
}

struct yaml_point {
        uint64_t time;
        double load;
};

struct yaml_load {
        struct yaml_point *points;
        size_t n_points;
};

static const struct conf_field yaml_point_fields[] = {
    CONF_FIELD_DURATION(struct yaml_point, time, "time", 0, INT64_C(1000000000) * 1000000000,
                        CONF_REQUIRED),
    CONF_FIELD_DOUBLE(struct yaml_point, load, "load", 0.0, 1.0, CONF_REQUIRED),
    CONF_FIELD_END,
};
static const struct conf_schema yaml_point_schema = {"point", yaml_point_fields};

static const struct conf_field yaml_load_fields[] = {
    CONF_FIELD_LIST(struct yaml_load, points, n_points, "load",
                    CONF_ELEM_STRUCT(&yaml_point_schema), CONF_MAX_ITEMS, CONF_REQUIRED),
    CONF_FIELD_END,
};
static const struct conf_schema yaml_load_schema = {"load-trace", yaml_load_fields};

int load_parse_yaml(const char *name, const char *data, size_t size, struct load_trace *ret,
                    char **ret_error)
{
        struct yaml_load y = {};
        struct load_trace t = {};
        size_t allocated = 0;
        int r;

        r = conf_load_buffer(&yaml_load_schema, name, data, size, &y, ret_error);
        if (r < 0)
                goto out;
        if (y.n_points == 0) {
                r = fail(ret_error, -EINVAL, "%s: load: no load points", name);
                goto out;
        }
        for (size_t i = 0; i < y.n_points; i++) {
                struct load_point p = {y.points[i].time, y.points[i].load};
                if (t.n > 0 && p.time_ns < t.p[t.n - 1].time_ns) {
                        r = fail(ret_error, -EINVAL,
                                 "%s: load[%zu].time: earlier than the previous point's; "
                                 "times must not decrease",
                                 name, i);
                        goto out;
                }
                r = push(&t, &allocated, &p);
                if (r < 0)
                        goto out;
        }
        *ret = t;
        t = (struct load_trace){};
out:
        load_trace_clear(&t);
        conf_free(&yaml_load_schema, &y);
        return r;
}

static bool has_suffix(const char *s, const char *suffix)
{
        size_t n = strlen(s), m = strlen(suffix);
        return n >= m && strcmp(s + n - m, suffix) == 0;
}

int load_trace_load(const char *path, struct load_trace *ret, char **ret_error)
{
        _cleanup_close_ int fd = -1;
        _cleanup_free_ char *buf = NULL;
        struct stat st;
        size_t done = 0;

        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &st) < 0)
                return fail(ret_error, -errno, "%s: %s", path, strerror(errno));
        if (!S_ISREG(st.st_mode))
                return fail(ret_error, -EINVAL, "%s: not a regular file", path);
        if (st.st_size > 64 << 20)
                return fail(ret_error, -E2BIG, "%s: larger than 64 MiB", path);
        buf = malloc((size_t)st.st_size + 1);
        if (!buf)
                return -ENOMEM;
        while (done < (size_t)st.st_size) {
                ssize_t k = read(fd, buf + done, (size_t)st.st_size - done);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return fail(ret_error, -errno, "%s: %s", path, strerror(errno));
                if (k == 0)
                        break;
                done += (size_t)k;
        }
        if (has_suffix(path, ".yaml") || has_suffix(path, ".yml"))
                return load_parse_yaml(path, buf, done, ret, ret_error);
        return load_parse_csv(path, buf, done, ret, ret_error);
}

double load_at(const struct load_trace *t, uint64_t time_ns)
{
        if (t->n == 0)
                return 0;
        /* Binary search for the last point at or before time_ns. */
        size_t lo = 0, hi = t->n;
        while (hi - lo > 1) {
                size_t mid = lo + (hi - lo) / 2;
                if (t->p[mid].time_ns <= time_ns)
                        lo = mid;
                else
                        hi = mid;
        }
        return t->p[lo].load;
}
