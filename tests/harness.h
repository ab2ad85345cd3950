/*
 * Integration-test harness: runs a real aquad on a private endpoint in a temporary folder.
 *
 *     struct aquad *d;
 *     cr_assert_eq(aquad_start("reclaim-deadline: 200ms\n", &d), 0);
 *     ... connect to aquad_endpoint(d) and aquad_side_path(d) ...
 *     cr_assert_eq(aquad_stop(d), 0);   // SIGTERM; 0 when aquad exited cleanly
 *
 * The aquad binary is $AQUAD (tests/meson.build sets it), else build/daemon/aquad. The child
 * dies with the test process (PR_SET_PDEATHSIG), so a crashed test leaves nothing running.
 * Set AQUA_TEST_VERBOSE=1 to run aquad with -v.
 */
#pragma once

#include <stdint.h>
#include <sys/types.h>

struct aquad;

/*
 * Write a config into a fresh temporary folder and start aquad on it; returns once it accepts
 * connections. The config sets endpoint (ipc://DIR/aquad.sock), side-socket (DIR/aquad.side)
 * and journal (DIR/journal); extra_yaml (may be NULL) adds further top-level keys and must not
 * repeat those three. Returns 0, or a negative errno (-ETIMEDOUT, -ECHILD when aquad exited).
 */
int aquad_start(const char *extra_yaml, struct aquad **ret);
/* The same with aquad's stderr (its log) appended to aquad_log_path(d) instead of the test's. */
int aquad_start_logged(const char *extra_yaml, struct aquad **ret);

/* Start aquad again on the same folder, config and journal (after aquad_kill). */
int aquad_restart(struct aquad *d);
/* The same with further arguments (NULL-terminated, e.g. {"--repair-journal", NULL}). */
int aquad_restart_args(struct aquad *d, const char *const *args);

/*
 * Run aquad -c config with further arguments (NULL-terminated, may be NULL) until it exits,
 * for an aquad expected to stop by itself (a refusal to start); past timeout_ms it is killed.
 * What it wrote to stderr is in *ret_log (NUL-terminated, free it), and is also copied to
 * stderr. Returns its exit status, 128 + signal when killed, or a negative errno.
 */
int aquad_run(const char *config, const char *const *args, uint64_t timeout_ms, char **ret_log);

/* Send sig and wait for aquad to exit; returns its exit status, or 128 + signal if killed. */
int aquad_kill(struct aquad *d, int sig);

/*
 * Stop aquad with SIGTERM (if it runs), remove the folder and free d. Returns aquad's exit
 * status (0: a clean stop, no leak under ASan), or -1 when it was not running.
 */
int aquad_stop(struct aquad *d);
/*
 * For a suite's .fini: stop d (NULL: nothing), and when a running aquad does not stop cleanly (a
 * crash, or a leak under ASan), abort this process. Criterion ignores a failed assertion in
 * .fini; it reports a process that dies there as a crash, which fails the test.
 */
void aquad_stop_in_teardown(struct aquad *d);

const char *aquad_endpoint(const struct aquad *d);  /* "ipc://DIR/aquad.sock" */
const char *aquad_side_path(const struct aquad *d); /* "DIR/aquad.side" */
const char *aquad_dir(const struct aquad *d);
const char *aquad_config_path(const struct aquad *d);
/* Replace the value of a top-level KEY in d's config file (for a reload or the next start);
 * a key the file lacks is added. 0, or -errno. */
int aquad_config_set(const struct aquad *d, const char *key, const char *value);
const char *aquad_log_path(const struct aquad *d); /* "DIR/aquad.log" */
pid_t aquad_pid(const struct aquad *d);

/*
 * A line for people (figures, what went wrong): on stderr, and appended to the file
 * $AQUA_TEST_LOG when set (tests/meson.build sets it: Criterion's TAP mode swallows a test's own
 * output, so this is where figures end up under meson test).
 */
void test_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
