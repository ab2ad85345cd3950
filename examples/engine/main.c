/* aqua-engine: replay a request trace through the simulated serving loop, FCFS and fair side by
 * side, or the four-way comparison of what operators run today against aqua and LayerKV. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine.h"
#include "example-log.h"
#include "example-parse.h"
#include "example-util.h"
#include "hostlink.h"

/* What one run is: a scheduler, where swapped KV goes, when prefills are admitted. */
struct run_spec {
        const char *label; /* "a".."d" in the four-way comparison, else NULL */
        enum sched_kind sched;
        const char *tier; /* a kv_tier's name, or "aqua" */
        enum engine_admission admission;
        uint32_t admit_layers;
};

#define MAX_RUNS 16

struct run_summary {
        struct run_spec spec;
        enum sched_kind sched;
        const char *tier;         /* a kv_tier's name, or "aqua" */
        uint64_t ttft[3], tbt[3]; /* p50, p90, p99 */
        double tokens_per_s, requests_per_s;
        double attainment, goodput; /* share of requests meeting the SLA; those per second */
        struct engine_result r;
        uint64_t wall_ns;
};

static const double percentiles[3] = {50, 90, 99};

static void help(void)
{
        printf("Usage: aqua-engine [OPTIONS]\n"
               "\n"
               "Replays a request trace through a simulated LLM-serving engine (continuous\n"
               "batching, chunked prefill, KV memory in blocks) on a virtual clock: compute is\n"
               "time per token, not a real model. Runs FCFS and the fair scheduler (prefills by\n"
               "least progress; SLA-aware: streaming decodes are never preempted, a decode is\n"
               "parked at most once; --tbt-budget 0: the time-sliced scheduler) on the same\n"
               "trace. Preempted requests' KV blocks are really copied to a host-memory swap\n"
               "backend and checked on the way back; the transfer time is\n"
               "simulated for peer HBM over NVLink and for DRAM over PCIe. Prints TTFT and TBT\n"
               "percentiles and throughput per run, and one 'SUMMARY key=value' line per run.\n"
               "\n"
               "Trace:\n"
               "  --trace FILE            replay FILE (CSV arrival_s,prompt_tokens,output_tokens,\n"
               "                          or .yaml with requests: [{arrival, prompt, output}])\n"
               "  --generate FILE         write a generated trace to FILE ('-': stdout) and exit\n"
               "  --requests N            generated requests (default 2000)\n"
               "  --seed N                generator seed (default 1)\n"
               "  --rate-on R, --rate-off R   arrivals/s in bursts and between them (30, 2)\n"
               "  --on S, --off S         mean burst and quiet period lengths, seconds (4, 8)\n"
               "Runs:\n"
               "  --sched LIST            fcfs,fair (default both)\n"
               "  --tier LIST             peer,dram (default both)\n"
               "  --admission MODE        request: a prefill starts when KV for its whole prompt\n"
               "                          fits (vLLM; default); layer[:K]: when K layers fit\n"
               "                          (LayerKV, K=4), finished layers offloaded as the next\n"
               "                          computes and prefetched before decode; chunk: when the\n"
               "                          first prefill chunk fits\n"
               "  --layer-full offload|wait  layer: when a layer does not fit, swap out lower-\n"
               "                          ranked requests (offload, default) or wait\n"
               "  --layers N              the model's layers (32)\n"
               "  --four-way              (a) fcfs, DRAM swap, whole-prompt admission; (b) fair,\n"
               "                          DRAM swap; (c) fair, aqua (peer HBM; with --swap host\n"
               "                          the peer tier's model); (d) (c) with --admission layer\n"
               "  --sweep RATES           the four-way runs over generated traces, one per burst\n"
               "                          arrival rate (e.g. 10,20,40,80): CSV and a PNG of TTFT\n"
               "                          p99 and goodput against rate (gnuplot)\n"
               "  --sweep-out PREFIX      files of --sweep: PREFIX.csv, .gp, .png (aqua-sweep)\n"
               "  --sweep-cases PREFIX    add aqua-cases --out PREFIX's long-prompt and\n"
               "                          multi-turn panels to the plot\n"
               "SLA:\n"
               "  --sla-ttft DUR          attainment: TTFT at most DUR (1s)\n"
               "  --sla-tbt DUR           ...and the request's own TBT p99 at most DUR (100ms)\n"
               "  --tbt-budget DUR        fair: a running decode never waits longer than this if\n"
               "                          it can be helped (default: --sla-tbt; 0: off, the\n"
               "                          plain time-sliced scheduler)\n"
               "  --swap host|aqua        where swapped KV goes (host): 'host' copies to host\n"
               "                          memory and models the tier's time; 'aqua' borrows peer\n"
               "                          GPU memory through aquad (libaqua, $AQUA_ENDPOINT) and\n"
               "                          falls back to DRAM; the runs then share it (no --tier)\n"
               "  --aqua-device N         aqua: the consumer's CUDA device (0)\n"
               "  --aqua-borrow SIZE      aqua: memory to borrow (1GiB)\n"
               "  --hold-at DUR           aqua: from this virtual time on, once swapped requests\n"
               "                          sit in peer memory, stop the clock and poll until a\n"
               "                          reclaim has moved memory (for demos that cause one)\n"
               "  --hold-timeout DUR      ...but no longer than this wall time (60s)\n"
               "Engine model:\n"
               "  --decode-slots N        decodes per iteration (64)\n"
               "  --batch-tokens N        tokens per iteration (1024)\n"
               "  --prefill-chunk N       prefill tokens of one request per iteration (512)\n"
               "  --slice N               fair: iterations per time slice (16)\n"
               "  --block-tokens N        tokens per KV block (16)\n"
               "  --bytes-per-token SIZE  KV bytes per token (128KiB)\n"
               "  --hbm SIZE              local HBM for KV (4GiB)\n"
               "  --kv-sample SIZE        bytes of each token's KV really kept and copied (32)\n"
               "  --iter-time DUR         fixed cost per iteration (8ms)\n"
               "  --prefill-time DUR      per prefill token (40us)\n"
               "  --decode-time DUR       per decoding sequence (300us)\n"
               "  --peer-bw GBPS          peer HBM over NVLink, GB/s (370)\n"
               "  --dram-bw GBPS          host DRAM over PCIe, GB/s (50)\n"
               "  --busy N                GPUs of an 8-GPU server swapping to DRAM at once (1):\n"
               "                          DRAM gets its share of the host link (2 GPUs per PCIe\n"
               "                          switch, 50 GB/s uplinks, 614 GB/s host memory)\n"
               "  --call-cost DUR         fixed cost of one batched copy (3us)\n"
               "Output:\n"
               "  --realtime[=SPEED]      pace each run in real time, SPEED times faster (1)\n"
               "  --progress DUR          print a progress line every DUR of wall time\n"
               "  --quiet                 print only the SUMMARY lines\n"
               "  -h, --help              show this help\n");
}

enum {
        ARG_TRACE = 0x100,
        ARG_GENERATE,
        ARG_REQUESTS,
        ARG_SEED,
        ARG_RATE_ON,
        ARG_RATE_OFF,
        ARG_ON,
        ARG_OFF,
        ARG_SCHED,
        ARG_TIER,
        ARG_DECODE_SLOTS,
        ARG_BATCH_TOKENS,
        ARG_PREFILL_CHUNK,
        ARG_SLICE,
        ARG_BLOCK_TOKENS,
        ARG_BYTES_PER_TOKEN,
        ARG_HBM,
        ARG_KV_SAMPLE,
        ARG_ITER_TIME,
        ARG_PREFILL_TIME,
        ARG_DECODE_TIME,
        ARG_PEER_BW,
        ARG_DRAM_BW,
        ARG_CALL_COST,
        ARG_REALTIME,
        ARG_QUIET,
        ARG_SWAP,
        ARG_AQUA_DEVICE,
        ARG_AQUA_BORROW,
        ARG_HOLD_AT,
        ARG_HOLD_TIMEOUT,
        ARG_PROGRESS,
        ARG_ADMISSION,
        ARG_LAYER_FULL,
        ARG_LAYERS,
        ARG_FOUR_WAY,
        ARG_SWEEP,
        ARG_SWEEP_OUT,
        ARG_SLA_TTFT,
        ARG_SLA_TBT,
        ARG_TBT_BUDGET,
        ARG_BUSY,
        ARG_SWEEP_CASES,
};

static const struct option options[] = {
    {"trace", required_argument, NULL, ARG_TRACE},
    {"generate", required_argument, NULL, ARG_GENERATE},
    {"requests", required_argument, NULL, ARG_REQUESTS},
    {"seed", required_argument, NULL, ARG_SEED},
    {"rate-on", required_argument, NULL, ARG_RATE_ON},
    {"rate-off", required_argument, NULL, ARG_RATE_OFF},
    {"on", required_argument, NULL, ARG_ON},
    {"off", required_argument, NULL, ARG_OFF},
    {"sched", required_argument, NULL, ARG_SCHED},
    {"tier", required_argument, NULL, ARG_TIER},
    {"decode-slots", required_argument, NULL, ARG_DECODE_SLOTS},
    {"batch-tokens", required_argument, NULL, ARG_BATCH_TOKENS},
    {"prefill-chunk", required_argument, NULL, ARG_PREFILL_CHUNK},
    {"slice", required_argument, NULL, ARG_SLICE},
    {"block-tokens", required_argument, NULL, ARG_BLOCK_TOKENS},
    {"bytes-per-token", required_argument, NULL, ARG_BYTES_PER_TOKEN},
    {"hbm", required_argument, NULL, ARG_HBM},
    {"kv-sample", required_argument, NULL, ARG_KV_SAMPLE},
    {"iter-time", required_argument, NULL, ARG_ITER_TIME},
    {"prefill-time", required_argument, NULL, ARG_PREFILL_TIME},
    {"decode-time", required_argument, NULL, ARG_DECODE_TIME},
    {"peer-bw", required_argument, NULL, ARG_PEER_BW},
    {"dram-bw", required_argument, NULL, ARG_DRAM_BW},
    {"call-cost", required_argument, NULL, ARG_CALL_COST},
    {"realtime", optional_argument, NULL, ARG_REALTIME},
    {"quiet", no_argument, NULL, ARG_QUIET},
    {"swap", required_argument, NULL, ARG_SWAP},
    {"aqua-device", required_argument, NULL, ARG_AQUA_DEVICE},
    {"aqua-borrow", required_argument, NULL, ARG_AQUA_BORROW},
    {"hold-at", required_argument, NULL, ARG_HOLD_AT},
    {"hold-timeout", required_argument, NULL, ARG_HOLD_TIMEOUT},
    {"progress", required_argument, NULL, ARG_PROGRESS},
    {"admission", required_argument, NULL, ARG_ADMISSION},
    {"layer-full", required_argument, NULL, ARG_LAYER_FULL},
    {"layers", required_argument, NULL, ARG_LAYERS},
    {"four-way", no_argument, NULL, ARG_FOUR_WAY},
    {"sweep", required_argument, NULL, ARG_SWEEP},
    {"sweep-out", required_argument, NULL, ARG_SWEEP_OUT},
    {"sla-ttft", required_argument, NULL, ARG_SLA_TTFT},
    {"sla-tbt", required_argument, NULL, ARG_SLA_TBT},
    {"tbt-budget", required_argument, NULL, ARG_TBT_BUDGET},
    {"busy", required_argument, NULL, ARG_BUSY},
    {"sweep-cases", required_argument, NULL, ARG_SWEEP_CASES},
    {"help", no_argument, NULL, 'h'},
    {},
};

struct args {
        const char *trace, *generate;
        struct trace_gen gen;
        bool sched[_SCHED_MAX], tier[_KV_TIER_MAX];
        struct engine_config cfg;
        double realtime; /* 0: as fast as possible */
        bool quiet;
        bool aqua;
        struct kv_swap_aqua_config aqua_cfg;
        bool hold;
        uint64_t hold_at_ns, hold_timeout_ns;
        uint64_t progress_ns; /* 0: none */
        bool four_way;
        bool tbt_budget_set;
        const char *sweep, *sweep_out, *sweep_cases;
        uint32_t busy; /* GPUs sharing the host link */
};

static int parse_u32(const char *opt, const char *s, uint32_t min, uint32_t *ret)
{
        int64_t v;
        if (parse_int64(s, 10, &v) < 0 || v < min || v > UINT32_MAX)
                return log_error_errno(EINVAL, "--%s: expected an integer >= %u, got \"%s\"", opt,
                                       min, s);
        *ret = (uint32_t)v;
        return 0;
}

static int parse_positive(const char *opt, const char *s, double *ret)
{
        double v;
        if (parse_double(s, &v) < 0 || !(v > 0))
                return log_error_errno(EINVAL, "--%s: expected a number > 0, got \"%s\"", opt, s);
        *ret = v;
        return 0;
}

static int parse_dur(const char *opt, const char *s, uint64_t *ret)
{
        if (parse_duration(s, ret) < 0)
                return log_error_errno(
                    EINVAL, "--%s: expected a duration (\"40us\", \"8ms\"), got \"%s\"", opt, s);
        return 0;
}

static int parse_bytes(const char *opt, const char *s, uint64_t *ret)
{
        if (parse_size(s, ret) < 0 || *ret == 0)
                return log_error_errno(
                    EINVAL, "--%s: expected a size (\"128KiB\", \"4GiB\"), got \"%s\"", opt, s);
        return 0;
}

/* "fcfs,fair" into flags; from_string maps a name to its index or a negative value. */
static int parse_list(const char *opt, const char *s, bool *flags, int n, int (*from)(const char *))
{
        _cleanup_free_ char *copy = strdup(s);
        if (!copy)
                return log_error_errno(ENOMEM, "Out of memory");
        memset(flags, 0, n * sizeof(bool));
        for (char *save = NULL, *w = strtok_r(copy, ",", &save); w;
             w = strtok_r(NULL, ",", &save)) {
                int i = from(w);
                if (i < 0 || i >= n)
                        return log_error_errno(EINVAL, "--%s: unknown name \"%s\"", opt, w);
                flags[i] = true;
        }
        return 0;
}

static int sched_index(const char *s)
{
        return sched_from_string(s);
}

static int tier_index(const char *s)
{
        return kv_tier_from_string(s);
}

static int parse_args(int argc, char **argv, struct args *a)
{
        uint64_t u;
        uint32_t v;
        double d;
        int c, r = 0;

        trace_gen_defaults(&a->gen);
        engine_config_defaults(&a->cfg);
        kv_swap_aqua_config_defaults(&a->aqua_cfg);
        a->hold_timeout_ns = 60 * NSEC_PER_SEC;
        a->cfg.admission = ADMIT_REQUEST;
        a->sched[SCHED_FCFS] = a->sched[SCHED_FAIR] = true;
        a->tier[KV_TIER_PEER] = a->tier[KV_TIER_DRAM] = true;

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                const char *name =
                    c >= ARG_TRACE && c <= ARG_TBT_BUDGET ? options[c - ARG_TRACE].name : "";
                switch (c) {
                case 'h':
                        help();
                        return 1;
                case ARG_TRACE:
                        a->trace = optarg;
                        break;
                case ARG_GENERATE:
                        a->generate = optarg;
                        break;
                case ARG_REQUESTS:
                        r = parse_u32(name, optarg, 1, &v);
                        a->gen.n = v;
                        break;
                case ARG_SEED:
                        r = parse_int64(optarg, 0, (int64_t *)&a->gen.seed) < 0
                                ? log_error_errno(EINVAL, "--seed: expected an integer, got \"%s\"",
                                                  optarg)
                                : 0;
                        break;
                case ARG_RATE_ON:
                        r = parse_positive(name, optarg, &a->gen.rate_on);
                        break;
                case ARG_RATE_OFF:
                        r = parse_positive(name, optarg, &a->gen.rate_off);
                        break;
                case ARG_ON:
                        r = parse_positive(name, optarg, &a->gen.on_s);
                        break;
                case ARG_OFF:
                        r = parse_positive(name, optarg, &a->gen.off_s);
                        break;
                case ARG_SCHED:
                        r = parse_list(name, optarg, a->sched, _SCHED_MAX, sched_index);
                        break;
                case ARG_TIER:
                        r = parse_list(name, optarg, a->tier, _KV_TIER_MAX, tier_index);
                        break;
                case ARG_DECODE_SLOTS:
                        r = parse_u32(name, optarg, 1, &a->cfg.decode_slots);
                        break;
                case ARG_BATCH_TOKENS:
                        r = parse_u32(name, optarg, 1, &a->cfg.max_batch_tokens);
                        break;
                case ARG_PREFILL_CHUNK:
                        r = parse_u32(name, optarg, 1, &a->cfg.max_prefill_chunk);
                        break;
                case ARG_SLICE:
                        r = parse_u32(name, optarg, 1, &a->cfg.slice_iters);
                        break;
                case ARG_BLOCK_TOKENS:
                        r = parse_u32(name, optarg, 1, &a->cfg.block_tokens);
                        break;
                case ARG_BYTES_PER_TOKEN:
                        r = parse_bytes(name, optarg, &a->cfg.bytes_per_token);
                        break;
                case ARG_HBM:
                        r = parse_bytes(name, optarg, &a->cfg.hbm_bytes);
                        break;
                case ARG_KV_SAMPLE:
                        r = parse_bytes(name, optarg, &u);
                        if (r == 0 && (u % 8 != 0 || u > 4096))
                                r = log_error_errno(
                                    EINVAL, "--kv-sample: must be a multiple of 8 up to 4096");
                        a->cfg.kv_sample_bytes = (uint32_t)u;
                        break;
                case ARG_ITER_TIME:
                        r = parse_dur(name, optarg, &a->cfg.iter_ns);
                        break;
                case ARG_PREFILL_TIME:
                        r = parse_dur(name, optarg, &a->cfg.prefill_token_ns);
                        break;
                case ARG_DECODE_TIME:
                        r = parse_dur(name, optarg, &a->cfg.decode_seq_ns);
                        break;
                case ARG_PEER_BW:
                        r = parse_positive(name, optarg, &a->cfg.cost[KV_TIER_PEER].gbytes_per_s);
                        break;
                case ARG_DRAM_BW:
                        r = parse_positive(name, optarg, &a->cfg.cost[KV_TIER_DRAM].gbytes_per_s);
                        break;
                case ARG_CALL_COST:
                        r = parse_dur(name, optarg, &u);
                        a->cfg.cost[KV_TIER_PEER].call_ns = a->cfg.cost[KV_TIER_DRAM].call_ns = u;
                        break;
                case ARG_REALTIME:
                        a->realtime = 1.0;
                        if (optarg) {
                                r = parse_positive(name, optarg, &d);
                                a->realtime = d;
                        }
                        break;
                case ARG_QUIET:
                        a->quiet = true;
                        break;
                case ARG_SWAP:
                        if (strcmp(optarg, "aqua") == 0 || strcmp(optarg, "host") == 0)
                                a->aqua = optarg[0] == 'a';
                        else
                                r = log_error_errno(
                                    EINVAL, "--swap: expected host or aqua, got \"%s\"", optarg);
                        break;
                case ARG_AQUA_DEVICE:
                        r = parse_u32(name, optarg, 0, &v);
                        a->aqua_cfg.device = (int)MIN(v, (uint32_t)INT32_MAX);
                        break;
                case ARG_AQUA_BORROW:
                        r = parse_bytes(name, optarg, &a->aqua_cfg.borrow_bytes);
                        break;
                case ARG_HOLD_AT:
                        r = parse_dur(name, optarg, &a->hold_at_ns);
                        a->hold = true;
                        break;
                case ARG_HOLD_TIMEOUT:
                        r = parse_dur(name, optarg, &a->hold_timeout_ns);
                        break;
                case ARG_PROGRESS:
                        r = parse_dur(name, optarg, &a->progress_ns);
                        break;
                case ARG_ADMISSION:
                        if (engine_admission_from_string(optarg, &a->cfg.admission,
                                                         &a->cfg.admit_layers) < 0)
                                r = log_error_errno(EINVAL,
                                                    "--admission: expected request, layer, "
                                                    "layer:K (K >= 2) or chunk, got \"%s\"",
                                                    optarg);
                        break;
                case ARG_LAYER_FULL:
                        a->cfg.layer_full = engine_layer_full_from_string(optarg);
                        if (a->cfg.layer_full < 0)
                                r = log_error_errno(
                                    EINVAL, "--layer-full: expected offload or wait, got \"%s\"",
                                    optarg);
                        break;
                case ARG_LAYERS:
                        r = parse_u32(name, optarg, 1, &a->cfg.n_layers);
                        break;
                case ARG_FOUR_WAY:
                        a->four_way = true;
                        break;
                case ARG_SWEEP:
                        a->sweep = optarg;
                        break;
                case ARG_SWEEP_OUT:
                        a->sweep_out = optarg;
                        break;
                case ARG_SLA_TTFT:
                        r = parse_dur(name, optarg, &a->cfg.sla_ttft_ns);
                        break;
                case ARG_SLA_TBT:
                        r = parse_dur(name, optarg, &a->cfg.sla_tbt_ns);
                        break;
                case ARG_TBT_BUDGET:
                        r = parse_dur(name, optarg, &a->cfg.tbt_budget_ns);
                        a->tbt_budget_set = true;
                        break;
                case ARG_BUSY:
                        r = parse_u32(name, optarg, 1, &a->busy);
                        break;
                case ARG_SWEEP_CASES:
                        a->sweep_cases = optarg;
                        break;
                default:
                        return -EINVAL;
                }
                if (r < 0)
                        return r;
        }
        if (optind < argc)
                return log_error_errno(EINVAL, "unexpected argument \"%s\" (see --help)",
                                       argv[optind]);
        if (a->hold && !a->aqua)
                return log_error_errno(EINVAL, "--hold-at needs --swap aqua");
        if (a->sweep && a->aqua)
                return log_error_errno(EINVAL, "--sweep runs on the host backend: no --swap aqua");
        if (!a->tbt_budget_set)
                a->cfg.tbt_budget_ns = a->cfg.sla_tbt_ns;
        if (a->busy > 1) {
                struct host_link h;
                host_link_defaults(&h);
                if (a->busy > h.gpus)
                        return log_error_errno(EINVAL, "--busy %u: the server has %u GPUs", a->busy,
                                               h.gpus);
                h.gpu_gbps = a->cfg.cost[KV_TIER_DRAM].gbytes_per_s;
                a->cfg.cost[KV_TIER_DRAM].gbytes_per_s = host_link_share(&h, a->busy, NULL);
        }
        if (a->cfg.admit_layers > a->cfg.n_layers)
                return log_error_errno(EINVAL, "--admission layer:%u: the model has %u layers",
                                       a->cfg.admit_layers, a->cfg.n_layers);
        uint64_t block = a->cfg.bytes_per_token * a->cfg.block_tokens;
        if (a->cfg.hbm_bytes / block == 0) {
                char b[32];
                return log_error_errno(EINVAL,
                                       "--hbm: holds not even one KV block of %s (%u tokens)",
                                       format_size(b, sizeof(b), block), a->cfg.block_tokens);
        }
        return 0;
}

static double ms(uint64_t ns)
{
        return (double)ns / NSEC_PER_MSEC;
}

/* One engine replaying the trace: a scheduler with its swap backend. */
struct run {
        struct run_spec spec;
        enum sched_kind sched;
        const char *tier;
        struct kv_swap own; /* the host backend of this run; unused with aqua */
        struct kv_swap *swap;
        struct engine *e;
        bool done;
        uint64_t done_wall_ns;
};

static int run_setup(const struct args *a, const struct trace *t, struct run *run,
                     struct kv_swap *shared)
{
        struct engine_config cfg = a->cfg;
        int r;

        cfg.sched = run->sched;
        cfg.admission = run->spec.admission;
        cfg.admit_layers = run->spec.admit_layers;
        run->swap = shared;
        if (!shared) {
                r = kv_swap_host_new(kv_tier_from_string(run->tier), 0, &run->own);
                if (r < 0)
                        return log_error_errno(r, "Failed to set up the host swap backend: %m");
                run->swap = &run->own;
        }
        r = engine_new(&cfg, run->swap, &run->e);
        if (r < 0)
                return log_error_errno(r, "Invalid engine configuration: %m");
        for (size_t i = 0; i < t->n && r >= 0; i++)
                r = engine_add(run->e, &t->req[i], NULL);
        if (r < 0)
                return log_error_errno(r, "Failed to queue requests: %m");
        return 0;
}

static void run_clear(struct run *run)
{
        run->e = engine_free(run->e);
        kv_swap_free(&run->own);
}

static void run_summarize(struct run *run, uint64_t start, struct run_summary *ret)
{
        struct run_summary s = {.spec = run->spec, .sched = run->sched, .tier = run->tier};

        engine_take_result(run->e, &s.r);
        for (int i = 0; i < 3; i++) {
                if (stats_percentile(&s.r.ttft, percentiles[i], &s.ttft[i]) < 0)
                        s.ttft[i] = 0;
                if (stats_percentile(&s.r.tbt, percentiles[i], &s.tbt[i]) < 0)
                        s.tbt[i] = 0;
        }
        uint64_t span = s.r.last_finish_ns - s.r.first_arrival_ns;
        if (span > 0) {
                s.tokens_per_s = (double)s.r.output_tokens * NSEC_PER_SEC / span;
                s.requests_per_s = (double)s.r.requests_done * NSEC_PER_SEC / span;
                s.goodput = (double)s.r.sla_met * NSEC_PER_SEC / span;
        }
        if (s.r.requests > 0)
                s.attainment = (double)s.r.sla_met / s.r.requests;
        s.wall_ns = run->done_wall_ns - start;
        *ret = s;
}

static void print_progress(const struct args *a, const struct run *runs, size_t n,
                           struct kv_swap *shared, uint64_t now)
{
        char line[512];
        size_t k = 0;

        k += snprintf(line + k, sizeof(line) - k, "progress t=%6.1fs", (double)now / NSEC_PER_SEC);
        for (size_t i = 0; i < n && k < sizeof(line); i++) {
                const struct engine_result *res = engine_result(runs[i].e);
                char name[16];
                if (runs[i].spec.label)
                        snprintf(name, sizeof(name), "(%s)", runs[i].spec.label);
                else
                        snprintf(name, sizeof(name), "%s", sched_to_string(runs[i].sched));
                k += snprintf(line + k, sizeof(line) - k, "  %s %" PRIu64 "/%" PRIu64 " done", name,
                              res->requests_done, res->requests);
        }
        struct kv_swap_aqua_stats st;
        if (shared && kv_swap_aqua_stats(shared, &st) == 0 && k < sizeof(line)) {
                char p[32], d[32];
                snprintf(line + k, sizeof(line) - k,
                         "  | swapped KV: %s in peer HBM (%" PRIu64
                         " requests), %s in DRAM (%" PRIu64 ")",
                         format_size(p, sizeof(p), st.bytes_peer), st.slots_peer,
                         format_size(d, sizeof(d), st.bytes_dram), st.slots_dram);
        }
        printf("%s\n", line);
        fflush(stdout);
}

/*
 * Demo support: stop the virtual clock and keep polling the backend (as an engine's loop would
 * at its safe point) until a reclaim has moved memory, so that a script can make one happen
 * while requests sit in peer memory. Returns the wall time spent.
 */
static uint64_t hold(const struct args *a, struct kv_swap *shared, uint64_t now)
{
        struct kv_swap_aqua_stats st = {};
        uint64_t start = now_mono_ns(), deadline = start + a->hold_timeout_ns;
        char p[32];

        kv_swap_aqua_stats(shared, &st);
        printf("HOLD t=%.1fs: %" PRIu64 " swapped requests (%s of KV) in peer memory; "
               "waiting for a reclaim\n",
               (double)now / NSEC_PER_SEC, st.slots_peer, format_size(p, sizeof(p), st.bytes_peer));
        fflush(stdout);
        kv_swap_aqua_take_reclaimed(shared);
        for (;;) {
                int r = shared->ops->poll(shared->ctx);
                if (r < 0) {
                        log_error_errno(r, "aqua: poll failed while holding: %m");
                        break;
                }
                if (kv_swap_aqua_take_reclaimed(shared)) {
                        printf("RESUME t=%.1fs: reclaim handled\n", (double)now / NSEC_PER_SEC);
                        break;
                }
                if (now_mono_ns() >= deadline) {
                        printf("RESUME t=%.1fs: no reclaim came within the hold timeout\n",
                               (double)now / NSEC_PER_SEC);
                        break;
                }
                sleep_ns(10 * NSEC_PER_MSEC);
        }
        fflush(stdout);
        return now_mono_ns() - start;
}

/*
 * Step every run on one virtual clock, the one furthest behind first, so that runs sharing an
 * aqua backend see the same memory at the same simulated time (a reclaim hits them all).
 */
static int run_all(const struct args *a, struct run *runs, size_t n, struct kv_swap *shared,
                   struct run_summary *ret)
{
        uint64_t start = now_mono_ns(), next_progress = start + a->progress_ns;
        bool hold_pending = a->hold;
        int r;

        for (;;) {
                struct run *run = NULL;
                for (size_t i = 0; i < n; i++)
                        if (!runs[i].done && (!run || engine_now(runs[i].e) < engine_now(run->e)))
                                run = &runs[i];
                if (!run)
                        return 0;
                struct kv_swap_aqua_stats st;
                if (hold_pending && engine_now(run->e) >= a->hold_at_ns &&
                    kv_swap_aqua_stats(shared, &st) == 0 && st.slots_peer > 0) {
                        hold_pending = false;
                        start += hold(a, shared, engine_now(run->e));
                }
                r = engine_step(run->e);
                if (r == ENGINE_DONE) {
                        run->done = true;
                        run->done_wall_ns = now_mono_ns();
                        run_summarize(run, start, &ret[run - runs]);
                        continue;
                }
                if (r < 0)
                        return log_error_errno(r, "Run %s/%s failed: %m",
                                               sched_to_string(run->sched), run->tier);
                uint64_t now = now_mono_ns();
                if (a->realtime > 0) {
                        uint64_t due = start + (uint64_t)((double)engine_now(run->e) / a->realtime);
                        if (due > now)
                                sleep_ns(due - now);
                }
                if (a->progress_ns > 0 && now >= next_progress) {
                        print_progress(a, runs, n, shared, engine_now(run->e));
                        next_progress = now + a->progress_ns;
                }
        }
}

static uint64_t sum_tiers(const uint64_t v[_KV_TIER_MAX])
{
        uint64_t s = 0;
        for (int i = 0; i < _KV_TIER_MAX; i++)
                s += v[i];
        return s;
}

/* Bytes over a tier's link, both directions, whole-request swaps and layer-wise transfers. */
static uint64_t link_bytes(const struct engine_result *r, enum kv_tier t)
{
        return r->swap_out_bytes[t] + r->swap_in_bytes[t] + r->layer_out_bytes[t] +
               r->layer_in_bytes[t];
}

static const char *admission_name(const struct run_spec *s, char *buf, size_t n)
{
        if (s->admission == ADMIT_LAYER)
                snprintf(buf, n, "layer:%u", s->admit_layers);
        else
                snprintf(buf, n, "%s", engine_admission_to_string(s->admission));
        return buf;
}

static void print_human(const struct run_summary *s)
{
        char out[32], in[32];
        printf("%-5s %-5s %5" PRIu64 "/%-5" PRIu64
               " %8.1f %8.1f %8.1f   %6.1f %6.1f %6.1f  %7.0f %7" PRIu64 " %10s %10s %8.1f\n",
               sched_to_string(s->sched), s->tier, s->r.requests_done, s->r.requests,
               ms(s->ttft[0]), ms(s->ttft[1]), ms(s->ttft[2]), ms(s->tbt[0]), ms(s->tbt[1]),
               ms(s->tbt[2]), s->tokens_per_s, s->r.preemptions,
               format_size(out, sizeof(out), sum_tiers(s->r.swap_out_bytes)),
               format_size(in, sizeof(in), sum_tiers(s->r.swap_in_bytes)),
               ms(sum_tiers(s->r.swap_ns)));
}

static const char *const four_way_what[4] = {
    "what operators run: FCFS, whole-prompt admission, KV swapped to DRAM over PCIe",
    "the fair scheduler (SLA-aware), KV swapped to DRAM over PCIe",
    "the fair scheduler, KV swapped to peer HBM lent through aqua (DRAM after a reclaim)",
    "(c) with LayerKV admission: K layers must fit, layers offloaded as computed",
};

static void print_ratio(const char *what, double a, double b, bool lower_better)
{
        if (a > 0 && b > 0)
                printf("  %-34s %6.1fx\n", what, lower_better ? a / b : b / a);
        else
                printf("  %-34s %7s\n", what, "-");
}

static void print_four_way(const struct args *a, const struct run_summary *s, size_t n)
{
        char nv[32], pc[32], adm[32];

        printf(
            "Four configurations on one trace. Compute and link times are modelled\n"
            "(H100-class: %.0f us per prefill token, %.0f us per decode, %.0f ms per iteration;\n"
            "NVLink %.0f GB/s, PCIe %.0f GB/s, %.0f us per copy call); the KV bytes are real:\n"
            "a %u-byte sample of every token is really copied and checksummed (the byte\n"
            "columns count the full %s per token the model stands for).\n"
            "SLA: TTFT <= %.0f ms and the request's own TBT p99 <= %.0f ms.\n\n",
            (double)a->cfg.prefill_token_ns / NSEC_PER_USEC,
            (double)a->cfg.decode_seq_ns / NSEC_PER_USEC, ms(a->cfg.iter_ns),
            a->cfg.cost[KV_TIER_PEER].gbytes_per_s, a->cfg.cost[KV_TIER_DRAM].gbytes_per_s,
            (double)a->cfg.cost[KV_TIER_PEER].call_ns / NSEC_PER_USEC, a->cfg.kv_sample_bytes,
            format_size(nv, sizeof(nv), a->cfg.bytes_per_token), ms(a->cfg.sla_ttft_ns),
            ms(a->cfg.sla_tbt_ns));
        for (size_t i = 0; i < n && i < 4; i++)
                printf("  (%s) %s\n", s[i].spec.label, four_way_what[i]);
        printf("\n     sched swap  admission  done/all  TTFT p50  TTFT p99   TBT p99  SLA met"
               "  goodput     NVLink       PCIe\n");
        for (size_t i = 0; i < n; i++)
                printf("FOUR (%s) %-4s %-5s %-9s %4" PRIu64 "/%-4" PRIu64
                       " %7.0fms %7.0fms %7.1fms %7.1f%% %5.2f r/s %10s %10s\n",
                       s[i].spec.label, sched_to_string(s[i].sched), s[i].tier,
                       admission_name(&s[i].spec, adm, sizeof(adm)), s[i].r.requests_done,
                       s[i].r.requests, ms(s[i].ttft[0]), ms(s[i].ttft[2]), ms(s[i].tbt[2]),
                       100 * s[i].attainment, s[i].goodput,
                       format_size(nv, sizeof(nv), link_bytes(&s[i].r, KV_TIER_PEER)),
                       format_size(pc, sizeof(pc), link_bytes(&s[i].r, KV_TIER_DRAM)));
        if (n < 4)
                return;
        printf("\nAgainst (a):\n");
        print_ratio("TTFT p99, (c) aqua", ms(s[0].ttft[2]), ms(s[2].ttft[2]), true);
        print_ratio("TTFT p99, (d) aqua + LayerKV", ms(s[0].ttft[2]), ms(s[3].ttft[2]), true);
        print_ratio("goodput, (c) aqua", s[0].goodput, s[2].goodput, false);
        print_ratio("goodput, (d) aqua + LayerKV", s[0].goodput, s[3].goodput, false);
        print_ratio("throughput (req/s), (d) vs (a)", s[0].requests_per_s, s[3].requests_per_s,
                    false);
        printf("What the link adds, (c) against (b) (same scheduler, DRAM swap):\n");
        print_ratio("TTFT p99", ms(s[1].ttft[2]), ms(s[2].ttft[2]), true);
        print_ratio("TBT p99", ms(s[1].tbt[2]), ms(s[2].tbt[2]), true);
        print_ratio("goodput", s[1].goodput, s[2].goodput, false);
        printf("\n");
}

static void print_summary(const struct run_summary *s)
{
        char adm[32];
        printf("SUMMARY sched=%s tier=%s run=%s admission=%s requests=%" PRIu64 " done=%" PRIu64
               " rejected=%" PRIu64 " lost=%" PRIu64 " ttft_p50_ms=%.3f ttft_p90_ms=%.3f"
               " ttft_p99_ms=%.3f tbt_p50_ms=%.3f tbt_p90_ms=%.3f tbt_p99_ms=%.3f"
               " tokens_per_s=%.1f requests_per_s=%.3f sla_met=%" PRIu64 " sla_ttft_met=%" PRIu64
               " sla_tbt_met=%" PRIu64 " attainment=%.4f goodput_rps=%.3f output_tokens=%" PRIu64
               " iterations=%" PRIu64 " preemptions=%" PRIu64 " swap_out_bytes=%" PRIu64
               " swap_in_bytes=%" PRIu64 " swap_out_peer_bytes=%" PRIu64
               " swap_out_dram_bytes=%" PRIu64 " swap_in_peer_bytes=%" PRIu64
               " swap_in_dram_bytes=%" PRIu64 " layered_prefills=%" PRIu64
               " layer_out_bytes=%" PRIu64 " layer_in_bytes=%" PRIu64 " nvlink_bytes=%" PRIu64
               " pcie_bytes=%" PRIu64 " overlap_ms=%.3f hidden_ms=%.3f swap_ms=%.3f"
               " integrity_errors=%" PRIu64 " wall_ms=%.1f\n",
               sched_to_string(s->sched), s->tier, s->spec.label ?: "-",
               admission_name(&s->spec, adm, sizeof(adm)), s->r.requests, s->r.requests_done,
               s->r.rejected, s->r.requests - s->r.requests_done, ms(s->ttft[0]), ms(s->ttft[1]),
               ms(s->ttft[2]), ms(s->tbt[0]), ms(s->tbt[1]), ms(s->tbt[2]), s->tokens_per_s,
               s->requests_per_s, s->r.sla_met, s->r.sla_ttft_met, s->r.sla_tbt_met, s->attainment,
               s->goodput, s->r.output_tokens, s->r.iterations, s->r.preemptions,
               sum_tiers(s->r.swap_out_bytes), sum_tiers(s->r.swap_in_bytes),
               s->r.swap_out_bytes[KV_TIER_PEER], s->r.swap_out_bytes[KV_TIER_DRAM],
               s->r.swap_in_bytes[KV_TIER_PEER], s->r.swap_in_bytes[KV_TIER_DRAM],
               s->r.layered_prefills, sum_tiers(s->r.layer_out_bytes),
               sum_tiers(s->r.layer_in_bytes), link_bytes(&s->r, KV_TIER_PEER),
               link_bytes(&s->r, KV_TIER_DRAM), ms(s->r.overlap_ns), ms(s->r.hidden_ns),
               ms(sum_tiers(s->r.swap_ns)), s->r.integrity_errors, ms(s->wall_ns));
}

/* The aqua backend's own line: real bytes (the KV samples), not the cost model's. */
static void print_aqua_summary(const struct kv_swap_aqua_stats *st)
{
        printf("SUMMARY swap=aqua leases=%" PRIu64 " lent_bytes=%" PRIu64 " peer_bytes=%" PRIu64
               " migrated_bytes=%" PRIu64 " slots_migrated=%" PRIu64 " slot_bytes_migrated=%" PRIu64
               " slots_promoted=%" PRIu64 " dram_budget=%" PRIu64 " peak_kv_peer_bytes=%" PRIu64
               " peak_kv_dram_bytes=%" PRIu64 " verified_swap_ins_peer=%" PRIu64
               " verified_swap_ins_dram=%" PRIu64 " checksum_failures=%" PRIu64 " copies=%" PRIu64
               " copy_pieces=%" PRIu64 " layer_offloads=%" PRIu64 " layer_prefetches=%" PRIu64 "\n",
               st->leases, st->lent_bytes, st->peer_bytes, st->migrated_bytes, st->slots_migrated,
               st->slot_bytes_migrated, st->slots_promoted, st->dram_budget, st->peak_bytes_peer,
               st->peak_bytes_dram, st->verified_swap_ins[KV_TIER_PEER],
               st->verified_swap_ins[KV_TIER_DRAM], st->checksum_failures, st->copies,
               st->copy_pieces, st->layer_offloads, st->layer_prefetches);
}

/* The runs asked for: the four-way comparison, or each scheduler on each tier. */
static size_t run_specs(const struct args *a, struct run_spec *v)
{
        size_t n = 0;

        if (a->four_way) {
                const char *fast = a->aqua ? "aqua" : "peer";
                v[n++] = (struct run_spec){"a", SCHED_FCFS, "dram", ADMIT_REQUEST, 0};
                v[n++] = (struct run_spec){"b", SCHED_FAIR, "dram", ADMIT_REQUEST, 0};
                v[n++] = (struct run_spec){"c", SCHED_FAIR, fast, ADMIT_REQUEST, 0};
                v[n++] =
                    (struct run_spec){"d", SCHED_FAIR, fast, ADMIT_LAYER,
                                      a->cfg.admission == ADMIT_LAYER ? a->cfg.admit_layers : 4};
                return n;
        }
        for (int s = 0; s < _SCHED_MAX; s++)
                for (int k = 0; k < _KV_TIER_MAX; k++) {
                        if (!a->sched[s] || (!a->aqua && !a->tier[k]) || (a->aqua && k > 0))
                                continue;
                        v[n++] = (struct run_spec){NULL, s, a->aqua ? "aqua" : kv_tier_to_string(k),
                                                   a->cfg.admission, a->cfg.admit_layers};
                }
        return n;
}

static void summaries_clear(struct run_summary *s, size_t n)
{
        for (size_t i = 0; i < n; i++) {
                stats_clear(&s[i].r.ttft);
                stats_clear(&s[i].r.tbt);
        }
}

/* Set up and run the specs on trace t (host backends, or the shared aqua one). */
static int run_specs_on(const struct args *a, const struct trace *t, const struct run_spec *spec,
                        size_t n, struct kv_swap *shared, struct run_summary *ret)
{
        struct run rs[MAX_RUNS] = {};
        int r = 0;

        for (size_t i = 0; i < n && r >= 0; i++) {
                rs[i].spec = spec[i];
                rs[i].sched = spec[i].sched;
                rs[i].tier = spec[i].tier;
                bool aq = strcmp(spec[i].tier, "aqua") == 0;
                r = run_setup(a, t, &rs[i], aq ? shared : NULL);
        }
        if (r >= 0)
                r = run_all(a, rs, n, shared, ret);
        for (size_t i = 0; i < n; i++)
                run_clear(&rs[i]);
        return r;
}

static int run_gnuplot(const char *script)
{
        pid_t pid = fork();
        int status;

        if (pid < 0)
                return -errno;
        if (pid == 0) {
                execlp("gnuplot", "gnuplot", script, (char *)NULL);
                _exit(127);
        }
        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return -errno;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
                return -ENOENT;
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EIO;
}

/* One point of the plot: a run's TTFT p99 (s) and goodput at one rate. */
struct sweep_point {
        double rate, ttft_p99_s, goodput;
};

/* The plot's data, one block per run (gnuplot's index), so that each run is one line. */
static int write_plot_data(const char *path, const struct sweep_point *p, size_t n_rates,
                           size_t n_runs)
{
        FILE *f = fopen(path, "we");
        if (!f)
                return -errno;
        for (size_t k = 0; k < n_runs; k++) {
                fprintf(f, "# run %c: rate ttft_p99_s goodput_rps\n", (char)('a' + k));
                for (size_t i = 0; i < n_rates; i++) {
                        const struct sweep_point *q = &p[i * n_runs + k];
                        fprintf(f, "%g %.4f %.4f\n", q->rate, q->ttft_p99_s, q->goodput);
                }
                fprintf(f, "\n\n");
        }
        return fclose(f) == 0 ? 0 : -errno;
}

/* cases: aqua-cases --out's prefix (NULL: none): a second row of panels, long prompt and
 * multi-turn, from its .dat files. */
static int write_plot_script(const char *path, const char *dat, const char *png, const char *cases)
{
        static const char *const titles =
            "array T[4] = ['(a) fcfs + DRAM swap', '(b) fair + DRAM swap', '(c) fair + aqua', "
            "'(d) fair + aqua + LayerKV']\n";
        FILE *f = fopen(path, "we");
        if (!f)
                return -errno;
        fprintf(f,
                "# TTFT p99 and goodput against the burst arrival rate, from aqua-engine --sweep\n"
                "set terminal pngcairo size 1100,%d\n"
                "set output '%s'\n"
                "set key top left\nset grid\nset offsets graph 0.03, graph 0.03, 0, 0\n"
                "set xlabel 'burst arrival rate (requests/s)'\n"
                "set multiplot layout %d,2 title 'Simulated serving: compute and links "
                "modelled (H100-class), KV bytes real'\n"
                "%s"
                "set logscale y\nset ylabel 'bursts: TTFT p99 (s)'\n"
                "plot for [i=0:3] '%s' index i using 1:2 with linespoints title T[i+1]\n"
                "unset logscale y\nset ylabel 'bursts: goodput (requests/s meeting the SLA)'\n"
                "set yrange [0:*]\nset key bottom left\n"
                "plot for [i=0:3] '%s' index i using 1:3 with linespoints title T[i+1]\n",
                cases ? 900 : 460, png, cases ? 2 : 1, titles, dat, dat);
        if (cases)
                fprintf(f,
                        "set yrange [*:*]\nset key top right\nset logscale y\n"
                        "set xlabel 'long prompt: context (K tokens)'\n"
                        "set ylabel 'long prompt: decode tokens/s'\n"
                        "plot '%s-long.dat' index 0 using 1:2 with linespoints title 'peer HBM "
                        "(NVLink)', '' index 1 using 1:2 with linespoints title 'DRAM, 1 GPU on "
                        "the host link', '' index 2 using 1:2 with linespoints title 'DRAM, 8 "
                        "GPUs'\n"
                        "set xlabel 'multi-turn: conversations/s'\n"
                        "set ylabel 'multi-turn: follow-up TTFT p99 (s)'\nset key top left\n"
                        "plot '%s-turns.dat' index 0 using 1:2 with linespoints title 'none "
                        "(recompute)', '' index 1 using 1:2 with linespoints title 'DRAM, 1 GPU', "
                        "'' index 2 using 1:2 with linespoints title 'DRAM, 8 GPUs', '' index 3 "
                        "using 1:2 with linespoints title 'peer HBM', '' index 4 using 1:2 with "
                        "linespoints title 'aqua: peer, then DRAM (1 GPU)', '' index 5 using 1:2 "
                        "with linespoints title 'aqua (8 GPUs)'\n",
                        cases, cases);
        fprintf(f, "unset multiplot\n");
        return fclose(f) == 0 ? 0 : -errno;
}

/* --sweep: the four-way runs over one generated trace per rate; CSV, script, PNG. */
static int sweep(struct args *a)
{
        const char *prefix = a->sweep_out ?: "aqua-sweep";
        _cleanup_free_ char *csv = NULL, *gp = NULL, *png = NULL, *dat = NULL,
                            *list = strdup(a->sweep);
        _cleanup_free_ struct sweep_point *pts = NULL;
        size_t n_rates = 0;
        struct run_spec spec[MAX_RUNS];
        FILE *f;
        int r = 0;

        a->four_way = true;
        size_t n = run_specs(a, spec);
        if (!list || asprintf(&csv, "%s.csv", prefix) < 0 || asprintf(&gp, "%s.gp", prefix) < 0 ||
            asprintf(&png, "%s.png", prefix) < 0 || asprintf(&dat, "%s.dat", prefix) < 0)
                return log_error_errno(ENOMEM, "Out of memory");
        f = fopen(csv, "we");
        if (!f)
                return log_error_errno(errno, "Failed to open %s: %m", csv);
        fprintf(f, "rate,run,ttft_p50_s,ttft_p99_s,tbt_p99_ms,attainment,goodput_rps,"
                   "requests_per_s,nvlink_bytes,pcie_bytes,requests,done,integrity_errors\n");
        if (!a->quiet)
                printf("rate  run  TTFT p99   TBT p99  SLA met  goodput\n");
        for (char *save = NULL, *w = strtok_r(list, ",", &save); w && r >= 0;
             w = strtok_r(NULL, ",", &save)) {
                struct trace t = {};
                struct run_summary s[MAX_RUNS] = {};
                double rate;
                if (parse_double(w, &rate) < 0 || !(rate > 0)) {
                        r = log_error_errno(EINVAL, "--sweep: not a rate: \"%s\"", w);
                        break;
                }
                a->gen.rate_on = rate;
                r = trace_generate(&a->gen, &t);
                if (r >= 0)
                        r = run_specs_on(a, &t, spec, n, NULL, s);
                struct sweep_point *np = reallocarray(pts, (n_rates + 1) * n, sizeof(*np));
                if (!np)
                        r = log_error_errno(ENOMEM, "Out of memory");
                else
                        pts = np;
                for (size_t i = 0; i < n && r >= 0; i++) {
                        pts[n_rates * n + i] =
                            (struct sweep_point){rate, ms(s[i].ttft[2]) / 1000, s[i].goodput};
                        fprintf(
                            f,
                            "%g,%s,%.4f,%.4f,%.3f,%.4f,%.4f,%.4f,%" PRIu64 ",%" PRIu64 ",%" PRIu64
                            ",%" PRIu64 ",%" PRIu64 "\n",
                            rate, s[i].spec.label, ms(s[i].ttft[0]) / 1000, ms(s[i].ttft[2]) / 1000,
                            ms(s[i].tbt[2]), s[i].attainment, s[i].goodput, s[i].requests_per_s,
                            link_bytes(&s[i].r, KV_TIER_PEER), link_bytes(&s[i].r, KV_TIER_DRAM),
                            s[i].r.requests, s[i].r.requests_done, s[i].r.integrity_errors);
                        if (!a->quiet)
                                printf("%4g  (%s) %7.0fms %7.1fms %7.1f%% %5.2f r/s\n", rate,
                                       s[i].spec.label, ms(s[i].ttft[2]), ms(s[i].tbt[2]),
                                       100 * s[i].attainment, s[i].goodput);
                        if (s[i].r.integrity_errors > 0 || s[i].r.requests_done != s[i].r.requests)
                                r = log_error_errno(EIO,
                                                    "Run (%s) at rate %g lost requests or "
                                                    "failed an integrity check",
                                                    s[i].spec.label, rate);
                }
                summaries_clear(s, n);
                trace_clear(&t);
                n_rates++;
        }
        if (fclose(f) != 0 && r >= 0)
                r = log_error_errno(errno, "Failed to write %s: %m", csv);
        if (r < 0)
                return r;
        r = write_plot_data(dat, pts, n_rates, n);
        if (r >= 0)
                r = write_plot_script(gp, dat, png, a->sweep_cases);
        if (r < 0)
                return log_error_errno(r, "Failed to write %s: %m", gp);
        r = run_gnuplot(gp);
        if (r == -ENOENT)
                log_warning("gnuplot is not installed: no plot drawn (install gnuplot-nox and "
                            "run: gnuplot %s)",
                            gp);
        else if (r < 0)
                log_warning("gnuplot failed on %s (run gnuplot %s to see why)", gp, gp);
        printf("SWEEP csv=%s script=%s plot=%s\n", csv, gp, r == 0 ? png : "-");
        return 0;
}

int main(int argc, char **argv)
{
        struct args a = {};
        struct trace t = {};
        struct run_summary runs[MAX_RUNS] = {};
        struct run_spec spec[MAX_RUNS];
        struct kv_swap shared = {};
        struct kv_swap_aqua_stats aqua_stats = {};
        size_t n_runs = 0;
        int r;

        log_setup("aqua-engine", LOG_LEVEL_INFO);
        r = parse_args(argc, argv, &a);
        if (r != 0)
                return r > 0 ? EXIT_SUCCESS : EXIT_FAILURE;
        if (a.sweep)
                return sweep(&a) < 0 ? EXIT_FAILURE : EXIT_SUCCESS;

        if (a.trace) {
                _cleanup_free_ char *error = NULL;
                r = trace_load(a.trace, &t, &error);
                if (r < 0) {
                        log_error("%s", error ?: strerror(-r));
                        return EXIT_FAILURE;
                }
        } else {
                r = trace_generate(&a.gen, &t);
                if (r < 0) {
                        log_error_errno(r, "Invalid trace generator parameters: %m");
                        return EXIT_FAILURE;
                }
        }

        if (a.generate) {
                FILE *f = strcmp(a.generate, "-") == 0 ? stdout : fopen(a.generate, "we");
                if (!f) {
                        log_error_errno(errno, "Failed to open %s: %m", a.generate);
                        trace_clear(&t);
                        return EXIT_FAILURE;
                }
                r = trace_write_csv(&t, f);
                if (f != stdout && fclose(f) != 0 && r == 0)
                        r = -errno;
                if (r < 0)
                        log_error_errno(r, "Failed to write %s: %m", a.generate);
                else if (f != stdout)
                        log_info("Wrote %zu requests to %s", t.n, a.generate);
                trace_clear(&t);
                return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
        }

        if (!a.quiet) {
                char hbm[32], bpt[32];
                uint64_t block = a.cfg.bytes_per_token * a.cfg.block_tokens;
                uint64_t prompt = 0, output = 0;
                for (size_t i = 0; i < t.n; i++) {
                        prompt += t.req[i].prompt_tokens;
                        output += t.req[i].output_tokens;
                }
                printf("Simulated serving on a virtual clock (compute is time per token, not a "
                       "model).\n");
                printf("Trace: %zu requests over %.1f s (%s), mean prompt %.0f, mean output %.0f "
                       "tokens\n",
                       t.n, (double)t.req[t.n - 1].arrival_ns / NSEC_PER_SEC,
                       a.trace ?: "generated, on/off bursts", (double)prompt / t.n,
                       (double)output / t.n);
                printf("KV: %s local = %" PRIu64
                       " blocks of %u tokens x %s/token (%u layers); %u decode slots, "
                       "%u tokens per iteration, slice %u iterations\n",
                       format_size(hbm, sizeof(hbm), a.cfg.hbm_bytes), a.cfg.hbm_bytes / block,
                       a.cfg.block_tokens, format_size(bpt, sizeof(bpt), a.cfg.bytes_per_token),
                       a.cfg.n_layers, a.cfg.decode_slots, a.cfg.max_batch_tokens,
                       a.cfg.slice_iters);
                if (a.aqua)
                        printf(
                            "Swap: aqua (peer GPU memory borrowed through aquad, DRAM when none; "
                            "real copies, checksummed); time modelled for peer %.0f GB/s, "
                            "dram %.0f GB/s\n\n",
                            a.cfg.cost[KV_TIER_PEER].gbytes_per_s,
                            a.cfg.cost[KV_TIER_DRAM].gbytes_per_s);
                else
                        printf("Swap: host-memory backend (real copies, checksummed); time "
                               "modelled for peer %.0f GB/s, dram %.0f GB/s\n\n",
                               a.cfg.cost[KV_TIER_PEER].gbytes_per_s,
                               a.cfg.cost[KV_TIER_DRAM].gbytes_per_s);
                fflush(stdout);
        }

        if (a.aqua) {
                r = kv_swap_aqua_new(&a.aqua_cfg, &shared);
                if (r < 0) {
                        log_error_errno(r, "Failed to set up the aqua swap backend: %m");
                        if (r == -ENOENT || r == -ECONNREFUSED)
                                log_error("Is aquad running? $AQUA_ENDPOINT names it.");
                        else if (r == -ELIBACC)
                                log_error("No CUDA driver: set $AQUA_CUDA_LIBRARY (simcuda's "
                                          "build/simcuda/libcuda.so.1 without a GPU).");
                        goto out;
                }
        }
        n_runs = run_specs(&a, spec);
        r = run_specs_on(&a, &t, spec, n_runs, a.aqua ? &shared : NULL, runs);
        if (r < 0)
                goto out;
        if (a.aqua)
                kv_swap_aqua_stats(&shared, &aqua_stats);

        if (!a.quiet) {
                if (a.four_way)
                        print_four_way(&a, runs, n_runs);
                else {
                        printf("sched tier   done/all   TTFT ms: p50      p90      p99   TBT ms: "
                               "p50    p90    p99    tok/s preempt  swapped-out  swapped-in  "
                               "swap-ms\n");
                        for (size_t i = 0; i < n_runs; i++)
                                print_human(&runs[i]);
                        printf("\n");
                }
        }
        for (size_t i = 0; i < n_runs; i++)
                print_summary(&runs[i]);
        if (a.aqua)
                print_aqua_summary(&aqua_stats);
        for (size_t i = 0; i < n_runs; i++)
                if (runs[i].r.integrity_errors > 0 || runs[i].r.requests_done != runs[i].r.requests)
                        r = -EIO;
        if (aqua_stats.checksum_failures > 0)
                r = -EIO;
        if (r < 0)
                log_error(
                    "Some runs lost requests or failed an integrity check (see SUMMARY lines)");
out:
        summaries_clear(runs, n_runs);
        kv_swap_free(&shared);
        trace_clear(&t);
        return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
