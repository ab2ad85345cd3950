/* A map from the daemon's 64-bit ids (never 0) to pointers: chunks and leases by id. */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct idmap {
        uint64_t *keys; /* 0: empty slot */
        void **values;
        size_t n, cap; /* cap is 0 or a power of two */
};

/* Insert or replace. Returns 0 or -ENOMEM. */
int idmap_put(struct idmap *m, uint64_t key, void *value);
void *idmap_get(const struct idmap *m, uint64_t key);
/* Remove key; returns its value or NULL. */
void *idmap_remove(struct idmap *m, uint64_t key);
void idmap_clear(struct idmap *m);
