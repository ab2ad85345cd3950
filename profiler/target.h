/* What the profiler drives: a real HTTP endpoint or the built-in engine model, behind one interface. */
#pragma once

#include <signal.h>
#include <stdint.h>

#include "measure.h"
#include "workload.h"

/* Named outcomes of target_run(). */
enum {
        TARGET_E_CANCELLED = 1, /* *cancel became non-zero; the run holds what was seen so far */
};

struct target;

struct target_ops {
        const char *name;
        /* Replay load; fill *ret_run (always initialised on return, even on error). */
        int (*run)(struct target *t, const struct load *load, const volatile sig_atomic_t *cancel,
                   struct run *ret_run);
        void (*free)(struct target *t);
};

struct target {
        const struct target_ops *ops;
        uint64_t kv_bytes_per_token;
        uint64_t kv_capacity; /* bytes of KV cache the engine holds on the GPU(s) */
};

static inline int target_run(struct target *t, const struct load *load,
                             const volatile sig_atomic_t *cancel, struct run *ret_run)
{
        return t->ops->run(t, load, cancel, ret_run);
}

static inline struct target *target_free(struct target *t)
{
        if (t)
                t->ops->free(t);
        return NULL;
}

static inline void target_freep(struct target **t)
{
        target_free(*t);
}
