/*
 * aqua-cases: the long-prompt and multi-turn workloads (cases.h) on each tier, with 1 and with 8
 * GPUs sharing the host link; real KV samples moved through aqua (or host memory) and checked.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "aqua/aqua.h"
#include "cases.h"
#include "example-log.h"
#include "example-parse.h"
#include "example-util.h"
#include "hostlink.h"

#define MAX_LIST 16

struct args {
        struct lp_model lp;
        uint64_t contexts[MAX_LIST];
        size_t n_contexts;
        uint64_t context; /* the headline context, whose bytes are real */
        struct mt_config mt;
        double rates[MAX_LIST];
        size_t n_rates;
        unsigned busy[MAX_LIST];
        size_t n_busy;
        struct host_link host;
        struct kv_tier_cost peer, pcie;
        bool aqua;
        struct kv_swap_aqua_config aqua_cfg;
        bool hold;
        uint64_t hold_timeout_ns;
        unsigned lp_steps;
        uint32_t mt_sample;            /* bytes of each token's KV really kept, multi-turn */
        const char *out;               /* PREFIX-long.dat, PREFIX-turns.dat */
        double peer_capacity_override; /* the bandwidth-alone run: peer with DRAM's capacity */
        bool quiet;
};

static void help(void)
{
        printf("Usage: aqua-cases [OPTIONS]\n"
               "\n"
               "Where the link to lent memory is on the critical path: one long prompt whose KV\n"
               "outgrows the GPU (layers streamed in every decode step, the next prefetched\n"
               "while one computes) and multi-turn conversations whose finished turns are\n"
               "offloaded and loaded back on the next turn's TTFT path (vLLM's\n"
               "OffloadingConnector). Tiers: none, DRAM over PCIe, peer HBM over NVLink, and\n"
               "aqua's peer-then-DRAM; the DRAM tier's bandwidth is shared by the GPUs swapping\n"
               "at once. Time is modelled; samples of every token's KV really move through aqua\n"
               "tensors (--swap aqua) or host memory and are checked.\n"
               "\n"
               "  --contexts LIST      long prompt: contexts in tokens (256K,512K,768K,1M)\n"
               "  --context N          ...the one whose sampled bytes really move (512K)\n"
               "  --steps N            ...decode steps really run on them (4; half after a hold)\n"
               "  --rate R             multi-turn: conversations per second (0.5)\n"
               "  --rates LIST         ...the sweep for the plot (0.2,0.3,0.4,0.5,0.6)\n"
               "  --conversations N    ...conversations (200)\n"
               "  --seed N             ...trace seed (1)\n"
               "  --think DUR          ...mean think time between turns (30s)\n"
               "  --peer-capacity SIZE the lender's spare HBM (40GB)\n"
               "  --dram-capacity SIZE the DRAM budget for this GPU (128GB)\n"
               "  --busy LIST          GPUs swapping to DRAM at once (1,8)\n"
               "  --peer-bw GBPS       NVLink per direction (370)\n"
               "  --pcie-bw GBPS       one GPU's PCIe link per direction (50)\n"
               "  --uplink-bw GBPS     a PCIe switch's uplink per direction (50)\n"
               "  --gpus N, --gpus-per-switch N   the server (8, 2)\n"
               "  --host-mem-bw GBPS   host memory bandwidth (614.4)\n"
               "  --swap host|aqua     where the sampled bytes go (host); aqua: borrow through\n"
               "                       aquad ($AQUA_ENDPOINT), DRAM tensors within its budget\n"
               "  --aqua-device N      aqua: the consumer's CUDA device (0)\n"
               "  --aqua-borrow SIZE   aqua: memory to borrow (1GiB)\n"
               "  --hold               aqua: once sampled bytes sit in peer memory, print HOLD\n"
               "                       and poll until a reclaim moved them, then RESUME\n"
               "  --hold-timeout DUR   ...but no longer than this (30s)\n"
               "  --out PREFIX         data for the plot: PREFIX-long.dat, PREFIX-turns.dat\n"
               "  --quiet              print only the SUMMARY lines\n"
               "  -h, --help           show this help\n");
}

enum {
        ARG_CONTEXTS = 0x100,
        ARG_CONTEXT,
        ARG_STEPS,
        ARG_RATE,
        ARG_RATES,
        ARG_CONVERSATIONS,
        ARG_SEED,
        ARG_THINK,
        ARG_PEER_CAPACITY,
        ARG_DRAM_CAPACITY,
        ARG_BUSY,
        ARG_PEER_BW,
        ARG_PCIE_BW,
        ARG_UPLINK_BW,
        ARG_GPUS,
        ARG_GPUS_PER_SWITCH,
        ARG_HOST_MEM_BW,
        ARG_SWAP,
        ARG_AQUA_DEVICE,
        ARG_AQUA_BORROW,
        ARG_HOLD,
        ARG_HOLD_TIMEOUT,
        ARG_OUT,
        ARG_QUIET,
};

static const struct option options[] = {
    {"contexts", required_argument, NULL, ARG_CONTEXTS},
    {"context", required_argument, NULL, ARG_CONTEXT},
    {"steps", required_argument, NULL, ARG_STEPS},
    {"rate", required_argument, NULL, ARG_RATE},
    {"rates", required_argument, NULL, ARG_RATES},
    {"conversations", required_argument, NULL, ARG_CONVERSATIONS},
    {"seed", required_argument, NULL, ARG_SEED},
    {"think", required_argument, NULL, ARG_THINK},
    {"peer-capacity", required_argument, NULL, ARG_PEER_CAPACITY},
    {"dram-capacity", required_argument, NULL, ARG_DRAM_CAPACITY},
    {"busy", required_argument, NULL, ARG_BUSY},
    {"peer-bw", required_argument, NULL, ARG_PEER_BW},
    {"pcie-bw", required_argument, NULL, ARG_PCIE_BW},
    {"uplink-bw", required_argument, NULL, ARG_UPLINK_BW},
    {"gpus", required_argument, NULL, ARG_GPUS},
    {"gpus-per-switch", required_argument, NULL, ARG_GPUS_PER_SWITCH},
    {"host-mem-bw", required_argument, NULL, ARG_HOST_MEM_BW},
    {"swap", required_argument, NULL, ARG_SWAP},
    {"aqua-device", required_argument, NULL, ARG_AQUA_DEVICE},
    {"aqua-borrow", required_argument, NULL, ARG_AQUA_BORROW},
    {"hold", no_argument, NULL, ARG_HOLD},
    {"hold-timeout", required_argument, NULL, ARG_HOLD_TIMEOUT},
    {"out", required_argument, NULL, ARG_OUT},
    {"quiet", no_argument, NULL, ARG_QUIET},
    {"help", no_argument, NULL, 'h'},
    {},
};

/* Tokens: "524288", "512K" or "1M" (K = 1024). */
static int parse_tokens(const char *s, uint64_t *ret)
{
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (end == s || errno != 0 || *s == '-')
                return -EINVAL;
        if (*end == 'K' || *end == 'k')
                v <<= 10, end++;
        else if (*end == 'M' || *end == 'm')
                v <<= 20, end++;
        if (*end != '\0' || v == 0 || v > (1ULL << 40))
                return -EINVAL;
        *ret = v;
        return 0;
}

static int parse_tokens_opt(const char *opt, const char *s, uint64_t *ret)
{
        if (parse_tokens(s, ret) < 0)
                return log_error_errno(EINVAL, "%s: not a number of tokens: \"%s\"", opt, s);
        return 0;
}

static int parse_duration_opt(const char *opt, const char *s, uint64_t *ret)
{
        if (parse_duration(s, ret) < 0)
                return log_error_errno(EINVAL, "%s: not a duration: \"%s\"", opt, s);
        return 0;
}

static int parse_size_opt(const char *opt, const char *s, uint64_t *ret)
{
        if (parse_size(s, ret) < 0)
                return log_error_errno(EINVAL, "%s: not a size: \"%s\"", opt, s);
        return 0;
}

static int parse_number(const char *opt, const char *s, double min, double *ret)
{
        if (parse_double(s, ret) < 0 || !(*ret >= min))
                return log_error_errno(EINVAL, "%s: not a number of at least %g: \"%s\"", opt, min,
                                       s);
        return 0;
}

static int parse_unsigned(const char *opt, const char *s, unsigned min, unsigned max, unsigned *ret)
{
        int64_t v;
        if (parse_int64(s, 10, &v) < 0 || v < min || v > max)
                return log_error_errno(EINVAL, "%s: not a whole number in [%u, %u]: \"%s\"", opt,
                                       min, max, s);
        *ret = (unsigned)v;
        return 0;
}

/* A comma-separated list through parse_one(opt, word, i): at most MAX_LIST words. */
static int parse_list(const char *opt, const char *s, size_t *ret_n,
                      int (*parse_one)(struct args *a, const char *opt, const char *w, size_t i),
                      struct args *a)
{
        _cleanup_free_ char *copy = strdup(s);
        size_t n = 0;
        if (!copy)
                return log_error_errno(ENOMEM, "Out of memory");
        for (char *save = NULL, *w = strtok_r(copy, ",", &save); w;
             w = strtok_r(NULL, ",", &save)) {
                if (n == MAX_LIST)
                        return log_error_errno(E2BIG, "%s: more than %d values", opt, MAX_LIST);
                int r = parse_one(a, opt, w, n);
                if (r < 0)
                        return r;
                n++;
        }
        if (n == 0)
                return log_error_errno(EINVAL, "%s: an empty list", opt);
        *ret_n = n;
        return 0;
}

static int one_context(struct args *a, const char *opt, const char *w, size_t i)
{
        return parse_tokens_opt(opt, w, &a->contexts[i]);
}

static int one_rate(struct args *a, const char *opt, const char *w, size_t i)
{
        return parse_number(opt, w, 1e-6, &a->rates[i]);
}

static int one_busy(struct args *a, const char *opt, const char *w, size_t i)
{
        return parse_unsigned(opt, w, 1, 1024, &a->busy[i]);
}

static int parse_args(int argc, char **argv, struct args *a)
{
        uint64_t u = 0;
        unsigned n;
        int c;

        lp_model_defaults(&a->lp);
        mt_config_defaults(&a->mt);
        host_link_defaults(&a->host);
        kv_swap_aqua_config_defaults(&a->aqua_cfg);
        struct kv_tier_cost cost[_KV_TIER_MAX];
        kv_tier_cost_defaults(cost);
        a->peer = cost[KV_TIER_PEER];
        a->pcie = cost[KV_TIER_DRAM];
        static const uint64_t contexts[] = {256 << 10, 512 << 10, 768 << 10, 1 << 20};
        memcpy(a->contexts, contexts, sizeof(contexts));
        a->n_contexts = ARRAY_SIZE(contexts);
        a->context = 512 << 10;
        static const double rates[] = {0.2, 0.3, 0.4, 0.5, 0.6};
        memcpy(a->rates, rates, sizeof(rates));
        a->n_rates = ARRAY_SIZE(rates);
        a->busy[0] = 1;
        a->busy[1] = 8;
        a->n_busy = 2;
        a->hold_timeout_ns = 30 * NSEC_PER_SEC;
        a->lp_steps = 4;
        a->mt_sample = 8;

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                int r = 0;
                switch (c) {
                case ARG_CONTEXTS:
                        r = parse_list("--contexts", optarg, &a->n_contexts, one_context, a);
                        break;
                case ARG_CONTEXT:
                        r = parse_tokens_opt("--context", optarg, &a->context);
                        break;
                case ARG_STEPS:
                        r = parse_unsigned("--steps", optarg, 1, 1000, &a->lp_steps);
                        break;
                case ARG_RATE:
                        r = parse_number("--rate", optarg, 1e-6, &a->mt.gen.rate);
                        break;
                case ARG_RATES:
                        r = parse_list("--rates", optarg, &a->n_rates, one_rate, a);
                        break;
                case ARG_CONVERSATIONS:
                        r = parse_unsigned("--conversations", optarg, 1, 100000, &n);
                        a->mt.gen.conversations = n;
                        break;
                case ARG_SEED:
                        r = parse_unsigned("--seed", optarg, 0, UINT32_MAX, &n);
                        a->mt.gen.seed = n;
                        break;
                case ARG_THINK:
                        r = parse_duration_opt("--think", optarg, &u);
                        a->mt.gen.think_mean_s = (double)u / NSEC_PER_SEC;
                        break;
                case ARG_PEER_CAPACITY:
                        r = parse_size_opt("--peer-capacity", optarg, &u);
                        a->mt.peer_capacity_bytes = (double)u;
                        break;
                case ARG_DRAM_CAPACITY:
                        r = parse_size_opt("--dram-capacity", optarg, &u);
                        a->mt.dram_capacity_bytes = (double)u;
                        break;
                case ARG_BUSY:
                        r = parse_list("--busy", optarg, &a->n_busy, one_busy, a);
                        break;
                case ARG_PEER_BW:
                        r = parse_number("--peer-bw", optarg, 1e-3, &a->peer.gbytes_per_s);
                        break;
                case ARG_PCIE_BW:
                        r = parse_number("--pcie-bw", optarg, 1e-3, &a->host.gpu_gbps);
                        break;
                case ARG_UPLINK_BW:
                        r = parse_number("--uplink-bw", optarg, 1e-3, &a->host.uplink_gbps);
                        break;
                case ARG_HOST_MEM_BW:
                        r = parse_number("--host-mem-bw", optarg, 1e-3, &a->host.host_mem_gbps);
                        break;
                case ARG_GPUS:
                        r = parse_unsigned("--gpus", optarg, 1, 1024, &a->host.gpus);
                        break;
                case ARG_GPUS_PER_SWITCH:
                        r = parse_unsigned("--gpus-per-switch", optarg, 1, 1024,
                                           &a->host.gpus_per_switch);
                        break;
                case ARG_SWAP:
                        if (strcmp(optarg, "aqua") == 0)
                                a->aqua = true;
                        else if (strcmp(optarg, "host") != 0)
                                r = log_error_errno(EINVAL, "--swap: 'host' or 'aqua', not \"%s\"",
                                                    optarg);
                        break;
                case ARG_AQUA_DEVICE:
                        r = parse_unsigned("--aqua-device", optarg, 0, 1024, &n);
                        a->aqua_cfg.device = (int)n;
                        break;
                case ARG_AQUA_BORROW:
                        r = parse_size_opt("--aqua-borrow", optarg, &a->aqua_cfg.borrow_bytes);
                        break;
                case ARG_HOLD:
                        a->hold = true;
                        break;
                case ARG_HOLD_TIMEOUT:
                        r = parse_duration_opt("--hold-timeout", optarg, &a->hold_timeout_ns);
                        break;
                case ARG_OUT:
                        a->out = optarg;
                        break;
                case ARG_QUIET:
                        a->quiet = true;
                        break;
                case 'h':
                        help();
                        return 1;
                default:
                        return -EINVAL;
                }
                if (r < 0)
                        return r;
        }
        if (optind < argc)
                return log_error_errno(EINVAL, "Unexpected argument \"%s\" (see --help)",
                                       argv[optind]);
        if (a->hold && !a->aqua)
                return log_error_errno(EINVAL, "--hold needs --swap aqua");
        bool listed = false;
        for (size_t i = 0; i < a->n_contexts; i++)
                listed = listed || a->contexts[i] == a->context;
        if (!listed)
                return log_error_errno(EINVAL, "--context %" PRIu64 " is not one of --contexts",
                                       a->context);
        return 0;
}

static double now_s(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char *gb(char *buf, size_t n, double bytes)
{
        if (bytes >= 1e9)
                snprintf(buf, n, "%.1f GB", bytes / 1e9);
        else if (bytes >= 1e6)
                snprintf(buf, n, "%.1f MB", bytes / 1e6);
        else
                snprintf(buf, n, "%.0f B", bytes);
        return buf;
}

static const char *tokens_str(char *buf, size_t n, uint64_t t)
{
        if (t % (1 << 20) == 0)
                snprintf(buf, n, "%" PRIu64 "M", t >> 20);
        else if (t % 1024 == 0)
                snprintf(buf, n, "%" PRIu64 "K", t >> 10);
        else
                snprintf(buf, n, "%" PRIu64, t);
        return buf;
}

/* The DRAM tier's cost when `busy` GPUs share the host link. */
static struct kv_tier_cost dram_cost(const struct args *a, unsigned busy,
                                     enum host_link_limit *ret_limit)
{
        struct kv_tier_cost c = a->pcie;
        c.gbytes_per_s = host_link_share(&a->host, busy, ret_limit);
        return c;
}

/* ------------------------------------------------------------ real bytes of the long prompt */

/* One 8-byte sample per token of each offloaded layer, in an aqua tensor or host memory. */
struct lp_bytes {
        const char *name; /* "peer" or "dram": the tier the model stands for */
        aqua_ctx *ctx;    /* NULL: host memory */
        aqua_tensor *tensor;
        aqua_layers *layers;
        uint64_t *host; /* the store, without aqua */
        uint64_t base;  /* the store's address */
        unsigned n_layers;
        uint64_t tokens, cap; /* tokens written per layer; room per layer */
        uint64_t *buf[2], *tok;
        uint64_t verified[3]; /* by aqua tier: [0] host memory, [1] peer, [2] DRAM */
        uint64_t failures, prefetches, offloads, bytes;
};

static uint64_t sample(uint64_t seed, unsigned layer, uint64_t token)
{
        uint64_t z = seed ^ ((uint64_t)layer << 40) ^ token;
        z += UINT64_C(0x9e3779b97f4a7c15);
        z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
        return z ^ (z >> 31);
}

static int lp_copy(struct lp_bytes *b, bool offload, unsigned layer, uint64_t dst, uint64_t src,
                   uint64_t bytes)
{
        b->bytes += bytes;
        if (!b->ctx) {
                memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
                return 0;
        }
        struct aqua_copy_piece piece = {dst, src, bytes};
        int r = offload ? aqua_layers_offload(b->layers, layer, &piece, 1, NULL)
                        : aqua_layers_prefetch(b->layers, layer, &piece, 1, NULL);
        if (r < 0)
                return r;
        return aqua_layers_wait(b->layers, layer);
}

/* Where layer j's samples are now: 0 host memory, 1 peer, 2 DRAM (3 local counts as 0). */
static unsigned lp_where(struct lp_bytes *b, unsigned j)
{
        struct aqua_tensor_range rg;
        if (!b->ctx || aqua_tensor_get_range(b->ctx, b->tensor, j * b->cap * 8, &rg) < 0)
                return 0;
        return rg.tier == AQUA_TIER_PEER ? 1 : rg.tier == AQUA_TIER_DRAM ? 2 : 0;
}

static int lp_bytes_open(struct lp_bytes *b, const char *name, aqua_ctx *ctx, enum aqua_tier tier,
                         unsigned n_layers, uint64_t tokens, unsigned steps)
{
        *b = (struct lp_bytes){.name = name,
                               .ctx = ctx,
                               .n_layers = n_layers,
                               .tokens = tokens,
                               .cap = tokens + steps};
        uint64_t bytes = (uint64_t)n_layers * b->cap * 8;
        int r;

        b->buf[0] = malloc(b->cap * 8);
        b->buf[1] = malloc(b->cap * 8);
        b->tok = malloc(8);
        if (!b->buf[0] || !b->buf[1] || !b->tok)
                return -ENOMEM;
        if (ctx) {
                struct aqua_tensor_options o = AQUA_TENSOR_OPTIONS_INIT;
                o.tier = tier;
                r = aqua_tensor_new(ctx, bytes, &o, &b->tensor);
                if (r >= 0)
                        r = aqua_tensor_grow(ctx, b->tensor, bytes);
                if (r == AQUA_NO_MEMORY)
                        r = -ENOSPC;
                if (r >= 0)
                        r = aqua_layers_new(ctx, n_layers, NULL, NULL, &b->layers);
                if (r < 0)
                        return r;
                b->base = aqua_tensor_dptr(b->tensor);
        } else {
                b->host = malloc(bytes);
                if (!b->host)
                        return -ENOMEM;
                b->base = (uint64_t)(uintptr_t)b->host;
        }
        /* The prefill's result: every token of each offloaded layer goes out once. */
        for (unsigned j = 0; j < n_layers; j++) {
                for (uint64_t t = 0; t < tokens; t++)
                        b->buf[0][t] = sample(1, j, t);
                r = lp_copy(b, true, j, b->base + j * b->cap * 8, (uint64_t)(uintptr_t)b->buf[0],
                            tokens * 8);
                if (r < 0)
                        return r;
                b->offloads++;
        }
        return 0;
}

/* One decode step on the real bytes: each offloaded layer comes in and is checked; the new
 * token's sample goes out. */
static int lp_bytes_step(struct lp_bytes *b)
{
        for (unsigned j = 0; j < b->n_layers; j++) {
                uint64_t *buf = b->buf[j % 2], off = b->base + j * b->cap * 8;
                unsigned where = lp_where(b, j);
                int r = lp_copy(b, false, j, (uint64_t)(uintptr_t)buf, off, b->tokens * 8);
                if (r < 0)
                        return r;
                b->prefetches++;
                bool ok = true;
                for (uint64_t t = 0; t < b->tokens && ok; t++)
                        ok = buf[t] == sample(1, j, t);
                if (!ok) {
                        b->failures++;
                        log_error("Long prompt (%s): layer %u's KV came back wrong", b->name, j);
                } else
                        b->verified[where]++;
                *b->tok = sample(1, j, b->tokens);
                r = lp_copy(b, true, j, off + b->tokens * 8, (uint64_t)(uintptr_t)b->tok, 8);
                if (r < 0)
                        return r;
                b->offloads++;
        }
        b->tokens++;
        return 0;
}

static uint64_t lp_bytes_peer(struct lp_bytes *b)
{
        struct aqua_tensor_info info;
        if (!b->ctx || aqua_tensor_get_info(b->ctx, b->tensor, &info) < 0)
                return 0;
        return info.peer_bytes;
}

static void lp_bytes_close(struct lp_bytes *b)
{
        if (b->ctx) {
                aqua_layers_free(b->layers);
                aqua_tensor_free(b->ctx, b->tensor);
        }
        free(b->host);
        free(b->buf[0]);
        free(b->buf[1]);
        free(b->tok);
}

/* ------------------------------------------------------------ real bytes of the multi-turn */

struct mt_real {
        struct kv_swap *swap;
        bool aqua;
        uint32_t sample, block_tokens;
        void **slot; /* per conversation: its context's sample in the tier */
        uint8_t **buf;
        uint64_t *filled; /* tokens of buf[] holding their samples */
        size_t n_conv;
        uint64_t stores, loads, evictions, failures, verified[_KV_TIER_MAX];
        /* The demo's hold: once the peer tier has slots and virtual time passes hold_at. */
        struct args *args;
        struct lp_bytes *lp;
        bool hold, held;
        uint64_t hold_at_ns;
        uint64_t moved_bytes; /* what the reclaim at the hold moved to DRAM */
};

/* The samples of tokens [first, first + n) of a conversation's context. */
static void mt_fill(const struct mt_real *m, uint32_t conv, uint8_t *p, uint64_t first, uint64_t n)
{
        for (uint64_t t = 0; t < n; t++)
                for (uint32_t k = 0; k < m->sample; k += 8) {
                        uint64_t v = sample(conv + 2, k, first + t);
                        memcpy(p + t * m->sample + k, &v, 8);
                }
}

static int mt_blocks(struct mt_real *m, uint32_t conv, uint64_t tokens, void ***ret, size_t *ret_n)
{
        size_t n = tokens / m->block_tokens;
        void **v = calloc(n ? n : 1, sizeof(*v));
        if (!v)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                v[i] = m->buf[conv] + i * m->block_tokens * m->sample;
        *ret = v;
        *ret_n = n;
        return 0;
}

static int mt_store(void *userdata, uint32_t conv, uint64_t tokens)
{
        struct mt_real *m = userdata;
        void **blocks;
        size_t n;
        enum kv_tier tier;

        if (m->slot[conv]) {
                m->swap->ops->discard(m->swap->ctx, m->slot[conv]);
                m->slot[conv] = NULL;
        }
        /* The context only grows: the samples of its earlier tokens are there already. */
        if (tokens > m->filled[conv]) {
                uint8_t *p = realloc(m->buf[conv], tokens * m->sample);
                if (!p)
                        return -ENOMEM;
                m->buf[conv] = p;
                mt_fill(m, conv, p + m->filled[conv] * m->sample, m->filled[conv],
                        tokens - m->filled[conv]);
                m->filled[conv] = tokens;
        }
        int r = mt_blocks(m, conv, tokens, &blocks, &n);
        if (r < 0)
                return r;
        r = m->swap->ops->swap_out(m->swap->ctx, blocks, n, m->block_tokens * m->sample,
                                   &m->slot[conv], &tier);
        free(blocks);
        if (r < 0)
                return log_error_errno(r, "Multi-turn: storing conversation %u's KV failed: %m",
                                       conv);
        m->stores++;
        return 0;
}

static int mt_load(void *userdata, uint32_t conv, uint64_t tokens)
{
        struct mt_real *m = userdata;
        void **blocks;
        size_t n;

        if (!m->slot[conv])
                return log_error_errno(EPROTO, "Multi-turn: conversation %u has no stored KV",
                                       conv);
        if (tokens > m->filled[conv])
                return log_error_errno(EPROTO,
                                       "Multi-turn: conversation %u: a load of %" PRIu64
                                       " tokens, %" PRIu64 " stored",
                                       conv, tokens, m->filled[conv]);
        enum kv_tier tier = m->swap->ops->tier_of(m->swap->ctx, m->slot[conv]);
        memset(m->buf[conv], 0, tokens * m->sample);
        int r = mt_blocks(m, conv, tokens, &blocks, &n);
        if (r < 0)
                return r;
        r = m->swap->ops->swap_in(m->swap->ctx, m->slot[conv], blocks, n,
                                  m->block_tokens * m->sample);
        m->slot[conv] = NULL;
        free(blocks);
        uint8_t *want = r >= 0 ? malloc(tokens * m->sample) : NULL;
        if (want) {
                mt_fill(m, conv, want, 0, tokens);
                if (memcmp(want, m->buf[conv], tokens * m->sample) != 0)
                        r = -EIO;
        } else if (r >= 0)
                r = -ENOMEM;
        free(want);
        m->loads++;
        if (r < 0) {
                m->failures++;
                return log_error_errno(r, "Multi-turn: conversation %u's KV came back wrong: %m",
                                       conv);
        }
        m->verified[tier]++;
        return 0;
}

static void mt_evict(void *userdata, uint32_t conv)
{
        struct mt_real *m = userdata;
        if (m->slot[conv]) {
                m->swap->ops->discard(m->swap->ctx, m->slot[conv]);
                m->slot[conv] = NULL;
                m->evictions++;
        }
}

/* Stop the clock until a reclaim moved the peer memory (the demo raises the lender's load). */
static int hold(struct mt_real *m)
{
        struct kv_swap_aqua_stats st;
        kv_swap_aqua_stats(m->swap, &st);
        uint64_t lp_peer = m->lp ? lp_bytes_peer(m->lp) : 0, lp_before = lp_peer;
        uint64_t migrated_before = st.migrated_bytes;
        if (st.slots_peer == 0 && lp_peer == 0)
                return 0;
        m->held = true;
        printf("HOLD multi-turn slots in peer memory: %" PRIu64 ", long-prompt KV in peer memory: "
               "%" PRIu64 " bytes\n",
               st.slots_peer, lp_peer);
        fflush(stdout);
        double until = now_s() + (double)m->args->hold_timeout_ns / NSEC_PER_SEC;
        bool moved = false;
        while (!moved && now_s() < until) {
                int r = m->swap->ops->poll(m->swap->ctx);
                if (r < 0)
                        return r;
                (void)kv_swap_aqua_take_reclaimed(m->swap);
                kv_swap_aqua_stats(m->swap, &st);
                lp_peer = m->lp ? lp_bytes_peer(m->lp) : 0;
                moved = st.slots_peer == 0 && lp_peer == 0;
                if (!moved)
                        nanosleep(&(struct timespec){0, 10000000}, NULL);
        }
        m->moved_bytes = st.migrated_bytes - migrated_before + (lp_before - lp_peer);
        printf("RESUME %s: multi-turn slots in peer memory %" PRIu64 ", in DRAM %" PRIu64
               "; long-prompt KV in peer memory %" PRIu64 " bytes\n",
               moved ? "after a reclaim" : "without a reclaim (timed out)", st.slots_peer,
               st.slots_dram, lp_peer);
        fflush(stdout);
        return 0;
}

static int mt_poll(void *userdata, uint64_t now)
{
        struct mt_real *m = userdata;
        if (m->hold && !m->held && now >= m->hold_at_ns)
                return hold(m);
        return m->swap->ops->poll ? m->swap->ops->poll(m->swap->ctx) : 0;
}

static int mt_real_open(struct mt_real *m, struct kv_swap *swap, const struct mt_config *c,
                        uint32_t sample)
{
        *m = (struct mt_real){.swap = swap,
                              .sample = sample,
                              .block_tokens = c->block_tokens,
                              .n_conv = c->gen.conversations};
        m->slot = calloc(m->n_conv, sizeof(*m->slot));
        m->buf = calloc(m->n_conv, sizeof(*m->buf));
        m->filled = calloc(m->n_conv, sizeof(*m->filled));
        return m->slot && m->buf && m->filled ? 0 : -ENOMEM;
}

/* Drop what a run left in the tier (not an eviction), keeping the counters. */
static void mt_real_drop(struct mt_real *m)
{
        for (size_t i = 0; m->slot && i < m->n_conv; i++)
                if (m->slot[i]) {
                        m->swap->ops->discard(m->swap->ctx, m->slot[i]);
                        m->slot[i] = NULL;
                }
}

static void mt_real_close(struct mt_real *m)
{
        mt_real_drop(m);
        for (size_t i = 0; m->buf && i < m->n_conv; i++)
                free(m->buf[i]);
        free(m->slot);
        free(m->buf);
        free(m->filled);
        m->slot = NULL;
        m->buf = NULL;
        m->filled = NULL;
}

/* ------------------------------------------------------------ the runs */

struct lp_row {
        uint64_t context;
        struct lp_plan plan;
        int plan_r;
        struct lp_step hbm, peer, dram[MAX_LIST];
};

struct mt_row {
        enum mt_tier tier;
        unsigned busy;
        double rate;
        struct mt_result r;
        double ttft_p50, ttft_p99, goodput, hit_rate, attain;
        double nvlink, pcie;
};

static double pct_ms(struct stats *s, double p)
{
        uint64_t v;
        return stats_percentile(s, p, &v) < 0 ? 0 : v / 1e6;
}

static void mt_summarize(struct mt_row *w)
{
        struct mt_result *r = &w->r;
        w->ttft_p50 = pct_ms(&r->ttft_follow, 50);
        w->ttft_p99 = pct_ms(&r->ttft_follow, 99);
        double span = (double)(r->last_finish_ns - r->first_arrival_ns) / 1e9;
        w->goodput = span > 0 ? r->sla_met_follow / span : 0;
        w->attain = r->follow_ups ? (double)r->sla_met_follow / r->follow_ups : 0;
        w->hit_rate =
            r->follow_ups ? (double)(r->hit_local + r->hit_peer + r->hit_dram) / r->follow_ups : 0;
        w->nvlink = r->load_bytes[KV_TIER_PEER] + r->store_bytes[KV_TIER_PEER];
        w->pcie = r->load_bytes[KV_TIER_DRAM] + r->store_bytes[KV_TIER_DRAM];
}

/* One multi-turn run; real bytes through `swap` (NULL: none). */
static int mt_one(struct args *a, enum mt_tier tier, unsigned busy, double rate,
                  struct kv_swap *swap, struct mt_real *real, struct mt_row *ret)
{
        struct mt_config c = a->mt;
        if (a->peer_capacity_override > 0)
                c.peer_capacity_bytes = a->peer_capacity_override;
        struct mt_bytes hooks = {real, mt_store, mt_load, mt_evict, mt_poll};
        c.tier = tier;
        c.gen.rate = rate;
        c.peer = a->peer;
        c.dram = dram_cost(a, busy, NULL);
        c.bytes = swap && tier != MT_NONE ? &hooks : NULL;
        *ret = (struct mt_row){.tier = tier, .busy = busy, .rate = rate};
        int r = mt_run(&c, &ret->r);
        if (r < 0)
                return log_error_errno(r, "Multi-turn (%s, %u busy, %g/s) failed: %m",
                                       mt_tier_to_string(tier), busy, rate);
        mt_summarize(ret);
        return 0;
}

static double ratio(double num, double den)
{
        return num > 0 && den > 0 ? num / den : 0;
}

static void print_ratio(const char *what, double x)
{
        if (x > 0)
                printf("  %-52s %6.1fx\n", what, x);
        else
                printf("  %-52s %7s\n", what, "-");
}

static int busy_index(const struct args *a, unsigned busy)
{
        for (size_t i = 0; i < a->n_busy; i++)
                if (a->busy[i] == busy)
                        return (int)i;
        return -1;
}

static void print_lp(const struct args *a, const struct lp_row *rows, size_t n,
                     const struct lp_bytes *peer, const struct lp_bytes *dram)
{
        char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32];
        const struct lp_model *m = &a->lp;
        printf(
            "\nLong prompt: one request decoding alone, Llama-3-8B's shape (%u layers, %s of KV\n"
            "per token and layer, %s of weights) on one H100 (%s HBM at %.0f GB/s, %.0f%% of it\n"
            "for vLLM, %s for activations: %s for KV). Layers whose KV does not fit stream\n"
            "in every step, the next prefetched while one computes (%u buffers). None: vLLM\n"
            "refuses a request whose KV does not fit. Recompute does not apply: rebuilding a\n"
            "layer's KV needs its input kept, %s per token against the %s of KV it saves.\n",
            m->layers, format_size(b1, sizeof(b1), m->kv_bytes_per_token_layer),
            gb(b2, sizeof(b2), m->weight_bytes), gb(b3, sizeof(b3), m->hbm_bytes), m->hbm_gbps,
            100 * m->mem_util, gb(b4, sizeof(b4), m->activation_bytes),
            gb(b5, sizeof(b5), rows[0].plan.kv_budget_bytes), m->buffers,
            format_size(b6, sizeof(b6), m->hidden_bytes_per_token),
            format_size(b7, sizeof(b7), m->kv_bytes_per_token_layer));
        printf("\n  context   KV     in HBM/streamed   tokens/s: peer");
        for (size_t k = 0; k < a->n_busy; k++)
                printf("  DRAM %u busy", a->busy[k]);
        for (size_t k = 0; k < a->n_busy; k++)
                printf("  peer/DRAM %u", a->busy[k]);
        printf("\n");
        for (size_t i = 0; i < n; i++) {
                const struct lp_row *w = &rows[i];
                printf("LONG %5s %7s", tokens_str(b1, sizeof(b1), w->context),
                       gb(b2, sizeof(b2),
                          (double)w->context * m->kv_bytes_per_token_layer * m->layers));
                if (w->plan_r < 0) {
                        printf("  does not fit even streamed\n");
                        continue;
                }
                printf("  %6u/%-2u %19.1f", w->plan.resident, w->plan.offloaded,
                       w->peer.tokens_per_s);
                for (size_t k = 0; k < a->n_busy; k++)
                        printf(" %12.1f", w->dram[k].tokens_per_s);
                for (size_t k = 0; k < a->n_busy; k++)
                        printf(" %11.1fx", ratio(w->peer.tokens_per_s, w->dram[k].tokens_per_s));
                printf("\n");
        }
        const struct lp_row *h = NULL;
        for (size_t i = 0; i < n; i++)
                if (rows[i].context == a->context)
                        h = &rows[i];
        if (h && h->plan_r >= 0) {
                printf("What the link adds at %s (peer against DRAM, what works today):\n",
                       tokens_str(b1, sizeof(b1), h->context));
                for (size_t k = 0; k < a->n_busy; k++) {
                        char what[80];
                        snprintf(what, sizeof(what), "tokens/s, %u GPU%s on the host link",
                                 a->busy[k], a->busy[k] == 1 ? "" : "s");
                        print_ratio(what, ratio(h->peer.tokens_per_s, h->dram[k].tokens_per_s));
                }
                printf("  per step: compute %.1f ms; streamed layers' transfers %.1f ms over "
                       "NVLink,",
                       h->peer.compute_ns / 1e6, h->peer.transfer_ns / 1e6);
                for (size_t k = 0; k < a->n_busy; k++)
                        printf(" %.1f ms over PCIe (%u busy)%s", h->dram[k].transfer_ns / 1e6,
                               a->busy[k], k + 1 < a->n_busy ? "," : "");
                printf("\n");
        }
        if (peer && dram)
                printf("  real bytes: an 8-byte sample of every token of the %u streamed layers, "
                       "%" PRIu64 " steps each on\n  peer (%s) and DRAM (%s); layers checked: "
                       "%" PRIu64 " from peer, %" PRIu64 " from DRAM, %" PRIu64
                       " from host memory, %" PRIu64 " wrong\n",
                       peer->n_layers, peer->prefetches / (peer->n_layers ? peer->n_layers : 1),
                       peer->ctx ? "an aqua tensor" : "host memory",
                       dram->ctx ? "an aqua DRAM tensor" : "host memory",
                       peer->verified[1] + dram->verified[1], peer->verified[2] + dram->verified[2],
                       peer->verified[0] + dram->verified[0], peer->failures + dram->failures);
}

static void print_mt(const struct args *a, struct mt_row *rows, size_t n,
                     const struct mt_row *same_room, const struct mt_real *real,
                     const struct mt_real *real2)
{
        char b1[32], b2[32], b3[32], b4[32];
        const struct mt_config *c = &a->mt;
        const struct mt_trace_gen *g = &c->gen;
        printf("\nMulti-turn: %zu conversations at %.2f/s, %u-%u turns; a first prompt of median "
               "%.0f tokens\n(system prompt, document, question), follow-ups of median %.0f, "
               "replies of median %.0f;\ncontexts up to %u tokens; think time %.0f s (mean). The "
               "GPU as in the burst demo, %s of HBM\nfor KV (running requests and cached "
               "prefixes); a finished turn's KV is offloaded (new blocks\nonly) and the next "
               "turn loads its prefix back before its prefill (vLLM's OffloadingConnector).\n"
               "Tier capacity: the lender's spare HBM %s, the DRAM budget %s. SLA: TTFT <= "
               "%.0f ms.\n",
               g->conversations, g->rate, g->turns_min, g->turns_max, g->first_median,
               g->user_median, g->output_median, g->context_max, g->think_mean_s,
               gb(b1, sizeof(b1), c->hbm_kv_bytes), gb(b2, sizeof(b2), c->peer_capacity_bytes),
               gb(b3, sizeof(b3), c->dram_capacity_bytes), c->sla_ttft_ns / 1e6);
        printf("\n  tier  busy  hits: HBM  tier  miss  follow-up TTFT p50    p99  SLA met  "
               "goodput      NVLink        PCIe\n");
        for (size_t i = 0; i < n; i++) {
                struct mt_row *w = &rows[i];
                uint64_t f = w->r.follow_ups ? w->r.follow_ups : 1;
                printf("TURNS %-4s %4u %9.0f%% %4.0f%% %4.0f%% %16.0fms %5.0fms %7.1f%% "
                       "%5.2f r/s %11s %11s\n",
                       mt_tier_to_string(w->tier), w->busy, 100.0 * w->r.hit_local / f,
                       100.0 * (w->r.hit_peer + w->r.hit_dram) / f, 100.0 * w->r.miss / f,
                       w->ttft_p50, w->ttft_p99, 100 * w->attain, w->goodput,
                       gb(b1, sizeof(b1), w->nvlink), gb(b4, sizeof(b4), w->pcie));
        }
        const struct mt_row *none = NULL, *dram[MAX_LIST] = {}, *peer = NULL, *aqua[MAX_LIST] = {};
        for (size_t i = 0; i < n; i++) {
                int k = busy_index(a, rows[i].busy);
                if (rows[i].tier == MT_NONE && k == 0)
                        none = &rows[i];
                else if (rows[i].tier == MT_DRAM && k >= 0)
                        dram[k] = &rows[i];
                else if (rows[i].tier == MT_PEER && k == 0)
                        peer = &rows[i];
                else if (rows[i].tier == MT_AQUA && k >= 0)
                        aqua[k] = &rows[i];
        }
        printf("What the link adds, peer against DRAM (follow-up TTFT p99):\n");
        for (size_t k = 0; k < a->n_busy; k++) {
                char what[80];
                snprintf(what, sizeof(what), "%u GPU%s on the host link", a->busy[k],
                         a->busy[k] == 1 ? "" : "s");
                print_ratio(what, peer && dram[k] ? ratio(dram[k]->ttft_p99, peer->ttft_p99) : 0);
        }
        if (same_room && dram[0] && peer) {
                /* Bandwidth alone: peer at DRAM's capacity against DRAM. Capacity alone: peer at
                 * its own capacity against peer at DRAM's. The factor further from 1 decides. */
                double bw = ratio(dram[0]->ttft_p99, same_room->ttft_p99);
                double cap = ratio(same_room->ttft_p99, peer->ttft_p99);
                printf("  bandwidth alone (peer given the DRAM budget's capacity, against DRAM): "
                       "%.2fx\n  capacity alone (peer at the lender's capacity, against that): "
                       "%.2fx\n  hit rates: DRAM %.0f%%, peer %.0f%%: %s decides\n",
                       bw, cap, 100 * dram[0]->hit_rate, 100 * peer->hit_rate,
                       !(bw > 0 && cap > 0)                                    ? "-"
                       : fabs(log(bw)) < log(1.1) && fabs(log(cap)) < log(1.1) ? "neither"
                       : fabs(log(bw)) > fabs(log(cap))                        ? "bandwidth"
                                                                               : "capacity");
        }
        printf("Against what operators run today, none (recompute), follow-up TTFT p99:\n");
        print_ratio("DRAM offload (1 busy)",
                    none && dram[0] ? ratio(none->ttft_p99, dram[0]->ttft_p99) : 0);
        print_ratio("aqua, peer then DRAM (1 busy)",
                    none && aqua[0] ? ratio(none->ttft_p99, aqua[0]->ttft_p99) : 0);
        if (none && aqua[0])
                printf("  hit rates: none %.0f%%, aqua %.0f%%\n", 100 * none->hit_rate,
                       100 * aqua[0]->hit_rate);
        if (real && real2)
                printf("  real bytes: a sample of %u bytes of every token; %" PRIu64
                       " stores, %" PRIu64 " loads checked (%" PRIu64 " from peer, %" PRIu64
                       " from DRAM), %" PRIu64 " wrong\n",
                       real->sample, real->stores + real2->stores, real->loads + real2->loads,
                       real->verified[KV_TIER_PEER] + real2->verified[KV_TIER_PEER],
                       real->verified[KV_TIER_DRAM] + real2->verified[KV_TIER_DRAM],
                       real->failures + real2->failures);
}

static void summary_lp(const struct args *a, const struct lp_row *rows, size_t n)
{
        for (size_t i = 0; i < n; i++) {
                const struct lp_row *w = &rows[i];
                if (w->plan_r < 0)
                        continue;
                printf("SUMMARY case=long-prompt context=%" PRIu64
                       " resident=%u streamed=%u tier=peer "
                       "busy=0 tokens_per_s=%.3f step_ms=%.3f link_bytes=%.0f\n",
                       w->context, w->plan.resident, w->plan.offloaded, w->peer.tokens_per_s,
                       w->peer.step_ns / 1e6, w->peer.link_bytes);
                for (size_t k = 0; k < a->n_busy; k++)
                        printf("SUMMARY case=long-prompt context=%" PRIu64 " resident=%u "
                               "streamed=%u tier=dram busy=%u tokens_per_s=%.3f step_ms=%.3f "
                               "link_bytes=%.0f\n",
                               w->context, w->plan.resident, w->plan.offloaded, a->busy[k],
                               w->dram[k].tokens_per_s, w->dram[k].step_ns / 1e6,
                               w->dram[k].link_bytes);
        }
}

static void summary_mt(const struct mt_row *w, const char *extra)
{
        const struct mt_result *r = &w->r;
        printf("SUMMARY case=multi-turn%s tier=%s busy=%u rate=%g conversations=%" PRIu64
               " turns=%" PRIu64 " done=%" PRIu64 " follow_ups=%" PRIu64 " hit_local=%" PRIu64
               " hit_peer=%" PRIu64 " hit_dram=%" PRIu64 " miss=%" PRIu64
               " follow_ttft_p50_ms=%.3f follow_ttft_p99_ms=%.3f sla_met_follow=%" PRIu64
               " goodput_rps=%.4f load_peer_bytes=%.0f load_dram_bytes=%.0f store_peer_bytes=%.0f"
               " store_dram_bytes=%.0f nvlink_bytes=%.0f pcie_bytes=%.0f evictions=%" PRIu64
               " loaded_tokens=%" PRIu64 " recomputed_tokens=%" PRIu64 " bytes_errors=%" PRIu64
               "\n",
               extra, mt_tier_to_string(w->tier), w->busy, w->rate, r->conversations, r->turns,
               r->done, r->follow_ups, r->hit_local, r->hit_peer, r->hit_dram, r->miss, w->ttft_p50,
               w->ttft_p99, r->sla_met_follow, w->goodput, r->load_bytes[KV_TIER_PEER],
               r->load_bytes[KV_TIER_DRAM], r->store_bytes[KV_TIER_PEER],
               r->store_bytes[KV_TIER_DRAM], w->nvlink, w->pcie, r->evictions, r->loaded_tokens,
               r->recomputed_tokens, r->bytes_errors);
}

static int write_dat(const struct args *a, const struct lp_row *lp, size_t n_lp,
                     struct mt_row *sweep, size_t n_sweep)
{
        _cleanup_free_ char *p1 = NULL, *p2 = NULL;
        if (asprintf(&p1, "%s-long.dat", a->out) < 0 || asprintf(&p2, "%s-turns.dat", a->out) < 0)
                return -ENOMEM;
        FILE *f = fopen(p1, "we");
        if (!f)
                return log_error_errno(errno, "Failed to open %s: %m", p1);
        /* Blocks: peer, then DRAM at each busy count; context in K tokens, tokens/s. */
        fprintf(f, "# long prompt, tier peer: context_k tokens_per_s\n");
        for (size_t i = 0; i < n_lp; i++)
                if (lp[i].plan_r >= 0)
                        fprintf(f, "%" PRIu64 " %.3f\n", lp[i].context >> 10,
                                lp[i].peer.tokens_per_s);
        for (size_t k = 0; k < a->n_busy; k++) {
                fprintf(f, "\n\n# long prompt, tier dram, %u busy: context_k tokens_per_s\n",
                        a->busy[k]);
                for (size_t i = 0; i < n_lp; i++)
                        if (lp[i].plan_r >= 0)
                                fprintf(f, "%" PRIu64 " %.3f\n", lp[i].context >> 10,
                                        lp[i].dram[k].tokens_per_s);
        }
        if (fclose(f) != 0)
                return log_error_errno(errno, "Failed to write %s: %m", p1);
        f = fopen(p2, "we");
        if (!f)
                return log_error_errno(errno, "Failed to open %s: %m", p2);
        /* Blocks in sweep order (tier, busy), each over the rates. */
        const char *sep = "";
        for (size_t i = 0; i < n_sweep; i++) {
                if (i == 0 || sweep[i].tier != sweep[i - 1].tier ||
                    sweep[i].busy != sweep[i - 1].busy) {
                        fprintf(f,
                                "%s# multi-turn, tier %s, %u busy: rate follow_ttft_p99_s "
                                "goodput_rps\n",
                                sep, mt_tier_to_string(sweep[i].tier), sweep[i].busy);
                        sep = "\n\n";
                }
                fprintf(f, "%g %.4f %.4f\n", sweep[i].rate, sweep[i].ttft_p99 / 1000,
                        sweep[i].goodput);
        }
        if (fclose(f) != 0)
                return log_error_errno(errno, "Failed to write %s: %m", p2);
        return 0;
}

int main(int argc, char **argv)
{
        struct args a = {};
        struct kv_swap shared = {}, host_dram = {}, host_peer = {};
        struct lp_bytes lpb_peer = {}, lpb_dram = {};
        struct lp_row lp[MAX_LIST] = {};
        struct mt_row rows[4 * MAX_LIST] = {}, same_room = {}, *sweep = NULL;
        struct mt_real real_aqua = {}, real_dram = {};
        size_t n_rows = 0, n_sweep = 0;
        bool lp_bytes_on = false;
        int r;

        log_setup("aqua-cases", LOG_LEVEL_INFO);
        r = parse_args(argc, argv, &a);
        if (r != 0)
                return r > 0 ? EXIT_SUCCESS : EXIT_FAILURE;

        /* The long prompt's model, every context. */
        const struct lp_row *head = NULL;
        for (size_t i = 0; i < a.n_contexts; i++) {
                struct lp_row *w = &lp[i];
                w->context = a.contexts[i];
                w->plan_r = lp_plan(&a.lp, w->context, &w->plan);
                if (w->plan_r < 0)
                        continue;
                lp_step(&a.lp, &w->plan, NULL, &w->hbm);
                lp_step(&a.lp, &w->plan, &a.peer, &w->peer);
                for (size_t k = 0; k < a.n_busy; k++) {
                        struct kv_tier_cost d = dram_cost(&a, a.busy[k], NULL);
                        lp_step(&a.lp, &w->plan, &d, &w->dram[k]);
                }
                if (w->context == a.context)
                        head = w;
        }

        /* Where the sampled bytes go. */
        if (a.aqua) {
                r = kv_swap_aqua_new(&a.aqua_cfg, &shared);
                if (r < 0) {
                        log_error_errno(r, "Failed to set up the aqua backend: %m");
                        if (r == -ENOENT || r == -ECONNREFUSED)
                                log_error("Is aquad running? $AQUA_ENDPOINT names it.");
                        goto out;
                }
        }
        r = kv_swap_host_new(KV_TIER_DRAM, 0, &host_dram);
        if (r >= 0)
                r = kv_swap_host_new(KV_TIER_PEER, 0, &host_peer);
        if (r < 0) {
                log_error_errno(r, "Failed to set up the host backends: %m");
                goto out;
        }
        aqua_ctx *ctx = a.aqua ? kv_swap_aqua_context(&shared) : NULL;
        if (a.hold) {
                /* A lender that just got its memory back from a consumer offers it again once
                 * aquad has scrubbed it: wait for peer memory, as the hold needs some. */
                struct kv_swap_aqua_stats st;
                double until = now_s() + (double)a.hold_timeout_ns / NSEC_PER_SEC;
                for (;;) {
                        r = shared.ops->poll(shared.ctx);
                        if (r < 0) {
                                log_error_errno(r, "aqua: %m");
                                goto out;
                        }
                        kv_swap_aqua_stats(&shared, &st);
                        if (st.lent_bytes > 0 || now_s() >= until)
                                break;
                        nanosleep(&(struct timespec){0, 50000000}, NULL);
                }
                if (st.lent_bytes == 0)
                        log_warning("aqua: no peer memory lent after %.0f s; the sampled KV goes "
                                    "to DRAM",
                                    (double)a.hold_timeout_ns / NSEC_PER_SEC);
        }

        /* The long prompt's real bytes at the headline context, the first half of its steps. */
        if (head && head->plan.offloaded > 0) {
                unsigned before = a.lp_steps / 2 ? a.lp_steps / 2 : 1;
                r = lp_bytes_open(&lpb_peer, "peer", ctx, AQUA_TIER_NONE, head->plan.offloaded,
                                  head->context, a.lp_steps);
                if (r >= 0)
                        r = lp_bytes_open(&lpb_dram, "dram", ctx, AQUA_TIER_DRAM,
                                          head->plan.offloaded, head->context, a.lp_steps);
                if (r == -ENOSPC && ctx) {
                        log_warning("Long prompt: no DRAM budget for a DRAM tensor; the DRAM "
                                    "tier's samples go to host memory");
                        lp_bytes_close(&lpb_dram);
                        r = lp_bytes_open(&lpb_dram, "dram", NULL, AQUA_TIER_DRAM,
                                          head->plan.offloaded, head->context, a.lp_steps);
                }
                for (unsigned s = 0; s < before && r >= 0; s++) {
                        r = lp_bytes_step(&lpb_peer);
                        if (r >= 0)
                                r = lp_bytes_step(&lpb_dram);
                }
                if (r < 0) {
                        log_error_errno(r, "Long prompt: moving the sampled KV failed: %m");
                        goto out;
                }
                lp_bytes_on = true;
        }

        /* Multi-turn at the headline rate: each tier at each busy count. The peer and aqua tiers'
         * bytes go through aqua when it is there, DRAM's through host memory (as in the burst
         * demo's (b)); the hold, when asked, comes in the middle of the first peer run. */
        r = mt_real_open(&real_aqua, a.aqua ? &shared : &host_peer, &a.mt, a.mt_sample);
        if (r >= 0)
                r = mt_real_open(&real_dram, &host_dram, &a.mt, a.mt_sample);
        if (r < 0)
                goto out;
        real_aqua.args = &a;
        real_aqua.lp = lp_bytes_on ? &lpb_peer : NULL;
        real_aqua.hold_at_ns = (uint64_t)(a.mt.gen.conversations / a.mt.gen.rate / 2 * 1e9);
        for (int t = 0; t < _MT_TIER_MAX && r >= 0; t++)
                for (size_t k = 0; k < a.n_busy && r >= 0; k++) {
                        if ((t == MT_NONE || t == MT_PEER) && k > 0)
                                continue; /* the host link is not theirs */
                        struct mt_real *real = t == MT_DRAM ? &real_dram : &real_aqua;
                        /* The hold comes in the first aqua run: the peer run before it loads
                         * from peer memory throughout, the runs after it from DRAM. */
                        real->hold = a.hold && t == MT_AQUA && !real->held;
                        r = mt_one(&a, t, a.busy[k], a.mt.gen.rate, real->swap, real,
                                   &rows[n_rows++]);
                        mt_real_drop(real);
                }
        if (r >= 0) {
                /* Which decides: the peer tier with DRAM's capacity, bandwidth the only change. */
                a.peer_capacity_override = a.mt.dram_capacity_bytes;
                r = mt_one(&a, MT_PEER, a.busy[0], a.mt.gen.rate, NULL, NULL, &same_room);
                a.peer_capacity_override = 0;
        }
        if (r < 0)
                goto out;

        /* The long prompt's second half, after the hold (its KV in DRAM if a reclaim came). */
        if (lp_bytes_on) {
                for (unsigned s = a.lp_steps / 2 ? a.lp_steps / 2 : 1; s < a.lp_steps && r >= 0;
                     s++) {
                        r = lp_bytes_step(&lpb_peer);
                        if (r >= 0)
                                r = lp_bytes_step(&lpb_dram);
                }
                if (r < 0) {
                        log_error_errno(r, "Long prompt: moving the sampled KV failed: %m");
                        goto out;
                }
        }

        /* The sweep for the plot: the model alone over the rates (the runs above moved bytes). */
        sweep = calloc(_MT_TIER_MAX * a.n_busy * a.n_rates, sizeof(*sweep));
        if (!sweep) {
                r = -ENOMEM;
                goto out;
        }
        for (int t = 0; t < _MT_TIER_MAX && r >= 0 && a.out; t++)
                for (size_t k = 0; k < a.n_busy && r >= 0; k++) {
                        if ((t == MT_NONE || t == MT_PEER) && k > 0)
                                continue;
                        for (size_t i = 0; i < a.n_rates && r >= 0; i++) {
                                r = mt_one(&a, t, a.busy[k], a.rates[i], NULL, NULL,
                                           &sweep[n_sweep]);
                                if (r >= 0)
                                        mt_result_clear(&sweep[n_sweep++].r);
                        }
                }
        if (r < 0)
                goto out;

        if (!a.quiet) {
                enum host_link_limit lim;
                printf("\nThe host link: %u GPUs, %u behind each PCIe switch; a GPU's link %.0f "
                       "GB/s, a switch's uplink %.0f GB/s,\nhost memory %.0f GB/s; NVLink %.0f "
                       "GB/s per pair, private (one-to-one pairing). DRAM tier per GPU:",
                       a.host.gpus, a.host.gpus_per_switch, a.host.gpu_gbps, a.host.uplink_gbps,
                       a.host.host_mem_gbps, a.peer.gbytes_per_s);
                for (size_t k = 0; k < a.n_busy; k++) {
                        double g = host_link_share(&a.host, a.busy[k], &lim);
                        printf("%s %.1f GB/s with %u busy (%s)", k ? ";" : "", g, a.busy[k],
                               host_link_limit_to_string(lim));
                }
                printf(".\n");
                print_lp(&a, lp, a.n_contexts, lp_bytes_on ? &lpb_peer : NULL,
                         lp_bytes_on ? &lpb_dram : NULL);
                print_mt(&a, rows, n_rows, &same_room, &real_aqua, &real_dram);
                printf("\n");
        }
        summary_lp(&a, lp, a.n_contexts);
        for (size_t i = 0; i < n_rows; i++)
                summary_mt(&rows[i], "");
        summary_mt(&same_room, " capacity=dram");
        uint64_t lp_fail = lpb_peer.failures + lpb_dram.failures;
        uint64_t mt_fail = real_aqua.failures + real_dram.failures;
        printf("SUMMARY case=bytes swap=%s held=%d moved_bytes=%" PRIu64 " lp_context=%" PRIu64
               " lp_layers_checked_peer=%" PRIu64 " lp_layers_checked_dram=%" PRIu64
               " lp_layers_checked_host=%" PRIu64 " lp_prefetches=%" PRIu64 " lp_offloads=%" PRIu64
               " lp_bytes=%" PRIu64 " mt_stores=%" PRIu64 " mt_loads=%" PRIu64
               " mt_checked_peer=%" PRIu64 " mt_checked_dram=%" PRIu64 " mt_evictions=%" PRIu64
               " checksum_failures=%" PRIu64 "\n",
               a.aqua ? "aqua" : "host", real_aqua.held, real_aqua.moved_bytes, a.context,
               lpb_peer.verified[1] + lpb_dram.verified[1],
               lpb_peer.verified[2] + lpb_dram.verified[2],
               lpb_peer.verified[0] + lpb_dram.verified[0],
               lpb_peer.prefetches + lpb_dram.prefetches, lpb_peer.offloads + lpb_dram.offloads,
               lpb_peer.bytes + lpb_dram.bytes, real_aqua.stores + real_dram.stores,
               real_aqua.loads + real_dram.loads,
               real_aqua.verified[KV_TIER_PEER] + real_dram.verified[KV_TIER_PEER],
               real_aqua.verified[KV_TIER_DRAM] + real_dram.verified[KV_TIER_DRAM],
               real_aqua.evictions + real_dram.evictions, lp_fail + mt_fail);
        if (a.out) {
                r = write_dat(&a, lp, a.n_contexts, sweep, n_sweep);
                if (r < 0)
                        goto out;
                printf("CASES data=%s-long.dat,%s-turns.dat\n", a.out, a.out);
        }
        if (lp_fail + mt_fail > 0) {
                log_error("Some sampled KV came back wrong (see the SUMMARY lines)");
                r = -EIO;
        }
out:
        for (size_t i = 0; i < n_rows; i++)
                mt_result_clear(&rows[i].r);
        mt_result_clear(&same_room.r);
        free(sweep);
        mt_real_close(&real_aqua);
        mt_real_close(&real_dram);
        lp_bytes_close(&lpb_peer);
        lp_bytes_close(&lpb_dram);
        kv_swap_free(&host_dram);
        kv_swap_free(&host_peer);
        kv_swap_free(&shared);
        return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
