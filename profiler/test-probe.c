/* The link probe on simcuda: every pair measured, links missing where there is no peer access. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe-nccl.h"
#include "probe.h"
#include "topology.h"
#include "util.h"

#define MiB (UINT64_C(1) << 20)
#define GiB (UINT64_C(1) << 30)

static char dir[] = "/tmp/aqua-test-probe-XXXXXX";
static struct cuda_driver *driver;

static void setup(void)
{
        char *error = NULL;

        cr_assert_not_null(mkdtemp(dir));
        unsetenv("AQUA_SIM_TOPOLOGY");
        unsetenv("AQUA_SIM_DEVICES");
        cr_assert_eq(cuda_driver_open(NULL, &driver, &error), 0, "%s", error ? error : "");
}

static void teardown(void)
{
        char cmd[128];

        driver = cuda_driver_close(driver);
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
}

TestSuite(probe, .init = setup, .fini = teardown);

static char *path_in_dir(const char *name)
{
        char *p;

        cr_assert_geq(asprintf(&p, "%s/%s", dir, name), 0);
        return p;
}

static char *read_text(const char *path)
{
        FILE *f = fopen(path, "re");
        char *buf = calloc(1, 65536);
        size_t n;

        cr_assert_not_null(f, "%s", path);
        cr_assert_not_null(buf);
        n = fread(buf, 1, 65535, f);
        buf[n] = '\0';
        fclose(f);
        return buf;
}

/* The file without comments or bandwidth values: what must survive a trip through simcuda. */
static char *structure(const char *path)
{
        _cleanup_free_ char *text = read_text(path);
        char *out = calloc(1, strlen(text) + 1), *o = out;

        cr_assert_not_null(out);
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
                char *quote = strrchr(line, '"'), *hash = strchr(quote ? quote : line, '#');
                char *bw = strstr(line, ", bandwidth:");
                size_t n;

                if (hash)
                        *hash = '\0';
                if (bw)
                        strcpy(bw, "}");
                for (n = strlen(line); n > 0 && line[n - 1] == ' '; n--)
                        line[n - 1] = '\0';
                if (*line)
                        o += sprintf(o, "%s\n", line);
        }
        return out;
}

static int run_probe(const char *var, const char *value, const char *machine, const char *output,
                     const char *extra)
{
        const char *exe = getenv("AQUA_TEST_PROFILE");
        pid_t pid;
        int status;

        cr_assert_not_null(exe, "AQUA_TEST_PROFILE is not set (run through meson test)");
        pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
                /* Its report would land in the TAP stream on stdout. */
                if (!freopen("/dev/null", "w", stdout))
                        _exit(127);
                setenv(var, value, 1);
                setenv("AQUA_SIM_MACHINE", machine, 1);
                execl(exe, exe, "probe", "-q", "--size", "1MiB", "--iters", "3", "-o", output,
                      extra, (char *)NULL);
                _exit(127);
        }
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static const struct probe_params small = {.size = 2 * MiB, .iterations = 3, .nccl = probe_nccl};

Test(probe, measures_every_pair_on_simcuda)
{
        _cleanup_(probe_result_done) struct probe_result r = {0};
        static volatile sig_atomic_t never;

        setenv("AQUA_SIM_DEVICES", "4x1GiB", 1);
        setenv("AQUA_SIM_MACHINE", "test-probe-pairs", 1);
        cr_assert_eq(probe_run(driver, &small, &never, NULL, NULL, &r), 0);
        cr_assert_eq(r.n_devices, 4);
        cr_assert(r.complete);
        for (int i = 0; i < 4; i++) {
                cr_expect_eq(r.devices[i].memory, GiB);
                cr_expect_str_eq(r.devices[i].name, "simcuda GPU");
                cr_expect_eq(strncmp(r.devices[i].uuid, "GPU-", 4), 0);
                for (int j = 0; j < 4; j++) {
                        if (i == j)
                                continue;
                        cr_expect(r.peer[i * 4 + j], "%d -> %d has no peer access", i, j);
                        cr_expect_gt(probe_at(r.copy, &r, i, j), 0.0, "%d -> %d", i, j);
                        cr_expect_eq(probe_at(r.nccl, &r, i, j), PROBE_NOT_MEASURED);
                }
        }
        /*
         * NCCL never runs here, and the note says why: where libnccl loads (the library the probe
         * opens: $AQUA_NCCL_LIBRARY or libnccl.so.2), its version and that simcuda runs no
         * kernels; where it does not (NCCL is optional), that it cannot be loaded.
         */
        cr_expect_not(r.nccl_ran);
        cr_assert_not_null(r.nccl_note);
        const char *lib = getenv("AQUA_NCCL_LIBRARY");
        if (!lib || !*lib)
                lib = "libnccl.so.2";
        if (dlopen(lib, RTLD_NOW | RTLD_LOCAL)) {
                cr_expect_not_null(strstr(r.nccl_note, "runs no kernels"), "%s", r.nccl_note);
                cr_expect_not_null(strstr(r.nccl_note, "NCCL 2."), "%s", r.nccl_note);
        } else {
                cr_expect_not_null(strstr(r.nccl_note, "skipped: cannot load"), "%s", r.nccl_note);
        }
}

Test(probe, missing_nccl_is_a_note_not_an_error)
{
        _cleanup_(probe_result_done) struct probe_result r = {0};
        struct probe_params p = small;
        static volatile sig_atomic_t never;

        p.nccl_library = "/nonexistent/libnccl.so.2";
        setenv("AQUA_SIM_DEVICES", "2x64MiB", 1);
        setenv("AQUA_SIM_MACHINE", "test-probe-no-nccl", 1);
        cr_assert_eq(probe_run(driver, &p, &never, NULL, NULL, &r), 0);
        cr_expect(r.complete);
        cr_expect_not(r.nccl_ran);
        cr_assert_not_null(r.nccl_note);
        cr_expect_not_null(strstr(r.nccl_note, "cannot load /nonexistent/libnccl.so.2"), "%s",
                           r.nccl_note);
}

Test(probe, pair_without_peer_link_shows_as_such)
{
        _cleanup_(probe_result_done) struct probe_result r = {0};
        _cleanup_free_ char *topo = path_in_dir("in.yaml"), *out = path_in_dir("out.yaml");
        _cleanup_free_ char *text = NULL;
        static volatile sig_atomic_t never;
        FILE *f = fopen(topo, "we");

        cr_assert_not_null(f);
        fprintf(f, "devices: [{memory: 64MiB}, {memory: 64MiB}, {name: lone, memory: 64MiB}]\n"
                   "links: [{a: 0, b: 1, bandwidth: 100GB}]\n");
        fclose(f);
        setenv("AQUA_SIM_TOPOLOGY", topo, 1);
        setenv("AQUA_SIM_MACHINE", "test-probe-unlinked", 1);
        cr_assert_eq(probe_run(driver, &small, &never, NULL, NULL, &r), 0);
        cr_assert_eq(r.n_devices, 3);
        cr_expect(r.peer[0 * 3 + 1] && r.peer[1 * 3 + 0]);
        cr_expect_gt(probe_link_bandwidth(&r, 0, 1), 0.0);
        for (int i = 0; i < 2; i++) {
                cr_expect_not(r.peer[i * 3 + 2]);
                cr_expect_not(r.peer[2 * 3 + i]);
                cr_expect_eq(probe_at(r.copy, &r, i, 2), PROBE_NOT_MEASURED);
                cr_expect_eq(probe_at(r.copy, &r, 2, i), PROBE_NOT_MEASURED);
        }

        cr_assert_eq(probe_write_topology(out, &r), 0);
        text = read_text(out);
        cr_expect_not_null(strstr(text, "name: \"lone\""), "%s", text);
        cr_expect_not_null(strstr(text, "  - {a: 0, b: 1, bandwidth: "), "%s", text);
        cr_expect_null(strstr(text, "{a: 0, b: 2"), "%s", text);
        cr_expect_null(strstr(text, "{a: 1, b: 2"), "%s", text);
        cr_expect_not_null(strstr(text, "# No peer access (cuDeviceCanAccessPeer): 0-2 1-2\n"),
                           "%s", text);
}

Test(probe, topology_round_trips_through_simcuda)
{
        _cleanup_(probe_result_done) struct probe_result r = {0};
        _cleanup_free_ char *a = path_in_dir("a.yaml"), *b = path_in_dir("b.yaml");
        _cleanup_free_ char *sa = NULL, *sb = NULL;
        static volatile sig_atomic_t never;

        cr_assert_eq(run_probe("AQUA_SIM_DEVICES", "4x1GiB", "test-probe-trip-a", a, "--no-nccl"),
                     0);
        /* Another machine id: UUIDs now come from the file, not from the id. */
        setenv("AQUA_SIM_TOPOLOGY", a, 1);
        setenv("AQUA_SIM_MACHINE", "test-probe-trip-b", 1);
        cr_assert_eq(probe_run(driver, &small, &never, NULL, NULL, &r), 0);
        cr_assert_eq(r.n_devices, 4);
        for (int i = 0; i < 4; i++) {
                cr_expect_eq(r.devices[i].memory, GiB);
                cr_expect_eq(r.devices[i].pci_bus, 0x10 + i);
                for (int j = 0; j < 4; j++)
                        cr_expect(i == j || r.peer[i * 4 + j], "%d -> %d", i, j);
        }
        cr_assert_eq(probe_write_topology(b, &r), 0);
        sa = structure(a);
        sb = structure(b);
        cr_expect_str_eq(sa, sb);
        cr_expect_not_null(strstr(sa, "  - {a: 2, b: 3}\n"), "%s", sa);
        cr_expect_not_null(strstr(sa, "    memory: 1073741824\n"), "%s", sa);
}

static void cancel_after_first(const struct probe_result *r, const char *method, int src, int dst,
                               double gbps, size_t done, size_t total, void *userdata)
{
        *(volatile sig_atomic_t *)userdata = 1;
}

Test(probe, interrupted_probe_keeps_links_and_leaves_out_bandwidths)
{
        _cleanup_(probe_result_done) struct probe_result r = {0};
        _cleanup_free_ char *part = path_in_dir("part.yaml"), *again = path_in_dir("again.yaml");
        _cleanup_free_ char *text = NULL;
        static volatile sig_atomic_t stop;

        setenv("AQUA_SIM_DEVICES", "3x64MiB", 1);
        setenv("AQUA_SIM_MACHINE", "test-probe-cancel", 1);
        cr_assert_eq(probe_run(driver, &small, &stop, cancel_after_first, (void *)&stop, &r),
                     PROBE_E_CANCELLED);
        cr_expect_not(r.complete);
        cr_expect_gt(probe_at(r.copy, &r, 0, 1), 0.0);
        cr_expect_eq(probe_at(r.copy, &r, 0, 2), PROBE_NOT_MEASURED);
        cr_assert_eq(probe_write_topology(part, &r), 0);
        text = read_text(part);
        cr_expect_not_null(strstr(text, "# INCOMPLETE"), "%s", text);
        cr_expect_not_null(strstr(text, "  - {a: 0, b: 2}"), "%s", text);
        /* It still loads: simcuda gives unmeasured links its default bandwidth. */
        cr_expect_eq(
            run_probe("AQUA_SIM_TOPOLOGY", part, "test-probe-cancel-2", again, "--no-nccl"), 0);
}

Test(probe, bad_arguments_are_refused)
{
        _cleanup_free_ char *out = path_in_dir("never.yaml");

        cr_expect_eq(run_probe("AQUA_SIM_DEVICES", "2x64MiB", "test-probe-args", out, "--iters=0"),
                     2);
        cr_expect_eq(run_probe("AQUA_SIM_DEVICES", "2x64MiB", "test-probe-args", out, "extra"), 2);
        /* A copy larger than a device cannot be allocated: a clear error and no file. */
        cr_expect_eq(
            run_probe("AQUA_SIM_DEVICES", "2x64MiB", "test-probe-args", out, "--size=1GiB"), 1);
        cr_expect_neq(access(out, F_OK), 0);
}

static void write_text(const char *path, const char *text)
{
        FILE *f = fopen(path, "we");

        cr_assert_not_null(f, "%s", path);
        fputs(text, f);
        cr_assert_eq(fclose(f), 0);
}

/* aqua-profile merge with these arguments after "merge" (at most 6); its exit status. */
static int run_merge(const char *const *args, size_t n_args)
{
        const char *exe = getenv("AQUA_TEST_PROFILE");
        const char *argv[9] = {exe, "merge"};
        pid_t pid;
        int status;

        cr_assert_not_null(exe, "AQUA_TEST_PROFILE is not set (run through meson test)");
        cr_assert_leq(n_args, 6);
        memcpy(argv + 2, args, n_args * sizeof(*args));
        pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
                if (!freopen("/dev/null", "w", stdout))
                        _exit(127);
                execv(exe, (char *const *)argv);
                _exit(127);
        }
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

Test(probe, files_of_two_hosts_merge_into_one_domain)
{
        _cleanup_free_ char *a = path_in_dir("node-a.yaml"), *b = path_in_dir("node-b.yaml");
        _cleanup_free_ char *d = path_in_dir("domain.yaml"), *again = path_in_dir("again.yaml");
        _cleanup_free_ char *text = NULL, *error = NULL;
        struct topology t _cleanup_(topology_free) = {0};
        struct topology ta _cleanup_(topology_free) = {0};

        cr_assert_eq(
            run_probe("AQUA_SIM_DEVICES", "2x1GiB", "test-probe-host-a", a, "--host=node-a"), 0);
        cr_assert_eq(
            run_probe("AQUA_SIM_DEVICES", "3x1GiB", "test-probe-host-b", b, "--host=node-b"), 0);
        text = read_text(a);
        cr_expect_not_null(strstr(text, "    host: \"node-a\"\n"), "%s", text);
        cr_assert_eq(run_merge((const char *[]){"-f", "900GB", "-o", d, a, b}, 6), 0);

        cr_assert_eq(topology_load(d, &t, &error), 0, "%s", error);
        cr_assert_eq(topology_load(a, &ta, &error), 0, "%s", error);
        cr_assert_eq(t.n_devices, 5);
        for (size_t i = 0; i < 5; i++)
                cr_expect_str_eq(t.devices[i].host, i < 2 ? "node-a" : "node-b");
        cr_expect_str_eq(t.devices[1].uuid, ta.devices[1].uuid);
        cr_expect_eq(t.bandwidth[0 * 5 + 1], ta.bandwidth[0 * 2 + 1], "a host's own link kept");
        cr_expect_gt(t.bandwidth[3 * 5 + 4], 0, "node-b's links, renumbered");
        for (size_t i = 0; i < 2; i++)
                for (size_t j = 2; j < 5; j++)
                        cr_expect_eq(t.bandwidth[i * 5 + j], 900000000000ull, "%zu-%zu", i, j);
        /* simcuda runs the domain as one machine of 5 devices. */
        cr_expect_eq(run_probe("AQUA_SIM_TOPOLOGY", d, "test-probe-domain", again, "--no-nccl"), 0);
}

Test(probe, merge_refuses_a_host_twice_and_a_file_without_hosts)
{
        _cleanup_free_ char *a = path_in_dir("twice.yaml"), *d = path_in_dir("never.yaml");
        _cleanup_free_ char *bare = path_in_dir("bare.yaml");

        cr_assert_eq(run_probe("AQUA_SIM_DEVICES", "2x1GiB", "test-probe-twice", a, "--host=n"), 0);
        cr_expect_eq(run_merge((const char *[]){"-o", d, a, a}, 4), 1);
        write_text(bare, "devices: [{memory: 1GiB}]\n");
        cr_expect_eq(run_merge((const char *[]){"-o", d, a, bare}, 4), 1);
        cr_expect_eq(run_merge((const char *[]){"-o", d}, 2), 2, "no inputs");
        cr_expect_eq(run_merge((const char *[]){"--fabric-bandwidth=fast", a}, 2), 2);
        cr_expect_neq(access(d, F_OK), 0);
}

/* A newline in a file's name must not end the comment it is named in. */
Test(probe, merge_keeps_odd_file_names_inside_comments)
{
        _cleanup_free_ char *odd = path_in_dir("a\nb: [.yaml"), *d = path_in_dir("odd-out.yaml");
        _cleanup_free_ char *error = NULL;
        struct topology t _cleanup_(topology_free) = {0};
        const char *inputs[1];

        write_text(odd, "devices: [{memory: 1GiB, host: n}]\n");
        inputs[0] = odd;
        cr_assert_eq(probe_merge_topology(inputs, 1, 0, d, &error), 0, "%s", error);
        cr_assert_eq(topology_load(d, &t, &error), 0, "%s", error);
        cr_assert_eq(t.n_devices, 1);
}

Test(probe, merge_names_the_file_and_device_without_a_host)
{
        _cleanup_free_ char *bare = path_in_dir("bare.yaml"), *d = path_in_dir("never.yaml");
        _cleanup_free_ char *error = NULL, *expected = NULL;
        const char *inputs[1];

        write_text(bare, "devices: [{memory: 1GiB, host: n}, {memory: 1GiB}]\n");
        inputs[0] = bare;
        cr_assert_eq(probe_merge_topology(inputs, 1, 0, d, &error), -EINVAL);
        cr_assert_geq(asprintf(&expected,
                               "%s: devices[1]: no host (probe it with aqua-profile probe, or add "
                               "host: NAME to each device)",
                               bare),
                      0);
        cr_expect_str_eq(error, expected);
}
