/* The aquad executable's accept() and accept4(): out of descriptors, a refused connection and
 * EAGAIN instead of EMFILE, so that libzmq's listeners never abort the process. */
#pragma once

/* Keep the spare descriptor the guard takes a connection with; call once at start. */
void accept_guard_init(void);
/* Calls on fd see EMFILE as it is (a listener that pauses by itself: the side channel). */
void accept_guard_passthrough(int fd);
/* Connections refused for want of a descriptor so far. */
unsigned long accept_guard_dropped(void);
