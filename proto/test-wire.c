/* Envelope encoding and the limits decoding enforces. */
#include <criterion/criterion.h>
#include <string.h>

#include "util.h"
#include "wire.h"

static const struct wire_limits limits = {.max_message = 4096, .max_repeated = 8, .max_string = 64};

static void *encode_borrow(size_t *len)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Borrow b = AQUA__BORROW__INIT;
        void *buf;

        b.bytes = 3ull << 30;
        b.min_bytes = 1ull << 30;
        e.request_id = 42;
        e.body_case = AQUA__ENVELOPE__BODY_BORROW;
        e.borrow = &b;
        cr_assert_eq(wire_encode(&e, &buf, len), 0);
        return buf;
}

Test(wire, round_trips_an_envelope_with_its_version)
{
        _cleanup_free_ void *buf = NULL;
        Aqua__Envelope *e = NULL;
        size_t len;

        buf = encode_borrow(&len);
        cr_assert_eq(wire_decode(buf, len, &limits, &e, NULL, 0), 0);
        cr_assert_eq(e->version, AQUA_PROTOCOL_VERSION);
        cr_assert_eq(e->request_id, 42);
        cr_assert_eq(e->body_case, AQUA__ENVELOPE__BODY_BORROW);
        cr_assert_eq(e->borrow->bytes, 3ull << 30);
        cr_assert_str_eq(wire_body_name(e), "borrow");
        aqua__envelope__free_unpacked(e, NULL);
}

Test(wire, refuses_a_message_over_the_size_limit_before_decoding)
{
        static uint8_t big[8192];
        Aqua__Envelope *e = NULL;
        char err[128];

        cr_assert_eq(wire_decode(big, sizeof(big), &limits, &e, err, sizeof(err)), WIRE_E_TOO_LARGE);
        cr_assert_str_eq(err, "message of 8192 bytes, limit 4096");
        cr_assert_null(e);
}

Test(wire, refuses_garbage_as_malformed)
{
        const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x01};
        Aqua__Envelope *e = NULL;
        char err[128];

        cr_assert_eq(wire_decode(junk, sizeof(junk), &limits, &e, err, sizeof(err)), WIRE_E_MALFORMED);
        cr_assert_str_eq(err, "6 bytes that do not decode as an aqua Envelope");
        cr_assert_eq(wire_error_code(WIRE_E_MALFORMED), AQUA__ERROR_CODE__ERROR_CODE_MALFORMED);
}

Test(wire, refuses_too_many_repeated_items_naming_the_field)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Offer o = AQUA__OFFER__INIT;
        Aqua__ChunkOffer chunks[9], *ptrs[9];
        _cleanup_free_ void *buf = NULL;
        Aqua__Envelope *out = NULL;
        char err[128];
        size_t len;

        for (int i = 0; i < 9; i++) {
                aqua__chunk_offer__init(&chunks[i]);
                chunks[i].size = 2u << 20;
                ptrs[i] = &chunks[i];
        }
        o.n_chunks = 9;
        o.chunks = ptrs;
        e.body_case = AQUA__ENVELOPE__BODY_OFFER;
        e.offer = &o;
        cr_assert_eq(wire_encode(&e, &buf, &len), 0);
        cr_assert_eq(wire_decode(buf, len, &limits, &out, err, sizeof(err)), WIRE_E_TOO_LARGE);
        cr_assert_str_eq(err, "field chunks: 9 items, limit 8");
}

Test(wire, refuses_a_long_string_in_a_nested_message)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        Aqua__Hello h = AQUA__HELLO__INIT;
        char name[100];
        _cleanup_free_ void *buf = NULL;
        Aqua__Envelope *out = NULL;
        char err[128];
        size_t len;

        memset(name, 'x', sizeof(name) - 1);
        name[sizeof(name) - 1] = '\0';
        h.client_name = name;
        e.body_case = AQUA__ENVELOPE__BODY_HELLO;
        e.hello = &h;
        cr_assert_eq(wire_encode(&e, &buf, &len), 0);
        cr_assert_eq(wire_decode(buf, len, &limits, &out, err, sizeof(err)), WIRE_E_TOO_LARGE);
        cr_assert_str_eq(err, "field client_name: string of 99 bytes, limit 64");
}

Test(wire, refuses_another_major_version)
{
        _cleanup_free_ void *buf = NULL;
        Aqua__Envelope *e = NULL;
        size_t len;
        char err[128];

        buf = encode_borrow(&len);
        /* version is field 1, a varint right at the start: 100 -> 200. */
        cr_assert_eq(((uint8_t *)buf)[0], 0x08);
        ((uint8_t *)buf)[1] = 200;
        cr_assert_eq(wire_decode(buf, len, &limits, &e, err, sizeof(err)), WIRE_E_MALFORMED,
                     "200 needs two varint bytes, so this byte alone is malformed");
        ((uint8_t *)buf)[1] = 0x7f; /* 127: major 1 still */
        cr_assert_eq(wire_decode(buf, len, &limits, &e, err, sizeof(err)), 0);
        aqua__envelope__free_unpacked(e, NULL);
        ((uint8_t *)buf)[1] = 0x05; /* 5: major 0 */
        cr_assert_eq(wire_decode(buf, len, &limits, &e, err, sizeof(err)), WIRE_E_VERSION);
        cr_assert_str_eq(err, "protocol version 5, this side speaks 100");
}

Test(wire, refuses_an_envelope_without_a_body)
{
        Aqua__Envelope e = AQUA__ENVELOPE__INIT;
        _cleanup_free_ void *buf = NULL;
        Aqua__Envelope *out = NULL;
        size_t len;
        char err[128];

        cr_assert_eq(wire_encode(&e, &buf, &len), 0);
        cr_assert_eq(wire_decode(buf, len, &limits, &out, err, sizeof(err)), WIRE_E_EMPTY);
        cr_assert_str_eq(err, "envelope without a body");
}
