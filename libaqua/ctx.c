/*
 * The context's small state: queued events, requests waiting for a reply, what a restart hands
 * back. Below the session (session.c) and the public calls (calls.c), which use it; it calls
 * neither.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "time-util.h"

uint64_t ctx_deadline(const aqua_ctx *ctx)
{
        return now_mono_ns() + (uint64_t)ctx->timeout_ms * NSEC_PER_MSEC;
}

int ctx_push_event(aqua_ctx *ctx, const struct aqua_event *ev)
{
        if (ctx->ev_n == ctx->ev_cap) {
                size_t cap = ctx->ev_cap ? ctx->ev_cap * 2 : 16;
                struct aqua_event *a = malloc(cap * sizeof(*a));

                if (!a)
                        return -ENOMEM;
                for (size_t i = 0; i < ctx->ev_n; i++)
                        a[i] = ctx->events[(ctx->ev_head + i) % ctx->ev_cap];
                free(ctx->events);
                ctx->events = a;
                ctx->ev_cap = cap;
                ctx->ev_head = 0;
        }
        ctx->events[(ctx->ev_head + ctx->ev_n++) % ctx->ev_cap] = *ev;
        return 0;
}

void ctx_forget_lease_events(aqua_ctx *ctx, const aqua_lease *lease)
{
        size_t kept = 0;

        for (size_t i = 0; i < ctx->ev_n; i++) {
                struct aqua_event ev = ctx->events[(ctx->ev_head + i) % ctx->ev_cap];

                if (ev.lease != lease)
                        ctx->events[(ctx->ev_head + kept++) % ctx->ev_cap] = ev;
        }
        ctx->ev_n = kept;
}

void ctx_forget_tensor_events(aqua_ctx *ctx, const struct aqua_tensor *t)
{
        size_t kept = 0;

        for (size_t i = 0; i < ctx->ev_n; i++) {
                struct aqua_event ev = ctx->events[(ctx->ev_head + i) % ctx->ev_cap];

                if (ev.tensor != t)
                        ctx->events[(ctx->ev_head + kept++) % ctx->ev_cap] = ev;
        }
        ctx->ev_n = kept;
}

int ctx_add_pending(aqua_ctx *ctx, uint64_t request_id, enum pending_kind kind, uint64_t arg)
{
        if (ctx->n_pending == ctx->cap_pending) {
                size_t cap = ctx->cap_pending ? ctx->cap_pending * 2 : 8;
                struct ctx_pending *a = realloc(ctx->pending, cap * sizeof(*a));

                if (!a)
                        return -ENOMEM;
                ctx->pending = a;
                ctx->cap_pending = cap;
        }
        ctx->pending[ctx->n_pending++] =
            (struct ctx_pending){.request_id = request_id, .kind = kind, .arg = arg};
        return 0;
}

bool ctx_take_pending(aqua_ctx *ctx, uint64_t request_id, struct ctx_pending *ret)
{
        for (size_t i = 0; i < ctx->n_pending; i++)
                if (ctx->pending[i].request_id == request_id) {
                        *ret = ctx->pending[i];
                        ctx->pending[i] = ctx->pending[--ctx->n_pending];
                        return true;
                }
        return false;
}

void held_clear(struct held *h)
{
        if (h->fds)
                side_close_fds(h->fds, h->n);
        free(h->items);
        free(h->ptrs);
        free(h->fds);
        free(h->fabric);
        free(h->ids);
        *h = (struct held){0};
}
