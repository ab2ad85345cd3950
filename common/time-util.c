/* Monotonic and wall clock helpers. */
#include "time-util.h"

#include <errno.h>
#include <limits.h>
#include <time.h>

static uint64_t clock_ns(clockid_t id)
{
        struct timespec ts;

        clock_gettime(id, &ts);
        return (uint64_t)ts.tv_sec * NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

uint64_t now_mono_ns(void)
{
        return clock_ns(CLOCK_MONOTONIC);
}

uint64_t now_real_ns(void)
{
        return clock_ns(CLOCK_REALTIME);
}

int ms_until(uint64_t deadline_ns)
{
        uint64_t now = now_mono_ns();
        uint64_t ms;

        if (deadline_ns <= now)
                return 0;
        ms = (deadline_ns - now + NSEC_PER_MSEC - 1) / NSEC_PER_MSEC;
        return ms > INT_MAX ? INT_MAX : (int)ms;
}

void sleep_ns(uint64_t ns)
{
        struct timespec ts = {.tv_sec = (time_t)(ns / NSEC_PER_SEC),
                              .tv_nsec = (long)(ns % NSEC_PER_SEC)};

        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}
