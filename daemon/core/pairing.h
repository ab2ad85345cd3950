/*
 * One-to-one pairing of producer GPUs with consumer GPUs over the peer-link topology: a maximum
 * matching that keeps pinned pairs, keeps current pairs where it can, and prefers links within
 * a host, then fast links.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

enum pairing_role {
        PAIRING_PRODUCER,
        PAIRING_CONSUMER,
        PAIRING_OTHER, /* neutral or unknown: never paired automatically */
};

struct pairing_link {
        size_t a, b;      /* node indexes; the link is symmetric */
        double bandwidth; /* GB/s, 0 when unknown */
        bool cross_host;  /* its ends are on two known, different hosts of the NVLink domain */
};

struct pairing_pair {
        size_t producer, consumer; /* node indexes */
};

/*
 * Pair producers with consumers. pinned pairs (from the config or an operator) are kept as they
 * are, link or not; current pairs are kept when their link still exists and neither side is
 * pinned elsewhere; remaining nodes are matched over links within a host first (a link whose
 * ends' hosts are not known counts as one), cross-host links after them, each fastest first,
 * then by augmenting paths so that as many GPUs as possible are paired (which may trade a
 * same-host pair for two cross-host ones). Returns 0 and a malloc'd array (possibly
 * empty, *ret may be NULL) or -EINVAL for an index out of range or a pair of the wrong roles.
 */
int pairing_compute(const enum pairing_role *roles, size_t n_nodes,
                    const struct pairing_link *links, size_t n_links,
                    const struct pairing_pair *pinned, size_t n_pinned,
                    const struct pairing_pair *current, size_t n_current, struct pairing_pair **ret,
                    size_t *ret_n);
