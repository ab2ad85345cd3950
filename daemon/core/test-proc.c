/* proc: a process's identity, and liveness that a reused pid or a reboot cannot fool. */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proc.h"

Test(proc, names_this_process_alive)
{
        struct proc_id id;

        cr_assert_eq(proc_identify(getpid(), &id), 0);
        cr_assert_eq(id.pid, getpid());
        cr_assert_gt(id.start_time, 0);
        cr_assert_eq(strlen(id.boot_id), PROC_BOOT_ID_LEN - 1);
        cr_assert_eq(proc_liveness(&id), PROC_ALIVE);
}

Test(proc, a_child_that_exited_is_gone)
{
        struct proc_id id;
        int status;
        pid_t child = fork();

        if (child == 0) {
                pause();
                _exit(0);
        }
        cr_assert_eq(proc_identify(child, &id), 0);
        cr_assert_eq(proc_liveness(&id), PROC_ALIVE);
        /* A later process has a later start time, so the parent's own start is before. */
        cr_assert_geq(id.start_time, 1);
        kill(child, SIGKILL);
        waitpid(child, &status, 0);
        cr_assert_eq(proc_liveness(&id), PROC_GONE);
        cr_assert_eq(proc_identify(child, &id), -ESRCH);
}

Test(proc, another_process_under_the_same_pid_or_another_boot_is_gone)
{
        struct proc_id id;

        cr_assert_eq(proc_identify(getpid(), &id), 0);
        id.start_time++;
        cr_assert_eq(proc_liveness(&id), PROC_GONE, "a reused pid");
        id.start_time--;
        id.boot_id[0] = id.boot_id[0] == '0' ? '1' : '0';
        cr_assert_eq(proc_liveness(&id), PROC_GONE, "another boot");
}

Test(proc, nothing_recorded_cannot_be_told)
{
        struct proc_id none = {0};

        cr_assert_eq(proc_liveness(&none), PROC_UNKNOWN);
}
