/*
 * What the integration tests share beyond harness.h and rawclient.h: a protocol client that
 * says hello to the test's aquad, aqua-agent processes (tests/aqua-agent.c) on pipes, and the
 * removal of a simulated machine's shared state.
 * The client and agent helpers fail the running Criterion test on any error.
 */
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "harness.h"
#include "rawclient.h"

/* Connect r to d and say hello as role; the test fails unless aquad welcomes it. */
/* The usual cast: producer GPU-P and consumer GPU-C with a peer link, and an admin client. */
void test_connect_cast(struct aquad *d, struct raw *producer, struct raw *consumer,
                       struct raw *admin);
void test_connect_as(struct aquad *d, struct raw *r, Aqua__Role role, const char *uuid,
                     const char *peer);

/*
 * Start $AQUA_AGENT with *ret_in writing to its stdin and *ret_out reading its stdout; it dies
 * with the test process. The streams keep stdio's default buffering.
 */
void test_agent_spawn(pid_t *ret_pid, FILE **ret_in, FILE **ret_out);
/* The same as user uid (and the group of that number, no others); (uid_t)-1: as this process. */
void test_agent_spawn_as(uid_t uid, pid_t *ret_pid, FILE **ret_in, FILE **ret_out);
/* SIGKILL the agent *pid (when > 0), reap it, close its streams and set *pid to 0. */
void test_agent_kill(pid_t *pid, FILE *in, FILE *out);

/* The number after "KEY=" in an agent's reply, or UINT64_MAX where the reply has none. */
uint64_t test_field(const char *reply, const char *key);

/* Remove simcuda's shared state of machine: the folder /dev/shm/aqua-sim-<uid>-<machine>. */
void test_sim_remove(const char *machine);
