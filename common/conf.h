/*
 * Declarative YAML configuration: a program describes its config as a schema of
 * typed fields pointing into its own struct, and conf_load() fills that struct,
 * with errors that name the file, line, column and key path.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum conf_type {
        CONF_STRING,   /* char *, heap-allocated */
        CONF_BOOL,     /* bool: true/false/yes/no/on/off */
        CONF_INT,      /* int64_t, range [min, max] */
        CONF_DOUBLE,   /* double, range [dmin, dmax] */
        CONF_SIZE,     /* uint64_t bytes: "16GiB", "512MB", 4096 */
        CONF_DURATION, /* uint64_t nanoseconds: "500ms", "2s" */
        CONF_MODE,     /* uint32_t file mode, always octal: 0660 */
        CONF_ENUM,     /* int: index into names[] */
        CONF_STRUCT,   /* nested mapping described by schema */
        CONF_LIST,     /* sequence: a heap array of elem, with a size_t count */
        _CONF_TYPE_MAX,
};

enum {
        CONF_REQUIRED = 1 << 0,
        CONF_RANGE = 1 << 1, /* min/max (or dmin/dmax) apply */
};

struct conf_schema;

struct conf_field {
        const char *key;
        enum conf_type type;
        size_t offset;
        unsigned flags;
        int64_t min, max;                /* CONF_INT, CONF_SIZE, CONF_DURATION (as int64) */
        double dmin, dmax;               /* CONF_DOUBLE */
        const char *const *names;        /* CONF_ENUM, NULL-terminated */
        const struct conf_schema *schema; /* CONF_STRUCT */
        const struct conf_field *elem;   /* CONF_LIST: element, with offset 0 */
        size_t elem_size;                /* CONF_LIST */
        size_t count_offset;             /* CONF_LIST: where the size_t count lives */
        size_t max_items;                /* CONF_LIST: 0 means CONF_MAX_ITEMS */
};

struct conf_schema {
        const char *name;
        const struct conf_field *fields; /* terminated by a field with key == NULL */
};

#define CONF_MAX_ITEMS    65536
#define CONF_MAX_FILE     (16u << 20)
#define CONF_MAX_NODES    1000000

/* Field constructors. T is the struct type, m the member. */
#define CONF_F(T, m, k, t, fl) .key = (k), .type = (t), .offset = offsetof(T, m), .flags = (fl)
#define CONF_FIELD_STRING(T, m, k, fl)     {CONF_F(T, m, k, CONF_STRING, fl)}
#define CONF_FIELD_BOOL(T, m, k, fl)       {CONF_F(T, m, k, CONF_BOOL, fl)}
#define CONF_FIELD_MODE(T, m, k, fl)       {CONF_F(T, m, k, CONF_MODE, fl)}
#define CONF_FIELD_INT(T, m, k, lo, hi, fl) \
        {CONF_F(T, m, k, CONF_INT, (fl) | CONF_RANGE), .min = (lo), .max = (hi)}
#define CONF_FIELD_SIZE(T, m, k, lo, hi, fl) \
        {CONF_F(T, m, k, CONF_SIZE, (fl) | CONF_RANGE), .min = (lo), .max = (hi)}
#define CONF_FIELD_DURATION(T, m, k, lo, hi, fl) \
        {CONF_F(T, m, k, CONF_DURATION, (fl) | CONF_RANGE), .min = (lo), .max = (hi)}
#define CONF_FIELD_DOUBLE(T, m, k, lo, hi, fl) \
        {CONF_F(T, m, k, CONF_DOUBLE, (fl) | CONF_RANGE), .dmin = (lo), .dmax = (hi)}
#define CONF_FIELD_ENUM(T, m, k, nm, fl)   {CONF_F(T, m, k, CONF_ENUM, fl), .names = (nm)}
#define CONF_FIELD_STRUCT(T, m, k, sch, fl) {CONF_F(T, m, k, CONF_STRUCT, fl), .schema = (sch)}
/* A list of m (an array pointer) counted by n (a size_t) with element descriptor el. */
#define CONF_FIELD_LIST(T, m, n, k, el, maxn, fl)                                       \
        {CONF_F(T, m, k, CONF_LIST, fl), .elem = (el), .elem_size = sizeof(*((T *)0)->m), \
         .count_offset = offsetof(T, n), .max_items = (maxn)}
#define CONF_FIELD_END {.key = NULL}

/* Element descriptors for CONF_FIELD_LIST. */
extern const struct conf_field conf_elem_string;
#define CONF_ELEM_INT(lo, hi) \
        (&(const struct conf_field){.type = CONF_INT, .flags = CONF_RANGE, .min = (lo), .max = (hi)})
#define CONF_ELEM_STRUCT(sch) (&(const struct conf_field){.type = CONF_STRUCT, .schema = (sch)})

/*
 * Load path into obj (already filled with defaults by the caller; only keys
 * present in the file are written). On failure returns a negative errno
 * (-ENOENT, -EACCES, ... for an unreadable file, -EINVAL for bad content,
 * -E2BIG for a file over CONF_MAX_FILE) and, when ret_error is not NULL, sets
 * *ret_error to a heap message "path:line:column: key.path: problem" for the
 * caller to free. obj may be partly filled on failure; conf_free() it anyway.
 * String and list defaults must be heap-allocated or NULL: a value from the
 * file replaces (and frees) the default.
 */
int conf_load(const struct conf_schema *schema, const char *path, void *obj, char **ret_error);
/* The same on a buffer; name is what messages show in place of the path. */
int conf_load_buffer(const struct conf_schema *schema, const char *name, const void *data,
                     size_t size, void *obj, char **ret_error);
/* Free the strings and lists conf_load() allocated in obj (not obj itself). */
void conf_free(const struct conf_schema *schema, void *obj);
