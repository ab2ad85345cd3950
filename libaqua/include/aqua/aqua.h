/*
 * libaqua: lend idle GPU memory to a paired GPU, or borrow it, through the aquad daemon.
 *
 * One aqua_ctx per GPU per process. A producer offers memory of its GPU and reclaims it when its
 * own load rises; a consumer borrows that memory, mapped into its GPU's address space, and gives
 * it back on request. Everything is coordinated by aquad over a ZeroMQ socket plus a Unix side
 * channel that carries the memory's file descriptors.
 *
 * Return values: 0 on success; a negative errno for failures; a positive AQUA_* outcome (below)
 * for expected results the caller must handle. Outputs are the last parameters, named ret_*, and
 * are written only when the function returns 0 (or where a function says so, an AQUA_* outcome).
 *
 * Threads: a context is not thread-safe. All calls on one aqua_ctx (and on its leases) must be
 * serialized by the caller, typically by making them from the engine's scheduler thread.
 * Different contexts are independent and may be used from different threads at once.
 * aqua_strerror() and aqua_version() may be called from any thread at any time.
 *
 * Device addresses are plain uint64_t (a CUdeviceptr) so that this header needs no cuda.h.
 * libaqua loads the CUDA driver at run time: $AQUA_CUDA_LIBRARY if set, else libcuda.so.1.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define AQUA_API __attribute__((visibility("default")))
#else
#define AQUA_API
#endif

#define AQUA_VERSION_MAJOR 0
#define AQUA_VERSION_MINOR 1

/* The daemon's endpoint when neither the options nor $AQUA_ENDPOINT name one. */
#define AQUA_DEFAULT_ENDPOINT "ipc:///run/aqua/aquad.sock"

/* "Everything": for aqua_reclaim() and friends. */
#define AQUA_ALL UINT64_MAX

/* Wait without a limit, for the timeout_ms parameters. */
#define AQUA_FOREVER (-1)

/* Expected outcomes, returned as positive ints. */
enum {
        AQUA_PENDING = 1, /* accepted; the result arrives later as events from aqua_poll() */
        AQUA_TIMEOUT,     /* the timeout passed first; what was done so far is reported */
        AQUA_NO_MEMORY,   /* borrow: not even min_bytes could be granted */
        AQUA_BARRED,      /* borrow: this consumer missed a reclaim deadline, no new leases */
        AQUA_LIMIT,       /* a limit of the daemon (chunks, leases, clients) was reached */
        AQUA_THROTTLED,   /* too many requests in flight; try again later */
        AQUA_DRAINING,    /* offer: an operator drained this GPU; no offers until aquactl undrain */
        AQUA_JOURNAL,     /* aquad could not make the change durable (its journal): refused and
                           * undone, nothing changed; it may succeed once aquad can write again */
        _AQUA_OUTCOME_MAX,
};

enum aqua_role {
        AQUA_ROLE_PRODUCER = 1, /* lends memory of its GPU */
        AQUA_ROLE_CONSUMER = 2, /* borrows memory for its GPU */
        AQUA_ROLE_NEUTRAL = 3,  /* registered, neither lends nor borrows (yet) */
};

typedef struct aqua_ctx aqua_ctx;
typedef struct aqua_lease aqua_lease;

/*
 * A short description of r: a positive AQUA_* outcome, a negative errno, or 0. Never NULL; the
 * string is static. Thread-safe.
 */
AQUA_API const char *aqua_strerror(int r);

/* The library's version as "major.minor.patch". Thread-safe. */
AQUA_API const char *aqua_version(void);

/* ------------------------------------------------------------------------------ logging */

enum aqua_log_level {
        AQUA_LOG_ERROR = 0,
        AQUA_LOG_WARNING,
        AQUA_LOG_NOTICE,
        AQUA_LOG_INFO,
        AQUA_LOG_DEBUG,
};

/* Receives one message (no trailing newline); message is valid only during the call. */
typedef void (*aqua_log_fn)(enum aqua_log_level level, const char *message, void *userdata);

/*
 * Route the library's messages of level max_level and more severe to fn; fn == NULL (the
 * default) silences them. The library writes nothing to stdout or stderr by itself. The setting
 * is process-wide: set it before opening contexts, or while no other thread is in libaqua.
 * fn may be called from inside any libaqua function, on the calling thread.
 */
AQUA_API void aqua_set_log(aqua_log_fn fn, void *userdata, enum aqua_log_level max_level);

/* ------------------------------------------------------------------------------ context */

struct aqua_options {
        /* sizeof(struct aqua_options) as the caller was compiled: fields may be added later. */
        size_t size;
        /* The daemon's ZeroMQ endpoint. NULL: $AQUA_ENDPOINT, else AQUA_DEFAULT_ENDPOINT. */
        const char *endpoint;
        /*
         * The daemon's side channel (an AF_UNIX SOCK_SEQPACKET socket path). NULL:
         * $AQUA_SIDE_PATH, else derived from an ipc:// endpoint: its path with a ".sock" suffix
         * replaced by (or else followed by) ".side" ("ipc:///run/aqua/aquad.sock" ->
         * "/run/aqua/aquad.side", aquad's default). A tcp:// endpoint needs it given.
         */
        const char *side_path;
        /* Shown to operators (aquactl). NULL: the program's name. */
        const char *client_name;
        /* Limit for connecting and for each blocking request. 0: 5000 ms. */
        int timeout_ms;
        /*
         * Producer: the size of each chunk aqua_offer() allocates, rounded up to the device's
         * allocation granularity. 0: 32 MiB. It is also the unit of reclaim and of borrowing.
         */
        uint64_t chunk_bytes;
        /*
         * CURVE for a tcp:// endpoint (aquad's remote.endpoint): aquad's public key and this
         * client's key pair, each Z85 text (40 characters, as `aquactl keygen` writes them).
         * NULL: $AQUA_SERVER_KEY (the key, or a file with a "public-key:" line such as aquad's
         * .pub file) and $AQUA_KEY_FILE (this client's pair file); neither: no CURVE. With a
         * side channel (side_path or $AQUA_SIDE_PATH) chunk handles are file descriptors on it,
         * as on aquad's host. Without one the client is on another host of the NVLink domain:
         * chunk handles travel as fabric handles (CU_MEM_HANDLE_TYPE_FABRIC) in the messages,
         * which the device must support (aqua_open() fails with -EOPNOTSUPP otherwise) and the
         * driver must permit (an IMEX channel; aqua_offer() and aqua_borrow() fail with -ENOKEY
         * otherwise). Errors: -EINVAL (a key that is not Z85, half a set, or a key file that
         * does not read).
         */
        const char *server_key;
        const char *public_key;
        const char *secret_key;
};

#define AQUA_OPTIONS_INIT                                                                          \
        {                                                                                          \
                .size = sizeof(struct aqua_options)                                                \
        }

/*
 * Open a context for CUDA device ordinal `device`, connect to aquad and register the GPU with
 * `role`. opts may be NULL (all defaults). Blocks for at most opts->timeout_ms.
 * The context uses the device's primary CUDA context and leaves the caller's current context
 * as it found it. Free it with aqua_close().
 * Errors: -EINVAL (bad argument), -ENODEV (no such device), -ELIBACC (no usable CUDA driver),
 * -ECONNREFUSED or -ENOENT (no daemon at the endpoint), -EACCES (the daemon refused this user:
 * not in its allow list), -EUSERS (the daemon has limits.clients connected: try again once one
 * has gone), -ESHUTDOWN (the daemon is stopping: try again when it is back), -EBUSY (the GPU is
 * registered by another live process), -ETIMEDOUT, -ENOMEM. A refusal's reason as the daemon
 * words it goes to the log callback (aqua_set_log()).
 */
AQUA_API int aqua_open(int device, enum aqua_role role, const struct aqua_options *opts,
                       aqua_ctx **ret_ctx);

/*
 * Close the context: unmap and release every lease and chunk it holds, then disconnect. The
 * daemon sees the disconnect at once and returns this consumer's chunks to their pool; memory a
 * producer lent stays alive as long as a consumer maps it. Accepts NULL; returns NULL.
 */
AQUA_API aqua_ctx *aqua_close(aqua_ctx *ctx);

struct aqua_info {
        int device;
        enum aqua_role role;
        char gpu_uuid[48];    /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
        char paired_with[48]; /* uuid of the paired GPU; empty when unpaired */
        uint64_t capacity;    /* bytes of device memory */
        uint64_t granularity; /* allocation granularity of the device */
        uint64_t chunk_bytes; /* producer: size of an offered chunk */
        uint64_t client_id;   /* the daemon's id for this context; 0 while disconnected */
        bool connected;
        /* consumer: the DRAM budget aquad held granted to this GPU when it last registered (its
         * Welcome): a re-registering consumer's grants survive aquad's restarts */
        uint64_t dram_budget;
        uint64_t reclaim_deadline_ms;
        uint64_t offered_bytes;  /* producer: in the daemon's pool (leased or not) */
        uint64_t borrowed_bytes; /* consumer: peer memory currently mapped */
        uint64_t dram_bytes;     /* consumer: data moved to DRAM by reclaims, still held */
        /* consumer, aqua tensors: bytes of tensor chunks per tier, and pool capacity left */
        uint64_t tensor_peer_bytes;
        uint64_t tensor_local_bytes;
        uint64_t tensor_dram_bytes; /* placement keeps it within dram_granted; reclaims may not */
        uint64_t pool_free_bytes;   /* free chunks of AQUA_BORROW_TENSORS leases */
        uint64_t dram_granted;      /* DRAM budget this context borrowed (AQUA_BORROW_ALLOW_DRAM) */
};

/* Fill *ret with the context's state as last known locally (no round trip). */
AQUA_API int aqua_get_info(aqua_ctx *ctx, struct aqua_info *ret);

/*
 * The device's free and total memory as its driver reports them (cuMemGetInfo in the device's
 * primary context): device-wide, every process's allocations counted, the chunks this context
 * offered among them. For a lender that watches what a workload beside it leaves free.
 * Returns 0, -EINVAL, or a negative errno for a driver failure (-EIO for a faulted context).
 */
AQUA_API int aqua_device_memory(aqua_ctx *ctx, uint64_t *ret_free, uint64_t *ret_total);

/* ------------------------------------------------------------------------------ producer */

/*
 * Allocate `bytes` (rounded up to whole chunks) of exportable memory on the context's GPU and
 * offer it to the daemon's pool. The memory stays owned by libaqua until reclaimed; the producer
 * never touches it. On a partial allocation (the GPU ran out of memory), what was allocated is
 * offered. *ret_offered (may be NULL) receives the bytes actually offered.
 * Errors: -EPERM (not a producer), -ENOMEM (not one chunk could be allocated), AQUA_LIMIT,
 * AQUA_DRAINING (an operator drained this GPU: nothing is offered until `aquactl undrain`; the
 * drain outlives this context), -ENOTCONN (no daemon), -ETIMEDOUT, -ENOKEY (fabric memory not
 * permitted: no IMEX channel).
 */
AQUA_API int aqua_offer(aqua_ctx *ctx, uint64_t bytes, uint64_t *ret_offered);

/*
 * Take back `bytes` (rounded up to whole chunks; AQUA_ALL: everything offered) and free them on
 * the GPU. Unleased chunks are freed at once; leased ones when their consumer has moved off them
 * (the daemon asks it to, with a deadline). A daemon reply names at most its repeated-items limit
 * of chunks; aqua_reclaim() asks again until the amount is covered or nothing more comes.
 * Blocks until all are free or timeout_ms passes
 * (AQUA_FOREVER: no limit). *ret_freed (may be NULL) receives the bytes freed during the call,
 * also when the result is AQUA_TIMEOUT: the rest is freed later inside aqua_poll(), which
 * reports it as AQUA_EVENT_RECLAIMED.
 * Returns 0, AQUA_TIMEOUT, -EPERM (not a producer), -ENOTCONN, -ENOMEM.
 */
AQUA_API int aqua_reclaim(aqua_ctx *ctx, uint64_t bytes, int timeout_ms, uint64_t *ret_freed);

/*
 * The non-blocking form of aqua_reclaim(): send the request and return AQUA_PENDING at once.
 * Every chunk freed as a result, including those the daemon frees at once, is reported by
 * aqua_poll() as AQUA_EVENT_RECLAIMED after libaqua has released it.
 */
AQUA_API int aqua_reclaim_async(aqua_ctx *ctx, uint64_t bytes);

/* ------------------------------------------------------------------------------ consumer */

/* For aqua_borrow()'s flags. */
#define AQUA_BORROW_ALLOW_DRAM (1u << 0) /* a DRAM budget may make up what peers cannot */
/*
 * The lease becomes capacity for aqua tensors (below) instead of a range the caller uses: its
 * chunks back tensor chunks one for one, and libaqua keeps each chunk used or free. The grant's
 * dptr is 0 (the lease's own range is libaqua's). aqua_return() of such a lease fails with
 * -EBUSY while a tensor still uses one of its chunks.
 */
#define AQUA_BORROW_TENSORS (1u << 1)

struct aqua_grant {
        /* The new lease; NULL when no peer memory was granted. Owned by the context. */
        aqua_lease *lease;
        /* Device address, on the context's GPU, where the lease's chunks are mapped back to
         * back, readable and writable by kernels on this GPU. 0 without a lease. */
        uint64_t dptr;
        uint64_t bytes;      /* peer memory mapped at dptr */
        uint64_t dram_bytes; /* DRAM budget granted: host memory the caller may pin */
        bool partial;        /* less than asked for */
};

/*
 * Borrow `bytes` of peer GPU memory, accepting no less than min_bytes (peer memory plus, with
 * AQUA_BORROW_ALLOW_DRAM, a DRAM budget). libaqua imports the granted chunks, reserves one
 * address range, maps them there and grants this GPU access. Blocks for at most the context's
 * timeout. Returns 0 (possibly a partial grant), AQUA_NO_MEMORY (nothing granted), AQUA_BARRED,
 * AQUA_LIMIT, AQUA_THROTTLED, -EPERM (not a consumer), -EINVAL (min_bytes > bytes),
 * -ENOTCONN, -ETIMEDOUT, -ENOMEM, -EIO (the driver failed to import or map), -ENOKEY (the
 * driver does not permit importing fabric handles: no IMEX channel, or not the producer's).
 */
AQUA_API int aqua_borrow(aqua_ctx *ctx, uint64_t bytes, uint64_t min_bytes, unsigned flags,
                         struct aqua_grant *ret);

/*
 * Give a lease back: unmap its range, release its chunks and tell the daemon. Data a reclaim
 * had moved to DRAM is freed too. Batches of aqua_copy_batch() still in flight are waited for
 * first (the caller's own work on the range must be done already: unmapping memory a GPU
 * still copies faults its context). `lease` is invalid afterwards; queued events naming it are
 * dropped. Local cleanup always completes; the result says whether the daemon acknowledged it
 * (-ENOTCONN, -ETIMEDOUT otherwise; the daemon reconciles when it sees this client again).
 */
AQUA_API int aqua_return(aqua_ctx *ctx, aqua_lease *lease);

/* Give back `bytes` of DRAM budget (the caller unpinned that much host memory). */
AQUA_API int aqua_return_dram(aqua_ctx *ctx, uint64_t bytes);

/* Where one chunk of a lease or of a tensor lives now. */
enum aqua_tier {
        AQUA_TIER_NONE = 0,  /* nothing: a tensor chunk not mapped (yet, or any more); a tensor-pool
                              * lease chunk given back to its producer by a reclaim */
        AQUA_TIER_PEER = 1,  /* a producer's GPU memory, leased and mapped over the peer link */
        AQUA_TIER_DRAM = 2,  /* host memory (moved there by a reclaim, or placed there) */
        AQUA_TIER_LOCAL = 3, /* the context's own GPU memory (tensors only) */
};

struct aqua_lease_info {
        uint64_t lease_id; /* the daemon's id */
        uint64_t dptr;     /* start of the lease's device range */
        uint64_t bytes;    /* length of the range */
        uint64_t peer_bytes;
        uint64_t dram_bytes;
        size_t n_chunks;
        uint64_t chunk_bytes;
};

AQUA_API int aqua_lease_get_info(aqua_ctx *ctx, const aqua_lease *lease,
                                 struct aqua_lease_info *ret);

struct aqua_chunk_info {
        uint64_t chunk_id; /* the daemon's id */
        uint64_t offset;   /* within the lease's range */
        uint64_t bytes;
        enum aqua_tier tier;
        /* AQUA_TIER_DRAM only: NULL when the DRAM is mapped at dptr + offset (the device
         * address is unchanged), else the host address now holding the chunk's bytes. */
        void *host;
};

/* Chunk `index` (0 .. n_chunks - 1) of a lease. Returns -ERANGE past the end. */
AQUA_API int aqua_lease_get_chunk(aqua_ctx *ctx, const aqua_lease *lease, size_t index,
                                  struct aqua_chunk_info *ret);

/* ------------------------------------------------------------------------------ both roles */

struct aqua_load {
        double load;         /* 0..1 of the engine's capacity */
        uint64_t used_bytes; /* device memory the engine uses itself */
        uint64_t free_bytes; /* device memory it could spare */
};

/*
 * Tell the daemon the engine's load. Does not wait for an answer: cheap enough for every few
 * engine iterations. Returns 0, -EINVAL, -ENOTCONN (nothing was sent: the daemon is away; report
 * again after AQUA_EVENT_RECONNECTED), -EAGAIN (the outgoing queue is full).
 */
AQUA_API int aqua_report_load(aqua_ctx *ctx, const struct aqua_load *load);

enum aqua_event_type {
        /* Producer: `bytes` of reclaimed memory were released on the GPU and are free now. */
        AQUA_EVENT_RECLAIMED = 1,
        /* Consumer: a reclaim moved the chunk at lease + offset to DRAM (see aqua_chunk_info:
         * `host` NULL means the device address is unchanged, else the data is at host). */
        AQUA_EVENT_MIGRATED,
        /* Consumer: a reclaim notice could not be honoured (a copy or the return failed); the
         * daemon will report the missed deadline. `error` says why. */
        AQUA_EVENT_RECLAIM_FAILED,
        /* Consumer: the daemon no longer knows this lease (after its restart); its chunks were
         * moved to DRAM like a reclaim. */
        AQUA_EVENT_LEASE_LOST,
        /* The daemon paired this GPU with another one, or unpaired it. */
        AQUA_EVENT_PAIR_CHANGED,
        /* The daemon is shutting down. */
        AQUA_EVENT_DAEMON_STOPPING,
        /* Consumer: chunks of a tensor changed tier outside a call on that tensor: a reclaim
         * moved them off a producer (to `tier`), or, for RELOCATED, their device address no
         * longer holds them. `tensor`, `offset`, `bytes` name the run; `tier` the new tier;
         * `host` is NULL when the device address is unchanged (always, where the driver maps
         * host memory), else the host address now holding the run's first byte. */
        AQUA_EVENT_TENSOR_MIGRATED,
        /* The connection to the daemon was lost. libaqua reconnects inside aqua_poll(); the
         * fd of aqua_fd() wakes the caller when it is time to try. Mappings stay valid. */
        AQUA_EVENT_DISCONNECTED,
        /* Connected and re-registered again, with what this context holds. */
        AQUA_EVENT_RECONNECTED,
};

typedef struct aqua_tensor aqua_tensor;

struct aqua_event {
        enum aqua_event_type type;
        aqua_lease *lease;   /* MIGRATED, RECLAIM_FAILED, LEASE_LOST */
        uint64_t offset;     /* MIGRATED: offset of the chunk in the lease; TENSOR_MIGRATED:
                              * offset in the tensor */
        uint64_t bytes;      /* RECLAIMED, MIGRATED, TENSOR_MIGRATED */
        int error;           /* RECLAIM_FAILED: a negative errno */
        aqua_tensor *tensor; /* TENSOR_MIGRATED (also RECLAIM_FAILED of a tensor's chunk) */
        enum aqua_tier tier; /* TENSOR_MIGRATED: where the run lives now */
        void *host;          /* TENSOR_MIGRATED: see there */
};

/*
 * Handle what the daemon has sent, without a round trip and without blocking: reclaim notices
 * are honoured here (a consumer copies the affected chunks to DRAM, unmaps them and returns
 * them), freed chunks released (producer), replies to earlier asynchronous requests consumed.
 * Up to n_events events are copied to `events`, their number to *ret_n; more stay queued for the
 * next call. Call it at a safe point of each engine iteration (no kernel may be using leased
 * memory that a reclaim could move: the copy is synchronous), or when aqua_fd() is readable.
 * Returns 0, -ENOMEM, -EIO (a driver failure; the affected lease is also reported as an event).
 */
AQUA_API int aqua_poll(aqua_ctx *ctx, struct aqua_event *events, size_t n_events, size_t *ret_n);

/*
 * A file descriptor that becomes readable when aqua_poll() has work: add it to an event loop
 * (POLLIN / EPOLLIN) and call aqua_poll() when it fires. It is edge-like: call aqua_poll() until
 * it returns no events before waiting again. The fd stays the same for the context's life; do
 * not read from it or close it.
 */
AQUA_API int aqua_fd(aqua_ctx *ctx, int *ret_fd);

/* ------------------------------------------------------------------------------ tensors */

/*
 * An aqua tensor is one reserved device address range of the context's GPU, backed chunk by
 * chunk by leased peer memory, the GPU's own memory, or host DRAM, and readable and writable by
 * kernels on that GPU wherever a chunk is mapped. Chunks are mapped on demand (grow) and
 * released at either end (trim) without moving the data between; a reclaim moves the chunks it
 * takes to DRAM and maps the DRAM at the same address (host-location cuMemCreate), so the
 * device pointer stays valid. Where the driver cannot map host memory there, the data goes to
 * pinned host memory and AQUA_EVENT_TENSOR_MIGRATED gives its host address.
 *
 * Placement of a new chunk: a free chunk of an AQUA_BORROW_TENSORS lease (of the tensor's chunk
 * size), else the GPU's own memory if the tensor allows it, else DRAM as long as the tensor
 * chunks in DRAM stay within the DRAM budget the daemon granted (aqua_borrow() with
 * AQUA_BORROW_ALLOW_DRAM). A tensor may name one tier instead.
 *
 * Tensors belong to their context: same thread rules (not thread-safe, serialize every call on
 * one context), freed by aqua_close() at the latest. Consumers only (-EPERM otherwise).
 */

/* For struct aqua_tensor_options.flags. */
#define AQUA_TENSOR_ALLOW_LOCAL (1u << 0) /* automatic placement may use the GPU's own memory */
#define AQUA_TENSOR_RECLAIM_LOCAL                                                                  \
        (1u << 1) /* a reclaim moves chunks to free local memory first                             \
                   */

struct aqua_tensor_options {
        size_t size; /* sizeof(struct aqua_tensor_options) as the caller was compiled */
        /* Size of each chunk, a multiple of the GPU's granularity; peer chunks of another size
         * cannot back this tensor. 0: the chunk size of the first AQUA_BORROW_TENSORS lease,
         * else 32 MiB. */
        uint64_t chunk_bytes;
        /* AQUA_TIER_NONE: automatic placement (above); PEER, LOCAL or DRAM: only that tier. */
        enum aqua_tier tier;
        unsigned flags;
};

#define AQUA_TENSOR_OPTIONS_INIT                                                                   \
        {                                                                                          \
                .size = sizeof(struct aqua_tensor_options)                                         \
        }

/*
 * Reserve max_bytes (rounded up to whole chunks) of device addresses for a tensor; nothing is
 * mapped yet. opts may be NULL. Free it with aqua_tensor_free().
 * Errors: -EPERM (not a consumer), -EINVAL, -ENOMEM, -EIO (the driver refused the range).
 */
AQUA_API int aqua_tensor_new(aqua_ctx *ctx, uint64_t max_bytes,
                             const struct aqua_tensor_options *opts, aqua_tensor **ret);

/* Unmap and release every chunk (peer chunks go back to their lease's free chunks) and the
 * range. Waits for libaqua's copies still in flight. Accepts NULL; returns NULL. */
AQUA_API aqua_tensor *aqua_tensor_free(aqua_ctx *ctx, aqua_tensor *t);

/* The tensor's device address (fixed for its life) and the size of its range. */
AQUA_API uint64_t aqua_tensor_dptr(const aqua_tensor *t);

struct aqua_tensor_info {
        uint64_t dptr;      /* start of the range; never changes */
        uint64_t max_bytes; /* length of the range */
        uint64_t chunk_bytes;
        uint64_t begin, end; /* the mapped window [begin, end), whole chunks; begin == end: empty */
        uint64_t peer_bytes, local_bytes, dram_bytes;
};

AQUA_API int aqua_tensor_get_info(aqua_ctx *ctx, const aqua_tensor *t,
                                  struct aqua_tensor_info *ret);

/*
 * Map chunks so that the window reaches `end` bytes (rounded up to a chunk); the start of the
 * window stays (offset 0 for a new tensor; where aqua_tensor_trim() left it, also when the trim
 * emptied the window). Growing to less than the current end does nothing. All or nothing: on
 * failure the chunks this call mapped are released again and the tensor is as before.
 * Returns 0, AQUA_NO_MEMORY (no tier allowed has room: no lease chunk free, no local memory or
 * not allowed, DRAM budget exhausted), -ERANGE (end > max_bytes), -EPERM, -EINVAL, -EIO.
 */
AQUA_API int aqua_tensor_grow(aqua_ctx *ctx, aqua_tensor *t, uint64_t end);

/*
 * Shrink the window to [begin, end): release whole chunks that lie entirely before begin or
 * entirely at or after end. Chunks in between keep their data and address; nothing is copied.
 * The window may then grow again at its end. Returns 0, -EINVAL (begin > end), -EPERM.
 */
AQUA_API int aqua_tensor_trim(aqua_ctx *ctx, aqua_tensor *t, uint64_t begin, uint64_t end);

/* One run of neighbouring chunks of one tier. */
struct aqua_tensor_range {
        uint64_t offset; /* in the tensor */
        uint64_t bytes;
        enum aqua_tier tier; /* AQUA_TIER_NONE: not mapped */
        /* NULL: the run is at dptr + offset. Else (pinned-host fallback, DRAM only) the host
         * address of the run's first chunk; such runs are one chunk long. */
        void *host;
};

/*
 * The run of chunks that holds `offset`: from the chunk containing it to the last neighbour of
 * the same tier (and mapping). Walk a tensor with offset = previous offset + bytes.
 * Returns 0 or -ERANGE (offset >= max_bytes).
 */
AQUA_API int aqua_tensor_get_range(aqua_ctx *ctx, const aqua_tensor *t, uint64_t offset,
                                   struct aqua_tensor_range *ret);

/*
 * Opt-in: move DRAM chunks (and local ones when include_local) of t (NULL:
 * every tensor of the context) to free chunks of AQUA_BORROW_TENSORS leases, at most max_bytes
 * (AQUA_ALL: no limit), e.g. after a producer offered again and aqua_borrow() got a lease.
 * Addresses stay; a chunk that was in pinned host memory is mapped at its address again (also
 * reported as AQUA_EVENT_TENSOR_MIGRATED with host NULL). Synchronous: waits for libaqua's copies
 * in flight, copies, remaps. *ret_bytes (may be NULL) gets the bytes moved. Returns 0 (also when
 * nothing could move), -EPERM, -EINVAL, -EIO.
 */
AQUA_API int aqua_tensor_promote(aqua_ctx *ctx, aqua_tensor *t, bool include_local,
                                 uint64_t max_bytes, uint64_t *ret_bytes);

/* ------------------------------------------------------------------------------ copies */

/*
 * CUDA streams and events as cuda.h declares them (CUstream, CUevent, or cudaStream_t and
 * cudaEvent_t of the runtime, which are the same pointers), without including cuda.h.
 */
struct CUstream_st;
struct CUevent_st;

/* One piece of a batch: bytes from src to dst. Device addresses, or host addresses of pinned
 * or pageable memory (unified addressing): any tier to any tier. */
struct aqua_copy_piece {
        uint64_t dst;
        uint64_t src;
        uint64_t bytes;
};

/* Identifies a batch for aqua_copy_query()/aqua_copy_wait(); increases with every batch. */
typedef uint64_t aqua_ticket;

/*
 * Copy n pieces asynchronously as one batch on `stream` (NULL: libaqua's own stream of the
 * context's GPU). Neighbouring pieces that continue each other (src and dst both contiguous)
 * merge into one; the rest goes through one cuMemcpyBatchAsync call where the driver has it,
 * else one copy per merged group. The batch starts after wait_event (may be NULL: the writer's
 * event, e.g. recorded after the kernel that produced the data) and, on `stream`, after the work
 * queued there before; done_event (may be NULL) is recorded when the batch has completed, for the
 * engine's streams to wait on. Pieces within a batch must not overlap each other's destinations.
 * libaqua keeps track of the batch: aqua_poll() waits for batches still in flight before a
 * reclaim moves chunks, so a copy never races a migration.
 * Memory the pieces name must stay mapped until the batch completes.
 * *ret_ticket (may be NULL) identifies the batch. Returns 0, -EINVAL (n == 0, a zero-length
 * piece), -ENOMEM, -EIO (the driver refused; nothing of the batch was queued then, unless the
 * driver lacks batches and failed half-way, which the error message logs).
 */
AQUA_API int aqua_copy_batch(aqua_ctx *ctx, const struct aqua_copy_piece *pieces, size_t n,
                             struct CUstream_st *stream, struct CUevent_st *wait_event,
                             struct CUevent_st *done_event, aqua_ticket *ret_ticket);

/* 0 when the batch has completed (or is unknown: long done), AQUA_PENDING while it runs. */
AQUA_API int aqua_copy_query(aqua_ctx *ctx, aqua_ticket ticket);

/* Block until the batch has completed. Returns 0 or -EIO. */
AQUA_API int aqua_copy_wait(aqua_ctx *ctx, aqua_ticket ticket);

/* ---------------------------------------------------------- layer-wise offload and prefetch */

/*
 * Layer-by-layer movement of a KV cache between the engine's working memory and an aqua tensor
 * (or any tier): offload layer i as soon as its compute is recorded, prefetch layer i + 1 while
 * layer i computes. Offloads run on one stream and prefetches on another, so the two directions
 * overlap each other and the engine's compute. Each layer has a completion event the engine's
 * compute stream can wait on (GPU-side) and a ticket the host can query.
 * Not thread-safe; belongs to its context (free it before aqua_close()).
 */
typedef struct aqua_layers aqua_layers;

/*
 * For n_layers layers. offload_stream / prefetch_stream: the caller's streams (NULL: libaqua
 * creates its own, non-blocking). Returns 0, -EINVAL, -ENOMEM, -EIO.
 */
AQUA_API int aqua_layers_new(aqua_ctx *ctx, unsigned n_layers, struct CUstream_st *offload_stream,
                             struct CUstream_st *prefetch_stream, aqua_layers **ret);
AQUA_API aqua_layers *aqua_layers_free(aqua_layers *l);

/*
 * Queue the offload of `layer`: the pieces (working memory -> tensor) start once `computed`
 * (the event the engine recorded after the layer's kernels; may be NULL) has completed.
 * Returns 0, -EINVAL (layer out of range), or aqua_copy_batch()'s errors.
 */
AQUA_API int aqua_layers_offload(aqua_layers *l, unsigned layer,
                                 const struct aqua_copy_piece *pieces, size_t n,
                                 struct CUevent_st *computed);

/*
 * Queue the prefetch of `layer` (tensor -> working memory), after `after` (may be NULL; e.g. the
 * event of the compute that frees the destination). Before the layer's kernels, make the
 * compute stream wait for aqua_layers_event(layer).
 */
AQUA_API int aqua_layers_prefetch(aqua_layers *l, unsigned layer,
                                  const struct aqua_copy_piece *pieces, size_t n,
                                  struct CUevent_st *after);

/* The event recorded after layer's last queued transfer (valid until aqua_layers_free()). */
AQUA_API int aqua_layers_event(aqua_layers *l, unsigned layer, struct CUevent_st **ret);

/* 0 when layer's last queued transfer has completed (or none was queued), AQUA_PENDING while
 * it runs, -EINVAL. */
AQUA_API int aqua_layers_query(aqua_layers *l, unsigned layer);

/* Block until layer's last queued transfer has completed; 0, -EINVAL, -EIO. */
AQUA_API int aqua_layers_wait(aqua_layers *l, unsigned layer);

/* ------------------------------------------------------------------------------ arenas */

/*
 * An arena hands out pieces of one aqua tensor as device allocations, for an allocator that wants
 * malloc/free over borrowed memory (PyTorch's pluggable allocator: see libaqua-torch.so below).
 * Pieces are placed first-fit from the start of the tensor, each aligned to `align`; the tensor
 * grows to cover the highest piece and is trimmed back when the highest ones are freed, so chunks
 * are mapped only where pieces are. A piece keeps its device address for its life, whichever
 * tier its chunks move to (a reclaim moves them to DRAM at the same address).
 *
 * The arena does not own the tensor (free the arena first). Same thread rules as the context.
 */
typedef struct aqua_arena aqua_arena;

/* align: a power of two, 0 for 512 bytes. Errors: -EINVAL, -ENOMEM, -EPERM (not a consumer). */
AQUA_API int aqua_arena_new(aqua_ctx *ctx, aqua_tensor *t, uint64_t align, aqua_arena **ret);
/* Forgets every piece (the tensor's chunks stay mapped: trim it or free it). Accepts NULL. */
AQUA_API aqua_arena *aqua_arena_free(aqua_arena *a);

/*
 * A piece of `bytes` (rounded up to the alignment): its device address in *ret_dptr. Returns 0,
 * -ERANGE (no gap of that size left in the tensor's range), AQUA_NO_MEMORY (the tensor could not
 * grow: no tier has room), -EINVAL (bytes 0), -ENOMEM, -EIO.
 */
AQUA_API int aqua_arena_alloc(aqua_arena *a, uint64_t bytes, uint64_t *ret_dptr);

/* Give back the piece at dptr; trims the tensor when it was the highest. 0, or -ENOENT. */
AQUA_API int aqua_arena_release(aqua_arena *a, uint64_t dptr);

struct aqua_arena_info {
        uint64_t pieces;       /* handed out */
        uint64_t bytes;        /* in those pieces, rounded to the alignment */
        uint64_t mapped_bytes; /* of the tensor's window */
};

AQUA_API int aqua_arena_get_info(const aqua_arena *a, struct aqua_arena_info *ret);

#ifdef __cplusplus
}
#endif
