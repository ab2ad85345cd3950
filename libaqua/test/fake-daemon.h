/*
 * A tiny stand-in for aquad in unit tests: a ROUTER and a side-channel listener on a private
 * path, driven step by step from the test (or from a thread the test starts). Not a daemon: it
 * only does what each test tells it to.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "aqua.pb-c.h"
#include "aqua/aqua.h"
#include "side.h"

struct fake {
        char dir[64];
        char endpoint[128];
        char side_path[128];
        void *zctx, *router;
        int listen_fd, side_fd;
        zmq_msg_t peer; /* the DEALER's routing id, from its last message */
        bool have_peer;
};

extern const uint8_t fake_token[SIDE_TOKEN_LEN];

void fake_start(struct fake *f);
void fake_stop(struct fake *f);
/* Stop listening (the side path disappears, as when the daemon is gone) and listen again. */
void fake_unlisten(struct fake *f);
void fake_listen(struct fake *f);
/* Accept the client's side connection and send it a HELLO (or a REJECT). */
void fake_accept(struct fake *f, bool reject);
/* Accept the side channel and refuse it with reason and text. */
void fake_reject(struct fake *f, Aqua__SideFrame__RejectReason reason, const char *text);
/* Receive one Envelope (blocking), remembering who sent it. */
Aqua__Envelope *fake_recv(struct fake *f);
/* Receive one side frame from the client (blocking); fds go to fds (room for max). */
Aqua__SideFrame *fake_side_recv(struct fake *f, int *fds, size_t max, size_t *ret_n);
void fake_send(struct fake *f, Aqua__Envelope *e);
void fake_send_raw(struct fake *f, const void *buf, size_t len);
void fake_send_ack(struct fake *f, uint64_t request_id);
void fake_send_pair_changed(struct fake *f, uint64_t request_id, const char *paired);
/* Answer a Hello with a Welcome. */
void fake_welcome(struct fake *f, uint64_t request_id, uint64_t client_id, const char *paired);

/* A private simulated machine (simcuda) for this test process, and its removal. */
/* aqua_open() against f, which welcomes the Hello (paired: Welcome.paired_with); the test fails
 * unless it opens. */
void fake_open(struct fake *f, int device, enum aqua_role role, const char *client_name,
               const char *paired, aqua_ctx **ret);
void test_sim_machine(const char *name, const char *devices);
void test_sim_cleanup(void);
