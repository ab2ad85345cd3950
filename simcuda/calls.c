/*
 * How many times this process called each Driver API entry point, for benchmarks that count
 * driver calls: simcudaGetCallCount() answers in process, AQUA_SIM_CALLS=FILE writes them at exit.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

static _Atomic(struct sim_counter *) counters;
static atomic_bool dump_armed;

/* "cuMemGetInfo" names cuMemGetInfo_v2 too: cuda.h maps names to versioned symbols. */
static bool name_matches(const char *entry, const char *name)
{
        size_t n = strlen(name);

        return strncmp(entry, name, n) == 0 &&
               (entry[n] == 0 || (entry[n] == '_' && entry[n + 1] == 'v'));
}

static void calls_dump(void)
{
        const char *path = getenv("AQUA_SIM_CALLS");
        FILE *f;

        if (!path || !*path)
                return;
        f = strcmp(path, "-") == 0 ? stderr : fopen(path, "we");
        if (!f)
                return;
        for (struct sim_counter *c = atomic_load(&counters); c; c = c->next)
                fprintf(f, "%s %llu\n", c->name, (unsigned long long)atomic_load(&c->n));
        if (f != stderr)
                fclose(f);
}

void sim_count(struct sim_counter *c)
{
        bool no = false;

        atomic_fetch_add_explicit(&c->n, 1, memory_order_relaxed);
        if (atomic_load_explicit(&c->linked, memory_order_acquire) ||
            !atomic_compare_exchange_strong(&c->linked, &no, true))
                return;
        /* First call of this entry point: put its counter on the list (lock-free push). */
        c->next = atomic_load(&counters);
        while (!atomic_compare_exchange_weak(&counters, &c->next, c)) {
        }
        no = false;
        if (atomic_compare_exchange_strong(&dump_armed, &no, true))
                atexit(calls_dump);
}

/*
 * Calls of the entry point `name` (its cuda.h name, e.g. "cuMemcpyBatchAsync") so far in this
 * process; NULL: all entry points together. Not part of the CUDA Driver API: find it with dlsym.
 */
__attribute__((visibility("default"))) unsigned long long simcudaGetCallCount(const char *name)
{
        unsigned long long n = 0;

        for (struct sim_counter *c = atomic_load(&counters); c; c = c->next)
                if (!name || name_matches(c->name, name))
                        n += atomic_load(&c->n);
        return n;
}
