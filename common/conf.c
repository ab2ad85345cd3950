/* Schema-driven YAML config loading on libyaml's document API. */
#include "conf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "parse-util.h"
#include "util.h"

const struct conf_field conf_elem_string = {.type = CONF_STRING};

struct loader {
        const char *name;
        yaml_document_t doc;
        size_t visited;
        char *error;
        char path[512]; /* key path of the node being filled, e.g. "pairs[2].producer" */
};

_printf_(3, 4) static int fail(struct loader *l, const yaml_node_t *node, const char *fmt, ...)
{
        char msg[512];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        free(l->error);
        if (asprintf(&l->error, "%s:%zu:%zu: %s%s%s", l->name, node->start_mark.line + 1,
                     node->start_mark.column + 1, l->path, l->path[0] ? ": " : "", msg) < 0)
                l->error = NULL;
        return -EINVAL;
}

static const char *scalar(const yaml_node_t *node)
{
        return (const char *)node->data.scalar.value;
}

/* A plain empty scalar, "~" or "null" is YAML's null: a key given without a value. */
static bool is_null(const yaml_node_t *node)
{
        const char *s;

        if (node->type != YAML_SCALAR_NODE || node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
                return false;
        s = scalar(node);
        return s[0] == '\0' || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 ||
               strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0;
}

static const char *describe(const yaml_node_t *node, char *buf, size_t len)
{
        switch (node->type) {
        case YAML_MAPPING_NODE:
                return "a mapping";
        case YAML_SEQUENCE_NODE:
                return "a list";
        case YAML_SCALAR_NODE:
                if (is_null(node))
                        return "nothing";
                snprintf(buf, len, "\"%.*s\"", 64, scalar(node));
                return buf;
        default:
                return "nothing";
        }
}

static int expect(struct loader *l, const yaml_node_t *node, const char *what)
{
        char buf[80];

        return fail(l, node, "expected %s, got %s", what, describe(node, buf, sizeof(buf)));
}

static int fill(struct loader *l, const struct conf_field *f, const yaml_node_t *node, void *dst);

static void path_push_key(struct loader *l, size_t *saved, const char *key)
{
        size_t n = strlen(l->path);

        *saved = n;
        snprintf(l->path + n, sizeof(l->path) - n, "%s%s", n ? "." : "", key);
}

static void path_push_index(struct loader *l, size_t *saved, size_t i)
{
        size_t n = strlen(l->path);

        *saved = n;
        snprintf(l->path + n, sizeof(l->path) - n, "[%zu]", i);
}

static int fill_struct(struct loader *l, const struct conf_schema *schema,
                       const yaml_node_t *node, void *obj)
{
        const struct conf_field *f;
        size_t n_fields = 0;

        if (node->type != YAML_MAPPING_NODE)
                return expect(l, node, "a mapping");

        for (f = schema->fields; f->key; f++)
                n_fields++;
        bool seen[n_fields ? n_fields : 1];
        memset(seen, 0, sizeof(seen));

        for (yaml_node_pair_t *p = node->data.mapping.pairs.start;
             p < node->data.mapping.pairs.top; p++) {
                yaml_node_t *k = yaml_document_get_node(&l->doc, p->key);
                yaml_node_t *v = yaml_document_get_node(&l->doc, p->value);
                size_t saved, i;
                int r;

                if (!k || !v)
                        return fail(l, node, "malformed YAML: dangling node");
                if (k->type != YAML_SCALAR_NODE)
                        return fail(l, k, "keys must be plain names");
                for (i = 0, f = schema->fields; f->key; f++, i++)
                        if (strcmp(f->key, scalar(k)) == 0)
                                break;
                path_push_key(l, &saved, scalar(k));
                if (!f->key)
                        return fail(l, k, "unknown key");
                if (seen[i])
                        return fail(l, k, "duplicate key");
                seen[i] = true;
                r = fill(l, f, v, (char *)obj + f->offset);
                if (r < 0)
                        return r;
                l->path[saved] = '\0';
        }

        size_t i = 0;
        for (f = schema->fields; f->key; f++, i++)
                if ((f->flags & CONF_REQUIRED) && !seen[i])
                        return fail(l, node, "missing required key '%s'", f->key);
        return 0;
}

static int check_range(struct loader *l, const struct conf_field *f, const yaml_node_t *node,
                       int64_t v)
{
        char lo[32], hi[32];

        if (!(f->flags & CONF_RANGE) || (v >= f->min && v <= f->max))
                return 0;
        if (f->type == CONF_SIZE) {
                format_size(lo, sizeof(lo), (uint64_t)f->min);
                format_size(hi, sizeof(hi), (uint64_t)f->max);
        } else if (f->type == CONF_DURATION) {
                format_duration(lo, sizeof(lo), (uint64_t)f->min);
                format_duration(hi, sizeof(hi), (uint64_t)f->max);
        } else {
                snprintf(lo, sizeof(lo), "%lld", (long long)f->min);
                snprintf(hi, sizeof(hi), "%lld", (long long)f->max);
        }
        return fail(l, node, "%s is out of range [%s, %s]", scalar(node), lo, hi);
}

/* A number too large for 64 bits: out of any declared range, and unusable without one. */
static int overflow(struct loader *l, const struct conf_field *f, const yaml_node_t *node,
                    int64_t clamped)
{
        int r = check_range(l, f, node, clamped);

        return r < 0 ? r : fail(l, node, "%s does not fit in 64 bits", scalar(node));
}

static int fill_scalar(struct loader *l, const struct conf_field *f, const yaml_node_t *node,
                       void *dst)
{
        const char *s;
        int64_t iv;
        uint64_t uv = 0;
        double dv;
        int r;

        if (node->type != YAML_SCALAR_NODE || is_null(node)) {
                static const char *const what[_CONF_TYPE_MAX] = {
                        [CONF_STRING] = "a string",
                        [CONF_BOOL] = "true or false",
                        [CONF_INT] = "an integer",
                        [CONF_DOUBLE] = "a number",
                        [CONF_SIZE] = "a size such as 512MiB",
                        [CONF_DURATION] = "a duration such as 500ms",
                        [CONF_MODE] = "an octal file mode such as 0660",
                        [CONF_ENUM] = "a name",
                };
                return expect(l, node, what[f->type]);
        }
        s = scalar(node);

        switch (f->type) {
        case CONF_STRING: {
                char *copy = strdup(s);
                if (!copy)
                        return -ENOMEM;
                free(*(char **)dst);
                *(char **)dst = copy;
                return 0;
        }
        case CONF_BOOL:
                if (!strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on"))
                        *(bool *)dst = true;
                else if (!strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off"))
                        *(bool *)dst = false;
                else
                        return expect(l, node, "true or false");
                return 0;
        case CONF_INT:
                r = parse_int64(s, 10, &iv);
                if (r == -ERANGE)
                        return overflow(l, f, node, s[0] == '-' ? INT64_MIN : INT64_MAX);
                if (r < 0)
                        return expect(l, node, "an integer");
                if (check_range(l, f, node, iv) < 0)
                        return -EINVAL;
                *(int64_t *)dst = iv;
                return 0;
        case CONF_DOUBLE:
                if (parse_double(s, &dv) < 0)
                        return expect(l, node, "a number");
                if ((f->flags & CONF_RANGE) && (dv < f->dmin || dv > f->dmax))
                        return fail(l, node, "%s is out of range [%g, %g]", s, f->dmin, f->dmax);
                *(double *)dst = dv;
                return 0;
        case CONF_SIZE:
        case CONF_DURATION:
                r = f->type == CONF_SIZE ? parse_size(s, &uv) : parse_duration(s, &uv);
                if (r == -ERANGE || (r == 0 && uv > INT64_MAX))
                        return overflow(l, f, node, INT64_MAX);
                if (r < 0)
                        return expect(l, node, f->type == CONF_SIZE ? "a size such as 512MiB"
                                                                    : "a duration such as 500ms");
                if (check_range(l, f, node, (int64_t)uv) < 0)
                        return -EINVAL;
                *(uint64_t *)dst = uv;
                return 0;
        case CONF_MODE:
                if (parse_int64(s, 8, &iv) < 0 || iv < 0 || iv > 07777)
                        return expect(l, node, "an octal file mode such as 0660");
                *(uint32_t *)dst = (uint32_t)iv;
                return 0;
        case CONF_ENUM: {
                char list[256] = "";
                for (int i = 0; f->names[i]; i++) {
                        if (strcmp(s, f->names[i]) == 0) {
                                *(int *)dst = i;
                                return 0;
                        }
                        snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s",
                                 i ? ", " : "", f->names[i]);
                }
                return fail(l, node, "expected one of %s, got \"%.64s\"", list, s);
        }
        default:
                return fail(l, node, "internal error: bad schema type %d", f->type);
        }
}

static void free_value(const struct conf_field *f, void *dst);

static int fill_list(struct loader *l, const struct conf_field *f, const yaml_node_t *node,
                     void *dst, void *obj_base)
{
        size_t *count = (size_t *)((char *)obj_base + f->count_offset);
        size_t max = f->max_items ? f->max_items : CONF_MAX_ITEMS;
        size_t n, bytes;
        char *items;

        if (node->type != YAML_SEQUENCE_NODE)
                return expect(l, node, "a list");
        n = (size_t)(node->data.sequence.items.top - node->data.sequence.items.start);
        if (n > max)
                return fail(l, node, "too many items (%zu, at most %zu)", n, max);

        /* Replace the default list. */
        for (size_t i = 0; i < *count; i++)
                free_value(f->elem, *(char **)dst + i * f->elem_size);
        free(*(void **)dst);
        *(void **)dst = NULL;
        *count = 0;

        if (n == 0)
                return 0;
        if (size_mul_overflows(n, f->elem_size, &bytes))
                return -ENOMEM;
        items = calloc(1, bytes);
        if (!items)
                return -ENOMEM;
        *(void **)dst = items;

        for (size_t i = 0; i < n; i++) {
                yaml_node_t *item = yaml_document_get_node(&l->doc, node->data.sequence.items.start[i]);
                size_t saved;
                int r;

                if (!item)
                        return fail(l, node, "malformed YAML: dangling node");
                path_push_index(l, &saved, i);
                *count = i + 1; /* so conf_free() sees what was filled so far */
                r = fill(l, f->elem, item, items + i * f->elem_size);
                if (r < 0)
                        return r;
                l->path[saved] = '\0';
        }
        return 0;
}

/* dst points at the member; for lists the count sits relative to the containing object. */
static int fill(struct loader *l, const struct conf_field *f, const yaml_node_t *node, void *dst)
{
        if (++l->visited > CONF_MAX_NODES)
                return fail(l, node, "document too large (more than %d values)", CONF_MAX_NODES);

        switch (f->type) {
        case CONF_STRUCT:
                return fill_struct(l, f->schema, node, dst);
        case CONF_LIST:
                return fill_list(l, f, node, dst, (char *)dst - f->offset);
        default:
                return fill_scalar(l, f, node, dst);
        }
}

static int load_document(struct loader *l, const struct conf_schema *schema, const void *data,
                         size_t size, void *obj)
{
        yaml_parser_t parser;
        yaml_node_t *root;
        int r;

        if (size == 0)
                goto empty;
        if (!yaml_parser_initialize(&parser))
                return -ENOMEM;
        yaml_parser_set_input_string(&parser, data, size);
        if (!yaml_parser_load(&parser, &l->doc)) {
                if (parser.error == YAML_MEMORY_ERROR) {
                        yaml_parser_delete(&parser);
                        return -ENOMEM;
                }
                free(l->error);
                if (asprintf(&l->error, "%s:%zu:%zu: malformed YAML: %s%s%s", l->name,
                             parser.problem_mark.line + 1, parser.problem_mark.column + 1,
                             parser.problem ? parser.problem : "parse error",
                             parser.context ? " " : "", parser.context ? parser.context : "") < 0)
                        l->error = NULL;
                yaml_parser_delete(&parser);
                return -EINVAL;
        }
        yaml_parser_delete(&parser);

        root = yaml_document_get_root_node(&l->doc);
        if (!root) {
                yaml_document_delete(&l->doc);
                goto empty;
        }
        if (root->type == YAML_SCALAR_NODE && is_null(root))
                r = fail(l, root, "empty document: expected a mapping of settings");
        else
                r = fill_struct(l, schema, root, obj);
        yaml_document_delete(&l->doc);
        return r;

empty:
        free(l->error);
        if (asprintf(&l->error, "%s: empty file", l->name) < 0)
                l->error = NULL;
        return -EINVAL;
}

int conf_load_buffer(const struct conf_schema *schema, const char *name, const void *data,
                     size_t size, void *obj, char **ret_error)
{
        struct loader l = {.name = name};
        int r;

        r = load_document(&l, schema, data, size, obj);
        if (r < 0 && ret_error) {
                if (!l.error && r == -ENOMEM)
                        l.error = strdup("out of memory");
                *ret_error = TAKE_PTR(l.error);
        }
        free(l.error);
        return r;
}

static int read_file(const char *path, char **ret_data, size_t *ret_size)
{
        _cleanup_close_ int fd = -1;
        _cleanup_free_ char *data = NULL;
        struct stat st;
        size_t have = 0, cap;

        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return -errno;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (S_ISDIR(st.st_mode))
                return -EISDIR;
        if (st.st_size > CONF_MAX_FILE)
                return -E2BIG;
        /* st_size is only a hint: pipes say 0 and files can grow while we read. */
        cap = (size_t)st.st_size + 1;
        for (;;) {
                ssize_t n;

                if (have == cap || !data) {
                        char *bigger;

                        if (have == cap)
                                cap *= 2;
                        if (cap > CONF_MAX_FILE + 1)
                                cap = CONF_MAX_FILE + 1;
                        bigger = realloc(data, cap < 4096 ? 4096 : cap);
                        if (!bigger)
                                return -ENOMEM;
                        data = bigger;
                        cap = cap < 4096 ? 4096 : cap;
                }
                n = read(fd, data + have, cap - have);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        break;
                have += (size_t)n;
                if (have > CONF_MAX_FILE)
                        return -E2BIG;
        }
        *ret_size = have;
        *ret_data = TAKE_PTR(data);
        return 0;
}

int conf_load(const struct conf_schema *schema, const char *path, void *obj, char **ret_error)
{
        _cleanup_free_ char *data = NULL;
        size_t size = 0;
        int r;

        r = read_file(path, &data, &size);
        if (r < 0) {
                if (ret_error && asprintf(ret_error, "%s: %s", path,
                                          r == -E2BIG ? "file too large (over 16 MiB)"
                                                      : strerror(-r)) < 0)
                        *ret_error = NULL;
                return r;
        }
        return conf_load_buffer(schema, path, data, size, obj, ret_error);
}

static void free_struct(const struct conf_schema *schema, void *obj);

static void free_value(const struct conf_field *f, void *dst)
{
        switch (f->type) {
        case CONF_STRING:
                free(*(char **)dst);
                *(char **)dst = NULL;
                break;
        case CONF_STRUCT:
                free_struct(f->schema, dst);
                break;
        case CONF_LIST: {
                size_t *count = (size_t *)((char *)dst - f->offset + f->count_offset);
                for (size_t i = 0; i < *count; i++)
                        free_value(f->elem, *(char **)dst + i * f->elem_size);
                free(*(void **)dst);
                *(void **)dst = NULL;
                *count = 0;
                break;
        }
        default:
                break;
        }
}

static void free_struct(const struct conf_schema *schema, void *obj)
{
        for (const struct conf_field *f = schema->fields; f->key; f++)
                free_value(f, (char *)obj + f->offset);
}

void conf_free(const struct conf_schema *schema, void *obj)
{
        if (obj)
                free_struct(schema, obj);
}
