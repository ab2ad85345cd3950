/*
 * What a domain's journal in etcd keeps in memory (journal-etcd.c): a map of keys to values, and
 * a page of chunks decoded from its JChunkPage (runs of alike chunks) and encoded back.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "journal.pb-c.h"

/* The chunks of one page: ids PAGE << PAGE_SHIFT ... + (1 << PAGE_SHIFT) - 1. */
#define PAGE_SHIFT 9

/* A chunk as a page holds it. */
struct jc {
        uint64_t id, size, client_ref, lease_id, deadline_ms, qstart;
        uint32_t qpid;
        bool reclaiming, orphan, dirty, quarantined, qback;
        char *producer, *qboot;
};

struct page {
        struct jc *v; /* sorted by id */
        size_t n, alloc;
};

/* A key: in the mirror, what etcd holds; pending, what the next commit writes. */
struct entry {
        struct entry *next;
        char *key;
        uint8_t *value; /* NULL with present false: absent (pending: to delete) */
        size_t len;
        bool present;
        bool unknown;      /* mirror: an attempt that may have landed wrote it */
        struct page *page; /* pending chunk page, decoded */
};

struct map {
        struct entry **b;
        size_t n_b, n;
};

struct entry *map_get(const struct map *m, const char *key);
/* The entry of key, made (absent) when there is none; NULL: out of memory. */
struct entry *map_ensure(struct map *m, const char *key);
void map_remove(struct map *m, const char *key);
void map_clear(struct map *m);
/* Every entry, in no order; the body may not add to or remove from the map. */
#define MAP_FOREACH(m, e)                                                                          \
        for (size_t _i = 0; _i < (m)->n_b; _i++)                                                   \
                for (struct entry *e = (m)->b[_i]; e; e = e->next)
/* e's value a copy of value (NULL: absent). */
int entry_set(struct entry *e, const uint8_t *value, size_t len);

void page_free(struct page *p);
/* A page from its JChunkPage (NULL: an empty page); -EBADMSG when it does not decode. */
int page_decode(const uint8_t *value, size_t len, struct page **ret);
/* The page packed: *ret NULL (and *ret_len 0) when it holds no chunk. */
int page_encode(const struct page *p, uint8_t **ret, size_t *ret_len);
int page_set(struct page *p, const Aquaj__JChunk *c);
void page_del(struct page *p, uint64_t id);
/* Chunk i of the page as a JChunk whose strings are the page's. */
void page_chunk(const struct page *p, size_t i, Aquaj__JChunk *ret);
