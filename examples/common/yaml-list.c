/* A list of flat mappings under one top-level key, read with libyaml's event parser. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "csv.h"
#include "example-parse.h"
#include "yaml-list.h"

struct reader {
        const char *name, *list;
        const struct yaml_field *fields;
        size_t n_fields;
        yaml_parser_t p;
        yaml_event_t ev;
        char **ret_error;
};

static int next(struct reader *r)
{
        yaml_event_delete(&r->ev);
        if (!yaml_parser_parse(&r->p, &r->ev))
                return csv_fail(r->ret_error, -EINVAL, "%s:%zu:%zu: %s", r->name,
                                r->p.problem_mark.line + 1, r->p.problem_mark.column + 1,
                                r->p.problem ?: "not YAML");
        return 0;
}

static const char *scalar(const struct reader *r)
{
        return (const char *)r->ev.data.scalar.value;
}

static int fail_at(struct reader *r, const char *what, const char *problem)
{
        return csv_fail(r->ret_error, -EINVAL, "%s:%zu:%zu: %s: %s", r->name,
                        r->ev.start_mark.line + 1, r->ev.start_mark.column + 1, what, problem);
}

static int value(struct reader *r, size_t item, const struct yaml_field *f, struct yaml_value *v)
{
        char what[128], problem[256];
        const char *s = scalar(r);
        int64_t i;

        snprintf(what, sizeof(what), "%s[%zu].%s", r->list, item, f->key);
        if (r->ev.type != YAML_SCALAR_EVENT)
                return fail_at(r, what, "expected a value");
        switch (f->kind) {
        case YAML_DURATION:
                if (parse_duration(s, &v->u) == 0 && v->u >= f->min && v->u <= f->max)
                        return 0;
                snprintf(problem, sizeof(problem), "expected a duration, got \"%s\"", s);
                break;
        case YAML_UINT:
                if (parse_int64(s, 10, &i) < 0)
                        snprintf(problem, sizeof(problem), "expected an integer, got \"%s\"", s);
                else if (i < f->min || i > f->max)
                        snprintf(problem, sizeof(problem), "%lld is out of range [%.0f, %.0f]",
                                 (long long)i, f->min, f->max);
                else {
                        v->u = (uint64_t)i;
                        return 0;
                }
                break;
        case YAML_DOUBLE:
                if (parse_double(s, &v->d) < 0)
                        snprintf(problem, sizeof(problem), "expected a number, got \"%s\"", s);
                else if (v->d < f->min || v->d > f->max)
                        snprintf(problem, sizeof(problem), "%g is out of range [%g, %g]", v->d,
                                 f->min, f->max);
                else
                        return 0;
                break;
        }
        return fail_at(r, what, problem);
}

/* One mapping of the list, its start event current. */
static int item(struct reader *r, size_t index, struct yaml_value *v)
{
        yaml_mark_t start = r->ev.start_mark;
        bool seen[16] = {};
        char what[64];
        int k;

        snprintf(what, sizeof(what), "%s[%zu]", r->list, index);
        if (r->ev.type != YAML_MAPPING_START_EVENT)
                return fail_at(r, what, "expected a mapping");
        while ((k = next(r)) == 0 && r->ev.type == YAML_SCALAR_EVENT) {
                size_t f = 0;
                while (f < r->n_fields && strcmp(r->fields[f].key, scalar(r)) != 0)
                        f++;
                if (f == r->n_fields)
                        return fail_at(r, what, "unknown key");
                seen[f] = true;
                if ((k = next(r)) < 0 || (k = value(r, index, &r->fields[f], &v[f])) < 0)
                        return k;
        }
        if (k < 0)
                return k;
        for (size_t f = 0; f < r->n_fields; f++)
                if (!seen[f])
                        return csv_fail(r->ret_error, -EINVAL,
                                        "%s:%zu:%zu: %s: missing required key '%s'", r->name,
                                        start.line + 1, start.column + 1, what, r->fields[f].key);
        return 0;
}

int yaml_read_list(const char *name, const char *data, size_t size, const char *list,
                   const struct yaml_field *fields, size_t n_fields, struct yaml_value **ret_values,
                   size_t *ret_n, char **ret_error)
{
        struct reader r = {name, list, fields, n_fields, .ret_error = ret_error};
        struct yaml_value *v = NULL;
        size_t n = 0, allocated = 0;
        bool found = false;
        int k = 0;

        if (n_fields > 16 || !yaml_parser_initialize(&r.p))
                return -EINVAL;
        yaml_parser_set_input_string(&r.p, (const unsigned char *)data, size);
        /* Stream, document, then the top-level mapping. */
        for (int i = 0; i < 3 && k == 0; i++)
                k = next(&r);
        if (k == 0 && r.ev.type != YAML_MAPPING_START_EVENT)
                k = csv_fail(ret_error, -EINVAL, "%s: expected a mapping with '%s'", name, list);
        while (k == 0 && (k = next(&r)) == 0 && r.ev.type == YAML_SCALAR_EVENT) {
                if (strcmp(scalar(&r), list) != 0) {
                        k = fail_at(&r, scalar(&r), "unknown key");
                        break;
                }
                found = true;
                if ((k = next(&r)) < 0)
                        break;
                if (r.ev.type != YAML_SEQUENCE_START_EVENT) {
                        k = fail_at(&r, list, "expected a list");
                        break;
                }
                while ((k = next(&r)) == 0 && r.ev.type != YAML_SEQUENCE_END_EVENT) {
                        if ((n + 1) * n_fields > allocated) {
                                size_t want = (n + 1) * n_fields * 2;
                                struct yaml_value *g = reallocarray(v, want, sizeof(*v));
                                if (!g) {
                                        k = -ENOMEM;
                                        break;
                                }
                                v = g;
                                allocated = want;
                        }
                        memset(v + n * n_fields, 0, n_fields * sizeof(*v));
                        if ((k = item(&r, n, v + n * n_fields)) < 0)
                                break;
                        n++;
                }
        }
        if (k == 0 && !found)
                k = csv_fail(ret_error, -EINVAL, "%s: missing required key '%s'", name, list);
        yaml_event_delete(&r.ev);
        yaml_parser_delete(&r.p);
        if (k < 0) {
                free(v);
                return k;
        }
        *ret_values = v;
        *ret_n = n;
        return 0;
}
