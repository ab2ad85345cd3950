/* The config loader: typed filling, and the exact message for each kind of bad input. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "conf.h"
#include "util.h"

enum mode { MODE_AUTO, MODE_STATIC };
static const char *const mode_names[] = {"auto", "static", NULL};

struct pair {
        char *producer;
        char *consumer;
};

struct limits {
        int64_t clients;
        uint64_t dram;
        uint64_t deadline;
};

struct config {
        char *endpoint;
        bool verbose;
        uint32_t socket_mode;
        double weight;
        int mode;
        struct limits limits;
        char **users;
        size_t n_users;
        struct pair *pairs;
        size_t n_pairs;
        int64_t *ports;
        size_t n_ports;
};

static const struct conf_field pair_fields[] = {
        CONF_FIELD_STRING(struct pair, producer, "producer", CONF_REQUIRED),
        CONF_FIELD_STRING(struct pair, consumer, "consumer", CONF_REQUIRED),
        CONF_FIELD_END,
};
static const struct conf_schema pair_schema = {"pair", pair_fields};

static const struct conf_field limits_fields[] = {
        CONF_FIELD_INT(struct limits, clients, "clients", 1, 4096, 0),
        CONF_FIELD_SIZE(struct limits, dram, "dram", 0, INT64_C(1) << 50, 0),
        CONF_FIELD_DURATION(struct limits, deadline, "deadline", 1000000, INT64_C(60000000000), 0),
        CONF_FIELD_END,
};
static const struct conf_schema limits_schema = {"limits", limits_fields};

static const struct conf_field config_fields[] = {
        CONF_FIELD_STRING(struct config, endpoint, "endpoint", CONF_REQUIRED),
        CONF_FIELD_BOOL(struct config, verbose, "verbose", 0),
        CONF_FIELD_MODE(struct config, socket_mode, "socket-mode", 0),
        CONF_FIELD_DOUBLE(struct config, weight, "weight", 0.0, 1.0, 0),
        CONF_FIELD_ENUM(struct config, mode, "mode", mode_names, 0),
        CONF_FIELD_STRUCT(struct config, limits, "limits", &limits_schema, 0),
        CONF_FIELD_LIST(struct config, users, n_users, "users", &conf_elem_string, 8, 0),
        CONF_FIELD_LIST(struct config, pairs, n_pairs, "pairs", CONF_ELEM_STRUCT(&pair_schema), 0, 0),
        CONF_FIELD_LIST(struct config, ports, n_ports, "ports", CONF_ELEM_INT(1, 65535), 0, 0),
        CONF_FIELD_END,
};
static const struct conf_schema config_schema = {"config", config_fields};

static struct config cfg;

static void reset(void)
{
        memset(&cfg, 0, sizeof(cfg));
        cfg.limits.clients = 64;
}

static void release(void)
{
        conf_free(&config_schema, &cfg);
}

TestSuite(conf, .init = reset, .fini = release);

/* Load text and return the error message (or NULL on success); the message is freed by the caller. */
static char *load(const char *text, int *ret)
{
        char *error = NULL;

        *ret = conf_load_buffer(&config_schema, "t.yaml", text, strlen(text), &cfg, &error);
        return error;
}

static void expect_error(const char *text, const char *message)
{
        _cleanup_free_ char *error = NULL;
        int r;

        error = load(text, &r);
        cr_assert_eq(r, -EINVAL, "r = %d", r);
        cr_assert_not_null(error);
        cr_assert_str_eq(error, message);
}

Test(conf, fills_every_type_from_a_valid_file)
{
        _cleanup_free_ char *error = NULL;
        int r;

        error = load("endpoint: ipc:///run/aqua/aquad.sock\n"
                     "verbose: yes\n"
                     "socket-mode: 0660\n"
                     "weight: 0.25\n"
                     "mode: static\n"
                     "limits:\n"
                     "  clients: 128\n"
                     "  dram: 16GiB\n"
                     "  deadline: 500ms\n"
                     "users: [root, aqua]\n"
                     "pairs:\n"
                     "  - {producer: GPU-1, consumer: GPU-0}\n"
                     "  - producer: GPU-3\n"
                     "    consumer: GPU-2\n"
                     "ports: [80, 443]\n",
                     &r);
        cr_assert_eq(r, 0, "%s", error);
        cr_assert_str_eq(cfg.endpoint, "ipc:///run/aqua/aquad.sock");
        cr_assert(cfg.verbose);
        cr_assert_eq(cfg.socket_mode, 0660);
        cr_assert_float_eq(cfg.weight, 0.25, 1e-12);
        cr_assert_eq(cfg.mode, MODE_STATIC);
        cr_assert_eq(cfg.limits.clients, 128);
        cr_assert_eq(cfg.limits.dram, UINT64_C(16) << 30);
        cr_assert_eq(cfg.limits.deadline, UINT64_C(500000000));
        cr_assert_eq(cfg.n_users, 2);
        cr_assert_str_eq(cfg.users[1], "aqua");
        cr_assert_eq(cfg.n_pairs, 2);
        cr_assert_str_eq(cfg.pairs[1].producer, "GPU-3");
        cr_assert_str_eq(cfg.pairs[1].consumer, "GPU-2");
        cr_assert_eq(cfg.n_ports, 2);
        cr_assert_eq(cfg.ports[1], 443);
}

Test(conf, keeps_defaults_for_absent_keys)
{
        _cleanup_free_ char *error = NULL;
        int r;

        error = load("endpoint: x\n", &r);
        cr_assert_eq(r, 0, "%s", error);
        cr_assert_eq(cfg.limits.clients, 64);
        cr_assert_eq(cfg.n_pairs, 0);
}

Test(conf, names_an_unknown_key_with_its_path)
{
        expect_error("endpoint: x\n"
                     "limits:\n"
                     "  clients: 4\n"
                     "  clinets: 5\n",
                     "t.yaml:4:3: limits.clinets: unknown key");
}

Test(conf, names_a_wrong_type)
{
        expect_error("endpoint: x\n"
                     "limits:\n"
                     "  clients: many\n",
                     "t.yaml:3:12: limits.clients: expected an integer, got \"many\"");
}

Test(conf, names_a_wrong_type_inside_a_list)
{
        expect_error("endpoint: x\n"
                     "pairs:\n"
                     "  - producer: GPU-1\n"
                     "    consumer: [GPU-0]\n",
                     "t.yaml:4:15: pairs[0].consumer: expected a string, got a list");
}

Test(conf, names_a_structure_where_a_value_belongs)
{
        expect_error("endpoint: x\nlimits: 5\n",
                     "t.yaml:2:9: limits: expected a mapping, got \"5\"");
}

Test(conf, names_a_missing_required_key)
{
        expect_error("verbose: true\n", "t.yaml:1:1: missing required key 'endpoint'");
}

Test(conf, names_a_missing_required_key_in_a_list_item)
{
        expect_error("endpoint: x\n"
                     "pairs:\n"
                     "  - producer: GPU-1\n",
                     "t.yaml:3:5: pairs[0]: missing required key 'consumer'");
}

Test(conf, names_an_out_of_range_integer)
{
        expect_error("endpoint: x\nlimits:\n  clients: 0\n",
                     "t.yaml:3:12: limits.clients: 0 is out of range [1, 4096]");
}

Test(conf, names_an_out_of_range_size_in_units)
{
        expect_error("endpoint: x\nlimits:\n  dram: 2PiB\n",
                     "t.yaml:3:9: limits.dram: 2PiB is out of range [0 B, 1 PiB]");
}

Test(conf, names_an_out_of_range_duration_in_units)
{
        expect_error("endpoint: x\nlimits:\n  deadline: 2m\n",
                     "t.yaml:3:13: limits.deadline: 2m is out of range [1.00 ms, 1.0 min]");
}

Test(conf, names_an_integer_too_large_for_64_bits)
{
        expect_error("endpoint: x\nlimits:\n  clients: 99999999999999999999\n",
                     "t.yaml:3:12: limits.clients: 99999999999999999999 is out of range [1, 4096]");
}

Test(conf, names_an_out_of_range_double_and_list_item)
{
        expect_error("endpoint: x\nweight: 1.5\n",
                     "t.yaml:2:9: weight: 1.5 is out of range [0, 1]");
        expect_error("endpoint: x\nports: [80, 70000]\n",
                     "t.yaml:2:13: ports[1]: 70000 is out of range [1, 65535]");
}

Test(conf, names_a_bad_enum_value_and_the_choices)
{
        expect_error("endpoint: x\nmode: dynamic\n",
                     "t.yaml:2:7: mode: expected one of auto, static, got \"dynamic\"");
}

Test(conf, names_a_key_without_a_value)
{
        expect_error("endpoint:\n", "t.yaml:1:10: endpoint: expected a string, got nothing");
}

Test(conf, names_a_duplicate_key)
{
        expect_error("endpoint: x\nendpoint: y\n", "t.yaml:2:1: endpoint: duplicate key");
}

Test(conf, names_too_many_list_items)
{
        expect_error("endpoint: x\nusers: [a, b, c, d, e, f, g, h, i]\n",
                     "t.yaml:2:8: users: too many items (9, at most 8)");
}

Test(conf, names_malformed_yaml_with_position)
{
        expect_error("endpoint: x\nlimits:\n  clients: 4\n bad: [\n",
                     "t.yaml:4:2: malformed YAML: did not find expected key while parsing a block mapping");
}

Test(conf, names_a_document_that_is_not_a_mapping)
{
        expect_error("- a\n- b\n", "t.yaml:1:1: expected a mapping, got a list");
}

Test(conf, names_an_empty_file)
{
        char path[] = "/tmp/aqua-conf-XXXXXX";
        _cleanup_free_ char *error = NULL;
        int fd = mkstemp(path);
        int r;

        cr_assert_geq(fd, 0);
        close(fd);
        r = conf_load(&config_schema, path, &cfg, &error);
        unlink(path);
        cr_assert_eq(r, -EINVAL);
        cr_assert_not_null(error);
        char expected[64];
        snprintf(expected, sizeof(expected), "%s: empty file", path);
        cr_assert_str_eq(error, expected);
}

Test(conf, names_a_file_holding_only_comments_as_empty)
{
        expect_error("# nothing here yet\n", "t.yaml: empty file");
}

Test(conf, names_a_missing_file)
{
        _cleanup_free_ char *error = NULL;
        int r;

        r = conf_load(&config_schema, "/nonexistent/aquad.yaml", &cfg, &error);
        cr_assert_eq(r, -ENOENT);
        cr_assert_str_eq(error, "/nonexistent/aquad.yaml: No such file or directory");
}

Test(conf, loads_a_real_file)
{
        char path[] = "/tmp/aqua-conf-XXXXXX";
        _cleanup_free_ char *error = NULL;
        const char text[] = "endpoint: tcp://127.0.0.1:5555\nlimits: {clients: 7}\n";
        int fd = mkstemp(path);
        int r;

        cr_assert_geq(fd, 0);
        cr_assert_eq(write(fd, text, sizeof(text) - 1), (ssize_t)sizeof(text) - 1);
        close(fd);
        r = conf_load(&config_schema, path, &cfg, &error);
        unlink(path);
        cr_assert_eq(r, 0, "%s", error);
        cr_assert_eq(cfg.limits.clients, 7);
}

Test(conf, replaces_heap_defaults_without_leaking)
{
        _cleanup_free_ char *error = NULL;
        int r;

        cfg.endpoint = strdup("default");
        cfg.users = calloc(1, sizeof(char *));
        cfg.users[0] = strdup("root");
        cfg.n_users = 1;
        error = load("endpoint: other\nusers: [a]\n", &r);
        cr_assert_eq(r, 0, "%s", error);
        cr_assert_str_eq(cfg.endpoint, "other");
        cr_assert_str_eq(cfg.users[0], "a");
}
