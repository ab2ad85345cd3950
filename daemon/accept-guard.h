/*
 * The aquad executable's accept() and accept4(): out of descriptors, a refused connection and
 * EAGAIN instead of EMFILE, so that libzmq's listeners never abort the process; and a share of
 * local (AF_UNIX) connections per user, so that one user's idle ZeroMQ connections cannot use
 * up the descriptors every other user's clients need.
 */
#pragma once

/* Keep the spare descriptor the guard takes a connection with; call once at start. */
void accept_guard_init(void);
/* Calls on fd see EMFILE as it is (a listener that pauses by itself: the side channel). */
void accept_guard_passthrough(int fd);
/* Connections refused for want of a descriptor so far. */
unsigned long accept_guard_dropped(void);
/*
 * At most max AF_UNIX connections held by one user at once (0: no limit); root and this
 * process's user have no share. A connection past it is closed as it is accepted (its client
 * sees it end and ZeroMQ tries again later), the caller told EAGAIN.
 */
void accept_guard_share(long max);
/* Connections closed over a user's share so far. */
unsigned long accept_guard_share_refused(void);
