/* aquactl: inspect and operate a running aquad (GPUs, pairs, leases, chunks, events; reclaim,
 * drain, pair, release, reload). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "admin.h"
#include "curve.h"
#include "format-json.h"
#include "format.h"
#include "log.h"
#include "parse-util.h"
#include "time-util.h"
#include "wire.h"

/* Exit codes; scripts can tell these apart without parsing messages. */
enum {
        EXIT_OK = 0,
        EXIT_FAILED = 1,      /* aquad refused or failed the request */
        EXIT_USAGE = 2,       /* bad command line: unknown command, bad size, missing argument */
        EXIT_UNREACHABLE = 3, /* aquad not running, not answering, or stopping */
        EXIT_DENIED = 4,      /* permission denied by the socket or by aquad */
        EXIT_UNKNOWN_GPU = 5, /* the GPU named is not one aquad knows */
};

#define TIMEOUT_DEFAULT_MS 5000

struct options {
        const char *endpoint;
        const char *side;
        const char *server_key;
        const char *key_file;
        bool json;
        int timeout_ms;
};

static void help(FILE *out)
{
        fprintf(
            out,
            "Usage: aquactl [OPTIONS] COMMAND [ARGS]\n"
            "\n"
            "Inspect and operate the aqua daemon.\n"
            "\n"
            "Commands:\n"
            "  status                 daemon summary: clients, pool, leases, DRAM fallback\n"
            "  gpus                   registered GPUs: role, client, load, bytes lent/borrowed\n"
            "  pairs                  producer/consumer pairs\n"
            "  leases                 leases, and what each consumer holds from whom\n"
            "  chunks                 chunks in the lending pool\n"
            "  events                 recent events (leases, reclaims, deadline misses)\n"
            "  reclaim GPU [SIZE]     take SIZE (default: all) back from GPU's consumers\n"
            "  drain GPU              stop lending GPU's memory and take it all back; the\n"
            "                         drain lasts, across its producer's restarts and aquad's,\n"
            "                         until undrain\n"
            "  undrain GPU            end GPU's drain: its producer may offer again\n"
            "  pair PRODUCER CONSUMER pair two GPUs\n"
            "  unpair GPU             remove GPU's pair\n"
            "  release GPU [--force]  release what GPU's silent client held (after an aquad\n"
            "                         restart, or a cut link): refused while its process runs\n"
            "                         or cannot be seen; --force then ends its leases, and\n"
            "                         quarantines their chunks while that process runs\n"
            "  reload                 reload aquad's config file and wait for its verdict:\n"
            "                         exit status 1 and the error if aquad refused the file\n"
            "                         (the running configuration is kept)\n"
            "  keygen FILE            write a CURVE key pair to FILE (0600) and its public key\n"
            "                         to FILE.pub, for aquad's remote.key-file or a client\n"
            "\n"
            "GPUs are named by ordinal or uuid; sizes like 2GiB, 512MiB, 1.5GB.\n"
            "\n"
            "Options:\n"
            "  -e, --endpoint=ENDPOINT  aquad's endpoint (default $AQUA_ENDPOINT or %s)\n"
            "      --side=PATH          side channel socket (default $AQUA_SIDE_PATH, or\n"
            "                           derived from ENDPOINT: /run/aqua/aquad.side)\n"
            "  -j, --json               print JSON for scripts\n"
            "      --server-key=KEY     aquad's CURVE public key (Z85, or a .pub file) for a\n"
            "                           tcp:// endpoint (default $AQUA_SERVER_KEY)\n"
            "      --key-file=FILE      this client's key pair from keygen (default\n"
            "                           $AQUA_KEY_FILE); with --server-key: no side channel\n"
            "  -t, --timeout=DURATION   how long to wait for aquad (default 5s)\n"
            "  -h, --help               show this help\n"
            "      --version            print the version\n"
            "\n"
            "Exit status: 0 ok, 1 request failed, 2 usage, 3 aquad unreachable,\n"
            "4 permission denied, 5 unknown GPU.\n",
            ADMIN_ENDPOINT_DEFAULT);
}

static int exit_for_outcome(int r)
{
        switch (r) {
        case ADMIN_E_NOT_RUNNING:
        case ADMIN_E_TIMEOUT:
        case ADMIN_E_STOPPING:
                return EXIT_UNREACHABLE;
        case ADMIN_E_DENIED:
                return EXIT_DENIED;
        default:
                return EXIT_FAILED;
        }
}

/* An Error reply, in words and as an exit code. */
static int report_error(const Aqua__Error *e, const char *gpu)
{
        switch (e->code) {
        case AQUA__ERROR_CODE__ERROR_CODE_PERMISSION:
                log_error("permission denied: %s", e->message);
                return EXIT_DENIED;
        case AQUA__ERROR_CODE__ERROR_CODE_UNKNOWN_GPU:
                if (gpu)
                        log_error("unknown GPU '%s': aquad knows no such GPU (aquactl gpus lists "
                                  "them)",
                                  gpu);
                else
                        log_error("unknown GPU: %s", e->message);
                return EXIT_UNKNOWN_GPU;
        case AQUA__ERROR_CODE__ERROR_CODE_STOPPING:
                log_error("aquad is stopping: %s", e->message);
                return EXIT_UNREACHABLE;
        default: {
                char code[48];

                log_error("aquad refused the request (%s): %s",
                          format_enum(&aqua__error_code__descriptor, e->code, code, sizeof(code)),
                          e->message);
                return EXIT_FAILED;
        }
        }
}

static void envelope_free(Aqua__Envelope *e)
{
        aqua__envelope__free_unpacked(e, NULL);
}
DEFINE_TRIVIAL_CLEANUP_FUNC(Aqua__Envelope *, envelope_free);

/* One call; on failure the message is logged and *ret_exit says how aquactl should exit. */
static int call(struct admin *a, Aqua__Envelope *request, const char *gpu,
                Aqua__Envelope **ret_reply, int *ret_exit)
{
        char err[512];
        Aqua__Envelope *reply = NULL;
        int r;

        r = admin_call(a, request, &reply, err, sizeof(err));
        if (r != 0) {
                log_error("%s", err);
                *ret_exit = r < 0 ? EXIT_FAILED : exit_for_outcome(r);
                return -1;
        }
        if (reply->body_case == AQUA__ENVELOPE__BODY_ERROR) {
                *ret_exit = report_error(reply->error, gpu);
                aqua__envelope__free_unpacked(reply, NULL);
                return -1;
        }
        *ret_reply = reply;
        return 0;
}

static int query(struct admin *a, enum view v, Aqua__Envelope **ret_reply, int *ret_exit)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__AdminQuery q = AQUA__ADMIN_QUERY__INIT;
        Aqua__Envelope *reply = NULL;

        q.what = view_query(v);
        e.body_case = AQUA__ENVELOPE__BODY_ADMIN_QUERY;
        e.admin_query = &q;
        if (call(a, &e, NULL, &reply, ret_exit) < 0)
                return -1;
        if (reply->body_case != AQUA__ENVELOPE__BODY_ADMIN_REPLY) {
                log_error("aquad answered a %s query with %s", view_to_string(v),
                          wire_body_name(reply));
                aqua__envelope__free_unpacked(reply, NULL);
                *ret_exit = EXIT_FAILED;
                return -1;
        }
        *ret_reply = reply;
        return 0;
}

static int show(struct admin *a, const struct options *o, enum view v)
{
        _cleanup_(envelope_freep) Aqua__Envelope *data = NULL;
        _cleanup_(envelope_freep) Aqua__Envelope *gpus = NULL;
        int code = EXIT_OK, r;

        if (query(a, v, &data, &code) < 0)
                return code;
        /* Other views name GPUs by ordinal and client; without that list they show uuids. */
        if (v != VIEW_GPUS && v != VIEW_EVENTS && query(a, VIEW_GPUS, &gpus, &code) < 0)
                log_warning("GPUs are shown by uuid");
        /* aquad cuts long lists at its limits; say so rather than show a part as the whole. */
        if (data->admin_reply->truncated)
                log_warning("aquad sent only part of the %s (it stops at its limits.repeated-items "
                            "and limits.message-size)",
                            view_to_string(v));
        if (o->json)
                r = json_print_view(stdout, v, data->admin_reply, gpus ? gpus->admin_reply : NULL);
        else
                r = format_view(stdout, v, data->admin_reply,
                                v == VIEW_GPUS ? data->admin_reply
                                : gpus         ? gpus->admin_reply
                                               : NULL);
        if (r < 0 || fflush(stdout) != 0) {
                log_error_errno(r < 0 ? r : -EIO, "Failed to print %s: %m", view_to_string(v));
                return EXIT_FAILED;
        }
        return EXIT_OK;
}

/* The reply's body message, for --json output of changing commands. */
static const ProtobufCMessage *body_of(const Aqua__Envelope *e)
{
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field(&aqua__envelope__descriptor, e->body_case);

        return f ? *(const ProtobufCMessage *const *)((const char *)e + f->offset) : NULL;
}

/* A changing command, built and checked before aquad is contacted. */
struct request {
        Aqua__Envelope e;
        union {
                Aqua__AdminReclaim reclaim;
                Aqua__AdminDrain drain;
                Aqua__AdminPair pair;
                Aqua__AdminUnpair unpair;
                Aqua__AdminRelease release;
                Aqua__AdminReload reload;
                Aqua__AdminUndrain undrain;
        } u;
        const char *gpu; /* named when aquad does not know it */
        char done[256];  /* what to tell the operator on success */
};

static int change(struct admin *a, const struct options *o, struct request *req)
{
        _cleanup_(envelope_freep) Aqua__Envelope *reply = NULL;
        const ProtobufCMessage *body;
        int code = EXIT_OK;

        if (call(a, &req->e, req->gpu, &reply, &code) < 0)
                return code;
        body = body_of(reply);
        if (o->json) {
                if (body && json_print_message(stdout, body) < 0)
                        return EXIT_FAILED;
                return fflush(stdout) == 0 ? EXIT_OK : EXIT_FAILED;
        }
        printf("%s\n", req->done);
        if (reply->body_case == AQUA__ENVELOPE__BODY_ACK && reply->ack->text && reply->ack->text[0])
                printf("%s\n", reply->ack->text);
        if (reply->body_case == AQUA__ENVELOPE__BODY_RECLAIM_REPLY) {
                const Aqua__ReclaimReply *rr = reply->reclaim_reply;
                char d[32];

                printf("%zu chunks free now, %zu to come back from consumers", rr->n_chunk_ids,
                       rr->n_pending_chunk_ids);
                if (rr->n_pending_chunk_ids)
                        printf(" within %s",
                               format_duration(d, sizeof(d), rr->deadline_ms * NSEC_PER_MSEC));
                printf("\n");
        }
        return fflush(stdout) == 0 ? EXIT_OK : EXIT_FAILED;
}

static int build_reclaim(char **args, int n, struct request *req)
{
        char size[32];
        uint64_t bytes = 0;

        if (n > 1 && strcmp(args[1], "all") != 0) {
                int r = parse_size(args[1], &bytes);

                if (r < 0 || bytes == 0) {
                        log_error("invalid size '%s': give a positive amount like 2GiB, 512MiB "
                                  "or 1.5GB, or 'all'",
                                  args[1]);
                        return -EINVAL;
                }
        }
        req->u.reclaim = (Aqua__AdminReclaim)AQUA__ADMIN_RECLAIM__INIT;
        req->u.reclaim.gpu = args[0];
        req->u.reclaim.bytes = bytes;
        req->e.body_case = AQUA__ENVELOPE__BODY_ADMIN_RECLAIM;
        req->e.admin_reclaim = &req->u.reclaim;
        req->gpu = args[0];
        if (bytes)
                snprintf(req->done, sizeof(req->done), "reclaiming %s from GPU %s",
                         format_size(size, sizeof(size), bytes), args[0]);
        else
                snprintf(req->done, sizeof(req->done), "reclaiming everything lent from GPU %s",
                         args[0]);
        return 0;
}

static int build_drain(char **args, int n, struct request *req)
{
        req->u.drain = (Aqua__AdminDrain)AQUA__ADMIN_DRAIN__INIT;
        req->u.drain.gpu = args[0];
        req->e.body_case = AQUA__ENVELOPE__BODY_ADMIN_DRAIN;
        req->e.admin_drain = &req->u.drain;
        req->gpu = args[0];
        snprintf(req->done, sizeof(req->done),
                 "GPU %s is draining: it lends nothing more and its leases are being reclaimed",
                 args[0]);
        return 0;
}

static int build_undrain(char **args, int n, struct request *req)
{
        req->u.undrain = (Aqua__AdminUndrain)AQUA__ADMIN_UNDRAIN__INIT;
        req->u.undrain.gpu = args[0];
        req->e.body_case = AQUA__ENVELOPE__BODY_ADMIN_UNDRAIN;
        req->e.admin_undrain = &req->u.undrain;
        req->gpu = args[0];
        snprintf(req->done, sizeof(req->done), "GPU %s is no longer draining: it may offer again",
                 args[0]);
        return 0;
}

static int build_pair(char **args, int n, struct request *req)
{
        req->u.pair = (Aqua__AdminPair)AQUA__ADMIN_PAIR__INIT;
        req->u.pair.producer = args[0];
        req->u.pair.consumer = args[1];
        req->e.body_case = AQUA__ENVELOPE__BODY_ADMIN_PAIR;
        req->e.admin_pair = &req->u.pair;
        snprintf(req->done, sizeof(req->done), "paired producer GPU %s with consumer GPU %s",
                 args[0], args[1]);
        return 0;
}

static int build_unpair(char **args, int n, struct request *req)
{
        req->u.unpair = (Aqua__AdminUnpair)AQUA__ADMIN_UNPAIR__INIT;
        req->u.unpair.gpu = args[0];
        req->e.body_case = AQUA__ENVELOPE__BODY_ADMIN_UNPAIR;
        req->e.admin_unpair = &req->u.unpair;
        req->gpu = args[0];
        snprintf(req->done, sizeof(req->done), "GPU %s is unpaired", args[0]);
        return 0;
}

static int build_release(char **args, int n, struct request *req)
{
        req->u.release = (Aqua__AdminRelease)AQUA__ADMIN_RELEASE__INIT;
        if (n == 2 && strcmp(args[0], "--force") == 0) {
                req->u.release.force = true;
                args++;
        } else if (n == 2 && strcmp(args[1], "--force") == 0)
                req->u.release.force = true;
        else if (n == 2) {
                log_error("release: '%s' is not --force", args[1]);
                return -EINVAL;
        }
        req->u.release.gpu = args[0];
        req->e.body_case = AQUA__ENVELOPE__BODY_ADMIN_RELEASE;
        req->e.admin_release = &req->u.release;
        req->gpu = args[0];
        snprintf(req->done, sizeof(req->done), "released what GPU %s held", args[0]);
        return 0;
}

static int build_reload(char **args, int n, struct request *req)
{
        req->u.reload = (Aqua__AdminReload)AQUA__ADMIN_RELOAD__INIT;
        req->e.body_case = AQUA__ENVELOPE__BODY_ADMIN_RELOAD;
        req->e.admin_reload = &req->u.reload;
        snprintf(req->done, sizeof(req->done), "aquad reloaded its configuration");
        return 0;
}

struct command {
        const char *name;
        int min_args, max_args;
        int (*build)(char **args, int n, struct request *req);
        const char *usage;
};

static const struct command commands[] = {
    {"reclaim", 1, 2, build_reclaim, "reclaim GPU [SIZE]"},
    {"drain", 1, 1, build_drain, "drain GPU"},
    {"undrain", 1, 1, build_undrain, "undrain GPU"},
    {"pair", 2, 2, build_pair, "pair PRODUCER CONSUMER"},
    {"unpair", 1, 1, build_unpair, "unpair GPU"},
    {"release", 1, 2, build_release, "release GPU [--force]"},
    {"reload", 0, 0, build_reload, "reload"},
};

static int parse_options(int argc, char **argv, struct options *o)
{
        static const struct option longopts[] = {
            {"endpoint", required_argument, NULL, 'e'},
            {"side", required_argument, NULL, 's'},
            {"json", no_argument, NULL, 'j'},
            {"timeout", required_argument, NULL, 't'},
            {"help", no_argument, NULL, 'h'},
            {"version", no_argument, NULL, 'V'},
            {"server-key", required_argument, NULL, 'S'},
            {"key-file", required_argument, NULL, 'K'},
            {},
        };
        uint64_t ns;
        int c;

        /* "+": options end at the command, so "reclaim 1 -5" is not read as an option. */
        while ((c = getopt_long(argc, argv, "+e:jt:h", longopts, NULL)) >= 0) {
                switch (c) {
                case 'e':
                        o->endpoint = optarg;
                        break;
                case 's':
                        o->side = optarg;
                        break;
                case 'j':
                        o->json = true;
                        break;
                case 'S':
                        o->server_key = optarg;
                        break;
                case 'K':
                        o->key_file = optarg;
                        break;
                case 't':
                        if (parse_duration(optarg, &ns) < 0 || ns < NSEC_PER_MSEC ||
                            ns > 3600 * NSEC_PER_SEC) {
                                log_error("invalid timeout '%s': give a duration like 5s or 500ms",
                                          optarg);
                                return -EINVAL;
                        }
                        o->timeout_ms = (int)(ns / NSEC_PER_MSEC);
                        break;
                case 'h':
                        help(stdout);
                        return 0;
                case 'V':
                        printf("aquactl %s\n", AQUA_PACKAGE_VERSION);
                        return 0;
                default:
                        return -EINVAL;
                }
        }
        return 1;
}

/* keygen FILE: a CURVE key pair for aquad's remote.key-file or for a remote client. */
static int keygen(char **args, int n)
{
        char pub[CURVE_KEY_TEXT + 1], err[512];

        if (n != 1) {
                log_error("usage: aquactl keygen FILE");
                return EXIT_USAGE;
        }
        if (curve_keyfile_write(args[0], pub, err, sizeof(err)) < 0) {
                log_error("%s", err);
                return EXIT_FAILED;
        }
        printf("%s\n", pub);
        return EXIT_OK;
}

/* A tcp:// endpoint with CURVE: the server's key (Z85 or a file holding it), our key pair. */
static int connect_remote(const struct options *o, struct admin **ret, char *err, size_t len)
{
        char server[CURVE_KEY_TEXT + 1], pub[CURVE_KEY_TEXT + 1], sec[CURVE_KEY_TEXT + 1];
        int r;

        if (strncmp(o->endpoint, "tcp://", 6) != 0) {
                snprintf(err, len, "a server key is for a tcp:// endpoint, not %s", o->endpoint);
                return -EINVAL;
        }
        if (curve_public_key_load(o->server_key, server, err, len) < 0)
                return -EINVAL;
        if (!o->key_file || !*o->key_file) {
                snprintf(err, len,
                         "a tcp:// endpoint with a server key needs this client's key "
                         "pair: --key-file or $AQUA_KEY_FILE (aquactl keygen FILE)");
                return -EINVAL;
        }
        if (curve_keyfile_load(o->key_file, pub, sec, err, len) < 0)
                return -EINVAL;
        r = admin_connect_remote(o->endpoint, server, pub, sec, "aquactl", o->timeout_ms, ret, err,
                                 len);
        explicit_bzero(sec, sizeof(sec));
        return r;
}

int main(int argc, char **argv)
{
        struct options o = {.timeout_ms = TIMEOUT_DEFAULT_MS};
        _cleanup_(admin_freep) struct admin *a = NULL;
        _cleanup_free_ char *side = NULL;
        const struct command *cmd = NULL;
        struct request req = {.e = AQUA__ENVELOPE__INIT};
        char err[512];
        enum view v = _VIEW_INVALID;
        int r, n_args;

        log_setup("aquactl", LOG_LEVEL_WARNING);
        r = parse_options(argc, argv, &o);
        if (r <= 0)
                return r < 0 ? EXIT_USAGE : EXIT_OK;
        if (optind >= argc) {
                help(stderr);
                return EXIT_USAGE;
        }
        n_args = argc - optind - 1;
        if (strcmp(argv[optind], "keygen") == 0)
                return keygen(argv + optind + 1, n_args);
        v = view_from_string(argv[optind]);
        for (size_t i = 0; v < 0 && i < ARRAY_SIZE(commands); i++)
                if (strcmp(argv[optind], commands[i].name) == 0)
                        cmd = &commands[i];
        if (v < 0 && !cmd) {
                log_error("unknown command '%s'; see aquactl --help", argv[optind]);
                return EXIT_USAGE;
        }
        if ((v >= 0 && n_args != 0) ||
            (cmd && (n_args < cmd->min_args || n_args > cmd->max_args))) {
                log_error("usage: aquactl %s", cmd ? cmd->usage : view_to_string(v));
                return EXIT_USAGE;
        }
        /* A mistyped size is reported as such, not hidden behind "aquad is not running". */
        if (cmd && cmd->build(argv + optind + 1, n_args, &req) < 0)
                return EXIT_USAGE;

        if (!o.endpoint)
                o.endpoint = getenv("AQUA_ENDPOINT");
        if (!o.endpoint || !*o.endpoint)
                o.endpoint = ADMIN_ENDPOINT_DEFAULT;
        if (!o.side)
                o.side = getenv("AQUA_SIDE_PATH");
        if (!o.side || !*o.side) {
                side = admin_side_path(o.endpoint);
                if (!side) {
                        log_error("out of memory");
                        return EXIT_FAILED;
                }
                o.side = side;
        }

        if (!o.server_key)
                o.server_key = getenv("AQUA_SERVER_KEY");
        if (!o.key_file)
                o.key_file = getenv("AQUA_KEY_FILE");
        if (o.server_key && *o.server_key) {
                r = connect_remote(&o, &a, err, sizeof(err));
                if (r == -EINVAL) {
                        log_error("%s", err);
                        return EXIT_USAGE;
                }
        } else
                r = admin_connect(o.endpoint, o.side, "aquactl", o.timeout_ms, &a, err,
                                  sizeof(err));
        if (r != 0) {
                log_error("%s", err);
                return r < 0 ? EXIT_FAILED : exit_for_outcome(r);
        }
        if (cmd)
                return change(a, &o, &req);
        return show(a, &o, v);
}
