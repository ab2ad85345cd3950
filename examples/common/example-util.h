/*
 * What the examples share besides libaqua: cleanup attributes, MIN/MAX, checked sizes and
 * clocks. Kept here (not in the project's internal library) so that each example builds
 * against <aqua/aqua.h> alone.
 */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define ARRAY_SIZE(a)  (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b)      ((a) < (b) ? (a) : (b))
#define MAX(a, b)      ((a) > (b) ? (a) : (b))

static inline void freep(void *p)
{
        free(*(void **)p);
}
#define _cleanup_(f)   __attribute__((cleanup(f)))
#define _cleanup_free_ _cleanup_(freep)

static inline void closep(int *fd)
{
        if (*fd >= 0) {
                int saved = errno;
                close(*fd);
                errno = saved;
        }
}
#define _cleanup_close_ _cleanup_(closep)

/* Hand a cleanup-managed pointer to the caller. */
#define TAKE_PTR(p)                                                                                \
        ({                                                                                         \
                __typeof__(p) _tmp_ = (p);                                                         \
                (p) = NULL;                                                                        \
                _tmp_;                                                                             \
        })

static inline bool size_mul_overflows(size_t a, size_t b, size_t *ret)
{
        return __builtin_mul_overflow(a, b, ret);
}

static inline bool size_add_overflows(size_t a, size_t b, size_t *ret)
{
        return __builtin_add_overflow(a, b, ret);
}

#define NSEC_PER_USEC UINT64_C(1000)
#define NSEC_PER_MSEC UINT64_C(1000000)
#define NSEC_PER_SEC  UINT64_C(1000000000)

static inline uint64_t now_mono_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

/* Sleep for ns, resuming after signals. */
static inline void sleep_ns(uint64_t ns)
{
        struct timespec ts = {(time_t)(ns / NSEC_PER_SEC), (long)(ns % NSEC_PER_SEC)};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}
