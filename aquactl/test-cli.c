/* The aquactl program's command line: exit codes and messages for mistakes made before aquad
 * answers. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "util.h"

extern char **environ;

struct result {
        int code;
        char out[8192];
        char err[8192];
};

static void slurp(int fd, char *buf, size_t len)
{
        size_t used = 0;
        ssize_t n;

        while (used + 1 < len && (n = read(fd, buf + used, len - 1 - used)) > 0)
                used += (size_t)n;
        buf[used] = '\0';
}

/* Run aquactl (the path meson gives in $AQUACTL) with args; stdout and stderr go to files. */
static void run(struct result *res, const char *const *args)
{
        const char *exe = getenv("AQUACTL");
        char *argv[16] = {(char *)"aquactl"};
        char out_path[] = "/tmp/aquactl-cli-out-XXXXXX", err_path[] = "/tmp/aquactl-cli-err-XXXXXX";
        int out = mkstemp(out_path), err = mkstemp(err_path), status;
        posix_spawn_file_actions_t fa;
        pid_t pid;
        size_t n = 1;

        cr_assert_not_null(exe, "AQUACTL is not set");
        cr_assert(out >= 0 && err >= 0);
        for (; args[n - 1] && n < ARRAY_SIZE(argv) - 1; n++)
                argv[n] = (char *)args[n - 1];
        argv[n] = NULL;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, out, 1);
        posix_spawn_file_actions_adddup2(&fa, err, 2);
        cr_assert_eq(posix_spawn(&pid, exe, &fa, NULL, argv, environ), 0);
        posix_spawn_file_actions_destroy(&fa);
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFEXITED(status));
        res->code = WEXITSTATUS(status);
        lseek(out, 0, SEEK_SET);
        lseek(err, 0, SEEK_SET);
        slurp(out, res->out, sizeof(res->out));
        slurp(err, res->err, sizeof(res->err));
        close(out);
        close(err);
        unlink(out_path);
        unlink(err_path);
}

#define RUN(res, ...) run(res, (const char *const[]){__VA_ARGS__, NULL})

static void setup(void)
{
        /* No daemon answers here, whatever the machine runs. */
        setenv("AQUA_ENDPOINT", "ipc:///nonexistent/aqua/aquad.sock", 1);
        unsetenv("AQUA_SIDE_PATH");
}

TestSuite(cli, .init = setup);

Test(cli, help_lists_every_command_and_exits_zero)
{
        struct result r;

        RUN(&r, "--help");
        cr_assert_eq(r.code, 0);
        for (const char *const *c =
                 (const char *const[]){"status", "gpus", "pairs", "leases", "chunks", "events",
                                       "reclaim GPU [SIZE]", "drain GPU", "pair PRODUCER CONSUMER",
                                       "unpair GPU", "--json", NULL};
             *c; c++)
                cr_assert(strstr(r.out, *c), "help lacks %s", *c);
}

Test(cli, no_command_is_a_usage_error)
{
        struct result r;

        RUN(&r, "--json");
        cr_assert_eq(r.code, 2);
        cr_assert(strstr(r.err, "Usage: aquactl"), "%s", r.err);
}

Test(cli, an_unknown_command_is_named)
{
        struct result r;

        RUN(&r, "leese");
        cr_assert_eq(r.code, 2);
        cr_assert_str_eq(r.err, "aquactl: error: unknown command 'leese'; see aquactl --help\n");
}

Test(cli, a_wrong_number_of_arguments_shows_the_usage)
{
        struct result r;

        RUN(&r, "pair", "1");
        cr_assert_eq(r.code, 2);
        cr_assert_str_eq(r.err, "aquactl: error: usage: aquactl pair PRODUCER CONSUMER\n");
        RUN(&r, "gpus", "1");
        cr_assert_eq(r.code, 2);
        cr_assert_str_eq(r.err, "aquactl: error: usage: aquactl gpus\n");
}

Test(cli, a_bad_size_is_reported_before_any_connection)
{
        struct result r;

        RUN(&r, "reclaim", "1", "lots");
        cr_assert_eq(r.code, 2);
        cr_assert_str_eq(r.err, "aquactl: error: invalid size 'lots': give a positive amount like "
                                "2GiB, 512MiB or 1.5GB, or 'all'\n");
        RUN(&r, "reclaim", "1", "0");
        cr_assert_eq(r.code, 2);
}

Test(cli, a_bad_timeout_is_a_usage_error)
{
        struct result r;

        RUN(&r, "-t", "soon", "status");
        cr_assert_eq(r.code, 2);
        cr_assert(strstr(r.err, "invalid timeout 'soon'"), "%s", r.err);
}

Test(cli, a_daemon_that_is_not_running_is_named_with_exit_code_3)
{
        struct result r;

        RUN(&r, "status");
        cr_assert_eq(r.code, 3);
        cr_assert_str_eq(r.err, "aquactl: error: aquad is not running at "
                                "ipc:///nonexistent/aqua/aquad.sock (/nonexistent/aqua/aquad.side: "
                                "No such file or directory)\n");
        RUN(&r, "-e", "ipc:///nonexistent/other.sock", "--side", "/nonexistent/s", "reclaim", "1",
            "2GiB");
        cr_assert_eq(r.code, 3);
        cr_assert(strstr(r.err, "not running at ipc:///nonexistent/other.sock (/nonexistent/s:"),
                  "%s", r.err);
}
