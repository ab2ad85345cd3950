/* The pool of server configurations and turning chosen configurations into a placement. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "configs.h"

void configs_done(struct configs *c)
{
        free(c->a);
        free(c->mem);
        free(c->bal);
        free(c->kind);
        *c = (struct configs){.n_types = c->n_types, .max = c->max};
}

int configs_push(struct configs *c, const uint8_t *a, int64_t mem, int bal, unsigned kind)
{
        if (c->n >= c->max)
                return -E2BIG;
        if (c->n == c->cap) {
                size_t cap = c->cap ? 2 * c->cap : 1024;
                uint8_t *na = realloc(c->a, cap * c->n_types + 1);
                int64_t *nm;
                int *nb;
                unsigned *nk;

                if (!na)
                        return -ENOMEM;
                c->a = na;
                nm = realloc(c->mem, cap * sizeof(*nm));
                if (!nm)
                        return -ENOMEM;
                c->mem = nm;
                nb = realloc(c->bal, cap * sizeof(*nb));
                if (!nb)
                        return -ENOMEM;
                c->bal = nb;
                nk = realloc(c->kind, cap * sizeof(*nk));
                if (!nk)
                        return -ENOMEM;
                c->kind = nk;
                c->cap = cap;
        }
        memcpy(c->a + c->n * c->n_types, a, c->n_types);
        c->mem[c->n] = mem;
        c->bal[c->n] = bal;
        c->kind[c->n] = kind;
        c->n++;
        return 0;
}

long configs_find(const struct configs *c, const uint8_t *a, unsigned kind)
{
        for (size_t i = 0; i < c->n; i++)
                if (c->kind[i] == kind && memcmp(c->a + i * c->n_types, a, c->n_types) == 0)
                        return (long)i;
        return -1;
}

int configs_deal(const struct place_problem *p, const struct configs *c, const long *x,
                 unsigned *server_of)
{
        _cleanup_free_ unsigned *next_server = calloc(p->n_kinds + 1, sizeof(unsigned));
        _cleanup_free_ unsigned *first = calloc(p->n_types + 1, sizeof(unsigned));
        _cleanup_free_ unsigned *next = calloc(p->n_types + 1, sizeof(unsigned));
        _cleanup_free_ unsigned *order = calloc(p->n_models + 1, sizeof(unsigned));

        if (!next_server || !first || !next || !order)
                return -ENOMEM;
        /* Models grouped by type, each group in problem order. */
        for (unsigned t = 0; t + 1 < p->n_types; t++)
                first[t + 1] = first[t] + p->types[t].count;
        for (unsigned i = 0; i < p->n_models; i++) {
                unsigned t = p->models[i].type;
                order[first[t] + next[t]++] = i;
        }
        memset(next, 0, (p->n_types + 1) * sizeof(unsigned));
        for (size_t i = 0; i < c->n; i++) {
                unsigned k = c->kind[i];

                for (long n = 0; n < x[i]; n++) {
                        unsigned server = p->kinds[k].first_server + next_server[k]++;

                        if (next_server[k] > p->kinds[k].n_servers)
                                return -EINVAL;
                        for (unsigned t = 0; t < p->n_types; t++)
                                for (unsigned m = 0; m < c->a[i * c->n_types + t]; m++) {
                                        if (next[t] >= p->types[t].count)
                                                return -EINVAL;
                                        server_of[order[first[t] + next[t]++]] = server;
                                }
                }
        }
        for (unsigned t = 0; t < p->n_types; t++)
                if (next[t] != p->types[t].count)
                        return -EINVAL;
        return 0;
}

size_t lower_index(const int64_t *v, size_t n, int64_t x)
{
        size_t lo = 0, hi = n;

        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (v[mid] < x)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return lo;
}

void place_average_bounds(const struct place_problem *p, int64_t *ret_memory, int *ret_balance)
{
        int64_t mem = 0;
        long bal = 0;

        for (unsigned i = 0; i < p->n_models; i++) {
                mem += p->types[p->models[i].type].memory;
                bal += p->types[p->models[i].type].balance;
        }
        mem = mem < 0 ? -mem : mem;
        bal = bal < 0 ? -bal : bal;
        *ret_memory = (mem + p->n_servers - 1) / p->n_servers;
        *ret_balance = (int)((bal + p->n_servers - 1) / p->n_servers);
}
