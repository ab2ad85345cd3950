/* Human views of canned replies, compared with exactly what an operator should see. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "format.h"
#include "test-canned.h"

static struct canned c;

static void setup(void)
{
        /* Event times print in local time; pin it so the expected text holds anywhere. */
        setenv("TZ", "UTC", 1);
        tzset();
        canned_init(&c);
}

TestSuite(format, .init = setup);

static char *render(enum view v, const Aqua__AdminReply *data, const Aqua__AdminReply *gpus)
{
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);

        cr_assert_not_null(f);
        cr_assert_eq(format_view(f, v, data, gpus), 0);
        fclose(f);
        return buf;
}

Test(format, status_counts_gpus_by_role_and_names_barred_consumers)
{
        _cleanup_free_ char *out = render(VIEW_STATUS, &c.status, &c.gpus);

        cr_assert_str_eq(out,
                         "aquad protocol 1.0, up 3h12m\n"
                         "clients          3\n"
                         "gpus             4: producer 1, consumer 2, neutral 1\n"
                         "pairs            2\n"
                         "leases           2\n"
                         "pool             4 GiB offered, 3 GiB lent\n"
                         "dram fallback    2.50 GiB granted of 64 GiB budget\n"
                         "deadline misses  1\n"
                         "leases lost      1\n"
                         "GPU 2 (vllm-mistral) missed a reclaim deadline and gets no new leases\n");
}

Test(format, status_without_a_gpu_list_shows_only_the_count)
{
        _cleanup_free_ char *out = render(VIEW_STATUS, &c.status, NULL);

        cr_assert(strstr(out, "gpus             4\n"), "%s", out);
}

Test(format, gpus_show_role_client_sizes_pair_and_state)
{
        _cleanup_free_ char *out = render(VIEW_GPUS, &c.gpus, &c.gpus);

        cr_assert_str_eq(
            out,
            "GPU  UUID          ROLE      CLIENT        USER   TENANT      PID  LOAD  CAPACITY  "
            "OFFERED   LENT  BORROWED     DRAM  PAIRED  STATE\n"
            "0    GPU-00000000  consumer  vllm-llama3   alice  team-a     4242   82%    80 GiB  "
            "      -      -     3 GiB  512 MiB  1       ok\n"
            "1    GPU-11111111  producer  whisper       root   user:0     4343   10%    80 GiB  "
            "  4 GiB  3 GiB         -        -  0       ok\n"
            "2    GPU-22222222  consumer  vllm-mistral  bob    user:1002  4444   50%    80 GiB  "
            "      -      -         -    2 GiB  -       barred\n"
            "3    GPU-33333333  neutral   -             -      -             -     -    80 GiB  "
            "      -      -         -        -  -       offline\n");
}

/* GPUs whose clients name their host get a HOST column; one that did not shows "-". */
Test(format, gpus_show_hosts_where_clients_name_them)
{
        c.gpu[0].host = "node-a";
        c.gpu[1].host = "node-b\x1b[31m";
        _cleanup_free_ char *out = render(VIEW_GPUS, &c.gpus, &c.gpus);

        cr_assert(strstr(out, "GPU  UUID          HOST            ROLE      CLIENT"), "%s", out);
        cr_assert(strstr(out, "0    GPU-00000000  node-a          consumer  vllm-llama3"), "%s",
                  out);
        cr_assert(strstr(out, "1    GPU-11111111  node-b\\x1b[31m  producer  whisper"), "%s", out);
        cr_assert(strstr(out, "2    GPU-22222222  -               consumer  vllm-mistral"), "%s",
                  out);
}

Test(format, leases_say_who_holds_what_from_whom_and_dram_per_consumer)
{
        _cleanup_free_ char *out = render(VIEW_LEASES, &c.leases, &c.gpus);

        cr_assert_str_eq(
            out,
            "LEASE  CONSUMER          USER   PRODUCER      USER  STATE        SIZE  CHUNKS    AGE   "
            "DEADLINE\n"
            "    7  0 (vllm-llama3)   alice  1 (whisper)   root  granted     2 GiB    1024  3m12s  "
            "        -\n"
            "    9  0 (vllm-llama3)   alice  1 (whisper)   root  reclaiming  1 GiB     512     5s  "
            "in 1.50 s\n"
            "    3  2 (vllm-mistral)  bob    GPU-deadbeef  -     lost        2 MiB       1  2d03h  "
            "        -\n"
                 "\n"
                 "CONSUMER          BORROWED  FROM         DRAM FALLBACK  STATE\n"
                 "0 (vllm-llama3)      3 GiB  1 (whisper)        512 MiB  ok\n"
                 "2 (vllm-mistral)         -  -                    2 GiB  barred\n");
}

Test(format, a_reclaiming_lease_past_its_deadline_is_overdue)
{
        c.lease[1].deadline_ms = 0;
        c.lease[1].overdue = true;
        _cleanup_free_ char *out = render(VIEW_LEASES, &c.leases, &c.gpus);

        cr_assert(strstr(out, "reclaiming  1 GiB     512     5s   overdue\n"), "%s", out);
}

/* Its notice still waits in aquad's outbox: the deadline has not started, nothing is late. */
Test(format, a_reclaim_whose_notice_waits_is_not_overdue)
{
        c.lease[1].deadline_ms = 0;
        c.lease[1].notice_pending = true;
        _cleanup_free_ char *out = render(VIEW_LEASES, &c.leases, &c.gpus);

        cr_assert(strstr(out, "reclaiming  1 GiB     512     5s  not yet told\n"), "%s", out);
        cr_assert_null(strstr(out, "overdue"), "%s", out);
}

Test(format, pairs_name_gpus_and_fall_back_to_a_short_uuid)
{
        _cleanup_free_ char *out = render(VIEW_PAIRS, &c.pairs, &c.gpus);

        cr_assert_str_eq(out, "PRODUCER      CONSUMER          SOURCE  BANDWIDTH\n"
                              "1 (whisper)   0 (vllm-llama3)   config   450 GB/s\n"
                              "GPU-deadbeef  2 (vllm-mistral)  auto            -\n"
                              "refused pin 3 -> 2 (vllm-mistral) (config): GPU-33333333 lends "
                              "as user:1001 and GPU-22222222 borrows as user:1002: tenants never "
                              "share memory\n");
}

/* A pair may cross hosts of an NVLink domain: each side's host, "-" where it is not known. */
Test(format, pairs_show_each_sides_host_where_gpus_name_them)
{
        c.gpu[0].host = "node-a";
        c.gpu[1].host = "node-b";
        _cleanup_free_ char *out = render(VIEW_PAIRS, &c.pairs, &c.gpus);

        cr_assert_str_eq(out,
                         "PRODUCER      HOST    CONSUMER          HOST    SOURCE  BANDWIDTH\n"
                         "1 (whisper)   node-b  0 (vllm-llama3)   node-a  config   450 GB/s\n"
                         "GPU-deadbeef  -       2 (vllm-mistral)  -       auto            -\n"
                         "refused pin 3 -> 2 (vllm-mistral) (config): GPU-33333333 lends as "
                         "user:1001 and GPU-22222222 borrows as user:1002: tenants never share "
                         "memory\n");
}

Test(format, chunks_end_with_totals_by_state)
{
        _cleanup_free_ char *out = render(VIEW_CHUNKS, &c.chunks, &c.gpus);

        cr_assert_str_eq(out, "CHUNK  PRODUCER      SIZE  STATE       LEASE\n"
                              "    1  1 (whisper)  2 MiB  free            -\n"
                              "    2  1 (whisper)  2 MiB  leased          7\n"
                              "    3  1 (whisper)  2 MiB  reclaiming      9\n"
                              "3 chunks, 1 free (2 MiB), 1 leased (2 MiB), 1 reclaiming (2 MiB)\n");
}

Test(format, chunks_count_dirty_and_scrubbing_chunks_under_their_names)
{
        c.chunk[0].state = "dirty";
        c.chunk[2].state = "scrubbing";
        c.chunk[2].lease_id = 0;
        _cleanup_free_ char *out = render(VIEW_CHUNKS, &c.chunks, &c.gpus);

        cr_assert(strstr(out, "3 chunks, 1 leased (2 MiB), 1 dirty (2 MiB), 1 scrubbing (2 MiB)\n"),
                  "%s", out);
}

Test(format, a_state_it_does_not_know_is_other)
{
        c.chunk[0].state = "haunted";
        _cleanup_free_ char *out = render(VIEW_CHUNKS, &c.chunks, &c.gpus);

        cr_assert(strstr(out, ", 1 other (2 MiB)\n"), "%s", out);
}

/* A client chooses its name: escapes in it must not reach the operator's terminal. */
Test(format, tables_show_control_characters_and_bad_utf8_as_escapes)
{
        c.gpu[1].client_name = "wh\x1b[31mis\xff\xfeper\r";
        c.event[0].text = "client \x1b]0;owned\x07 registered";
        _cleanup_free_ char *gpus = render(VIEW_GPUS, &c.gpus, &c.gpus);
        _cleanup_free_ char *pairs = render(VIEW_PAIRS, &c.pairs, &c.gpus);
        _cleanup_free_ char *status = render(VIEW_STATUS, &c.status, &c.gpus);
        _cleanup_free_ char *events = render(VIEW_EVENTS, &c.events, NULL);

        cr_assert(strstr(gpus, "wh\\x1b[31mis\\xff\\xfeper\\x0d  "), "%s", gpus);
        cr_assert(strstr(pairs, "1 (wh\\x1b[31mis\\xff\\xfeper\\x0d)"), "%s", pairs);
        cr_assert(strstr(events, "client \\x1b]0;owned\\x07 registered"), "%s", events);
        for (const char *s = gpus; *s; s++)
                cr_assert(*s != '\x1b' && *s != '\r' && (unsigned char)*s < 0x80, "%s", gpus);
        for (const char *s = events; *s; s++)
                cr_assert(*s != '\x1b' && *s != '\x07', "%s", events);
        cr_assert_null(strchr(status, '\x1b'));
}

/* Valid UTF-8 is the operator's own language and stays as it is. */
Test(format, tables_keep_valid_utf8)
{
        c.gpu[1].client_name = "w\xc3\xbcrfel";
        _cleanup_free_ char *out = render(VIEW_PAIRS, &c.pairs, &c.gpus);

        cr_assert(strstr(out, "1 (w\xc3\xbcrfel)"), "%s", out);
}

Test(format, events_show_wall_clock_time)
{
        _cleanup_free_ char *out = render(VIEW_EVENTS, &c.events, NULL);

        cr_assert_str_eq(out,
                         "TIME                 KIND           WHAT\n"
                         "2026-11-30 00:53:20  lease          lease 7: 2 GiB from GPU 1 to GPU 0\n"
                         "2026-11-30 00:54:21  deadline-miss  GPU 2 missed the reclaim deadline of "
                         "lease 3\n");
}

Test(format, empty_lists_say_so_in_words)
{
        Aqua__AdminReply empty = AQUA__ADMIN_REPLY__INIT;
        static const struct {
                enum view v;
                const char *text;
        } cases[] = {
            {VIEW_GPUS, "no GPUs registered\n"}, {VIEW_PAIRS, "no pairs\n"},
            {VIEW_LEASES, "no leases\n"},        {VIEW_CHUNKS, "no chunks in the pool\n"},
            {VIEW_EVENTS, "no events\n"},
        };

        for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
                _cleanup_free_ char *out = render(cases[i].v, &empty, NULL);

                cr_assert_str_eq(out, cases[i].text);
        }
}

Test(format, gpu_labels_prefer_ordinal_and_client)
{
        char buf[96];

        cr_assert_str_eq(format_gpu_label(buf, sizeof(buf), &c.gpus, UUID1), "1 (whisper)");
        cr_assert_str_eq(format_gpu_label(buf, sizeof(buf), &c.gpus, UUID3), "3");
        cr_assert_str_eq(format_gpu_label(buf, sizeof(buf), &c.gpus, UUID_GONE), "GPU-deadbeef");
        cr_assert_str_eq(format_gpu_label(buf, sizeof(buf), NULL, UUID1), "GPU-11111111");
        cr_assert_str_eq(format_gpu_label(buf, sizeof(buf), &c.gpus, ""), "-");
}

Test(format, ages_read_in_the_two_largest_units)
{
        char buf[32];

        cr_assert_str_eq(format_age(buf, sizeof(buf), 999), "0s");
        cr_assert_str_eq(format_age(buf, sizeof(buf), 59999), "59s");
        cr_assert_str_eq(format_age(buf, sizeof(buf), 60000), "1m00s");
        cr_assert_str_eq(format_age(buf, sizeof(buf), 3599000), "59m59s");
        cr_assert_str_eq(format_age(buf, sizeof(buf), 3600000), "1h00m");
        cr_assert_str_eq(format_age(buf, sizeof(buf), 86400000 + 7200000), "1d02h");
}

Test(format, enum_names_lose_their_prefix)
{
        char buf[32];

        cr_assert_str_eq(
            format_enum(&aqua__role__descriptor, AQUA__ROLE__ROLE_PRODUCER, buf, sizeof(buf)),
            "producer");
        cr_assert_str_eq(format_enum(&aqua__error_code__descriptor,
                                     AQUA__ERROR_CODE__ERROR_CODE_UNKNOWN_GPU, buf, sizeof(buf)),
                         "unknown-gpu");
        cr_assert_str_eq(format_enum(&aqua__role__descriptor, 99, buf, sizeof(buf)), "99");
}

Test(format, view_names_round_trip)
{
        for (int v = 0; v < _VIEW_MAX; v++)
                cr_assert_eq(view_from_string(view_to_string(v)), v);
        cr_assert_eq(view_from_string("leasez"), _VIEW_INVALID);
        cr_assert_eq(view_query(VIEW_CHUNKS), AQUA__ADMIN_QUERY__WHAT__WHAT_CHUNKS);
}

/* Custody by identity, item 8: two silent GPUs restored as ordinal 0 on two hosts are named
 * apart; one whose ordinal nobody recorded is named by its uuid, never as "GPU 0". */
Test(format, gpus_that_share_an_ordinal_are_named_apart_in_status)
{
        c.gpu[0].host = "node-a";
        c.gpu[2].host = "node-b";
        c.gpu[2].ordinal = 0;
        c.gpu[0].silent = c.gpu[2].silent = true;
        c.gpu[3].ordinal_unknown = true;
        c.gpu[3].silent = true;
        _cleanup_free_ char *out = render(VIEW_STATUS, &c.status, &c.gpus);

        cr_assert(strstr(out, "GPU node-a:0 (vllm-llama3) is silent"), "%s", out);
        cr_assert(strstr(out, "GPU node-b:0 (vllm-mistral) is silent"), "%s", out);
        cr_assert_null(strstr(out, "GPU 0 "), "%s", out);
        cr_assert_null(strstr(out, "GPU 3 "), "an ordinal nobody recorded is not shown: %s", out);
}
