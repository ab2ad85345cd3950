/* Start, restart and stop a private aquad for integration tests. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "time-util.h"
#include "util.h"

struct aquad {
        char dir[64];
        char config[128];
        char endpoint[160];
        char ipc[128];
        char side[128];
        char log[128];
        bool logged; /* stderr to log */
        pid_t pid;
};

static int spawn(struct aquad *d)
{
        const char *bin = getenv("AQUAD");
        uint64_t deadline;
        struct stat st;
        pid_t pid;

        if (!bin || !bin[0])
                bin = "build/daemon/aquad";
        /* A file left by a killed aquad must not pass for the new one's. */
        unlink(d->ipc);
        pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                const char *verbose = getenv("AQUA_TEST_VERBOSE");
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (d->logged) {
                        int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);

                        if (fd < 0 || dup2(fd, STDERR_FILENO) < 0)
                                _exit(127);
                }
                if (verbose && verbose[0] == '1')
                        execl(bin, "aquad", "-c", d->config, "-v", (char *)NULL);
                else
                        execl(bin, "aquad", "-c", d->config, (char *)NULL);
                fprintf(stderr, "harness: cannot run %s: %m\n", bin);
                _exit(127);
        }
        d->pid = pid;
        /* aquad listens on the side channel before it binds the ZeroMQ endpoint. */
        deadline = now_mono_ns() + 20 * NSEC_PER_SEC;
        while (stat(d->ipc, &st) < 0) {
                int status;
                if (waitpid(pid, &status, WNOHANG) == pid) {
                        d->pid = 0;
                        return -ECHILD;
                }
                if (now_mono_ns() > deadline)
                        return -ETIMEDOUT;
                sleep_ns(2 * NSEC_PER_MSEC);
        }
        return 0;
}

static int start(const char *extra_yaml, bool logged, struct aquad **ret)
{
        struct aquad *d = calloc(1, sizeof(*d));
        FILE *f;
        int r;

        if (!d)
                return -ENOMEM;
        snprintf(d->dir, sizeof(d->dir), "/tmp/aquad-test-XXXXXX");
        if (!mkdtemp(d->dir)) {
                free(d);
                return -errno;
        }
        snprintf(d->config, sizeof(d->config), "%s/aquad.yaml", d->dir);
        snprintf(d->ipc, sizeof(d->ipc), "%s/aquad.sock", d->dir);
        snprintf(d->endpoint, sizeof(d->endpoint), "ipc://%s", d->ipc);
        snprintf(d->side, sizeof(d->side), "%s/aquad.side", d->dir);
        snprintf(d->log, sizeof(d->log), "%s/aquad.log", d->dir);
        d->logged = logged;
        f = fopen(d->config, "we");
        if (!f) {
                r = -errno;
                goto fail;
        }
        fprintf(f, "endpoint: %s\nside-socket: %s\njournal: %s/journal\n%s", d->endpoint, d->side,
                d->dir, extra_yaml ? extra_yaml : "");
        fclose(f);
        r = spawn(d);
        if (r < 0)
                goto fail;
        *ret = d;
        return 0;
fail:
        aquad_stop(d);
        return r;
}

int aquad_start(const char *extra_yaml, struct aquad **ret)
{
        return start(extra_yaml, false, ret);
}

int aquad_start_logged(const char *extra_yaml, struct aquad **ret)
{
        return start(extra_yaml, true, ret);
}

int aquad_restart(struct aquad *d)
{
        if (d->pid > 0)
                return -EBUSY;
        return spawn(d);
}

int aquad_kill(struct aquad *d, int sig)
{
        int status;

        if (d->pid <= 0)
                return -1;
        kill(d->pid, sig);
        while (waitpid(d->pid, &status, 0) < 0)
                if (errno != EINTR)
                        return -1;
        d->pid = 0;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int aquad_stop(struct aquad *d)
{
        char cmd[128];
        int status = -1;

        if (!d)
                return -1;
        if (d->pid > 0)
                status = aquad_kill(d, SIGTERM);
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
        if (system(cmd) != 0)
                fprintf(stderr, "harness: could not remove %s\n", d->dir);
        free(d);
        return status;
}

const char *aquad_endpoint(const struct aquad *d)
{
        return d->endpoint;
}

const char *aquad_side_path(const struct aquad *d)
{
        return d->side;
}

const char *aquad_dir(const struct aquad *d)
{
        return d->dir;
}

const char *aquad_config_path(const struct aquad *d)
{
        return d->config;
}

const char *aquad_log_path(const struct aquad *d)
{
        return d->log;
}

void test_note(const char *fmt, ...)
{
        const char *path = getenv("AQUA_TEST_LOG");
        va_list ap;

        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
        if (path && path[0]) {
                FILE *f = fopen(path, "ae");
                if (!f)
                        return;
                va_start(ap, fmt);
                vfprintf(f, fmt, ap);
                va_end(ap);
                fputc('\n', f);
                fclose(f);
        }
}

pid_t aquad_pid(const struct aquad *d)
{
        return d->pid;
}
