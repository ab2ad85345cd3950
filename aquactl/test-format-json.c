/* --json output parsed back: every field under its proto name, exact 64-bit sizes, enum names. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>

#include "format-json.h"
#include "test-canned.h"

static struct canned c;

static void setup(void)
{
        canned_init(&c);
}

TestSuite(format_json, .init = setup);

/* Print view v and parse the text back; the caller puts the object. */
static struct json_object *roundtrip(enum view v, const Aqua__AdminReply *data,
                                     const Aqua__AdminReply *gpus)
{
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        struct json_object *o;

        cr_assert_not_null(f);
        cr_assert_eq(json_print_view(f, v, data, gpus), 0);
        fclose(f);
        o = json_tokener_parse(buf);
        cr_assert_not_null(o, "not JSON: %s", buf);
        free(buf);
        return o;
}

static struct json_object *get(struct json_object *o, const char *key)
{
        struct json_object *v = NULL;

        cr_assert(json_object_object_get_ex(o, key, &v), "no key %s in %s", key,
                  json_object_to_json_string(o));
        return v;
}

Test(format_json, gpus_keep_every_field_with_exact_sizes)
{
        struct json_object *doc = roundtrip(VIEW_GPUS, &c.gpus, NULL);
        struct json_object *gpus = get(doc, "gpus"), *g0, *g3;

        cr_assert_eq(json_object_array_length(gpus), 4);
        g0 = json_object_array_get_idx(gpus, 0);
        cr_assert_str_eq(json_object_get_string(get(g0, "uuid")), UUID0);
        cr_assert_str_eq(json_object_get_string(get(g0, "role")), "consumer");
        /* 80 GiB does not fit 32 bits; scripts must get it exactly. */
        cr_assert_eq(json_object_get_uint64(get(g0, "capacity")), 80 * GIB);
        cr_assert_eq(json_object_get_uint64(get(g0, "dram_bytes")), 512 * MIB);
        cr_assert_float_eq(json_object_get_double(get(g0, "load")), 0.82, 1e-9);
        cr_assert_str_eq(json_object_get_string(get(g0, "paired_with")), UUID1);
        /* Zeros and false are present, never omitted. */
        g3 = json_object_array_get_idx(gpus, 3);
        cr_assert_eq(json_object_get_uint64(get(g3, "client_id")), 0);
        cr_assert_eq(json_object_get_boolean(get(g3, "barred")), 0);
        cr_assert(json_object_get_boolean(get(json_object_array_get_idx(gpus, 2), "barred")));
        json_object_put(doc);
}

Test(format_json, status_carries_the_status_and_the_gpus)
{
        struct json_object *doc = roundtrip(VIEW_STATUS, &c.status, &c.gpus);
        struct json_object *s = get(doc, "status");

        cr_assert_eq(json_object_get_uint64(get(s, "uptime_ms")), 11525000);
        cr_assert_eq(json_object_get_uint64(get(s, "dram_granted")), 2 * GIB + 512 * MIB);
        cr_assert_eq(json_object_get_uint64(get(s, "leases_lost")), 1);
        cr_assert_eq(json_object_array_length(get(doc, "gpus")), 4);
        json_object_put(doc);
}

Test(format_json, status_without_a_reply_status_is_null)
{
        Aqua__AdminReply empty = AQUA__ADMIN_REPLY__INIT;
        struct json_object *doc = roundtrip(VIEW_STATUS, &empty, NULL);

        cr_assert(json_object_is_type(get(doc, "status"), json_type_null));
        json_object_put(doc);
}

Test(format_json, each_list_view_is_named_after_it_and_says_if_it_was_cut)
{
        const Aqua__AdminReply *data[_VIEW_MAX] = {&c.status, &c.gpus,   &c.pairs,
                                                   &c.leases, &c.chunks, &c.events};
        const size_t n[_VIEW_MAX] = {0, 4, 3, 3, 3, 2}; /* pairs: one refused pin */

        for (int v = VIEW_GPUS; v < _VIEW_MAX; v++) {
                struct json_object *doc = roundtrip(v, data[v], NULL);

                cr_assert_eq(json_object_object_length(doc), 2);
                cr_assert_eq(json_object_array_length(get(doc, view_to_string(v))), n[v]);
                cr_assert_eq(json_object_get_boolean(get(doc, "truncated")), 0);
                json_object_put(doc);
        }
}

Test(format_json, leases_keep_states_ids_and_the_cut)
{
        struct json_object *doc, *l;

        c.leases.truncated = true;
        doc = roundtrip(VIEW_LEASES, &c.leases, &c.gpus);
        cr_assert(json_object_get_boolean(get(doc, "truncated")));
        l = json_object_array_get_idx(get(doc, "leases"), 1);

        cr_assert_eq(json_object_get_uint64(get(l, "lease_id")), 9);
        cr_assert_str_eq(json_object_get_string(get(l, "state")), "reclaiming");
        cr_assert_str_eq(json_object_get_string(get(l, "consumer_uuid")), UUID0);
        cr_assert_eq(json_object_get_uint64(get(l, "deadline_ms")), 1500);
        json_object_put(doc);
}

Test(format_json, an_empty_list_is_an_empty_array)
{
        Aqua__AdminReply empty = AQUA__ADMIN_REPLY__INIT;
        struct json_object *doc = roundtrip(VIEW_LEASES, &empty, NULL);

        cr_assert_eq(json_object_array_length(get(doc, "leases")), 0);
        json_object_put(doc);
}

Test(format_json, messages_show_only_the_set_oneof_member_and_bytes_as_hex)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Hello h = AQUA__HELLO__INIT;
        uint8_t token[3] = {0x00, 0xab, 0xff};
        uint64_t ids[2] = {4, 5};
        Aqua__ReclaimReply rr = AQUA__RECLAIM_REPLY__INIT;
        struct json_object *o;

        h.token = (ProtobufCBinaryData){.len = 3, .data = token};
        h.role = AQUA__ROLE__ROLE_ADMIN;
        e.body_case = AQUA__ENVELOPE__BODY_HELLO;
        e.hello = &h;
        o = json_from_message(&e.base);
        cr_assert_not_null(o);
        cr_assert_eq(json_object_object_length(o), 3, "%s", json_object_to_json_string(o));
        cr_assert_str_eq(json_object_get_string(get(get(o, "hello"), "token")), "00abff");
        cr_assert_str_eq(json_object_get_string(get(get(o, "hello"), "role")), "admin");
        json_object_put(o);

        rr.n_pending_chunk_ids = 2;
        rr.pending_chunk_ids = ids;
        rr.deadline_ms = 2000;
        o = json_from_message(&rr.base);
        cr_assert_eq(json_object_array_length(get(o, "chunk_ids")), 0);
        cr_assert_eq(
            json_object_get_uint64(json_object_array_get_idx(get(o, "pending_chunk_ids"), 1)), 5);
        json_object_put(o);
}

/* A client chooses its name: whatever bytes it sent, scripts get valid JSON and valid UTF-8. */
Test(format_json, invalid_utf8_and_control_characters_still_make_valid_json)
{
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        struct json_tokener *tok = json_tokener_new();
        struct json_object *doc, *g1;

        c.gpu[1].client_name = "wh\x1b[31mis\xff\xfeper\xe2\x82";
        c.gpu[0].client_name = "w\xc3\xbcrfel\xf0\x9f\x90\x8b";
        cr_assert_eq(json_print_view(f, VIEW_GPUS, &c.gpus, NULL), 0);
        fclose(f);
        json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
        doc = json_tokener_parse_ex(tok, buf, (int)len);
        cr_assert_not_null(doc, "not valid JSON (%s): %s",
                           json_tokener_error_desc(json_tokener_get_error(tok)), buf);
        cr_assert_null(strchr(buf, '\x1b'), "%s", buf);
        g1 = json_object_array_get_idx(get(doc, "gpus"), 1);
        /* Each bad byte (and the cut-off sequence) is one U+FFFD; the escape is kept as text. */
        cr_assert_str_eq(json_object_get_string(get(g1, "client_name")),
                         "wh\x1b[31mis\xef\xbf\xbd\xef\xbf\xbdper\xef\xbf\xbd");
        cr_assert_str_eq(json_object_get_string(
                             get(json_object_array_get_idx(get(doc, "gpus"), 0), "client_name")),
                         "w\xc3\xbcrfel\xf0\x9f\x90\x8b");
        json_object_put(doc);
        json_tokener_free(tok);
        free(buf);
}
