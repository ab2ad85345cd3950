/*
 * The pool as the code outside the core sees it: values for aquactl's queries, the metrics and a
 * Grant's chunk list, and the few things it tells the core (a load report, new settings, who
 * observes reclaims). Nothing outside the core walks or writes the core's lists and objects.
 */
#include <string.h>

#include "broker-private.h"
#include "broker.h"

static const char *or_empty(const char *s)
{
        return s ? s : "";
}

const char *broker_gpu_uuid(const struct gpu *g)
{
        return g->uuid;
}

enum gpu_role broker_gpu_role(const struct gpu *g)
{
        return g->role;
}

struct client *broker_gpu_owner(const struct gpu *g)
{
        return g->owner;
}

const char *broker_gpu_paired_device(const struct gpu *g)
{
        return g->paired ? g->paired->device : "";
}

uint64_t broker_gpu_dram_bytes(const struct gpu *g)
{
        return g->dram_bytes;
}

size_t broker_gpu_leases(const struct gpu *g)
{
        return list_length(&g->leases);
}

void broker_counts(const struct broker *broker, struct broker_counts *ret)
{
        *ret = (struct broker_counts){
            .gpus = broker->n_gpus,
            .leases = broker->n_leases,
            .chunks = broker->n_chunks,
            .pool_bytes = broker->pool_bytes,
            .lent_bytes = broker->lent_bytes,
            .dram_granted = broker->dram_granted,
            .deadline_misses = broker->stats.deadline_misses,
            .journal_error = broker->journal_error,
            .compact_error = broker->compact_error,
            .next_deadline_ns = broker->next_deadline_ns,
            .uncommitted = broker->n_ops,
        };
}

const struct broker_settings *broker_settings_in_force(const struct broker *broker)
{
        return &broker->settings;
}

struct events *broker_events(struct broker *broker)
{
        return &broker->events;
}

struct journal *broker_journal(struct broker *broker)
{
        return broker->journal;
}

void broker_totals(const struct broker *broker, struct broker_totals *ret)
{
        *ret = (struct broker_totals){
            .gpus = broker->n_gpus,
            .leases = broker->n_leases,
            .chunks = broker->n_chunks,
            .pool_bytes = broker->pool_bytes,
            .lent_bytes = broker->lent_bytes,
            .dram_budget = broker->settings.dram_budget,
            .dram_granted = broker->dram_granted,
            .chunks_quarantined = broker->n_quarantined,
            .degraded = broker->journal_error || broker->compact_error,
            .stats = broker->stats,
        };
        for (const struct list_node *x = broker->gpus.next; x != &broker->gpus; x = x->next) {
                const struct gpu *g = list_entry(x, struct gpu, node);

                if (g->role < _GPU_ROLE_MAX)
                        ret->gpus_by_role[g->role]++;
                ret->pairs += g->paired && g->role == GPU_ROLE_PRODUCER;
                ret->pins = broker->n_pins;
                ret->gpus_silent += g->silent;
                for (const struct list_node *k = g->chunks.next; k != &g->chunks; k = k->next) {
                        const struct chunk *c = list_entry(k, struct chunk, producer_node);

                        if (c->state < _CHUNK_STATE_MAX) {
                                ret->chunks_by_state[c->state]++;
                                ret->chunk_bytes_by_state[c->state] += c->size;
                        }
                }
        }
        for (const struct list_node *x = broker->leases.next; x != &broker->leases; x = x->next) {
                const struct lease *l = list_entry(x, struct lease, broker_node);

                if (l->state < _LEASE_STATE_MAX)
                        ret->leases_by_state[l->state]++;
        }
}

size_t broker_view_gpus(const struct broker *broker, struct broker_gpu_view *out, size_t max)
{
        size_t n = 0;

        for (const struct list_node *x = broker->gpus.next; x != &broker->gpus && n < max;
             x = x->next, n++) {
                const struct gpu *g = list_entry(x, struct gpu, node);

                out[n] = (struct broker_gpu_view){
                    .uuid = g->uuid,
                    .ordinal = g->ordinal,
                    .ordinal_known = g->ordinal_known,
                    .role = g->role,
                    .capacity = g->capacity,
                    .owner = g->owner,
                    .client_name = or_empty(g->client_name),
                    .host = or_empty(g->host),
                    .pid = g->pid,
                    .paired_with = g->paired ? g->paired->uuid : "",
                    .pair_source = g->pair_source ? g->pair_source : "auto",
                    .pair_bandwidth = g->pair_bandwidth,
                    .offered_bytes = g->offered_bytes,
                    .lent_bytes = g->lent_bytes,
                    .borrowed_bytes = g->borrowed_bytes,
                    .dram_bytes = g->dram_bytes,
                    .barred = g->barred,
                    .draining = g->draining,
                    .silent = g->silent,
                    .reported = g->reported,
                    .reclaim_returned_chunks = g->reclaim_returned_chunks,
                    .reclaim_returned_bytes = g->reclaim_returned_bytes,
                    .held = g->custody.held &&
                            (g->custody.who.remote || g->custody.who.uid != CUSTODY_UID_UNKNOWN),
                    .remote = g->custody.who.remote,
                    .lends_to_all = g->custody.who.lends_to_all,
                    .uid = g->custody.who.uid,
                    .key = g->custody.who.key,
                };
                gpu_tenant(g, out[n].tenant, sizeof(out[n].tenant));
        }
        return n;
}

size_t broker_view_refused_pins(const struct broker *broker, struct broker_refused_pin *out,
                                size_t max)
{
        size_t n = 0;

        for (size_t k = 0; k < broker->n_pins && n < max; k++)
                if (broker->pins[k].refused)
                        out[n++] = (struct broker_refused_pin){
                            broker->pins[k].producer, broker->pins[k].consumer,
                            broker->pins[k].source, broker->pins[k].refused};
        return n;
}

size_t broker_view_leases(const struct broker *broker, uint64_t now_ns,
                          struct broker_lease_view *out, size_t max)
{
        size_t n = 0;

        for (const struct list_node *x = broker->leases.next; x != &broker->leases && n < max;
             x = x->next, n++) {
                const struct lease *l = list_entry(x, struct lease, broker_node);
                uint64_t deadline = 0;
                bool pending = false;

                for (const struct list_node *k = l->chunks.next; k != &l->chunks; k = k->next) {
                        const struct chunk *c = list_entry(k, struct chunk, lease_node);

                        if (c->deadline_ns && (!deadline || c->deadline_ns < deadline))
                                deadline = c->deadline_ns;
                        pending |= c->state == CHUNK_RECLAIMING && c->deadline_pending;
                }
                out[n] = (struct broker_lease_view){
                    .id = l->id,
                    .producer_uuid = l->producer->uuid,
                    .consumer_uuid = l->consumer->uuid,
                    .state = l->state,
                    .bytes = l->bytes,
                    .chunks = l->n_chunks,
                    .age_ms = (now_ns - l->created_ns) / 1000000,
                    .deadline_ms = deadline > now_ns ? (deadline - now_ns) / 1000000 : 0,
                    .notice_pending = pending && !deadline,
                    .overdue = l->overdue || (deadline && deadline <= now_ns),
                };
        }
        return n;
}

static const char *chunk_condition(const struct chunk *c)
{
        if (c->state != CHUNK_FREE)
                return chunk_state_to_string(c->state);
        return c->quarantined ? "quarantined"
               : c->scrubbing ? "scrubbing"
               : c->dirty     ? "dirty"
                              : "free";
}

size_t broker_view_chunks(const struct broker *broker, struct broker_chunk_view *out, size_t max)
{
        size_t n = 0;

        for (const struct list_node *x = broker->gpus.next; x != &broker->gpus; x = x->next) {
                const struct gpu *g = list_entry(x, struct gpu, node);

                for (const struct list_node *k = g->chunks.next; k != &g->chunks && n < max;
                     k = k->next, n++) {
                        const struct chunk *c = list_entry(k, struct chunk, producer_node);

                        out[n] = (struct broker_chunk_view){
                            .id = c->id,
                            .producer_uuid = g->uuid,
                            .size = c->size,
                            .condition = chunk_condition(c),
                            .lease_id = c->lease ? c->lease->id : 0,
                        };
                }
        }
        return n;
}

size_t broker_grant_chunks(const struct broker_grant *grant, struct broker_granted_chunk *out,
                           size_t max)
{
        size_t n = 0;

        if (!grant->lease)
                return 0;
        for (const struct list_node *k = grant->lease->chunks.next;
             k != &grant->lease->chunks && n < max; k = k->next, n++) {
                const struct chunk *c = list_entry(k, struct chunk, lease_node);

                out[n] = (struct broker_granted_chunk){
                    .id = c->id,
                    .size = c->size,
                    .producer_uuid = c->producer->uuid,
                    .fabric = c->fabric,
                    .fd = c->fd,
                };
        }
        return n;
}

size_t broker_grant_size(const struct broker_grant *grant)
{
        return grant->lease ? grant->lease->n_chunks : 0;
}

uint64_t broker_grant_lease_id(const struct broker_grant *grant)
{
        return grant->lease ? grant->lease->id : 0;
}

void broker_report_load(struct broker *broker, struct gpu *g, const struct broker_load *load)
{
        (void)broker;
        g->reported = *load;
}

void broker_set_settings(struct broker *broker, const struct broker_settings *settings,
                         uint64_t compact_threshold)
{
        broker->settings = *settings;
        broker->compact_threshold = compact_threshold;
}

void broker_observe_reclaims(struct broker *broker, broker_reclaimed_fn fn, void *userdata)
{
        broker->on_reclaimed = fn;
        broker->on_reclaimed_userdata = userdata;
}

void broker_unobserve_reclaims(struct broker *broker, void *userdata)
{
        if (broker->on_reclaimed_userdata != userdata)
                return;
        broker->on_reclaimed = NULL;
        broker->on_reclaimed_userdata = NULL;
}
