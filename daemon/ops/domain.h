/*
 * aquad in a domain (config domain:): leader election through an etcd lease. Instances campaign
 * for the election key /aqua/NAME/leader; the one that creates it leads and serves, the others
 * wait, bound to nothing, until the key is gone (its lease expired or was revoked). The leader
 * keeps its lease alive from the loop; the journal's every commit is fenced by the key's create
 * revision and lease (journal_open_etcd()). A leader that cannot renew its lease within its TTL
 * stops serving: another may lead by then.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "journal.h"

struct domain;
struct etcd;

int domain_new(const struct config_domain *c, const char *endpoint, struct domain **ret);
struct domain *domain_free(struct domain *d);
DEFINE_TRIVIAL_CLEANUP_FUNC(struct domain *, domain_free);

/* Wait until this instance leads (0), logging who leads meanwhile; stop is checked between
 * tries (a signal handler's flag). */
int domain_campaign(struct domain *d, volatile const bool *stop);

/* The store and the fence for journal_open_etcd(). */
struct etcd *domain_etcd(struct domain *d);
const char *domain_journal_prefix(const struct domain *d);
struct journal_fence domain_fence(const struct domain *d);

/* When domain_tick() wants to run next (CLOCK_MONOTONIC ns). */
uint64_t domain_deadline(const struct domain *d);
/* Renew the lease when due: 0, or -ESTALE once this instance may no longer lead (etcd says its
 * lease is gone, or its TTL passed with no renewal), with why in domain_lost(). */
int domain_tick(struct domain *d, uint64_t now);
const char *domain_lost(const struct domain *d);
/* Give up the lead at a clean stop, so that another need not wait for the TTL. */
void domain_resign(struct domain *d);

struct domain_view {
        const char *name, *advertise;
        const char *etcd_error; /* "" when the last call succeeded */
        int64_t term;           /* the election key's create revision */
        bool leader;
        uint64_t commits;
        double commit_seconds; /* summed */
};
void domain_view(const struct domain *d, struct domain_view *ret);
/* A journal commit through etcd took this long. */
void domain_count_commit(struct domain *d, uint64_t ns);
