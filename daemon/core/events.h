/* A bounded ring of recent events (leases, reclaims, deadline misses, clients) for aquactl. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define EVENTS_DEFAULT_SIZE 256
#define EVENT_KIND_MAX      24
#define EVENT_TEXT_MAX      200

struct event {
        uint64_t time_ms; /* wall clock */
        char kind[EVENT_KIND_MAX];
        char text[EVENT_TEXT_MAX];
};

struct events {
        struct event *ring;
        size_t size;  /* capacity */
        size_t head;  /* next slot to write */
        size_t count; /* valid entries, at most size */
        uint64_t total;
};

int events_init(struct events *e, size_t size);
void events_deinit(struct events *e);
/* Record an event, dropping the oldest when full. Text longer than EVENT_TEXT_MAX is cut. */
void events_add(struct events *e, const char *kind, const char *fmt, ...) _printf_(3, 4);
/* The i-th oldest retained event, 0 <= i < e->count. */
const struct event *events_get(const struct events *e, size_t i);
