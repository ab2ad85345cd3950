/* Start, restart and stop a private aquad for integration tests. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
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

/* In a forked child: become aquad -c config [-v] args..., dying with the test process. */
static _Noreturn void exec_aquad(const char *config, const char *const *args)
{
        const char *bin = getenv("AQUAD"), *verbose = getenv("AQUA_TEST_VERBOSE");
        const char *argv[16] = {"aquad", "-c", config};
        size_t n = 3;

        if (!bin || !bin[0])
                bin = "build/daemon/aquad";
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (verbose && verbose[0] == '1')
                argv[n++] = "-v";
        for (; args && *args && n < ARRAY_SIZE(argv) - 1; args++)
                argv[n++] = *args;
        argv[n] = NULL;
        execv(bin, (char *const *)argv);
        fprintf(stderr, "harness: cannot run %s: %m\n", bin);
        _exit(127);
}

static int spawn(struct aquad *d, const char *const *args)
{
        uint64_t deadline;
        struct stat st;
        pid_t pid;

        /* A file left by a killed aquad must not pass for the new one's. */
        unlink(d->ipc);
        pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                if (d->logged) {
                        int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);

                        if (fd < 0 || dup2(fd, STDERR_FILENO) < 0)
                                _exit(127);
                }
                exec_aquad(d->config, args);
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
        r = spawn(d, NULL);
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
        return aquad_restart_args(d, NULL);
}

int aquad_restart_args(struct aquad *d, const char *const *args)
{
        if (d->pid > 0)
                return -EBUSY;
        return spawn(d, args);
}

/* Wait for pid, killing it at deadline_ns; its exit status, or 128 + signal. */
static int reap(pid_t pid, uint64_t deadline_ns)
{
        bool killed = false;
        int status;

        for (;;) {
                pid_t w = waitpid(pid, &status, killed ? 0 : WNOHANG);
                if (w == pid)
                        break;
                if (w < 0 && errno != EINTR)
                        return -errno;
                if (!killed && now_mono_ns() >= deadline_ns)
                        killed = kill(pid, SIGKILL) == 0;
                else if (!killed)
                        sleep_ns(2 * NSEC_PER_MSEC);
        }
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int aquad_run(const char *config, const char *const *args, uint64_t timeout_ms, char **ret_log)
{
        uint64_t deadline = now_mono_ns() + timeout_ms * NSEC_PER_MSEC;
        _cleanup_free_ char *log = NULL;
        size_t len = 0, cap = 0;
        int pipefd[2];
        pid_t pid;

        if (pipe2(pipefd, O_CLOEXEC) < 0)
                return -errno;
        pid = fork();
        if (pid < 0) {
                close(pipefd[0]);
                close(pipefd[1]);
                return -errno;
        }
        if (pid == 0) {
                dup2(pipefd[1], STDERR_FILENO);
                exec_aquad(config, args);
        }
        close(pipefd[1]);
        /* Read until aquad closes its stderr (it exits) or the time is up. */
        for (;;) {
                struct pollfd pfd = {.fd = pipefd[0], .events = POLLIN};
                int64_t left = (int64_t)(deadline - now_mono_ns()) / (int64_t)NSEC_PER_MSEC;
                ssize_t n;

                if (now_mono_ns() >= deadline || poll(&pfd, 1, (int)MAX(left, 1)) == 0)
                        break;
                if (cap - len < 4096) {
                        char *p = realloc(log, cap + 65536);
                        if (!p)
                                break;
                        log = p;
                        cap += 65536;
                }
                n = read(pipefd[0], log + len, cap - len - 1);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        break;
                len += (size_t)n;
        }
        close(pipefd[0]);
        if (!log && !(log = calloc(1, 1))) {
                reap(pid, 0);
                return -ENOMEM;
        }
        log[len] = '\0';
        fputs(log, stderr); /* where aquad's log would have gone */
        *ret_log = TAKE_PTR(log);
        return reap(pid, deadline);
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

void aquad_stop_in_teardown(struct aquad *d)
{
        bool running = d && d->pid > 0;
        pid_t pid = running ? d->pid : 0;
        int status = aquad_stop(d);

        if (running && status != 0) {
                fprintf(stderr, "harness: aquad (pid %d) did not stop cleanly: exit status %d; "
                                "its output is above\n", (int)pid, status);
                abort();
        }
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

int aquad_config_set(const struct aquad *d, const char *key, const char *value)
{
        char line[512], out[8192] = "";
        size_t klen = strlen(key);
        bool found = false;
        FILE *f = fopen(d->config, "re");

        if (!f)
                return -errno;
        while (fgets(line, sizeof(line), f)) {
                if (strncmp(line, key, klen) == 0 && line[klen] == ':') {
                        snprintf(line, sizeof(line), "%s: %s\n", key, value);
                        found = true;
                }
                strncat(out, line, sizeof(out) - strlen(out) - 1);
        }
        fclose(f);
        if (!found)
                snprintf(out + strlen(out), sizeof(out) - strlen(out), "%s: %s\n", key, value);
        f = fopen(d->config, "we");
        if (!f)
                return -errno;
        fputs(out, f);
        return fclose(f) == 0 ? 0 : -errno;
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
