/* A producer's load over time, read from a file: (time, load 0..1) steps. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "csv.h"
#include "example-parse.h"
#include "example-util.h"
#include "load.h"
#include "yaml-list.h"

void load_trace_clear(struct load_trace *t)
{
        free(t->p);
        *t = (struct load_trace){};
}

static int push(struct load_trace *t, size_t *allocated, const struct load_point *p)
{
        int r = csv_reserve((void **)&t->p, allocated, t->n, sizeof(*p), 64, LOAD_MAX_POINTS);
        if (r < 0)
                return r;
        t->p[t->n++] = *p;
        return 0;
}

int load_parse_csv(const char *name, const char *data, size_t size, struct load_trace *ret,
                   char **ret_error)
{
        struct csv_lines lines;
        struct load_trace t = {};
        size_t allocated = 0;
        char *field[2];
        int r;

        r = csv_lines_init(&lines, name, data, size, ret_error);
        if (r < 0)
                return r;
        while ((r = csv_lines_fields(&lines, "time_s,load", field, 2, ret_error)) > 0) {
                size_t line_no = lines.line_no;
                const char *ts = field[0], *ls = field[1];
                struct load_point p;
                double secs;
                if (parse_double(ts, &secs) < 0 || !(secs >= 0) || secs > 1e9) {
                        r = csv_fail(ret_error, -EINVAL,
                                     "%s:%zu: time_s: expected seconds >= 0, got \"%s\"", name,
                                     line_no, ts);
                        goto out;
                }
                p.time_ns = (uint64_t)llround(secs * (double)NSEC_PER_SEC);
                if (parse_double(ls, &p.load) < 0 || !(p.load >= 0 && p.load <= 1)) {
                        r = csv_fail(ret_error, -EINVAL,
                                     "%s:%zu: load: expected a number in [0, 1], got \"%s\"", name,
                                     line_no, ls);
                        goto out;
                }
                if (t.n > 0 && p.time_ns < t.p[t.n - 1].time_ns) {
                        r = csv_fail(ret_error, -EINVAL,
                                     "%s:%zu: time_s %s is earlier than the previous point's; "
                                     "times must not decrease",
                                     name, line_no, ts);
                        goto out;
                }
                r = push(&t, &allocated, &p);
                if (r == -E2BIG)
                        r = csv_fail(ret_error, r, "%s:%zu: more than %d points", name, line_no,
                                     LOAD_MAX_POINTS);
                if (r < 0)
                        goto out;
        }
        if (r < 0)
                goto out;
        if (t.n == 0) {
                r = csv_fail(ret_error, -EINVAL, "%s: no load points", name);
                goto out;
        }
        csv_lines_done(&lines);
        *ret = t;
        return 0;
out:
        csv_lines_done(&lines);
        load_trace_clear(&t);
        return r;
}

static const struct yaml_field yaml_point_fields[] = {
    {"time", YAML_DURATION, 0, 1e18},
    {"load", YAML_DOUBLE, 0.0, 1.0},
};

int load_parse_yaml(const char *name, const char *data, size_t size, struct load_trace *ret,
                    char **ret_error)
{
        _cleanup_free_ struct yaml_value *v = NULL;
        struct load_trace t = {};
        size_t allocated = 0, n;
        int r;

        r = yaml_read_list(name, data, size, "load", yaml_point_fields,
                           ARRAY_SIZE(yaml_point_fields), &v, &n, ret_error);
        if (r < 0)
                return r;
        if (n == 0)
                return csv_fail(ret_error, -EINVAL, "%s: load: no load points", name);
        for (size_t i = 0; i < n; i++) {
                struct load_point p = {v[2 * i].u, v[2 * i + 1].d};
                if (t.n > 0 && p.time_ns < t.p[t.n - 1].time_ns) {
                        r = csv_fail(ret_error, -EINVAL,
                                     "%s: load[%zu].time: earlier than the previous point's; "
                                     "times must not decrease",
                                     name, i);
                        break;
                }
                r = push(&t, &allocated, &p);
                if (r < 0)
                        break;
        }
        if (r < 0) {
                load_trace_clear(&t);
                return r;
        }
        *ret = t;
        return 0;
}

int load_trace_load(const char *path, struct load_trace *ret, char **ret_error)
{
        _cleanup_free_ char *buf = NULL;
        size_t size;
        int r;

        r = csv_read_file(path, 64, &buf, &size, ret_error);
        if (r < 0)
                return r;
        if (csv_path_is_yaml(path))
                return load_parse_yaml(path, buf, size, ret, ret_error);
        return load_parse_csv(path, buf, size, ret, ret_error);
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
