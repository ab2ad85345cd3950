/* Intrusive doubly linked lists: an object links into as many lists as it has list_node members. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

struct list_node {
        struct list_node *prev, *next;
};

/* A list head is a node pointing at itself when empty. */
#define LIST_HEAD_INIT(h)                                                                          \
        {                                                                                          \
                &(h), &(h)                                                                         \
        }

static inline void list_init(struct list_node *h)
{
        h->prev = h->next = h;
}

static inline bool list_empty(const struct list_node *h)
{
        return h->next == h;
}

/* Whether n is linked into some list (unlinked nodes are kept self-pointing or zeroed). */
static inline bool list_linked(const struct list_node *n)
{
        return n->next && n->next != n;
}

static inline void list_append(struct list_node *h, struct list_node *n)
{
        n->prev = h->prev;
        n->next = h;
        h->prev->next = n;
        h->prev = n;
}

static inline void list_unlink(struct list_node *n)
{
        if (!list_linked(n))
                return;
        n->prev->next = n->next;
        n->next->prev = n->prev;
        n->prev = n->next = n;
}

static inline size_t list_length(const struct list_node *h)
{
        size_t n = 0;

        for (const struct list_node *i = h->next; i != h; i = i->next)
                n++;
        return n;
}

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#define list_entry(n, type, member) container_of(n, type, member)

/* Iterate safely against removal of the current entry. */
#define list_for_each(pos, tmp, head)                                                              \
        for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head);                           \
             (pos) = (tmp), (tmp) = (pos)->next)
