/* READY, STATUS and STOPPING for systemd's Type=notify, with STATUS sent only when it changes. */
#include "notify.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <systemd/sd-daemon.h>

#include "broker.h"
#include "log.h"
#include "parse-util.h"

/* What STATUS= shows; compared field by field so that the loop pays a few compares per turn. */
struct status_figures {
        size_t clients;
        size_t gpus;
        size_t leases;
        uint64_t pool_bytes;
        uint64_t lent_bytes;
        uint64_t dram_granted;
        uint64_t deadline_misses;
        int journal_error, compact_error;
};

static bool same(const struct status_figures *a, const struct status_figures *b)
{
        return a->clients == b->clients && a->gpus == b->gpus && a->leases == b->leases &&
               a->pool_bytes == b->pool_bytes && a->lent_bytes == b->lent_bytes &&
               a->dram_granted == b->dram_granted && a->deadline_misses == b->deadline_misses &&
               a->journal_error == b->journal_error && a->compact_error == b->compact_error;
}

static struct status_figures last;
static bool sent;

static struct status_figures figures(const struct broker *broker, size_t n_clients)
{
        struct broker_counts n;

        broker_counts(broker, &n);
        return (struct status_figures){
            .clients = n_clients,
            .gpus = n.gpus,
            .leases = n.leases,
            .pool_bytes = n.pool_bytes,
            .lent_bytes = n.lent_bytes,
            .dram_granted = n.dram_granted,
            .deadline_misses = n.deadline_misses,
            .journal_error = n.journal_error,
            .compact_error = n.compact_error,
        };
}

static void send_status(const struct status_figures *f, const char *prefix)
{
        char pool[32], lent[32], dram[32], degraded[160] = "";
        int r;

        if (f->journal_error || f->compact_error)
                snprintf(degraded, sizeof(degraded), "DEGRADED: the journal cannot be %s (%s); ",
                         f->journal_error ? "written" : "compacted",
                         strerror(-(f->journal_error ? f->journal_error : f->compact_error)));
        r = sd_notifyf(0,
                       "%sSTATUS=%s%zu clients, %zu GPUs, %zu leases; pool %s, lent %s, DRAM "
                       "fallback %s; %" PRIu64 " deadline misses",
                       prefix, degraded, f->clients, f->gpus, f->leases,
                       format_size(pool, sizeof(pool), f->pool_bytes),
                       format_size(lent, sizeof(lent), f->lent_bytes),
                       format_size(dram, sizeof(dram), f->dram_granted), f->deadline_misses);
        if (r < 0)
                log_warning_errno(r, "Failed to notify systemd: %m");
}

void notify_ready(const struct broker *broker, size_t n_clients)
{
        last = figures(broker, n_clients);
        sent = true;
        send_status(&last, "READY=1\n");
}

void notify_status(const struct broker *broker, size_t n_clients)
{
        struct status_figures now = figures(broker, n_clients);

        if (sent && same(&now, &last))
                return;
        last = now;
        sent = true;
        send_status(&last, "");
}

void notify_stopping(const char *why)
{
        int r = sd_notifyf(0, "STOPPING=1\nSTATUS=Stopping (%s)", why);

        if (r < 0)
                log_warning_errno(r, "Failed to notify systemd: %m");
}
