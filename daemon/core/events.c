/* The event ring: fixed memory, oldest entries overwritten. */
#include "events.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "time-util.h"

int events_init(struct events *e, size_t size)
{
        *e = (struct events){0};
        e->ring = calloc(size ? size : 1, sizeof(*e->ring));
        if (!e->ring)
                return -ENOMEM;
        e->size = size ? size : 1;
        return 0;
}

void events_deinit(struct events *e)
{
        free(e->ring);
        *e = (struct events){0};
}

void events_add(struct events *e, const char *kind, const char *fmt, ...)
{
        struct event *ev;
        va_list ap;

        if (!e->ring)
                return;
        ev = &e->ring[e->head];
        ev->time_ms = now_real_ns() / NSEC_PER_MSEC;
        snprintf(ev->kind, sizeof(ev->kind), "%s", kind);
        va_start(ap, fmt);
        vsnprintf(ev->text, sizeof(ev->text), fmt, ap);
        va_end(ap);
        e->head = (e->head + 1) % e->size;
        if (e->count < e->size)
                e->count++;
        e->total++;
}

const struct event *events_get(const struct events *e, size_t i)
{
        if (i >= e->count)
                return NULL;
        return &e->ring[(e->head + e->size - e->count + i) % e->size];
}
