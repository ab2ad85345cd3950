/*
 * Streams and events. Each stream is a queue run in order by its own worker thread, asynchronous
 * to the caller; events mark a point in a stream's queue. One lock and one condition variable
 * cover all of them: progress anywhere wakes every waiter, which rechecks its own condition.
 * Streams and events belong to the context (and its epoch) they were made in; a context that
 * faulted runs no more work, as a GPU context with a sticky error does not.
 */
#include <signal.h>
#include <string.h>
#include <time.h>

#include "sim.h"

/* OP_FAULT: work the device cannot do (memory it has no access to): running it faults. */
enum op_type { OP_COPY, OP_SET, OP_RECORD, OP_WAIT, OP_HOST, OP_FAULT };

struct op {
        struct op *next;
        enum op_type type;
        uint64_t seq;
        union {
                struct {
                        struct sim_piece *pieces;
                        size_t n;
                        void *staging;
                } copy;
                struct {
                        void *dst;
                        size_t n;
                        unsigned char value;
                } set;
                struct {
                        struct CUevent_st *ev;
                        uint64_t gen;
                } record;
                struct {
                        struct CUstream_st *stream;
                        uint64_t seq;
                } wait;
                struct {
                        CUhostFn fn;
                        void *data;
                } host;
        };
};

struct CUstream_st {
        struct CUctx_st *ctx;
        unsigned epoch;           /* of ctx, when made */
        struct CUstream_st *next; /* in ctx->streams */
        unsigned flags;
        bool legacy; /* the context's default stream */
        bool destroyed;
        bool running; /* the worker is running head, without the lock */
        unsigned refs;
        uint64_t enqueued, completed; /* op sequence numbers */
        struct op *head, *tail;
};

struct CUevent_st {
        struct CUctx_st *ctx;
        unsigned epoch; /* of ctx, when made */
        unsigned flags;
        unsigned refs;
        struct CUstream_st *stream; /* where last recorded; NULL if never */
        uint64_t seq;               /* complete once stream->completed reaches it */
        uint64_t gen;               /* which record the pending stamp belongs to */
        bool stamped;
        struct timespec stamp;
};

#define LOCK()   pthread_mutex_lock(&sim.stream_lock)
#define UNLOCK() pthread_mutex_unlock(&sim.stream_lock)
#define WAIT()   pthread_cond_wait(&sim.progress, &sim.stream_lock)
#define WAKE()   pthread_cond_broadcast(&sim.progress)

static void stream_unref_locked(struct CUstream_st *s)
{
        if (--s->refs > 0)
                return;
        for (struct CUstream_st **p = &s->ctx->streams; *p; p = &(*p)->next)
                if (*p == s) {
                        *p = s->next;
                        break;
                }
        free(s);
}

static void event_unref_locked(struct CUevent_st *e)
{
        if (--e->refs > 0)
                return;
        if (e->stream)
                stream_unref_locked(e->stream);
        free(e);
}

static void op_free_locked(struct op *op)
{
        switch (op->type) {
        case OP_COPY:
                free(op->copy.pieces);
                free(op->copy.staging);
                break;
        case OP_RECORD:
                event_unref_locked(op->record.ev);
                break;
        case OP_WAIT:
                stream_unref_locked(op->wait.stream);
                break;
        default:
                break;
        }
        free(op);
}

static void op_run(struct op *op)
{
        switch (op->type) {
        case OP_COPY:
                for (size_t i = 0; i < op->copy.n; i++)
                        memmove(op->copy.pieces[i].dst, op->copy.pieces[i].src,
                                op->copy.pieces[i].size);
                break;
        case OP_SET:
                memset(op->set.dst, op->set.value, op->set.n);
                break;
        case OP_HOST:
                op->host.fn(op->host.data);
                break;
        default:
                break;
        }
}

CUresult sim_ctx_usable_locked(const struct CUctx_st *ctx)
{
        if (ctx->retains == 0)
                return CUDA_ERROR_CONTEXT_IS_DESTROYED;
        return ctx->sticky;
}

static CUresult ctx_usable(struct CUctx_st *ctx, struct CUctx_st **ret)
{
        CUresult res;

        if (!ctx)
                return CUDA_ERROR_INVALID_CONTEXT;
        LOCK();
        res = sim_ctx_usable_locked(ctx);
        UNLOCK();
        if (res == CUDA_SUCCESS)
                *ret = ctx;
        return res;
}

CUresult sim_ctx_get(struct CUctx_st **ret)
{
        return ctx_usable(sim_current_ctx(), ret);
}

CUresult sim_ctx_named(CUcontext ctx, struct CUctx_st **ret)
{
        bool known = false;

        if (!ctx)
                return sim_ctx_get(ret);
        for (int i = 0; i < sim.n_devices && !known; i++)
                known = sim.devices[i].primary == ctx;
        return known ? ctx_usable(ctx, ret) : CUDA_ERROR_INVALID_CONTEXT;
}

/* A handle from an epoch of its context that has ended names nothing any more. */
static CUresult stream_usable_locked(const struct CUstream_st *s)
{
        if (s->epoch != s->ctx->epoch)
                return CUDA_ERROR_INVALID_HANDLE;
        return sim_ctx_usable_locked(s->ctx);
}

CUresult sim_stream_check(struct CUstream_st *s)
{
        CUresult res;

        LOCK();
        res = stream_usable_locked(s);
        UNLOCK();
        return res;
}

static CUresult event_usable_locked(const struct CUevent_st *e)
{
        if (e->epoch != e->ctx->epoch)
                return CUDA_ERROR_INVALID_HANDLE;
        return sim_ctx_usable_locked(e->ctx);
}

int sim_stream_device(const struct CUstream_st *s)
{
        return s->ctx->device;
}

static bool overlaps(const void *p, size_t n, uintptr_t lo, uintptr_t hi)
{
        return n && (uintptr_t)p < hi && (uintptr_t)p + n > lo;
}

/* Does op reach into [lo, hi) (only by writing, when write_only)? */
static bool op_touches(const struct op *op, uintptr_t lo, uintptr_t hi, bool write_only)
{
        switch (op->type) {
        case OP_COPY:
                for (size_t i = 0; i < op->copy.n; i++) {
                        const struct sim_piece *p = &op->copy.pieces[i];

                        if (overlaps(p->dst, p->size, lo, hi) ||
                            (!write_only && overlaps(p->src, p->size, lo, hi)))
                                return true;
                }
                return false;
        case OP_SET:
                return overlaps(op->set.dst, op->set.n, lo, hi);
        default:
                return false;
        }
}

static void *worker(void *arg)
{
        struct CUstream_st *s = arg;

        LOCK();
        for (;;) {
                struct op *op;

                while (!s->head && !s->destroyed)
                        WAIT();
                op = s->head;
                if (!op)
                        break;
                if (op->type == OP_WAIT) {
                        while (op->wait.stream->completed < op->wait.seq)
                                WAIT();
                } else if (op->type == OP_RECORD) {
                        struct CUevent_st *e = op->record.ev;

                        if (e->gen == op->record.gen) {
                                clock_gettime(CLOCK_MONOTONIC, &e->stamp);
                                e->stamped = true;
                        }
                } else if (op->type == OP_FAULT) {
                        if (s->ctx->sticky == CUDA_SUCCESS)
                                s->ctx->sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
                } else if (s->ctx->sticky == CUDA_SUCCESS) {
                        /* After a fault the context runs nothing more; the queue just drains. */
                        s->running = true;
                        UNLOCK();
                        op_run(op);
                        LOCK();
                        s->running = false;
                }
                s->head = op->next;
                if (!s->head)
                        s->tail = NULL;
                s->completed = op->seq;
                op_free_locked(op);
                WAKE();
        }
        stream_unref_locked(s);
        UNLOCK();
        return NULL;
}

/* A new stream with its worker; the caller holds one reference, the worker another. */
static CUresult stream_new_locked(struct CUctx_st *ctx, unsigned flags, bool legacy,
                                  struct CUstream_st **ret)
{
        struct CUstream_st *s = calloc(1, sizeof(*s));
        sigset_t all, old;
        pthread_attr_t attr;
        pthread_t thread;
        int r;

        if (!s)
                return CUDA_ERROR_OUT_OF_MEMORY;
        s->ctx = ctx;
        s->epoch = ctx->epoch;
        s->flags = flags;
        s->legacy = legacy;
        s->refs = 2;
        /* Signals meant for the program go to its own threads, never to a stream worker. */
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        r = pthread_create(&thread, &attr, worker, s);
        pthread_attr_destroy(&attr);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (r != 0) {
                free(s);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        s->next = ctx->streams;
        ctx->streams = s;
        *ret = s;
        return CUDA_SUCCESS;
}

CUresult sim_stream_resolve(CUstream h, struct CUctx_st *ctx, struct CUstream_st **ret)
{
        CUresult res = CUDA_SUCCESS;

        if (h && h != CU_STREAM_LEGACY && h != CU_STREAM_PER_THREAD) {
                *ret = h;
                return CUDA_SUCCESS;
        }
        if (!ctx)
                return CUDA_ERROR_INVALID_CONTEXT;
        LOCK();
        res = sim_ctx_usable_locked(ctx);
        if (res == CUDA_SUCCESS && !ctx->null_stream)
                res = stream_new_locked(ctx, 0, true, &ctx->null_stream);
        if (res == CUDA_SUCCESS)
                *ret = ctx->null_stream;
        UNLOCK();
        return res;
}

static void push_locked(struct CUstream_st *s, struct op *op)
{
        op->next = NULL;
        op->seq = ++s->enqueued;
        if (s->tail)
                s->tail->next = op;
        else
                s->head = op;
        s->tail = op;
        WAKE();
}

static CUresult push_wait_locked(struct CUstream_st *s, struct CUstream_st *on, uint64_t seq)
{
        struct op *op = calloc(1, sizeof(*op));

        if (!op)
                return CUDA_ERROR_OUT_OF_MEMORY;
        op->type = OP_WAIT;
        op->wait.stream = on;
        op->wait.seq = seq;
        on->refs++;
        push_locked(s, op);
        return CUDA_SUCCESS;
}

/*
 * Queue op on s, after what the legacy default stream semantics order it behind: work on the
 * default stream waits for every blocking stream, and a blocking stream waits for the default one.
 */
static CUresult enqueue_locked(struct CUstream_st *s, struct op *op)
{
        struct CUstream_st *null = s->ctx->null_stream;
        CUresult res = stream_usable_locked(s);

        if (res != CUDA_SUCCESS)
                return res;
        if (s->legacy) {
                for (struct CUstream_st *b = s->ctx->streams; b; b = b->next) {
                        if (b == s || (b->flags & CU_STREAM_NON_BLOCKING) ||
                            b->completed >= b->enqueued)
                                continue;
                        res = push_wait_locked(s, b, b->enqueued);
                        if (res != CUDA_SUCCESS)
                                return res;
                }
        } else if (!(s->flags & CU_STREAM_NON_BLOCKING) && null &&
                   null->completed < null->enqueued) {
                res = push_wait_locked(s, null, null->enqueued);
                if (res != CUDA_SUCCESS)
                        return res;
        }
        push_locked(s, op);
        return CUDA_SUCCESS;
}

static CUresult enqueue(struct CUstream_st *s, struct op *op)
{
        CUresult res;

        LOCK();
        res = enqueue_locked(s, op);
        UNLOCK();
        if (res != CUDA_SUCCESS) {
                /* Refused (a faulted context, a stale stream): the copy owned its pieces. */
                if (op->type == OP_COPY) {
                        free(op->copy.pieces);
                        free(op->copy.staging);
                }
                free(op);
        }
        return res;
}

CUresult sim_stream_copy(struct CUstream_st *s, struct sim_piece *pieces, size_t n, void *staging)
{
        struct op *op = calloc(1, sizeof(*op));

        if (!op) {
                free(pieces);
                free(staging);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        op->type = OP_COPY;
        op->copy.pieces = pieces;
        op->copy.n = n;
        op->copy.staging = staging;
        return enqueue(s, op);
}

CUresult sim_stream_fault(struct CUstream_st *s)
{
        struct op *op = calloc(1, sizeof(*op));

        if (!op)
                return CUDA_ERROR_OUT_OF_MEMORY;
        op->type = OP_FAULT;
        return enqueue(s, op);
}

CUresult sim_ctx_fault(struct CUctx_st *ctx)
{
        LOCK();
        if (ctx->sticky == CUDA_SUCCESS)
                ctx->sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
        WAKE();
        UNLOCK();
        return CUDA_ERROR_ILLEGAL_ADDRESS;
}

CUresult sim_stream_memset(struct CUstream_st *s, void *dst, unsigned char value, size_t n)
{
        struct op *op = calloc(1, sizeof(*op));

        if (!op)
                return CUDA_ERROR_OUT_OF_MEMORY;
        op->type = OP_SET;
        op->set.dst = dst;
        op->set.value = value;
        op->set.n = n;
        return enqueue(s, op);
}

/* Wait until s has run everything queued on it up to seq, holding a reference meanwhile. */
static void wait_stream_locked(struct CUstream_st *s, uint64_t seq)
{
        s->refs++;
        while (s->completed < seq)
                WAIT();
        stream_unref_locked(s);
}

static bool drains(const struct CUstream_st *s, bool only_blocking)
{
        return !only_blocking || s->legacy || !(s->flags & CU_STREAM_NON_BLOCKING);
}

void sim_stream_drain(struct CUctx_st *ctx, bool only_blocking)
{
        struct {
                struct CUstream_st *s;
                uint64_t seq;
        } *todo = NULL;
        size_t n = 0, cap = 0;

        LOCK();
        /* Snapshot first: the lists may change while this thread sleeps. */
        for (int i = 0; i < sim.n_devices; i++) {
                struct CUctx_st *c = sim.devices[i].primary;

                if (ctx && c != ctx)
                        continue;
                for (struct CUstream_st *s = c->streams; s; s = s->next) {
                        if (!drains(s, only_blocking) || s->completed >= s->enqueued)
                                continue;
                        if (n == cap) {
                                size_t ncap = cap ? cap * 2 : 16;
                                void *p = realloc(todo, ncap * sizeof(*todo));

                                if (!p) { /* fall back to waiting on this one now */
                                        wait_stream_locked(s, s->enqueued);
                                        continue;
                                }
                                todo = p;
                                cap = ncap;
                        }
                        todo[n].s = s;
                        todo[n].seq = s->enqueued;
                        s->refs++;
                        n++;
                }
        }
        for (size_t i = 0; i < n; i++) {
                while (todo[i].s->completed < todo[i].seq)
                        WAIT();
                stream_unref_locked(todo[i].s);
        }
        UNLOCK();
        free(todo);
}

void sim_stream_fault_range(uintptr_t lo, uintptr_t hi, int dev, bool write_only)
{
        bool busy;

        if (!sim.strict) {
                sim_stream_drain(dev < 0 ? NULL : sim.devices[dev].primary, false);
                return;
        }
        LOCK();
        for (int i = 0; i < sim.n_devices; i++) {
                struct CUctx_st *c = sim.devices[i].primary;

                if (dev >= 0 && i != dev)
                        continue;
                for (struct CUstream_st *st = c->streams; st && !c->sticky; st = st->next)
                        for (struct op *op = st->head; op; op = op->next)
                                if (op_touches(op, lo, hi, write_only)) {
                                        c->sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
                                        break;
                                }
        }
        WAKE();
        /* A copy already under way cannot be stopped half-way: let it end before the memory goes.
         */
        do {
                busy = false;
                for (int i = 0; i < sim.n_devices && !busy; i++)
                        for (struct CUstream_st *st = sim.devices[i].primary->streams; st && !busy;
                             st = st->next)
                                busy = st->running && op_touches(st->head, lo, hi, write_only);
                if (busy)
                        WAIT();
        } while (busy);
        UNLOCK();
}

void sim_stream_ctx_destroy(struct CUctx_st *ctx)
{
        struct CUstream_st *null;

        sim_stream_drain(ctx, false);
        LOCK();
        if (ctx->retains > 0) { /* retained again meanwhile */
                UNLOCK();
                return;
        }
        ctx->epoch++;
        ctx->sticky = CUDA_SUCCESS;
        for (struct CUstream_st *st = ctx->streams; st; st = st->next) {
                if (st->destroyed)
                        continue;
                /* The program's handle stays readable (as a dead one) until cuStreamDestroy. */
                if (st != ctx->null_stream)
                        st->refs++;
                st->destroyed = true;
        }
        null = ctx->null_stream;
        ctx->null_stream = NULL;
        if (null)
                stream_unref_locked(null);
        WAKE();
        UNLOCK();
        sim_linear_release_ctx(ctx);
}

SIM_API cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
        SIM_COUNT();
        struct CUctx_st *ctx = sim_current_ctx();
        struct CUstream_st *s;
        CUresult res;

        SIM_CHECK_INIT();
        if (!phStream || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
                return CUDA_ERROR_INVALID_VALUE;
        if (!ctx)
                return CUDA_ERROR_INVALID_CONTEXT;
        LOCK();
        res = sim_ctx_usable_locked(ctx);
        if (res == CUDA_SUCCESS)
                res = stream_new_locked(ctx, Flags, false, &s);
        if (res == CUDA_SUCCESS)
                s->refs--; /* the handle's reference and the worker's are the same until destroy */
        UNLOCK();
        if (res == CUDA_SUCCESS)
                *phStream = s;
        return res;
}

/* Like the real driver, work already queued still runs; the stream goes away after it. */
SIM_API cuStreamDestroy(CUstream hStream)
{
        SIM_COUNT();
        CUresult res = CUDA_SUCCESS;

        SIM_CHECK_INIT();
        if (!hStream || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD)
                return CUDA_ERROR_INVALID_HANDLE;
        LOCK();
        if (hStream->epoch != hStream->ctx->epoch) {
                /* Its context is gone and took the stream along; only the dead handle is left. */
                stream_unref_locked(hStream);
                res = CUDA_ERROR_INVALID_HANDLE;
        } else {
                hStream->destroyed = true;
                WAKE();
        }
        UNLOCK();
        return res;
}

SIM_API cuStreamSynchronize(CUstream hStream)
{
        SIM_COUNT();
        struct CUstream_st *s;
        CUresult res;

        SIM_CHECK_INIT();
        res = sim_stream_resolve(hStream, sim_current_ctx(), &s);
        if (res != CUDA_SUCCESS)
                return res;
        LOCK();
        res = stream_usable_locked(s);
        if (res == CUDA_SUCCESS && !s->legacy)
                wait_stream_locked(s, s->enqueued);
        UNLOCK();
        if (res == CUDA_SUCCESS && s->legacy)
                sim_stream_drain(s->ctx, true);
        if (res != CUDA_SUCCESS)
                return res;
        LOCK();
        res = stream_usable_locked(s); /* its work may have faulted meanwhile */
        UNLOCK();
        return res;
}

SIM_API cuStreamQuery(CUstream hStream)
{
        SIM_COUNT();
        struct CUstream_st *s;
        CUresult res;
        bool idle;

        SIM_CHECK_INIT();
        res = sim_stream_resolve(hStream, sim_current_ctx(), &s);
        if (res != CUDA_SUCCESS)
                return res;
        LOCK();
        res = stream_usable_locked(s);
        idle = s->completed >= s->enqueued;
        UNLOCK();
        if (res != CUDA_SUCCESS)
                return res;
        return idle ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

/* The stream a call names (in the current context) and a new op of type for it. */
static CUresult stream_op_new(CUstream hStream, enum op_type type, struct CUstream_st **ret_s,
                              struct op **ret_op)
{
        struct CUstream_st *s;
        struct op *op;
        CUresult res;

        res = sim_stream_resolve(hStream, sim_current_ctx(), &s);
        if (res != CUDA_SUCCESS)
                return res;
        op = calloc(1, sizeof(*op));
        if (!op)
                return CUDA_ERROR_OUT_OF_MEMORY;
        op->type = type;
        *ret_s = s;
        *ret_op = op;
        return CUDA_SUCCESS;
}

SIM_API cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
        SIM_COUNT();
        struct CUstream_st *s;
        struct op *op;
        CUresult res;

        SIM_CHECK_INIT();
        if (!fn)
                return CUDA_ERROR_INVALID_VALUE;
        res = stream_op_new(hStream, OP_HOST, &s, &op);
        if (res != CUDA_SUCCESS)
                return res;
        op->host.fn = fn;
        op->host.data = userData;
        return enqueue(s, op);
}

SIM_API cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
        SIM_COUNT();
        const unsigned known =
            CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
        struct CUctx_st *ctx;
        struct CUevent_st *e;
        CUresult res;

        SIM_CHECK_INIT();
        if (!phEvent || (Flags & ~known) ||
            ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
                return CUDA_ERROR_INVALID_VALUE;
        res = sim_ctx_get(&ctx);
        if (res != CUDA_SUCCESS)
                return res;
        e = calloc(1, sizeof(*e));
        if (!e)
                return CUDA_ERROR_OUT_OF_MEMORY;
        LOCK();
        e->ctx = ctx;
        e->epoch = ctx->epoch;
        UNLOCK();
        e->flags = Flags;
        e->refs = 1;
        *phEvent = e;
        return CUDA_SUCCESS;
}

SIM_API cuEventDestroy(CUevent hEvent)
{
        SIM_COUNT();
        CUresult res;

        SIM_CHECK_INIT();
        if (!hEvent)
                return CUDA_ERROR_INVALID_HANDLE;
        LOCK();
        /* An event whose context is gone is a dead handle; what is left of it goes anyway. */
        res = hEvent->epoch != hEvent->ctx->epoch ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
        event_unref_locked(hEvent);
        UNLOCK();
        return res;
}

SIM_API cuEventRecord(CUevent hEvent, CUstream hStream)
{
        SIM_COUNT();
        struct CUstream_st *s;
        struct op *op;
        CUresult res;

        SIM_CHECK_INIT();
        if (!hEvent)
                return CUDA_ERROR_INVALID_HANDLE;
        res = stream_op_new(hStream, OP_RECORD, &s, &op);
        if (res != CUDA_SUCCESS)
                return res;
        op->record.ev = hEvent;
        LOCK();
        res = event_usable_locked(hEvent);
        /* Documented: the event and the stream must belong to the same context. */
        if (res == CUDA_SUCCESS && hEvent->ctx != s->ctx)
                res = CUDA_ERROR_INVALID_HANDLE;
        if (res == CUDA_SUCCESS) {
                op->record.gen = ++hEvent->gen;
                res = enqueue_locked(s, op);
        }
        if (res == CUDA_SUCCESS) {
                hEvent->refs++; /* held by the queued op */
                s->refs++;
                if (hEvent->stream)
                        stream_unref_locked(hEvent->stream);
                hEvent->stream = s;
                hEvent->seq = op->seq;
                hEvent->stamped = false;
        }
        UNLOCK();
        if (res != CUDA_SUCCESS)
                free(op);
        return res;
}

static bool event_done_locked(const struct CUevent_st *e)
{
        return !e->stream || e->stream->completed >= e->seq;
}

SIM_API cuEventQuery(CUevent hEvent)
{
        SIM_COUNT();
        bool done;

        CUresult res;

        SIM_CHECK_INIT();
        if (!hEvent)
                return CUDA_ERROR_INVALID_HANDLE;
        LOCK();
        res = event_usable_locked(hEvent);
        done = event_done_locked(hEvent);
        UNLOCK();
        if (res != CUDA_SUCCESS)
                return res;
        return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SIM_API cuEventSynchronize(CUevent hEvent)
{
        SIM_COUNT();
        CUresult res;

        SIM_CHECK_INIT();
        if (!hEvent)
                return CUDA_ERROR_INVALID_HANDLE;
        LOCK();
        res = event_usable_locked(hEvent);
        if (res == CUDA_SUCCESS && hEvent->stream) {
                wait_stream_locked(hEvent->stream, hEvent->seq);
                res = event_usable_locked(hEvent); /* the work before it may have faulted */
        }
        UNLOCK();
        return res;
}

SIM_API cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
        SIM_COUNT();
        CUresult res = CUDA_SUCCESS;

        SIM_CHECK_INIT();
        if (!pMilliseconds)
                return CUDA_ERROR_INVALID_VALUE;
        if (!hStart || !hEnd)
                return CUDA_ERROR_INVALID_HANDLE;
        LOCK();
        res = event_usable_locked(hStart);
        if (res == CUDA_SUCCESS)
                res = event_usable_locked(hEnd);
        if (res != CUDA_SUCCESS)
                ;
        else if ((hStart->flags | hEnd->flags) & CU_EVENT_DISABLE_TIMING || !hStart->stream ||
                 !hEnd->stream || hStart->ctx != hEnd->ctx)
                res = CUDA_ERROR_INVALID_HANDLE;
        else if (!event_done_locked(hStart) || !event_done_locked(hEnd) || !hStart->stamped ||
                 !hEnd->stamped)
                res = CUDA_ERROR_NOT_READY;
        else
                *pMilliseconds = (float)((hEnd->stamp.tv_sec - hStart->stamp.tv_sec) * 1e3 +
                                         (hEnd->stamp.tv_nsec - hStart->stamp.tv_nsec) / 1e6);
        UNLOCK();
        return res;
}

SIM_API cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
        SIM_COUNT();
        struct CUstream_st *s;
        struct op *op;
        CUresult res;

        SIM_CHECK_INIT();
        if (!hEvent)
                return CUDA_ERROR_INVALID_HANDLE;
        /* CU_EVENT_WAIT_EXTERNAL is documented as invalid outside stream capture (none here). */
        if (Flags != CU_EVENT_WAIT_DEFAULT)
                return CUDA_ERROR_INVALID_VALUE;
        res = stream_op_new(hStream, OP_WAIT, &s, &op);
        if (res != CUDA_SUCCESS)
                return res;
        LOCK();
        /* Waiting on an event of another context is allowed; on a dead one it is not. */
        res = hEvent->epoch != hEvent->ctx->epoch ? CUDA_ERROR_INVALID_HANDLE
                                                  : stream_usable_locked(s);
        if (res != CUDA_SUCCESS || !hEvent->stream || hEvent->stream == s ||
            event_done_locked(hEvent)) {
                /* Nothing to wait for: never recorded, already complete, or ordered already. */
                UNLOCK();
                free(op);
                return res;
        }
        op->wait.stream = hEvent->stream;
        op->wait.seq = hEvent->seq;
        hEvent->stream->refs++;
        res = enqueue_locked(s, op);
        if (res != CUDA_SUCCESS)
                stream_unref_locked(hEvent->stream);
        UNLOCK();
        if (res != CUDA_SUCCESS)
                free(op);
        return res;
}

/* The stream's context; NULL (and the legacy handles) name the current context's. */
SIM_API cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
        SIM_COUNT();
        struct CUstream_st *s;
        CUresult res;

        SIM_CHECK_INIT();
        if (!pctx)
                return CUDA_ERROR_INVALID_VALUE;
        res = sim_stream_resolve(hStream, sim_current_ctx(), &s);
        if (res == CUDA_SUCCESS)
                res = sim_stream_check(s);
        if (res == CUDA_SUCCESS)
                *pctx = s->ctx;
        return res;
}

/* CUDA 12.5's form: green contexts are not modelled, so the stream never has one. */
SIM_API cuStreamGetCtx_v2(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx)
{
        SIM_COUNT();
        CUresult res;

        if (!pCtx || !pGreenCtx)
                return CUDA_ERROR_INVALID_VALUE;
        res = cuStreamGetCtx(hStream, pCtx);
        if (res == CUDA_SUCCESS)
                *pGreenCtx = NULL;
        return res;
}
