/*
 * libaqua-torch.so: PyTorch's pluggable-allocator entry points over an aqua arena, so that
 * tensors of a torch.cuda.MemPool live in borrowed memory (aqua.torch loads this library, binds
 * a context and an arena, and hands torch the two functions below).
 *
 * torch calls these from any thread, while libaqua's context is not thread-safe: every call into
 * the bound context goes through one lock, and the engine polls through aqua_torch_poll() to
 * take the same lock.
 */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "aqua/aqua.h"

#define TORCH_API __attribute__((visibility("default")))

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static aqua_ctx *bound_ctx;
static aqua_arena *bound_arena;
static int bound_device = -1;

/* Bind (or with NULLs, unbind) the context and arena allocations come from. 0 or -EINVAL. */
TORCH_API int aqua_torch_bind(aqua_ctx *ctx, aqua_arena *arena, int device)
{
        if (!ctx != !arena)
                return -EINVAL;
        pthread_mutex_lock(&lock);
        bound_ctx = ctx;
        bound_arena = arena;
        bound_device = ctx ? device : -1;
        pthread_mutex_unlock(&lock);
        return 0;
}

/* torch's alloc_fn: NULL when nothing is bound, for another device, or the arena is full
 * (torch then raises its out-of-memory error). The stream does not matter: the memory is
 * usable on every stream of the device as soon as it is mapped. */
TORCH_API void *aqua_torch_alloc(ssize_t size, int device, void *stream)
{
        uint64_t dptr = 0;
        int r = -ENODEV;

        (void)stream;
        if (size <= 0)
                return NULL;
        pthread_mutex_lock(&lock);
        if (bound_arena && device == bound_device)
                r = aqua_arena_alloc(bound_arena, (uint64_t)size, &dptr);
        pthread_mutex_unlock(&lock);
        return r == 0 ? (void *)(uintptr_t)dptr : NULL;
}

/* torch's free_fn: torch frees a segment only once the work that used it is done. */
TORCH_API void aqua_torch_free(void *ptr, ssize_t size, int device, void *stream)
{
        (void)size;
        (void)device;
        (void)stream;
        pthread_mutex_lock(&lock);
        if (bound_arena)
                (void)aqua_arena_release(bound_arena, (uint64_t)(uintptr_t)ptr);
        pthread_mutex_unlock(&lock);
}

/* aqua_poll() on the bound context under the allocator's lock (-ENOTCONN: nothing bound). */
TORCH_API int aqua_torch_poll(struct aqua_event *events, size_t n_events, size_t *ret_n)
{
        int r = -ENOTCONN;

        pthread_mutex_lock(&lock);
        if (bound_ctx)
                r = aqua_poll(bound_ctx, events, n_events, ret_n);
        pthread_mutex_unlock(&lock);
        return r;
}

/* What the arena holds, under the lock; 0, -ENOTCONN, or aqua_arena_get_info()'s errors. */
TORCH_API int aqua_torch_info(struct aqua_arena_info *ret)
{
        int r = -ENOTCONN;

        pthread_mutex_lock(&lock);
        if (bound_arena)
                r = aqua_arena_get_info(bound_arena, ret);
        pthread_mutex_unlock(&lock);
        return r;
}
