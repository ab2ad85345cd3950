/* Fuzz harness for the YAML config loader, with a schema that uses every field type. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"

struct item {
        char *name;
        int64_t count;
};

struct nested {
        uint64_t size;
        uint64_t timeout;
        double ratio;
};

struct fuzz_config {
        char *endpoint;
        bool flag;
        uint32_t mode;
        int kind;
        struct nested nested;
        char **names;
        size_t n_names;
        struct item *items;
        size_t n_items;
        int64_t *numbers;
        size_t n_numbers;
};

static const char *const kind_names[] = {"a", "b", "c", NULL};

static const struct conf_field item_fields[] = {
        CONF_FIELD_STRING(struct item, name, "name", CONF_REQUIRED),
        CONF_FIELD_INT(struct item, count, "count", -5, 5, 0),
        CONF_FIELD_END,
};
static const struct conf_schema item_schema = {"item", item_fields};

static const struct conf_field nested_fields[] = {
        CONF_FIELD_SIZE(struct nested, size, "size", 0, INT64_C(1) << 40, 0),
        CONF_FIELD_DURATION(struct nested, timeout, "timeout", 0, INT64_C(3600000000000), 0),
        CONF_FIELD_DOUBLE(struct nested, ratio, "ratio", -1.0, 1.0, 0),
        CONF_FIELD_END,
};
static const struct conf_schema nested_schema = {"nested", nested_fields};

static const struct conf_field fields[] = {
        CONF_FIELD_STRING(struct fuzz_config, endpoint, "endpoint", 0),
        CONF_FIELD_BOOL(struct fuzz_config, flag, "flag", 0),
        CONF_FIELD_MODE(struct fuzz_config, mode, "mode", 0),
        CONF_FIELD_ENUM(struct fuzz_config, kind, "kind", kind_names, 0),
        CONF_FIELD_STRUCT(struct fuzz_config, nested, "nested", &nested_schema, 0),
        CONF_FIELD_LIST(struct fuzz_config, names, n_names, "names", &conf_elem_string, 64, 0),
        CONF_FIELD_LIST(struct fuzz_config, items, n_items, "items", CONF_ELEM_STRUCT(&item_schema), 64, 0),
        CONF_FIELD_LIST(struct fuzz_config, numbers, n_numbers, "numbers", CONF_ELEM_INT(0, 100), 64, 0),
        CONF_FIELD_END,
};
static const struct conf_schema schema = {"fuzz", fields};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct fuzz_config cfg;
        char *error = NULL;
        int r;

        memset(&cfg, 0, sizeof(cfg));
        r = conf_load_buffer(&schema, "fuzz.yaml", data, size, &cfg, &error);
        /* Every failure must come with a message that names the input. */
        if (r < 0 && r != -ENOMEM && (!error || strncmp(error, "fuzz.yaml", 9) != 0))
                abort();
        free(error);
        conf_free(&schema, &cfg);
        return 0;
}
