/* What the integration tests share: a welcomed client, aqua-agent processes, simcuda clean-up. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <grp.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

void test_connect_as(struct aquad *d, struct raw *r, Aqua__Role role, const char *uuid,
                     const char *peer)
{
        Aqua__Envelope *w;

        cr_assert_eq(raw_connect(r, aquad_endpoint(d), aquad_side_path(d)), 0);
        w = raw_hello(r, role, uuid, peer, NULL, 0, NULL);
        cr_assert_not_null(w);
        cr_assert_eq(w->body_case, AQUA__ENVELOPE__BODY_WELCOME, "hello answered with error %d: %s",
                     raw_error_code(w), raw_error_code(w) >= 0 ? w->error->message : "");
        raw_free(w);
}

void test_connect_cast(struct aquad *d, struct raw *producer, struct raw *consumer,
                       struct raw *admin)
{
        test_connect_as(d, producer, AQUA__ROLE__ROLE_PRODUCER, "GPU-P", "GPU-C");
        test_connect_as(d, consumer, AQUA__ROLE__ROLE_CONSUMER, "GPU-C", "GPU-P");
        test_connect_as(d, admin, AQUA__ROLE__ROLE_ADMIN, NULL, NULL);
}

void test_agent_spawn(pid_t *ret_pid, FILE **ret_in, FILE **ret_out)
{
        test_agent_spawn_as((uid_t)-1, ret_pid, ret_in, ret_out);
}

void test_agent_spawn_as(uid_t uid, pid_t *ret_pid, FILE **ret_in, FILE **ret_out)
{
        const char *bin = getenv("AQUA_AGENT");
        int to[2], from[2];
        pid_t pid;

        cr_assert_not_null(bin, "AQUA_AGENT is not set");
        cr_assert_eq(pipe2(to, O_CLOEXEC), 0);
        cr_assert_eq(pipe2(from, O_CLOEXEC), 0);
        pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
                if (uid != (uid_t)-1 &&
                    (setgroups(0, NULL) < 0 || setgid((gid_t)uid) < 0 || setuid(uid) < 0))
                        _exit(126);
                /* After the change of credentials, which would clear it. */
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                dup2(to[0], 0);
                dup2(from[1], 1);
                execl(bin, "aqua-agent", (char *)NULL);
                _exit(127);
        }
        close(to[0]);
        close(from[1]);
        *ret_pid = pid;
        *ret_in = fdopen(to[1], "w");
        *ret_out = fdopen(from[0], "r");
}

uint64_t test_field(const char *reply, const char *key)
{
        char k[64];
        const char *p;

        snprintf(k, sizeof(k), "%s=", key);
        p = reply ? strstr(reply, k) : NULL;
        return p ? strtoull(p + strlen(k), NULL, 0) : UINT64_MAX;
}

void test_agent_kill(pid_t *pid, FILE *in, FILE *out)
{
        if (*pid <= 0)
                return;
        kill(*pid, SIGKILL);
        waitpid(*pid, NULL, 0);
        *pid = 0;
        fclose(in);
        fclose(out);
}

void test_sim_remove(const char *machine)
{
        char path[256];
        struct dirent *de;
        DIR *d;

        snprintf(path, sizeof(path), "/dev/shm/aqua-sim-%u-%s", (unsigned)getuid(), machine);
        d = opendir(path);
        if (!d)
                return;
        while ((de = readdir(d)))
                if (de->d_name[0] != '.')
                        unlinkat(dirfd(d), de->d_name, 0);
        closedir(d);
        rmdir(path);
}
