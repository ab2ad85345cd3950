/* aquactl's human views: GPUs named by ordinal and client, sizes in binary units, ages, states. */
#include "format.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <time.h>

#include "parse-util.h"
#include "table.h"
#include "text.h"
#include "time-util.h"

#define LABEL_MAX 96
#define CELL_MAX  64

static const char *const view_names[_VIEW_MAX] = {
    [VIEW_STATUS] = "status", [VIEW_GPUS] = "gpus",     [VIEW_PAIRS] = "pairs",
    [VIEW_LEASES] = "leases", [VIEW_CHUNKS] = "chunks", [VIEW_EVENTS] = "events",
};

static const Aqua__AdminQuery__What view_what[_VIEW_MAX] = {
    [VIEW_STATUS] = AQUA__ADMIN_QUERY__WHAT__WHAT_STATUS,
    [VIEW_GPUS] = AQUA__ADMIN_QUERY__WHAT__WHAT_GPUS,
    [VIEW_PAIRS] = AQUA__ADMIN_QUERY__WHAT__WHAT_PAIRS,
    [VIEW_LEASES] = AQUA__ADMIN_QUERY__WHAT__WHAT_LEASES,
    [VIEW_CHUNKS] = AQUA__ADMIN_QUERY__WHAT__WHAT_CHUNKS,
    [VIEW_EVENTS] = AQUA__ADMIN_QUERY__WHAT__WHAT_EVENTS,
};

const char *view_to_string(enum view v)
{
        return v >= 0 && v < _VIEW_MAX ? view_names[v] : NULL;
}

enum view view_from_string(const char *s)
{
        for (int i = 0; i < _VIEW_MAX; i++)
                if (strcmp(s, view_names[i]) == 0)
                        return i;
        return _VIEW_INVALID;
}

Aqua__AdminQuery__What view_query(enum view v)
{
        return view_what[v];
}

const char *format_enum(const ProtobufCEnumDescriptor *d, int value, char *buf, size_t len)
{
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(d, value);
        size_t prefix = SIZE_MAX;

        if (!ev) {
                snprintf(buf, len, "%d", value);
                return buf;
        }
        /* Every value of an aqua enum starts with the same "ROLE_"-style prefix; drop it. */
        for (unsigned i = 0; i < d->n_values; i++) {
                const char *a = d->values[0].name, *b = d->values[i].name;
                size_t n = 0, last = 0;

                while (a[n] && a[n] == b[n]) {
                        if (a[n] == '_')
                                last = n + 1;
                        n++;
                }
                prefix = MIN(prefix, last);
        }
        if (d->n_values < 2 || prefix == SIZE_MAX)
                prefix = 0;
        size_t i = 0;
        for (const char *s = ev->name + prefix; *s && i + 1 < len; s++)
                buf[i++] = *s == '_' ? '-' : (char)(*s >= 'A' && *s <= 'Z' ? *s - 'A' + 'a' : *s);
        buf[i] = '\0';
        return buf;
}

char *format_age(char *buf, size_t len, uint64_t ms)
{
        uint64_t s = ms / MSEC_PER_SEC;

        if (s < 60)
                snprintf(buf, len, "%" PRIu64 "s", s);
        else if (s < 3600)
                snprintf(buf, len, "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
        else if (s < 86400)
                snprintf(buf, len, "%" PRIu64 "h%02" PRIu64 "m", s / 3600, s / 60 % 60);
        else
                snprintf(buf, len, "%" PRIu64 "d%02" PRIu64 "h", s / 86400, s / 3600 % 24);
        return buf;
}

static const Aqua__GpuInfo *find_gpu(const Aqua__AdminReply *gpus, const char *uuid)
{
        if (!gpus || !uuid || !*uuid)
                return NULL;
        for (size_t i = 0; i < gpus->n_gpus; i++)
                if (strcmp(gpus->gpus[i]->uuid, uuid) == 0)
                        return gpus->gpus[i];
        return NULL;
}

/* How many GPUs of the listing share g's ordinal, and of those how many its host too. */
static void ordinal_peers(const Aqua__AdminReply *gpus, const Aqua__GpuInfo *g, size_t *ret_same,
                          size_t *ret_same_host)
{
        *ret_same = *ret_same_host = 0;
        for (size_t i = 0; i < gpus->n_gpus; i++) {
                const Aqua__GpuInfo *x = gpus->gpus[i];
                if (x->ordinal_unknown || x->ordinal != g->ordinal)
                        continue;
                (*ret_same)++;
                *ret_same_host += strcmp(x->host, g->host) == 0;
        }
}

/*
 * A GPU's name in tables and messages, unique within the listing: its ordinal where no other
 * GPU has it, HOST:ORDINAL where hosts tell them apart, ORDINAL/ROLE for a device's two
 * registrations, else the uuid's first 12 characters (also for an ordinal nobody recorded).
 */
static void gpu_name(char *buf, size_t len, const Aqua__AdminReply *gpus, const Aqua__GpuInfo *g)
{
        const char *role = strchr(g->uuid, '/');
        size_t same, same_host;

        if (g->ordinal_unknown) {
                snprintf(buf, len, "%.12s", g->uuid);
                return;
        }
        ordinal_peers(gpus, g, &same, &same_host);
        if (same <= 1)
                snprintf(buf, len, "%" PRIu32, g->ordinal);
        else if (same_host == 1 && g->host[0])
                snprintf(buf, len, "%s:%" PRIu32, g->host, g->ordinal);
        else if (same_host == 2 && role)
                snprintf(buf, len, "%s%s%" PRIu32 "%s", g->host, g->host[0] ? ":" : "", g->ordinal,
                         role);
        else
                snprintf(buf, len, "%.12s", g->uuid);
}

char *format_gpu_label(char *buf, size_t len, const Aqua__AdminReply *gpus, const char *uuid)
{
        const Aqua__GpuInfo *g = find_gpu(gpus, uuid);
        char name[CELL_MAX];

        if (g)
                gpu_name(name, sizeof(name), gpus, g);
        if (g && *g->client_name)
                snprintf(buf, len, "%s (%s)", name, g->client_name);
        else if (g)
                snprintf(buf, len, "%s", name);
        else if (uuid && *uuid)
                snprintf(buf, len, "%.12s", uuid);
        else
                snprintf(buf, len, "-");
        return buf;
}

/* Sizes that do not apply (a producer's borrowed bytes) read better as "-" than "0 B". */
static const char *size_cell(char *buf, size_t len, uint64_t bytes)
{
        return bytes ? format_size(buf, len, bytes) : "-";
}

static const char *gpu_state(const Aqua__GpuInfo *g)
{
        if (g->client_id == 0)
                return "offline";
        if (g->barred && g->draining)
                return "barred,draining";
        if (g->barred)
                return "barred";
        if (g->draining)
                return "draining";
        return "ok";
}

static int print_table(FILE *out, struct table *t, const char *empty)
{
        if (!t)
                return -ENOMEM;
        if (table_rows(t) == 0) {
                fprintf(out, "%s\n", empty);
                return ferror(out) ? -EIO : 0;
        }
        return table_print(t, out);
}

static int format_status(FILE *out, const Aqua__AdminReply *data, const Aqua__AdminReply *gpus)
{
        const Aqua__StatusInfo *s = data->status;
        char a[CELL_MAX], b[CELL_MAX], label[LABEL_MAX];
        unsigned by_role[8] = {0}; /* indexed by Role; later roles fit */

        if (!s) {
                fprintf(out, "aquad sent no status\n");
                return ferror(out) ? -EIO : 0;
        }
        /* daemon_version is the protocol version aquad speaks: major * 100 + minor. */
        fprintf(out, "aquad protocol %" PRIu32 ".%" PRIu32 ", up %s\n", s->daemon_version / 100,
                s->daemon_version % 100, format_age(a, sizeof(a), s->uptime_ms));
        fprintf(out, "%-17s%" PRIu32 "\n", "clients", s->clients);
        fprintf(out, "%-17s%" PRIu32, "gpus", s->gpus);
        if (gpus && gpus->n_gpus > 0) {
                const char *sep = ": ";

                for (size_t i = 0; i < gpus->n_gpus; i++)
                        if ((unsigned)gpus->gpus[i]->role < ARRAY_SIZE(by_role))
                                by_role[gpus->gpus[i]->role]++;
                for (unsigned r = 0; r < ARRAY_SIZE(by_role); r++) {
                        if (!by_role[r])
                                continue;
                        fprintf(out, "%s%s %u", sep,
                                format_enum(&aqua__role__descriptor, (int)r, a, sizeof(a)),
                                by_role[r]);
                        sep = ", ";
                }
        }
        fputc('\n', out);
        fprintf(out, "%-17s%" PRIu32 "\n", "pairs", s->pairs);
        fprintf(out, "%-17s%" PRIu32 "\n", "leases", s->leases);
        fprintf(out, "%-17s%s offered, %s lent\n", "pool", format_size(a, sizeof(a), s->pool_bytes),
                format_size(b, sizeof(b), s->lent_bytes));
        fprintf(out, "%-17s%s granted of %s budget\n", "dram fallback",
                format_size(a, sizeof(a), s->dram_granted),
                format_size(b, sizeof(b), s->dram_budget));
        fprintf(out, "%-17s%" PRIu64 "\n", "deadline misses", s->deadline_misses);
        fprintf(out, "%-17s%" PRIu64 "\n", "leases lost", s->leases_lost);
        if (s->domain && s->domain[0]) {
                fprintf(out, "%-17s%s, led by %s (term %" PRIu64 ")\n", "domain", s->domain,
                        s->domain_leader, s->domain_term);
                fprintf(out, "%-17s%s; %" PRIu64 " commits, %.2f ms each on average\n", "etcd",
                        s->etcd, s->etcd_commits, s->etcd_commit_mean_ms);
        }
        if (s->degraded && s->degraded[0])
                fprintf(out, "DEGRADED: %s\n", s->degraded);

        /* The states an operator has to act on, spelled out rather than left in a column. */
        for (size_t i = 0; gpus && i < gpus->n_gpus; i++) {
                const Aqua__GpuInfo *g = gpus->gpus[i];
                _cleanup_free_ char *safe = NULL;

                if (!g->barred && !g->draining && !g->silent)
                        continue;
                /* The label holds the client's name: as harmless here as in the tables. */
                safe = text_printable(format_gpu_label(label, sizeof(label), gpus, g->uuid));
                if (!safe)
                        return -ENOMEM;
                if (g->barred)
                        fprintf(out, "GPU %s missed a reclaim deadline and gets no new leases\n",
                                safe);
                if (g->draining)
                        fprintf(out, "GPU %s is draining\n", safe);
                if (g->silent)
                        fprintf(out,
                                "GPU %s is silent (it has not re-registered since aquad "
                                "restarted, or it is a remote client aquad cannot hear); its "
                                "leases are kept while its process may run ('aquactl release' "
                                "once it is gone)\n",
                                safe);
        }
        return ferror(out) ? -EIO : 0;
}

/* Whether any GPU names its host (libaqua's clients do): then tables show hosts. */
static bool any_host(const Aqua__AdminReply *gpus)
{
        for (size_t i = 0; gpus && i < gpus->n_gpus; i++)
                if (gpus->gpus[i]->host && *gpus->gpus[i]->host)
                        return true;
        return false;
}

static int format_gpus(FILE *out, const Aqua__AdminReply *data)
{
        static const char *const headers[] = {
            "GPU",      "UUID",    "ROLE", "CLIENT",   "USER", "TENANT", "PID",   "LOAD",
            "CAPACITY", "OFFERED", "LENT", "BORROWED", "DRAM", "PAIRED", "STATE"};
        /* With GPUs that name their host (libaqua does), a HOST column after the uuid. */
        static const char *const host_headers[] = {
            "GPU",  "UUID",     "HOST",    "ROLE", "CLIENT",   "USER", "TENANT", "PID",
            "LOAD", "CAPACITY", "OFFERED", "LENT", "BORROWED", "DRAM", "PAIRED", "STATE"};
        bool hosts = any_host(data);
        _cleanup_(table_freep) struct table *t =
            hosts ? table_new(host_headers, ARRAY_SIZE(host_headers))
                  : table_new(headers, ARRAY_SIZE(headers));

        if (!t)
                return -ENOMEM;
        for (size_t c = 6; c <= 12; c++)
                table_align_right(t, c + hosts);
        for (size_t i = 0; i < data->n_gpus; i++) {
                const Aqua__GpuInfo *g = data->gpus[i];
                char ord[16], uuid[16], role[32], pid[16], load[16], cap[CELL_MAX], off[CELL_MAX],
                    lent[CELL_MAX], bor[CELL_MAX], dram[CELL_MAX], paired[LABEL_MAX];
                bool online = g->client_id != 0;

                snprintf(ord, sizeof(ord), "%" PRIu32, g->ordinal);
                snprintf(uuid, sizeof(uuid), "%.12s", g->uuid);
                snprintf(pid, sizeof(pid), "%" PRIu32, g->pid);
                snprintf(load, sizeof(load), "%.0f%%", g->load * 100.0);
                /* Only the paired GPU's ordinal: its client is on its own row. */
                const Aqua__GpuInfo *p = find_gpu(data, g->paired_with);
                if (p)
                        snprintf(paired, sizeof(paired), "%" PRIu32, p->ordinal);
                else
                        format_gpu_label(paired, sizeof(paired), NULL, g->paired_with);
                const char *row[] = {
                    ord,
                    uuid,
                    *g->host ? g->host : "-",
                    format_enum(&aqua__role__descriptor, g->role, role, sizeof(role)),
                    online && *g->client_name ? g->client_name : "-",
                    *g->user ? g->user : "-",
                    *g->tenant ? g->tenant : "-",
                    online && g->pid ? pid : "-",
                    online ? load : "-",
                    size_cell(cap, sizeof(cap), g->capacity),
                    size_cell(off, sizeof(off), g->offered_bytes),
                    size_cell(lent, sizeof(lent), g->lent_bytes),
                    size_cell(bor, sizeof(bor), g->borrowed_bytes),
                    size_cell(dram, sizeof(dram), g->dram_bytes),
                    paired,
                    gpu_state(g),
                };
                /* Without hosts the row is the same less its third cell. */
                if (!hosts)
                        memmove(&row[2], &row[3], sizeof(row) - 3 * sizeof(row[0]));
                if (table_add_row(t, row) < 0)
                        return -ENOMEM;
        }
        return print_table(out, t, "no GPUs registered");
}

static int format_pairs(FILE *out, const Aqua__AdminReply *data, const Aqua__AdminReply *gpus)
{
        static const char *const headers[] = {"PRODUCER", "CONSUMER", "SOURCE", "BANDWIDTH"};
        /* Where GPUs name their hosts, each side's host after it: a pair may cross hosts. */
        static const char *const host_headers[] = {"PRODUCER", "HOST",   "CONSUMER",
                                                   "HOST",     "SOURCE", "BANDWIDTH"};
        bool hosts = any_host(gpus);
        _cleanup_(table_freep) struct table *t =
            hosts ? table_new(host_headers, ARRAY_SIZE(host_headers))
                  : table_new(headers, ARRAY_SIZE(headers));
        int r;

        if (!t)
                return -ENOMEM;
        table_align_right(t, hosts ? 5 : 3);
        for (size_t i = 0; i < data->n_pairs; i++) {
                const Aqua__PairInfo *p = data->pairs[i];
                if (*p->refused)
                        continue;
                const Aqua__GpuInfo *gp = find_gpu(gpus, p->producer_uuid);
                const Aqua__GpuInfo *gc = find_gpu(gpus, p->consumer_uuid);
                char prod[LABEL_MAX], cons[LABEL_MAX], bw[32];

                if (p->bandwidth_gbps > 0)
                        snprintf(bw, sizeof(bw), "%.0f GB/s", p->bandwidth_gbps);
                const char *row[] = {
                    format_gpu_label(prod, sizeof(prod), gpus, p->producer_uuid),
                    gp && *gp->host ? gp->host : "-",
                    format_gpu_label(cons, sizeof(cons), gpus, p->consumer_uuid),
                    gc && *gc->host ? gc->host : "-",
                    *p->source ? p->source : "-",
                    p->bandwidth_gbps > 0 ? bw : "-",
                };
                /* Without hosts, the row less its second and fourth cells. */
                if (!hosts) {
                        row[1] = row[2];
                        memmove(&row[2], &row[4], 2 * sizeof(row[0]));
                }
                if (table_add_row(t, row) < 0)
                        return -ENOMEM;
        }
        r = print_table(out, t, "no pairs");
        /* Pins that cannot stand: their consumers stay unpaired until an operator changes them. */
        for (size_t i = 0; r == 0 && i < data->n_pairs; i++) {
                const Aqua__PairInfo *p = data->pairs[i];
                char prod[LABEL_MAX], cons[LABEL_MAX];
                _cleanup_free_ char *line = NULL, *safe = NULL;

                if (!*p->refused)
                        continue;
                if (asprintf(&line, "refused pin %s -> %s (%s): %s",
                             format_gpu_label(prod, sizeof(prod), gpus, p->producer_uuid),
                             format_gpu_label(cons, sizeof(cons), gpus, p->consumer_uuid),
                             *p->source ? p->source : "-", p->refused) < 0 ||
                    !(safe = text_printable(line)))
                        return -ENOMEM;
                fprintf(out, "%s\n", safe);
        }
        return r < 0 ? r : ferror(out) ? -EIO : 0;
}

static bool lease_active(const Aqua__LeaseInfo *l)
{
        return strcmp(l->state, "returned") != 0 && strcmp(l->state, "lost") != 0;
}

/* Per consumer: what it borrowed, from whom (by its live leases), and its DRAM fallback. */
static int format_consumers(FILE *out, const Aqua__AdminReply *data, const Aqua__AdminReply *gpus)
{
        static const char *const headers[] = {"CONSUMER", "BORROWED", "FROM", "DRAM FALLBACK",
                                              "STATE"};
        _cleanup_(table_freep) struct table *t = table_new(headers, ARRAY_SIZE(headers));

        if (!t)
                return -ENOMEM;
        table_align_right(t, 1);
        table_align_right(t, 3);
        for (size_t i = 0; gpus && i < gpus->n_gpus; i++) {
                const Aqua__GpuInfo *g = gpus->gpus[i];
                char cons[LABEL_MAX], bor[CELL_MAX], dram[CELL_MAX], from[256] = "";
                size_t used = 0;

                if (g->role != AQUA__ROLE__ROLE_CONSUMER)
                        continue;
                for (size_t j = 0; j < data->n_leases; j++) {
                        const Aqua__LeaseInfo *l = data->leases[j];
                        char prod[LABEL_MAX];
                        bool seen = false;

                        if (strcmp(l->consumer_uuid, g->uuid) != 0 || !lease_active(l))
                                continue;
                        for (size_t k = 0; k < j && !seen; k++)
                                seen =
                                    lease_active(data->leases[k]) &&
                                    strcmp(data->leases[k]->consumer_uuid, g->uuid) == 0 &&
                                    strcmp(data->leases[k]->producer_uuid, l->producer_uuid) == 0;
                        if (seen)
                                continue;
                        format_gpu_label(prod, sizeof(prod), gpus, l->producer_uuid);
                        int n = snprintf(from + used, sizeof(from) - used, "%s%s", used ? ", " : "",
                                         prod);
                        if (n > 0)
                                used = MIN(used + (size_t)n, sizeof(from) - 1);
                }
                const char *row[] = {
                    format_gpu_label(cons, sizeof(cons), gpus, g->uuid),
                    size_cell(bor, sizeof(bor), g->borrowed_bytes),
                    used ? from : "-",
                    size_cell(dram, sizeof(dram), g->dram_bytes),
                    gpu_state(g),
                };
                if (table_add_row(t, row) < 0)
                        return -ENOMEM;
        }
        if (table_rows(t) == 0)
                return 0;
        fputc('\n', out);
        return table_print(t, out);
}

static int format_leases(FILE *out, const Aqua__AdminReply *data, const Aqua__AdminReply *gpus)
{
        static const char *const headers[] = {"LEASE", "CONSUMER", "USER",   "PRODUCER", "USER",
                                              "STATE", "SIZE",     "CHUNKS", "AGE",      "DEADLINE"};
        _cleanup_(table_freep) struct table *t = table_new(headers, ARRAY_SIZE(headers));
        int r;

        if (!t)
                return -ENOMEM;
        table_align_right(t, 0);
        for (size_t c = 6; c <= 9; c++)
                table_align_right(t, c);
        for (size_t i = 0; i < data->n_leases; i++) {
                const Aqua__LeaseInfo *l = data->leases[i];
                const Aqua__GpuInfo *gc = find_gpu(gpus, l->consumer_uuid);
                const Aqua__GpuInfo *gp = find_gpu(gpus, l->producer_uuid);
                char id[24], cons[LABEL_MAX], prod[LABEL_MAX], size[CELL_MAX], chunks[16],
                    age[CELL_MAX], deadline[CELL_MAX] = "-";

                snprintf(id, sizeof(id), "%" PRIu64, l->lease_id);
                snprintf(chunks, sizeof(chunks), "%" PRIu32, l->chunks);
                if (strcmp(l->state, "reclaiming") == 0) {
                        char d[CELL_MAX];

                        /* No deadline at all (its producer is gone: moving off at its own
                         * pace) stays "-". */
                        if (l->overdue)
                                snprintf(deadline, sizeof(deadline), "overdue");
                        else if (l->deadline_ms > 0)
                                snprintf(
                                    deadline, sizeof(deadline), "in %s",
                                    format_duration(d, sizeof(d), l->deadline_ms * NSEC_PER_MSEC));
                        else if (l->notice_pending)
                                snprintf(deadline, sizeof(deadline), "not yet told");
                }
                const char *row[] = {
                    id,
                    format_gpu_label(cons, sizeof(cons), gpus, l->consumer_uuid),
                    gc && *gc->user ? gc->user : "-",
                    format_gpu_label(prod, sizeof(prod), gpus, l->producer_uuid),
                    gp && *gp->user ? gp->user : "-",
                    l->state,
                    format_size(size, sizeof(size), l->bytes),
                    chunks,
                    format_age(age, sizeof(age), l->age_ms),
                    deadline,
                };
                if (table_add_row(t, row) < 0)
                        return -ENOMEM;
        }
        r = print_table(out, t, "no leases");
        if (r < 0)
                return r;
        r = format_consumers(out, data, gpus);
        if (r < 0)
                return r;
        return ferror(out) ? -EIO : 0;
}

static int format_chunks(FILE *out, const Aqua__AdminReply *data, const Aqua__AdminReply *gpus)
{
        static const char *const headers[] = {"CHUNK", "PRODUCER", "SIZE", "STATE", "LEASE"};
        _cleanup_(table_freep) struct table *t = table_new(headers, ARRAY_SIZE(headers));
        /* Totals by state, in the order a chunk passes through them (aquad's ChunkInfo.state). */
        static const char *const states[] = {"free",  "leased",    "reclaiming", "returned",
                                             "dirty", "scrubbing", "quarantined"};
        uint64_t bytes[ARRAY_SIZE(states) + 1] = {0};
        size_t count[ARRAY_SIZE(states) + 1] = {0};
        int r;

        if (!t)
                return -ENOMEM;
        table_align_right(t, 0);
        table_align_right(t, 2);
        table_align_right(t, 4);
        for (size_t i = 0; i < data->n_chunks; i++) {
                const Aqua__ChunkInfo *c = data->chunks[i];
                char id[24], prod[LABEL_MAX], size[CELL_MAX], lease[24];
                size_t s = 0;

                while (s < ARRAY_SIZE(states) && strcmp(states[s], c->state) != 0)
                        s++;
                count[s]++;
                bytes[s] += c->size;
                snprintf(id, sizeof(id), "%" PRIu64, c->chunk_id);
                snprintf(lease, sizeof(lease), "%" PRIu64, c->lease_id);
                const char *row[] = {
                    id,
                    format_gpu_label(prod, sizeof(prod), gpus, c->producer_uuid),
                    format_size(size, sizeof(size), c->size),
                    c->state,
                    c->lease_id ? lease : "-",
                };
                if (table_add_row(t, row) < 0)
                        return -ENOMEM;
        }
        r = print_table(out, t, "no chunks in the pool");
        if (r < 0 || data->n_chunks == 0)
                return r;
        fprintf(out, "%zu chunks", data->n_chunks);
        for (size_t s = 0; s <= ARRAY_SIZE(states); s++) {
                char size[CELL_MAX];

                if (count[s])
                        fprintf(out, ", %zu %s (%s)", count[s],
                                s < ARRAY_SIZE(states) ? states[s] : "other",
                                format_size(size, sizeof(size), bytes[s]));
        }
        fputc('\n', out);
        return ferror(out) ? -EIO : 0;
}

static int format_events(FILE *out, const Aqua__AdminReply *data)
{
        static const char *const headers[] = {"TIME", "KIND", "WHAT"};
        _cleanup_(table_freep) struct table *t = table_new(headers, ARRAY_SIZE(headers));

        if (!t)
                return -ENOMEM;
        for (size_t i = 0; i < data->n_events; i++) {
                const Aqua__EventInfo *e = data->events[i];
                time_t sec = (time_t)(e->time_ms / MSEC_PER_SEC);
                char when[32] = "-";
                struct tm tm;

                if (localtime_r(&sec, &tm))
                        strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
                const char *row[] = {when, e->kind, e->text};
                if (table_add_row(t, row) < 0)
                        return -ENOMEM;
        }
        return print_table(out, t, "no events");
}

int format_view(FILE *out, enum view v, const Aqua__AdminReply *data, const Aqua__AdminReply *gpus)
{
        switch (v) {
        case VIEW_STATUS:
                return format_status(out, data, gpus);
        case VIEW_GPUS:
                return format_gpus(out, data);
        case VIEW_PAIRS:
                return format_pairs(out, data, gpus);
        case VIEW_LEASES:
                return format_leases(out, data, gpus);
        case VIEW_CHUNKS:
                return format_chunks(out, data, gpus);
        case VIEW_EVENTS:
                return format_events(out, data);
        default:
                return -EINVAL;
        }
}
