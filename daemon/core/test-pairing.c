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
        struct pairing_link links[] = {{0, 1, 50}, {0, 2, 300}};
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
        struct pairing_link links[] = {{0, 3, 400}, {0, 1, 100}, {2, 3, 100}};
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
                        links[k++] = (struct pairing_link){a, b, 450};
        cr_assert_eq(pairing_compute(roles, 8, links, k, NULL, 0, NULL, 0, &out, &n), 0);
        cr_assert_eq(n, 4);
        assert_one_to_one(out, n);
        free(out);
}

Test(pairing, keeps_pinned_pairs_even_without_a_link)
{
        enum pairing_role roles[] = {P, C, P, C};
        struct pairing_link links[] = {{0, 3, 400}, {2, 3, 10}};
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
        struct pairing_link links[] = {{0, 1, 10}, {0, 2, 400}};
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
        struct pairing_link links[] = {{0, 1, 100}, {0, 2, 100}};
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
