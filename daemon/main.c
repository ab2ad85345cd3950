/* aquad: the aqua coordinator. Parses the command line, loads the config, runs the server. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "accept-guard.h"
#include "config.h"
#include "log.h"
#include "notify.h"
#include "reload.h"
#include "server.h"
#include "wire.h"

static void usage(FILE *f)
{
        fprintf(f,
                "Usage: aquad [-c PATH] [--check-config] [--repair-journal] [-v]\n"
                "  -c, --config PATH     configuration file (default %s)\n"
                "      --check-config    validate the configuration and exit\n"
                "      --repair-journal  if the journal is damaged before its end, keep a copy\n"
                "                        of it and cut it at the damage, then start\n"
                "  -v, --verbose         log debug messages\n"
                "  -h, --help            show this help\n"
                "      --version         print the version\n",
                CONFIG_DEFAULT_PATH);
}

/* Readiness is known here: under systemd, READY=1 goes out now. */
static void ready(struct server *s, void *userdata)
{
        log_info("Ready");
        notify_ready(s->broker, s->n_clients);
}

int main(int argc, char **argv)
{
        static const struct option options[] = {
            {"config", required_argument, NULL, 'c'},
            {"check-config", no_argument, NULL, 'C'},
            {"verbose", no_argument, NULL, 'v'},
            {"help", no_argument, NULL, 'h'},
            {"version", no_argument, NULL, 'V'},
            {"repair-journal", no_argument, NULL, 'R'},
            {},
        };
        _cleanup_(server_freep) struct server *s = NULL;
        _cleanup_(config_freep) struct config *config = NULL;
        _cleanup_free_ char *error = NULL;
        const char *path = CONFIG_DEFAULT_PATH;
        bool check = false, verbose = false;
        unsigned flags = 0;
        int c, r;

        while ((c = getopt_long(argc, argv, "c:vh", options, NULL)) >= 0) {
                switch (c) {
                case 'c':
                        path = optarg;
                        break;
                case 'C':
                        check = true;
                        break;
                case 'v':
                        verbose = true;
                        break;
                case 'R':
                        flags |= SERVER_REPAIR_JOURNAL;
                        break;
                case 'h':
                        usage(stdout);
                        return 0;
                case 'V':
                        printf("aquad %s (protocol %d.%d)\n", AQUA_PACKAGE_VERSION,
                               AQUA_PROTOCOL_VERSION / 100, AQUA_PROTOCOL_VERSION % 100);
                        return 0;
                default:
                        usage(stderr);
                        return 2;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "aquad: unexpected argument \"%s\"\n", argv[optind]);
                usage(stderr);
                return 2;
        }

        log_setup("aquad", verbose ? LOG_LEVEL_DEBUG : LOG_LEVEL_INFO);
        r = config_load(path, NULL, 0, &config, &error);
        if (r < 0) {
                if (error)
                        fprintf(stderr, "%s\n", error);
                else
                        fprintf(stderr, "%s: %s\n", path, strerror(-r));
                return 1;
        }
        r = config_check_paths(config, &error);
        if (r < 0) {
                fprintf(stderr, "%s: %s\n", path, error ? error : strerror(-r));
                return 1;
        }
        if (check) {
                printf("%s: ok\n", path);
                return 0;
        }
        log_setup("aquad", verbose ? LOG_LEVEL_DEBUG : config->log_level);

        accept_guard_init();
        r = server_new(config, path, flags, &s);
        if (r < 0)
                return 1; /* the reason is logged */
        accept_guard_passthrough(s->side_fd);
        s->fdg.share = accept_guard_share;
        s->fdg.share_refused = accept_guard_share_refused;
        server_apply_settings(s);
        config = NULL; /* the server owns it now */
        s->verbose = verbose;
        server_set_ready(s, ready, NULL);
        r = server_run(s);
        return r < 0 ? 1 : 0;
}
