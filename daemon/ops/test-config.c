/* aquad's config: defaults, every key, and the errors an operator sees. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "config.h"
#include "curve.h"
#include "log.h"

static int load(const char *text, struct config **ret, char **ret_error)
{
        return config_load("aquad.yaml", text, strlen(text), ret, ret_error);
}

static void expect_error(const char *text, const char *message)
{
        _cleanup_(config_freep) struct config *c = NULL;
        _cleanup_free_ char *error = NULL;

        cr_assert_eq(load(text, &c, &error), -EINVAL);
        cr_assert_null(c);
        cr_assert_not_null(error);
        cr_assert_str_eq(error, message);
}

Test(config, has_defaults_for_an_empty_file)
{
        _cleanup_(config_freep) struct config *c = NULL;
        _cleanup_free_ char *error = NULL;

        cr_assert_eq(load("{}\n", &c, &error), 0, "%s", error);
        cr_assert_str_eq(c->endpoint, CONFIG_DEFAULT_ENDPOINT);
        cr_assert_str_eq(c->side_socket, CONFIG_DEFAULT_SIDE);
        cr_assert_str_eq(c->journal, CONFIG_DEFAULT_JOURNAL);
        cr_assert_eq(c->socket_mode, 0660);
        cr_assert_eq(c->pairing, CONFIG_PAIRING_AUTO);
        cr_assert_eq(c->limits.message_size, 1u << 20);
        cr_assert_eq(c->limits.request_rate, 2000);
        cr_assert_eq(c->limits.request_burst, 1000);
        cr_assert(c->scrub_chunks);
        cr_assert_eq(c->log_level, LOG_LEVEL_INFO);
        cr_assert_null(c->metrics);
}

Test(config, reads_every_key)
{
        _cleanup_(config_freep) struct config *c = NULL;
        _cleanup_free_ char *error = NULL;

        cr_assert_eq(load("endpoint: ipc:///tmp/x/aquad.sock\n"
                          "side-socket: /tmp/x/aquad.side\n"
                          "socket-mode: 0600\n"
                          "socket-group: root\n"
                          "allow: {users: [root, 1234], groups: [0]}\n"
                          "admin: {users: [root]}\n"
                          "dram-budget: 64GiB\n"
                          "scrub-chunks: false\n"
                          "limits:\n"
                          "  clients: 8\n"
                          "  chunks: 100\n"
                          "  leases: 10\n"
                          "  pending-requests: 2\n"
                          "  message-size: 64KiB\n"
                          "  repeated-items: 300\n"
                          "  request-rate: 0\n"
                          "  request-burst: 5\n"
                          "reclaim-deadline: 250ms\n"
                          "reconcile-timeout: 3s\n"
                          "request-timeout: 2s\n"
                          "pairing: static\n"
                          "pairs:\n"
                          "  - {producer: GPU-1, consumer: GPU-0}\n"
                          "journal: /tmp/x/journal\n"
                          "journal-compact-size: 1MiB\n"
                          "metrics: 127.0.0.1:9400\n"
                          "log-level: debug\n",
                          &c, &error),
                     0, "%s", error);
        cr_assert_str_eq(c->side_socket, "/tmp/x/aquad.side");
        cr_assert_eq(c->socket_mode, 0600);
        cr_assert_eq(c->allow.n_users, 2);
        cr_assert_eq(c->allow.uids[0], 0);
        cr_assert_eq(c->allow.uids[1], 1234);
        cr_assert_eq(c->allow.gids[0], 0);
        cr_assert_eq(c->admin.n_users, 1);
        cr_assert_eq(c->dram_budget, UINT64_C(64) << 30);
        cr_assert_not(c->scrub_chunks);
        cr_assert_eq(c->limits.clients, 8);
        cr_assert_eq(c->limits.pending_requests, 2);
        cr_assert_eq(c->limits.message_size, 64 << 10);
        cr_assert_eq(c->limits.request_rate, 0);
        cr_assert_eq(c->limits.request_burst, 5);
        cr_assert_eq(c->reclaim_deadline_ns, UINT64_C(250000000));
        cr_assert_eq(c->pairing, CONFIG_PAIRING_STATIC);
        cr_assert_eq(c->n_pairs, 1);
        cr_assert_str_eq(c->pairs[0].producer, "GPU-1");
        cr_assert_eq(c->journal_compact_bytes, 1u << 20);
        cr_assert_str_eq(c->metrics, "127.0.0.1:9400");
        cr_assert_eq(c->log_level, LOG_LEVEL_DEBUG);
}

Test(config, names_file_line_and_key_of_a_bad_value)
{
        expect_error("limits:\n  clients: 0\n",
                     "aquad.yaml:2:12: limits.clients: 0 is out of range [1, 65536]");
}

Test(config, rejects_unknown_keys)
{
        expect_error("endpiont: ipc:///x\n", "aquad.yaml:1:1: endpiont: unknown key");
}

Test(config, rejects_a_gpu_in_two_pairs)
{
        expect_error("pairs:\n  - {producer: A, consumer: B}\n  - {producer: C, consumer: A}\n",
                     "aquad.yaml: pairs[1]: A is already in pairs[0]; pairs are one-to-one");
}

Test(config, rejects_an_unknown_user)
{
        expect_error("allow: {users: [no-such-user-aqua]}\n",
                     "aquad.yaml: allow.users[0]: no user \"no-such-user-aqua\"");
}

Test(config, rejects_an_endpoint_of_another_transport)
{
        expect_error("endpoint: udp://x\n",
                     "aquad.yaml: endpoint: \"udp://x\" is neither ipc:// nor tcp://");
}

Test(config, rejects_a_relative_side_socket)
{
        expect_error("side-socket: run/aquad.side\n",
                     "aquad.yaml: side-socket: \"run/aquad.side\" must be an absolute path of at "
                     "most 107 bytes");
}

Test(config, admits_root_and_self_when_no_list_is_given)
{
        struct config_access a = {0};

        cr_assert(config_access_allows(&a, 0, 0, NULL, 0));
        cr_assert(config_access_allows(&a, geteuid(), 12345, NULL, 0));
}

Test(config, admits_by_user_primary_group_or_supplementary_group)
{
        uid_t uids[] = {1000};
        gid_t gids[] = {2000};
        gid_t extra[] = {5, 2000};
        struct config_access a = {.n_users = 1, .n_groups = 1, .uids = uids, .gids = gids};

        cr_assert(config_access_allows(&a, 1000, 1, NULL, 0));
        cr_assert(config_access_allows(&a, 1001, 2000, NULL, 0));
        cr_assert(config_access_allows(&a, 1001, 1, extra, 2));
        cr_assert_not(config_access_allows(&a, 1001, 1, extra, 1));
        cr_assert_not(config_access_allows(&a, 0, 0, NULL, 0));
}

/* Write text to dir/name; returns the path for the caller to free. */
static char *write_file(const char *dir, const char *name, const char *text)
{
        char *path = NULL;
        FILE *f;

        cr_assert_geq(asprintf(&path, "%s/%s", dir, name), 0);
        f = fopen(path, "we");
        cr_assert_not_null(f);
        fputs(text, f);
        fclose(f);
        return path;
}

Test(config, takes_pairs_from_a_placer_plan_beside_it)
{
        char dir[] = "/tmp/aquad-plan-XXXXXX";
        _cleanup_(config_freep) struct config *c = NULL;
        _cleanup_free_ char *error = NULL, *conf = NULL, *plan = NULL;

        cr_assert_not_null(mkdtemp(dir));
        plan = write_file(
            dir, "server-3.yaml",
            "pairs:\n  - producer: 2\n    consumer: 0\n  - {producer: 3, consumer: 1}\n");
        conf = write_file(dir, "aquad.yaml", "pairing: static\nplan: server-3.yaml\n");
        cr_assert_eq(config_load(conf, NULL, 0, &c, &error), 0, "%s", error);
        cr_assert_eq(c->n_pairs, 2);
        cr_assert_str_eq(c->pairs[0].producer, "2");
        cr_assert_str_eq(c->pairs[0].consumer, "0");
        cr_assert_str_eq(c->pairs[1].producer, "3");
        cr_assert_str_eq(c->pairs[1].consumer, "1");
        unlink(plan);
        unlink(conf);
        rmdir(dir);
}

Test(config, names_the_plan_and_its_problem)
{
        char dir[] = "/tmp/aquad-plan-XXXXXX";
        _cleanup_(config_freep) struct config *c = NULL;
        _cleanup_free_ char *error = NULL, *conf = NULL, *plan = NULL, *expected = NULL;

        cr_assert_not_null(mkdtemp(dir));
        plan = write_file(dir, "p.yaml", "pairs:\n  - producer: GPU-1\n    consumer: 0\n");
        conf = write_file(dir, "aquad.yaml", "plan: p.yaml\n");
        cr_assert_eq(config_load(conf, NULL, 0, &c, &error), -EINVAL);
        cr_assert_geq(asprintf(&expected,
                               "%s: plan: %s:2:15: pairs[0].producer: expected an integer, got "
                               "\"GPU-1\"",
                               conf, plan),
                      0);
        cr_assert_str_eq(error, expected);
        unlink(plan);
        unlink(conf);
        rmdir(dir);
}

Test(config, names_a_missing_plan_file)
{
        expect_error("pairs: [{producer: \"2\", consumer: \"5\"}]\nplan: /nonexistent/p.yaml\n",
                     "aquad.yaml: plan: /nonexistent/p.yaml: No such file or directory");
}

Test(config, reads_link_bandwidths_from_a_probe_topology)
{
        char dir[] = "/tmp/aquad-topo-XXXXXX";
        _cleanup_(config_freep) struct config *c = NULL;
        _cleanup_free_ char *error = NULL, *conf = NULL, *topo = NULL;

        cr_assert_not_null(mkdtemp(dir));
        topo = write_file(
            dir, "topology.yaml",
            "devices:\n  - {memory: 80GiB, uuid: GPU-a}\n  - {memory: 80GiB, uuid: GPU-b}\n"
            "links: [{a: 0, b: 1, bandwidth: 450GB}]\n");
        conf = write_file(dir, "aquad.yaml", "topology: topology.yaml\n");
        cr_assert_eq(config_load(conf, NULL, 0, &c, &error), 0, "%s", error);
        cr_assert_eq(topology_link_by_uuid(&c->links, "GPU-a", "GPU-b"), 450000000000ull);
        unlink(topo);
        unlink(conf);
        rmdir(dir);
}

Test(config, names_the_topology_and_its_problem)
{
        expect_error("topology: /nonexistent/topology.yaml\n",
                     "aquad.yaml: topology: /nonexistent/topology.yaml: No such file or directory");
}

Test(config, refuses_plain_tcp_unless_asked_for)
{
        _cleanup_(config_freep) struct config *c = NULL;
        _cleanup_free_ char *error = NULL;

        expect_error("endpoint: tcp://127.0.0.1:7000\n",
                     "aquad.yaml: endpoint: \"tcp://127.0.0.1:7000\" is plain tcp, with no "
                     "encryption and no authentication; serve other hosts on remote.endpoint "
                     "with CURVE keys, or set plain-tcp: true to accept it");
        cr_assert_eq(load("endpoint: tcp://127.0.0.1:7000\nplain-tcp: true\n", &c, &error), 0, "%s",
                     error);
        cr_assert(c->plain_tcp);
}

/* A config beside a server key pair and a client's, in a folder of its own. */
struct remote_fixture {
        char dir[32];
        char *server, *server_pub, *client, *client_pub, *conf;
        char server_key[CURVE_KEY_TEXT + 1], client_key[CURVE_KEY_TEXT + 1];
};

static void remote_setup(struct remote_fixture *f)
{
        char err[256];

        snprintf(f->dir, sizeof(f->dir), "/tmp/aquad-curve-XXXXXX");
        cr_assert_not_null(mkdtemp(f->dir));
        cr_assert_geq(asprintf(&f->server, "%s/server.key", f->dir), 0);
        cr_assert_geq(asprintf(&f->server_pub, "%s/server.key.pub", f->dir), 0);
        cr_assert_geq(asprintf(&f->client, "%s/client.key", f->dir), 0);
        cr_assert_geq(asprintf(&f->client_pub, "%s/client.key.pub", f->dir), 0);
        cr_assert_eq(curve_keyfile_write(f->server, f->server_key, err, sizeof(err)), 0, "%s", err);
        cr_assert_eq(curve_keyfile_write(f->client, f->client_key, err, sizeof(err)), 0, "%s", err);
}

static int remote_load(struct remote_fixture *f, const char *text, struct config **ret,
                       char **ret_error)
{
        free(f->conf);
        f->conf = write_file(f->dir, "aquad.yaml", text);
        return config_load(f->conf, NULL, 0, ret, ret_error);
}

static void remote_teardown(struct remote_fixture *f)
{
        unlink(f->server);
        unlink(f->server_pub);
        unlink(f->client);
        unlink(f->client_pub);
        if (f->conf)
                unlink(f->conf);
        rmdir(f->dir);
        free(f->server);
        free(f->server_pub);
        free(f->client);
        free(f->client_pub);
        free(f->conf);
}

Test(config, reads_the_remote_endpoint_its_keys_and_identities)
{
        struct remote_fixture f = {0};
        _cleanup_(config_freep) struct config *c = NULL;
        _cleanup_free_ char *error = NULL, *text = NULL;
        uint8_t raw[32];

        remote_setup(&f);
        cr_assert_geq(asprintf(&text,
                               "remote:\n  endpoint: tcp://10.9.0.1:7100\n  key-file: server.key\n"
                               "  heartbeat-interval: 200ms\n  heartbeat-timeout: 2s\n"
                               "  grace: 1m\n"
                               "  clients:\n    - user: root\n      keys: [\"%s\"]\n",
                               f.client_key),
                      0);
        cr_assert_eq(remote_load(&f, text, &c, &error), 0, "%s", error);
        cr_assert_str_eq(c->remote.endpoint, "tcp://10.9.0.1:7100");
        cr_assert_str_eq(c->remote.public_key, f.server_key);
        cr_assert_eq(strlen(c->remote.secret_key), CURVE_KEY_TEXT);
        cr_assert_eq(c->remote.heartbeat_interval_ns, 200 * 1000000ull);
        cr_assert_eq(c->remote.heartbeat_timeout_ns, 2000 * 1000000ull);
        cr_assert_eq(c->remote.grace_ns, 60000 * 1000000ull);
        cr_assert_eq(c->remote.n_clients, 1);
        cr_assert_eq(c->remote.clients[0].uid, 0);
        cr_assert_not_null(zmq_z85_decode(raw, f.client_key));
        cr_assert_eq(config_remote_find(c, raw), &c->remote.clients[0]);
        cr_assert_not_null(zmq_z85_decode(raw, f.server_key));
        cr_assert_null(config_remote_find(c, raw));
        remote_teardown(&f);
}

static void remote_expect(struct remote_fixture *f, const char *text, const char *message)
{
        _cleanup_(config_freep) struct config *c = NULL;
        _cleanup_free_ char *error = NULL, *expected = NULL;

        cr_assert_eq(remote_load(f, text, &c, &error), -EINVAL, "accepted:\n%s", text);
        cr_assert_geq(asprintf(&expected, "%s: %s", f->conf, message), 0);
        cr_assert_str_eq(error, expected);
}

Test(config, names_the_remote_key_that_is_wrong)
{
        struct remote_fixture f = {0};
        _cleanup_free_ char *dup = NULL, *own = NULL, *pubonly = NULL, *msg = NULL;

        remote_setup(&f);
        remote_expect(&f, "remote:\n  key-file: server.key\n",
                      "remote: no endpoint (remote.endpoint: tcp://ADDRESS:PORT)");
        remote_expect(&f, "remote:\n  endpoint: ipc:///tmp/x\n  key-file: server.key\n",
                      "remote.endpoint: \"ipc:///tmp/x\" is not tcp://");
        remote_expect(&f, "remote:\n  endpoint: tcp://10.9.0.1:7100\n",
                      "remote.key-file: required: aquad's key pair (`aquactl keygen FILE` "
                      "writes one)");
        remote_expect(&f,
                      "remote:\n  endpoint: tcp://10.9.0.1:7100\n  key-file: server.key\n"
                      "  clients: [{user: root, keys: [\"short\"]}]\n",
                      "remote.clients[0].keys[0]: \"short\" is not a Z85 CURVE public key (40 "
                      "characters)");
        remote_expect(&f,
                      "remote:\n  endpoint: tcp://10.9.0.1:7100\n  key-file: server.key\n"
                      "  clients: [{user: nosuchuser-aqua, keys: [\"x\"]}]\n",
                      "remote.clients[0].user: no user \"nosuchuser-aqua\"");
        cr_assert_geq(asprintf(&dup,
                               "remote:\n  endpoint: tcp://10.9.0.1:7100\n  key-file: server.key\n"
                               "  clients:\n    - {user: root, keys: [\"%s\"]}\n"
                               "    - {user: \"0\", keys: [\"%s\"]}\n",
                               f.client_key, f.client_key),
                      0);
        remote_expect(&f, dup,
                      "remote.clients[1].keys[0]: already remote.clients[0].keys[0]; a key is "
                      "one identity");
        cr_assert_geq(asprintf(&own,
                               "remote:\n  endpoint: tcp://10.9.0.1:7100\n  key-file: server.key\n"
                               "  clients: [{user: root, keys: [\"%s\"]}]\n",
                               f.server_key),
                      0);
        remote_expect(&f, own, "remote.clients[0].keys[0]: aquad's own public key");
        /* The server needs its secret key: a .pub file is not enough. */
        cr_assert_geq(asprintf(&msg,
                               "remote.key-file: %s: no secret-key (a .pub file holds only "
                               "the public key)",
                               f.server_pub),
                      0);
        pubonly = strdup("remote:\n  endpoint: tcp://10.9.0.1:7100\n  key-file: server.key.pub\n");
        remote_expect(&f, pubonly, msg);
        remote_expect(&f,
                      "remote:\n  endpoint: tcp://10.9.0.1:7100\n  key-file: server.key\n"
                      "  heartbeat-interval: 5s\n  heartbeat-timeout: 1s\n",
                      "remote.heartbeat-timeout: shorter than remote.heartbeat-interval");
        remote_teardown(&f);
}

/* A domain: its keys, their defaults, and each mistake named. */
Test(config, reads_a_domain_and_names_what_is_wrong_with_one)
{
        struct remote_fixture f = {0};
        _cleanup_(config_freep) struct config *c = NULL;
        _cleanup_free_ char *error = NULL, *pw = NULL;
        const char *remote = "remote:\n  endpoint: tcp://10.9.0.1:7100\n  key-file: server.key\n";
        char text[1024];
        FILE *file;

        remote_setup(&f);
        cr_assert_geq(asprintf(&pw, "%s/etcd-password", f.dir), 0);
        file = fopen(pw, "we");
        cr_assert_not_null(file);
        fputs("s3cret\n", file);
        fclose(file);
        snprintf(text, sizeof(text),
                 "%sdomain:\n  name: rack1\n  etcd: [http://10.0.0.1:2379, https://10.0.0.2:2379]\n"
                 "  etcd-user: aquad\n  etcd-password-file: etcd-password\n",
                 remote);
        cr_assert_eq(remote_load(&f, text, &c, &error), 0, "%s", error);
        cr_assert_str_eq(c->domain.name, "rack1");
        cr_assert_eq(c->domain.n_etcd, 2);
        cr_assert_str_eq(c->domain.etcd[1], "https://10.0.0.2:2379");
        cr_assert_eq(c->domain.lease_ttl_ns, 5000 * 1000000ull);
        cr_assert_eq(c->domain.etcd_timeout_ns, 1000 * 1000000ull);
        cr_assert_str_eq(c->domain.etcd_password, "s3cret");

        snprintf(text, sizeof(text), "%sdomain:\n  etcd: [http://10.0.0.1:2379]\n", remote);
        remote_expect(&f, text,
                      "domain.name: required, without '/': the domain's keys in etcd are under "
                      "/aqua/NAME/");
        snprintf(text, sizeof(text), "%sdomain:\n  name: r\n  etcd: [10.0.0.1:2379]\n", remote);
        remote_expect(&f, text, "domain.etcd[0]: \"10.0.0.1:2379\" is not http:// or https://");
        remote_expect(&f, "domain:\n  name: r\n  etcd: [http://10.0.0.1:2379]\n",
                      "domain: needs remote.endpoint: the clients of a domain reach whichever "
                      "aquad leads over tcp");
        remote_expect(&f, "domain:\n  name: r\n",
                      "domain: no etcd (domain.etcd: [http://HOST:2379, ...])");
        snprintf(text, sizeof(text),
                 "%sdomain:\n  name: r\n  etcd: [http://a:2379]\n  lease-ttl: 1500ms\n", remote);
        remote_expect(&f, text, "domain.lease-ttl: etcd's leases are whole seconds");
        snprintf(text, sizeof(text),
                 "%sdomain:\n  name: r\n  etcd: [http://a:2379]\n  lease-ttl: 2s\n"
                 "  etcd-timeout: 1500ms\n",
                 remote);
        remote_expect(&f, text,
                      "domain.etcd-timeout: more than half domain.lease-ttl: a leader could lose "
                      "its lease waiting for one call");
        snprintf(text, sizeof(text),
                 "%sdomain:\n  name: r\n  etcd: [http://a:2379]\n  etcd-user: aquad\n", remote);
        remote_expect(&f, text, "domain: etcd-user and etcd-password-file go together");
        unlink(pw);
        remote_teardown(&f);
}

/* Tenants: who each peer is, first tenant that names it; the default is none (its own). */
Test(config, finds_a_peers_tenant_by_cgroup_key_user_or_group)
{
        _cleanup_(config_freep) struct config *c = NULL;
        _cleanup_free_ char *error = NULL;
        const gid_t groups[] = {4242, 0};
        const char *key = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID";

        cr_assert_eq(load("tenants:\n"
                          "  - name: pod-a\n"
                          "    cgroups: ['*pod1a2b*', '/system.slice/vllm.service']\n"
                          "  - name: ops\n"
                          "    users: [root]\n"
                          "    keys: ['Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID']\n"
                          "  - name: wheel\n"
                          "    groups: [0]\n",
                          &c, &error),
                     0, "%s", error);
        cr_assert_eq(c->n_tenants, 3);
#define OF(...) config_tenant_of(c, &(struct config_peer){__VA_ARGS__})
        /* A pod's cgroup, by systemd's driver, by cgroupfs's, read from another namespace. */
        cr_assert_str_eq(OF(.uid = 1000, .gid = 1000,
                            .cgroup = "/kubepods.slice/kubepods-burstable.slice/"
                                      "kubepods-burstable-pod1a2b_3c.slice/cri-containerd-9f.scope"),
                         "pod-a");
        cr_assert_str_eq(OF(.uid = 1000, .gid = 1000, .cgroup = "/kubepods/besteffort/pod1a2b-3c/9f"),
                         "pod-a");
        cr_assert_str_eq(OF(.uid = 1000, .gid = 1000, .cgroup = "/../../kubepods-pod1a2b_3c.slice"),
                         "pod-a");
        /* An ancestor: the service's own cgroup and what it made below it. */
        cr_assert_str_eq(OF(.uid = 1000, .gid = 1000, .cgroup = "/system.slice/vllm.service/w1"),
                         "pod-a");
        cr_assert_null(OF(.uid = 1000, .gid = 1000, .cgroup = "/system.slice/vllm.service2"));
        /* By user, then by group (primary or supplementary). */
        cr_assert_str_eq(OF(.uid = 0, .gid = 0), "ops");
        cr_assert_str_eq(OF(.uid = 1000, .gid = 0), "wheel");
        cr_assert_str_eq(OF(.uid = 1000, .gid = 1000, .groups = groups, .n_groups = 2), "wheel");
        cr_assert_null(OF(.uid = 1000, .gid = 1000, .groups = groups, .n_groups = 1));
        /* A remote key, or its user; never a group or cgroup for a remote peer. */
        cr_assert_str_eq(OF(.remote = true, .uid = 65534, .key = key), "ops");
        cr_assert_str_eq(OF(.remote = true, .uid = 0, .key = "x"), "ops");
        cr_assert_null(OF(.remote = true, .uid = 65534, .gid = 0, .key = "x",
                          .cgroup = "/kubepods/pod1a2b"));
#undef OF
}

Test(config, names_what_is_wrong_with_a_tenant)
{
        expect_error("tenants:\n  - name: a\n", "aquad.yaml: tenants[0]: names nobody (give users, "
                                                 "groups, keys or cgroups)");
        expect_error("tenants:\n  - {name: 'a b', users: [root]}\n",
                     "aquad.yaml: tenants[0].name: \"a b\" must be 1 to 48 letters, digits, '-', "
                     "'_' or '.'");
        expect_error("tenants:\n  - {name: 'user:0', users: [root]}\n",
                     "aquad.yaml: tenants[0].name: \"user:0\" must be 1 to 48 letters, digits, "
                     "'-', '_' or '.'");
        expect_error("tenants:\n  - {name: a, users: [root]}\n  - {name: a, groups: [root]}\n",
                     "aquad.yaml: tenants[1].name: \"a\" is already tenants[0]");
        expect_error("tenants:\n  - {name: a, users: [root]}\n  - {name: b, users: [0]}\n",
                     "aquad.yaml: tenants[1].users[0]: \"0\" is already in tenant \"a\"; a user is "
                     "in one tenant");
        expect_error("tenants:\n  - {name: a, users: [no-such-user-here]}\n",
                     "aquad.yaml: tenants[0].users[0]: no user \"no-such-user-here\"");
        expect_error("tenants:\n  - {name: a, keys: [short]}\n",
                     "aquad.yaml: tenants[0].keys[0]: \"short\" is not a Z85 CURVE public key (40 "
                     "characters)");
        expect_error("tenants:\n  - {name: a, cgroups: [kubepods]}\n",
                     "aquad.yaml: tenants[0].cgroups[0]: \"kubepods\" is neither a cgroup path "
                     "(\"/...\") nor a pattern that starts with '*'");
}

/* remote.clients binds a key to the GPUs or hosts it may register. */
Test(config, binds_a_remote_key_to_its_gpus_and_hosts)
{
        struct config_remote_client rc = {
            .user = (char *)"alice",
            .gpus = (char *[]){(char *)"GPU-1234*"},
            .n_gpus = 1,
            .hosts = (char *[]){(char *)"node-[ab]"},
            .n_hosts = 1,
        };

        cr_assert(config_remote_may_register(&rc, "gpu-12345678", NULL), "uuids ignore case");
        cr_assert(config_remote_may_register(&rc, "GPU-9", "node-b"));
        cr_assert_not(config_remote_may_register(&rc, "GPU-9", "node-c"));
        cr_assert_not(config_remote_may_register(&rc, "GPU-9", NULL));
}
