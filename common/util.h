/* Small helpers every part of aqua shares: cleanup attributes, error conventions, arithmetic. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

/*
 * Error conventions. Functions return int:
 *   0            success
 *   negative     a negative errno; fatal for the operation, passed up unchanged
 *   positive     a named, expected outcome the caller must handle (each module
 *                defines its own, e.g. CONF_E_INVALID), never an errno.
 */

#define _cleanup_(f) __attribute__((cleanup(f)))
#define _unused_     __attribute__((unused))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _public_     __attribute__((visibility("default")))
#define _likely_(x)  __builtin_expect(!!(x), 1)
#define _unlikely_(x) __builtin_expect(!!(x), 0)

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b)     ((a) < (b) ? (a) : (b))
#define MAX(a, b)     ((a) > (b) ? (a) : (b))

/* Round x up to a multiple of the power of two a. */
#define ALIGN_UP(x, a) (((x) + ((a) - 1)) & ~((__typeof__(x))(a) - 1))

static inline void freep(void *p)
{
        free(*(void **)p);
}
#define _cleanup_free_ _cleanup_(freep)

static inline int safe_close(int fd)
{
        if (fd >= 0) {
                int saved = errno;
                close(fd);
                errno = saved;
        }
        return -1;
}

static inline void closep(int *fd)
{
        safe_close(*fd);
}
#define _cleanup_close_ _cleanup_(closep)

/* Hand ownership of a cleanup-managed pointer to the caller. */
#define TAKE_PTR(p)                          \
        ({                                   \
                __typeof__(p) _tmp_ = (p);   \
                (p) = NULL;                  \
                _tmp_;                       \
        })

#define TAKE_FD(fd)                      \
        ({                               \
                int _tmp_ = (fd);        \
                (fd) = -1;               \
                _tmp_;                   \
        })

/* Generate foo_freep() for a destructor foo_free(T *) so locals can be _cleanup_(foo_freep). */
#define DEFINE_TRIVIAL_CLEANUP_FUNC(type, func) \
        static inline void func##p(type *p)     \
        {                                       \
                if (*p)                         \
                        func(*p);               \
        }

/* Overflow-checked arithmetic for sizes that come from the outside. */
static inline bool size_mul_overflows(size_t a, size_t b, size_t *ret)
{
        return __builtin_mul_overflow(a, b, ret);
}
static inline bool size_add_overflows(size_t a, size_t b, size_t *ret)
{
        return __builtin_add_overflow(a, b, ret);
}
