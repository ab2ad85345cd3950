/* Open addressing with linear probing and backward-shift deletion (no tombstones to age). */
#include "idmap.h"

#include <errno.h>
#include <stdlib.h>

static size_t slot_of(uint64_t key, size_t cap)
{
        /* Ids are often sequential; a multiplicative hash spreads them over the table. */
        return (size_t)((key * UINT64_C(0x9e3779b97f4a7c15)) >> 17) & (cap - 1);
}

static int grow(struct idmap *m)
{
        size_t cap = m->cap ? m->cap * 2 : 64;
        uint64_t *keys = calloc(cap, sizeof(*keys));
        void **values = calloc(cap, sizeof(*values));

        if (!keys || !values) {
                free(keys);
                free(values);
                return -ENOMEM;
        }
        for (size_t i = 0; i < m->cap; i++) {
                size_t s;

                if (!m->keys[i])
                        continue;
                for (s = slot_of(m->keys[i], cap); keys[s]; s = (s + 1) & (cap - 1))
                        ;
                keys[s] = m->keys[i];
                values[s] = m->values[i];
        }
        free(m->keys);
        free(m->values);
        m->keys = keys;
        m->values = values;
        m->cap = cap;
        return 0;
}

int idmap_put(struct idmap *m, uint64_t key, void *value)
{
        size_t s;

        if (key == 0)
                return -EINVAL;
        if ((m->n + 1) * 4 > m->cap * 3) {
                int r = grow(m);
                if (r < 0)
                        return r;
        }
        for (s = slot_of(key, m->cap); m->keys[s]; s = (s + 1) & (m->cap - 1))
                if (m->keys[s] == key) {
                        m->values[s] = value;
                        return 0;
                }
        m->keys[s] = key;
        m->values[s] = value;
        m->n++;
        return 0;
}

static size_t find(const struct idmap *m, uint64_t key)
{
        if (m->cap == 0 || key == 0)
                return SIZE_MAX;
        for (size_t s = slot_of(key, m->cap); m->keys[s]; s = (s + 1) & (m->cap - 1))
                if (m->keys[s] == key)
                        return s;
        return SIZE_MAX;
}

void *idmap_get(const struct idmap *m, uint64_t key)
{
        size_t s = find(m, key);

        return s == SIZE_MAX ? NULL : m->values[s];
}

void *idmap_remove(struct idmap *m, uint64_t key)
{
        size_t s = find(m, key), mask = m->cap - 1;
        void *v;

        if (s == SIZE_MAX)
                return NULL;
        v = m->values[s];
        /* Shift later members of the probe run back so lookups never stop at a hole early. */
        for (size_t j = (s + 1) & mask; m->keys[j]; j = (j + 1) & mask) {
                size_t home = slot_of(m->keys[j], m->cap);

                if (((j - home) & mask) >= ((j - s) & mask)) {
                        m->keys[s] = m->keys[j];
                        m->values[s] = m->values[j];
                        s = j;
                }
        }
        m->keys[s] = 0;
        m->values[s] = NULL;
        m->n--;
        return v;
}

void idmap_clear(struct idmap *m)
{
        free(m->keys);
        free(m->values);
        *m = (struct idmap){0};
}
