/*
 * The broker's pairs: the pins (the config's, the plan's, an operator's), taken in order of
 * precedence, then the one-to-one matching (pairing.c) over the links registered GPUs report,
 * within the tenants custody allows; aquactl's pair and unpair.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "broker-private.h"
#include "broker.h"
#include "log.h"
#include "pairing.h"
#include "topology.h"

#define E(name) BROKER_E_##name

/* ------------------------------------------------------------------------------ pins */

static int pin_add(struct broker *broker, const char *producer, const char *consumer,
                   const char *source)
{
        struct broker_pin *pins = reallocarray(broker->pins, broker->n_pins + 1, sizeof(*pins));

        if (!pins)
                return -ENOMEM;
        broker->pins = pins;
        pins[broker->n_pins] =
            (struct broker_pin){strdup(producer), strdup(consumer), source, NULL};
        if (!pins[broker->n_pins].producer || !pins[broker->n_pins].consumer) {
                pin_free(&pins[broker->n_pins]);
                return -ENOMEM;
        }
        broker->n_pins++;
        return 0;
}

/* Remove every pin that names uuid on either side; returns how many. */
size_t broker_pins_remove(struct broker *broker, const char *uuid)
{
        size_t k = 0, removed = 0;

        for (size_t i = 0; i < broker->n_pins; i++) {
                if (strcmp(broker->pins[i].producer, uuid) == 0 ||
                    strcmp(broker->pins[i].consumer, uuid) == 0) {
                        pin_free(&broker->pins[i]);
                        removed++;
                        continue;
                }
                broker->pins[k++] = broker->pins[i];
        }
        broker->n_pins = k;
        return removed;
}

int broker_pins_add(struct broker *broker, const char *producer, const char *consumer,
                    const char *source)
{
        if (producer[0])
                broker_pins_remove(broker, producer);
        if (consumer[0])
                broker_pins_remove(broker, consumer);
        return pin_add(broker, producer, consumer, source);
}

int broker_set_config_pins(struct broker *broker, const char *const *producers,
                           const char *const *consumers, size_t n)
{
        int r;

        pins_clear(broker, "config");
        for (size_t i = 0; i < n; i++) {
                /* An operator's pin on either GPU wins over the config. */
                bool taken = false;
                for (size_t k = 0; k < broker->n_pins; k++)
                        if (strcmp(broker->pins[k].producer, producers[i]) == 0 ||
                            strcmp(broker->pins[k].consumer, consumers[i]) == 0 ||
                            strcmp(broker->pins[k].producer, consumers[i]) == 0 ||
                            strcmp(broker->pins[k].consumer, producers[i]) == 0)
                                taken = true;
                if (taken)
                        continue;
                r = pin_add(broker, producers[i], consumers[i], "config");
                if (r < 0)
                        return r;
        }
        return 0;
}

/* ------------------------------------------------------------------------------ pairing */

/*
 * The GPU key names: a registered one before one restored from the journal before one that is
 * gone, where an ordinal (or a device's two roles) names more than one.
 */
static size_t index_of(struct gpu *const *gpus, size_t n, const char *key)
{
        size_t best = SIZE_MAX;
        int best_rank = -1;

        for (size_t i = 0; key[0] && i < n; i++) {
                int rank = gpus[i]->owner ? 2 : gpus[i]->restored ? 1 : 0;
                if (rank > best_rank && gpu_is(gpus[i], key)) {
                        best = i;
                        best_rank = rank;
                }
        }
        return best;
}

/*
 * The order pins are taken in: an operator's, newest first, then the config's and the plan's in
 * their order. A pin naming a GPU that an earlier one named is passed over, however either names
 * it (uuid, ordinal, HOST:ORDINAL), so no GPU is ever in two pins.
 */
static size_t pin_at(const struct broker *broker, size_t k)
{
        size_t n_operator = 0;

        for (size_t i = 0; i < broker->n_pins; i++)
                n_operator += strcmp(broker->pins[i].source, "aquactl") == 0;
        for (size_t i = broker->n_pins, seen = 0; k < n_operator && i-- > 0;)
                if (strcmp(broker->pins[i].source, "aquactl") == 0 && seen++ == k)
                        return i;
        for (size_t i = 0, seen = n_operator; i < broker->n_pins; i++)
                if (strcmp(broker->pins[i].source, "aquactl") != 0 && seen++ == k)
                        return i;
        return SIZE_MAX;
}

/* What a GPU reported for its k-th link, or the operator's topology file where it reported none. */
static double link_bandwidth(const struct broker *broker, const struct gpu *g, size_t k)
{
        if (g->links[k].bandwidth > 0 || !broker->settings.links)
                return g->links[k].bandwidth;
        /* A GPU reports links to the devices its own driver sees: on its own host. */
        return (double)topology_link_by_host(broker->settings.links, g->host, g->device, g->host,
                                             g->links[k].uuid) /
               1e9;
}

/* Registered, or restored from the journal and not yet given up: a GPU that may pair. */
static bool live(const struct gpu *g)
{
        return g->owner || g->restored;
}

/* Both hosts known and different: a link between them crosses the NVLink fabric. */
static bool cross_host(const struct gpu *a, const struct gpu *b)
{
        return a->host && b->host && strcmp(a->host, b->host) != 0;
}

/* A link between a and b may pair them: a producer and a consumer that may borrow from it. */
static bool may_pair(const struct gpu *a, const struct gpu *b)
{
        if (a->role == GPU_ROLE_PRODUCER && b->role == GPU_ROLE_CONSUMER)
                return custody_may_lend(a, b, NULL, 0);
        if (b->role == GPU_ROLE_PRODUCER && a->role == GPU_ROLE_CONSUMER)
                return custody_may_lend(b, a, NULL, 0);
        return false;
}

/*
 * Whether pin p of producer a and consumer b may stand. A pin never joins two tenants: one that
 * would keeps its consumer unpaired, says why once (log, event) and shows it in `aquactl pairs`.
 */
static bool pin_trusted(struct broker *broker, struct broker_pin *p, const struct gpu *a,
                        const struct gpu *b)
{
        char why[BROKER_ERR_MAX];

        if (custody_may_lend(a, b, why, sizeof(why))) {
                free(p->refused);
                p->refused = NULL;
                return true;
        }
        if (p->refused && strcmp(p->refused, why) == 0)
                return false;
        free(p->refused);
        p->refused = strdup(why);
        log_warning("Pin %s -> %s (%s) refused: %s", p->producer, p->consumer, p->source, why);
        events_add(&broker->events, "pair", "pin %s %s refused: %s", p->producer, p->consumer, why);
        return false;
}

int broker_recompute_pairs(struct broker *broker)
{
        _cleanup_free_ struct gpu **gpus = NULL;
        _cleanup_free_ enum pairing_role *roles = NULL;
        _cleanup_free_ struct pairing_link *links = NULL;
        _cleanup_free_ struct pairing_pair *pinned = NULL, *current = NULL, *out = NULL;
        _cleanup_free_ const char **source = NULL;
        _cleanup_free_ struct gpu **mate = NULL;
        _cleanup_free_ double *bw = NULL;
        _cleanup_free_ bool *pinned_gpu = NULL;
        size_t n = 0, n_links = 0, n_pinned = 0, n_current = 0, n_out = 0, max_links = 0;
        int r;

        for (struct list_node *x = broker->gpus.next; x != &broker->gpus; x = x->next)
                max_links += list_entry(x, struct gpu, node)->n_links;
        gpus = calloc(broker->n_gpus + 1, sizeof(*gpus));
        roles = calloc(broker->n_gpus + 1, sizeof(*roles));
        mate = calloc(broker->n_gpus + 1, sizeof(*mate));
        source = calloc(broker->n_gpus + 1, sizeof(*source));
        bw = calloc(broker->n_gpus + 1, sizeof(*bw));
        pinned_gpu = calloc(broker->n_gpus + 1, sizeof(*pinned_gpu));
        /*
         * A reported link may name a device's two registrations; a device's two are linked;
         * with a topology file, any two GPUs on different hosts may be (no client reports those).
         */
        links = calloc(2 * max_links + broker->n_gpus + 1 +
                           (broker->settings.links ? broker->n_gpus * (broker->n_gpus + 1) / 2 : 0),
                       sizeof(*links));
        pinned = calloc(broker->n_pins + 1, sizeof(*pinned));
        current = calloc(broker->n_gpus + 1, sizeof(*current));
        if (!gpus || !roles || !mate || !source || !bw || !pinned_gpu || !links || !pinned ||
            !current)
                return -ENOMEM;

        for (struct list_node *x = broker->gpus.next; x != &broker->gpus; x = x->next)
                gpus[n++] = list_entry(x, struct gpu, node);
        for (size_t i = 0; i < n; i++) {
                struct gpu *g = gpus[i];
                roles[i] = !live(g)                       ? PAIRING_OTHER
                           : g->role == GPU_ROLE_PRODUCER ? PAIRING_PRODUCER
                           : g->role == GPU_ROLE_CONSUMER ? PAIRING_CONSUMER
                                                          : PAIRING_OTHER;
        }
        for (size_t k = 0; k < broker->n_pins; k++) {
                struct broker_pin *p = &broker->pins[pin_at(broker, k)];
                size_t a = index_of(gpus, n, p->producer), b = index_of(gpus, n, p->consumer);

                if ((a != SIZE_MAX && pinned_gpu[a]) || (b != SIZE_MAX && pinned_gpu[b])) {
                        free(p->refused); /* not refused: given way to a pin taken first */
                        p->refused = NULL;
                        continue;
                }
                /*
                 * A pinned GPU pairs with its pin's other side or with nobody: while that one is
                 * not here (not registered, not restored from the journal), it waits unpaired,
                 * so that the plan's pairs never lend to a stranger only to reclaim at once when
                 * the planned GPU comes. A pin with one side empty keeps its GPU unpaired.
                 */
                if (a != SIZE_MAX) {
                        pinned_gpu[a] = true;
                        roles[a] = PAIRING_OTHER;
                }
                if (b != SIZE_MAX) {
                        pinned_gpu[b] = true;
                        roles[b] = PAIRING_OTHER;
                }
                if (a == SIZE_MAX || b == SIZE_MAX || !live(gpus[a]) || !live(gpus[b]) ||
                    gpus[a]->role != GPU_ROLE_PRODUCER || gpus[b]->role != GPU_ROLE_CONSUMER)
                        continue;
                if (!pin_trusted(broker, p, gpus[a], gpus[b]))
                        continue; /* kept apart, both, while the pin stands */
                roles[a] = PAIRING_PRODUCER;
                roles[b] = PAIRING_CONSUMER;
                pinned[n_pinned++] = (struct pairing_pair){a, b};
                source[a] = source[b] = p->source;
        }
        for (size_t i = 0; broker->settings.auto_pairing && i < n; i++) {
                if (!gpus[i]->owner)
                        continue;
                /* A device may have a registration per role: link to each of them. */
                for (size_t k = 0; k < gpus[i]->n_links; k++)
                        for (size_t j = 0; j < n; j++) {
                                if (j == i || !gpus[j]->owner ||
                                    !gpu_is(gpus[j], gpus[i]->links[k].uuid) ||
                                    !may_pair(gpus[i], gpus[j]))
                                        continue;
                                links[n_links++] =
                                    (struct pairing_link){i, j, link_bandwidth(broker, gpus[i], k),
                                                          cross_host(gpus[i], gpus[j])};
                        }
                for (size_t j = i + 1; j < n; j++) {
                        uint64_t bytes;

                        if (!gpus[j]->owner || !may_pair(gpus[i], gpus[j]))
                                continue;
                        /* The two roles of one device: no link is faster than its own memory. */
                        if (strcmp(gpus[i]->device, gpus[j]->device) == 0 &&
                            !cross_host(gpus[i], gpus[j])) {
                                links[n_links++] = (struct pairing_link){i, j, HUGE_VAL, false};
                                continue;
                        }
                        if (!broker->settings.links || !cross_host(gpus[i], gpus[j]))
                                continue;
                        bytes =
                            topology_link_by_host(broker->settings.links, gpus[i]->host,
                                                  gpus[i]->device, gpus[j]->host, gpus[j]->device);
                        if (bytes > 0)
                                links[n_links++] =
                                    (struct pairing_link){i, j, (double)bytes / 1e9, true};
                }
        }
        for (size_t i = 0; i < n; i++)
                if (roles[i] == PAIRING_PRODUCER && gpus[i]->paired) {
                        size_t j = index_of(gpus, n, gpus[i]->paired->uuid);
                        if (j != SIZE_MAX && roles[j] == PAIRING_CONSUMER)
                                current[n_current++] = (struct pairing_pair){i, j};
                }
        r = pairing_compute(roles, n, links, n_links, pinned, n_pinned, current, n_current, &out,
                            &n_out);
        if (r < 0)
                return r;
        for (size_t k = 0; k < n_out; k++) {
                size_t a = out[k].producer, b = out[k].consumer;
                mate[a] = gpus[b];
                mate[b] = gpus[a];
                for (size_t l = 0; l < n_links; l++)
                        if (((links[l].a == a && links[l].b == b) ||
                             (links[l].a == b && links[l].b == a)) &&
                            !isinf(links[l].bandwidth))
                                bw[a] = bw[b] = MAX(bw[a], links[l].bandwidth);
                if (!source[a])
                        source[a] = source[b] = "auto";
        }
        for (size_t i = 0; i < n; i++) {
                struct gpu *before = gpus[i]->paired;
                gpu_set_pair(broker, gpus[i], mate[i], source[i], bw[i]);
                if (before != mate[i])
                        events_add(&broker->events, "pair", "%s %s %s", gpus[i]->uuid,
                                   mate[i] ? "paired with" : "unpaired",
                                   mate[i] ? mate[i]->uuid : "");
                else if (mate[i]) {
                        gpus[i]->pair_source = source[i];
                        gpus[i]->pair_bandwidth = bw[i];
                }
        }
        /* A producer's consumer may have changed or gone: what the last one left is scrubbed. */
        for (size_t i = 0; i < n; i++)
                scrub_check(broker, gpus[i]);
        return 0;
}

int broker_pin(struct broker *broker, const char *producer, const char *consumer,
               char err[BROKER_ERR_MAX])
{
        struct gpu *a = NULL, *b = NULL;
        int r;

        r = broker_lookup_gpu(broker, producer, "pair", &a, err);
        if (r == 0)
                r = broker_lookup_gpu(broker, consumer, "pair", &b, err);
        if (r != 0)
                return r;
        if (a->role != GPU_ROLE_PRODUCER || b->role != GPU_ROLE_CONSUMER)
                return broker_fail(err, E(WRONG_ROLE),
                                   "pair: %s must be a producer and %s a consumer", a->uuid,
                                   b->uuid);
        r = broker_pins_add(broker, a->uuid, b->uuid, "aquactl");
        if (r < 0)
                return r;
        journal_pin(broker, a->uuid, b->uuid, false);
        return broker_recompute_pairs(broker);
}

int broker_unpin(struct broker *broker, const char *gpu, char err[BROKER_ERR_MAX])
{
        struct gpu *g = NULL;
        int r;

        r = broker_lookup_gpu(broker, gpu, "unpair", &g, err);
        if (r != 0)
                return r;
        /* Pinned to nobody: automatic pairing leaves it alone too. */
        r = broker_pins_add(broker, g->uuid, "", "aquactl");
        if (r < 0)
                return r;
        journal_pin(broker, g->uuid, "", false);
        return broker_recompute_pairs(broker);
}
