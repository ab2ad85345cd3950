/*
 * The one YAML shape the examples read: a top-level key naming a list of flat mappings, e.g.
 * "requests: [{arrival: 10ms, prompt: 128, output: 64}]", on libyaml directly.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

enum yaml_kind {
        YAML_DURATION, /* "250ms", "1.5" (seconds): u in ns */
        YAML_UINT,     /* an integer in [min, max]: u */
        YAML_DOUBLE,   /* a number in [min, max]: d */
};

/* One key of each item; every key is required. */
struct yaml_field {
        const char *key;
        enum yaml_kind kind;
        double min, max;
};

struct yaml_value {
        uint64_t u;
        double d;
};

/*
 * Read the list under key `list` of the top-level mapping: *ret_values gets n_fields values per
 * item in fields' order (free() it), *ret_n the items. Returns 0 or -EINVAL (with a heap message
 * "name:line:col: list[i].key: problem" in *ret_error when it is not NULL), -ENOMEM.
 */
int yaml_read_list(const char *name, const char *data, size_t size, const char *list,
                   const struct yaml_field *fields, size_t n_fields, struct yaml_value **ret_values,
                   size_t *ret_n, char **ret_error);
