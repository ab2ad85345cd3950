/* Pairing: one-to-one, only over links, pinned pairs kept, as many GPUs paired as possible. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>

#include "pairing.h"

#define P PAIRING_PRODUCER
#define C PAIRING_CONSUMER
#define O PAIRING_OTHER

static size_t mate_of(const struct pairing_pair *pairs, size_t n, size_t producer)
{
        for (size_t i = 0; i < n; i++)
                if (pairs[i].producer == producer)
                        return pairs[i].consumer;
        return SIZE_MAX;
}

static void assert_one_to_one(const struct pairing_pair *pairs, size_t n)
{
        for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j < i; j++) {
                        cr_assert_neq(pairs[i].producer, pairs[j].producer);
                        cr_assert_neq(pairs[i].consumer, pairs[j].consumer);
                }
}

Test(pairing, pairs_only_gpus_with_a_peer_link)
{
        enum pairing_role roles[] = {P, C, C};
        struct pairing_link links[] = {{.a = 0, .b = 2, .bandwidth = 100}};
        struct pairing_pair *out = NULL;
        size_t n = 0;

        cr_assert_eq(pairing_compute(roles, 3, links, 1, NULL, 0, NULL, 0, &out, &n), 0);
        cr_assert_eq(n, 1);
        cr_assert_eq(mate_of(out, n, 0), 2);
        free(out);
}

Test(pairing, prefers_the_faster_link)
{
        enum pairing_role roles[] = {P, C, C};
        struct pairing_link links[] = {{0, 1, 50, false}, {0, 2, 300, false}};
        struct pairing_pair *out = NULL;
        size_t n = 0;

        cr_assert_eq(pairing_compute(roles, 3, links, 2, NULL, 0, NULL, 0, &out, &n), 0);
        cr_assert_eq(n, 1);
        cr_assert_eq(mate_of(out, n, 0), 2);
        free(out);
}

Test(pairing, finds_the_maximum_matching_where_greedy_would_not)
{
        /* Greedy on the fast link 0-3 would leave producer 2 alone; the matching pairs both. */
        enum pairing_role roles[] = {P, C, P, C};
        struct pairing_link links[] = {{0, 3, 400, false}, {0, 1, 100, false}, {2, 3, 100, false}};
        struct pairing_pair *out = NULL;
        size_t n = 0;

        cr_assert_eq(pairing_compute(roles, 4, links, 3, NULL, 0, NULL, 0, &out, &n), 0);
        cr_assert_eq(n, 2);
        assert_one_to_one(out, n);
        cr_assert_eq(mate_of(out, n, 0), 1);
        cr_assert_eq(mate_of(out, n, 2), 3);
        free(out);
}

Test(pairing, balances_an_eight_gpu_all_to_all_domain)
{
        enum pairing_role roles[8] = {P, P, P, P, C, C, C, C};
        struct pairing_link links[28];
        struct pairing_pair *out = NULL;
        size_t n = 0, k = 0;

        for (size_t a = 0; a < 8; a++)
                for (size_t b = a + 1; b < 8; b++)
                        links[k++] = (struct pairing_link){a, b, 450, false};
        cr_assert_eq(pairing_compute(roles, 8, links, k, NULL, 0, NULL, 0, &out, &n), 0);
        cr_assert_eq(n, 4);
        assert_one_to_one(out, n);
        free(out);
}

Test(pairing, keeps_pinned_pairs_even_without_a_link)
{
        enum pairing_role roles[] = {P, C, P, C};
        struct pairing_link links[] = {{0, 3, 400, false}, {2, 3, 10, false}};
        struct pairing_pair pinned[] = {{.producer = 0, .consumer = 1}};
        struct pairing_pair *out = NULL;
        size_t n = 0;

        cr_assert_eq(pairing_compute(roles, 4, links, 2, pinned, 1, NULL, 0, &out, &n), 0);
        cr_assert_eq(n, 2);
        cr_assert_eq(mate_of(out, n, 0), 1);
        cr_assert_eq(mate_of(out, n, 2), 3);
        free(out);
}

Test(pairing, keeps_current_pairs_over_faster_new_links)
{
        enum pairing_role roles[] = {P, C, C};
        struct pairing_link links[] = {{0, 1, 10, false}, {0, 2, 400, false}};
        struct pairing_pair current[] = {{0, 1}};
        struct pairing_pair *out = NULL;
        size_t n = 0;

        cr_assert_eq(pairing_compute(roles, 3, links, 2, NULL, 0, current, 1, &out, &n), 0);
        cr_assert_eq(n, 1);
        cr_assert_eq(mate_of(out, n, 0), 1);
        free(out);
}

Test(pairing, never_pairs_neutral_gpus_or_two_producers)
{
        enum pairing_role roles[] = {P, P, O};
        struct pairing_link links[] = {{0, 1, 100, false}, {0, 2, 100, false}};
        struct pairing_pair *out = NULL;
        size_t n = 0;

        cr_assert_eq(pairing_compute(roles, 3, links, 2, NULL, 0, NULL, 0, &out, &n), 0);
        cr_assert_eq(n, 0);
        free(out);
}

Test(pairing, rejects_a_pinned_pair_of_the_wrong_roles)
{
        enum pairing_role roles[] = {C, P};
        struct pairing_pair pinned[] = {{.producer = 0, .consumer = 1}};
        struct pairing_pair *out = NULL;
        size_t n = 0;

        cr_assert_eq(pairing_compute(roles, 2, NULL, 0, pinned, 1, NULL, 0, &out, &n), -EINVAL);
}

/* Hosts: links marked cross_host join GPUs on two different known hosts of one NVLink domain. */
#define X true

/* Pair, check that exactly n_pairs came out one to one, and return producer's consumer. */
static size_t mate_after(const enum pairing_role *roles, size_t n_nodes,
                         const struct pairing_link *links, size_t n_links,
                         const struct pairing_pair *pinned, size_t n_pinned,
                         const struct pairing_pair *current, size_t n_current, size_t n_pairs,
                         size_t producer)
{
        struct pairing_pair *out = NULL;
        size_t n = 0, mate;

        cr_assert_eq(pairing_compute(roles, n_nodes, links, n_links, pinned, n_pinned, current,
                                     n_current, &out, &n),
                     0);
        cr_assert_eq(n, n_pairs);
        assert_one_to_one(out, n);
        mate = mate_of(out, n, producer);
        free(out);
        return mate;
}

Test(pairing, prefers_a_same_host_link_over_a_faster_cross_host_one)
{
        /* Consumer 1 is on the producer's host at 100 GB/s; consumer 2 on another at 900. */
        enum pairing_role roles[] = {P, C, C};
        struct pairing_link links[] = {{0, 2, 900, X}, {0, 1, 100, false}};

        cr_assert_eq(mate_after(roles, 3, links, 2, NULL, 0, NULL, 0, 1, 0), 1);
}

Test(pairing, pairs_across_hosts_when_no_same_host_consumer_is_free)
{
        /* Producers 0 and 2 share a host with consumer 1 only; producer 2 goes over the fabric. */
        enum pairing_role roles[] = {P, C, P, C};
        struct pairing_link links[] = {
            {0, 1, 450, false}, {2, 1, 450, false}, {2, 3, 900, X}, {0, 3, 900, X}};

        cr_assert_eq(mate_after(roles, 4, links, 4, NULL, 0, NULL, 0, 2, 0), 1,
                     "the earlier of two equal same-host links");
        cr_assert_eq(mate_after(roles, 4, links, 4, NULL, 0, NULL, 0, 2, 2), 3);
}

Test(pairing, pairs_more_gpus_over_the_fabric_rather_than_fewer_on_one_host)
{
        /* Same-host 0-1 first would leave producer 2, whose only link is to 1, alone. */
        enum pairing_role roles[] = {P, C, P, C};
        struct pairing_link links[] = {{0, 1, 450, false}, {2, 1, 900, X}, {0, 3, 900, X}};

        cr_assert_eq(mate_after(roles, 4, links, 3, NULL, 0, NULL, 0, 2, 0), 3);
        cr_assert_eq(mate_after(roles, 4, links, 3, NULL, 0, NULL, 0, 2, 2), 1);
}

Test(pairing, breaks_ties_between_cross_host_links_by_bandwidth_then_order)
{
        enum pairing_role roles[] = {P, C, C, C};
        struct pairing_link links[] = {{0, 1, 400, X}, {0, 2, 900, X}, {0, 3, 900, X}};

        cr_assert_eq(mate_after(roles, 4, links, 3, NULL, 0, NULL, 0, 1, 0), 2);
}

Test(pairing, treats_links_of_gpus_with_unknown_hosts_as_today)
{
        /* Neither link is cross-host (a host is not known): bandwidth decides, as without hosts. */
        enum pairing_role roles[] = {P, C, C};
        struct pairing_link links[] = {{0, 1, 100, false}, {0, 2, 300, false}};

        cr_assert_eq(mate_after(roles, 3, links, 2, NULL, 0, NULL, 0, 1, 0), 2);
}

Test(pairing, keeps_current_and_pinned_cross_host_pairs_over_a_new_same_host_link)
{
        /* Moving a pair would reclaim its leases: stability wins over locality. */
        enum pairing_role roles[] = {P, C, C};
        struct pairing_link links[] = {{0, 1, 900, X}, {0, 2, 450, false}};
        struct pairing_pair kept[] = {{0, 1}};

        cr_assert_eq(mate_after(roles, 3, links, 2, NULL, 0, kept, 1, 1, 0), 1, "current");
        cr_assert_eq(mate_after(roles, 3, links, 2, kept, 1, NULL, 0, 1, 0), 1, "pinned");
}

Test(pairing, pairs_a_72_gpu_domain_within_hosts)
{
        /* 18 hosts x 4 GPUs, every pair linked; on each host GPUs 0-1 produce and 2-3 consume. */
        enum pairing_role roles[72];
        struct pairing_link links[72 * 71 / 2];
        size_t k = 0;

        for (size_t i = 0; i < 72; i++)
                roles[i] = i % 4 < 2 ? P : C;
        for (size_t a = 0; a < 72; a++)
                for (size_t b = a + 1; b < 72; b++)
                        links[k++] = (struct pairing_link){a, b, 900, a / 4 != b / 4};
        for (size_t p = 0; p < 72; p += 4)
                for (size_t q = p; q < p + 2; q++)
                        cr_assert_eq(mate_after(roles, 72, links, k, NULL, 0, NULL, 0, 36, q) / 4,
                                     q / 4, "GPU %zu paired off its host", q);
}
