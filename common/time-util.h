/* Monotonic and wall clock helpers in nanoseconds. */
#pragma once

#include <stdint.h>

#define NSEC_PER_USEC UINT64_C(1000)
#define NSEC_PER_MSEC UINT64_C(1000000)
#define NSEC_PER_SEC  UINT64_C(1000000000)
#define USEC_PER_SEC  UINT64_C(1000000)
#define MSEC_PER_SEC  UINT64_C(1000)

/* CLOCK_MONOTONIC: for deadlines, timeouts and intervals. */
uint64_t now_mono_ns(void);
/* CLOCK_REALTIME: only for timestamps shown to people or written to journals. */
uint64_t now_real_ns(void);
/* Milliseconds until deadline_ns (monotonic), 0 if it has passed; for poll(2)-style timeouts. */
int ms_until(uint64_t deadline_ns);
/* Sleep for ns nanoseconds, resuming after signals. */
void sleep_ns(uint64_t ns);
