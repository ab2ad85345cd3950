/* Envelope encoding, and decoding that enforces size limits before anything is trusted. */
#include "wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static int too_large(char *err, size_t err_len, const char *fmt, const char *field, size_t n,
                     size_t limit)
{
        if (err)
                snprintf(err, err_len, fmt, field, n, limit);
        return WIRE_E_TOO_LARGE;
}

static int check_field(const ProtobufCFieldDescriptor *f, const void *member, size_t count,
                       const struct wire_limits *limits, char *err, size_t err_len)
{
        for (size_t i = 0; i < count; i++) {
                const void *item = f->label == PROTOBUF_C_LABEL_REPEATED
                                           ? (const char *)*(void *const *)member +
                                                     i * (f->type == PROTOBUF_C_TYPE_BYTES
                                                                  ? sizeof(ProtobufCBinaryData)
                                                                  : sizeof(void *))
                                           : member;
                size_t n;
                int r;

                switch (f->type) {
                case PROTOBUF_C_TYPE_STRING: {
                        const char *s = *(const char *const *)item;
                        n = s ? strlen(s) : 0;
                        if (n > limits->max_string)
                                return too_large(err, err_len, "field %s: string of %zu bytes, limit %zu",
                                                 f->name, n, limits->max_string);
                        break;
                }
                case PROTOBUF_C_TYPE_BYTES:
                        n = ((const ProtobufCBinaryData *)item)->len;
                        if (n > limits->max_string)
                                return too_large(err, err_len, "field %s: %zu bytes, limit %zu",
                                                 f->name, n, limits->max_string);
                        break;
                case PROTOBUF_C_TYPE_MESSAGE: {
                        const ProtobufCMessage *sub = *(const ProtobufCMessage *const *)item;
                        /* aqua.proto has no recursive messages, so this recursion is bounded. */
                        if (!sub)
                                break;
                        r = wire_check_limits(sub, limits, err, err_len);
                        if (r != 0)
                                return r;
                        break;
                }
                default:
                        break;
                }
        }
        return 0;
}

int wire_check_limits(const ProtobufCMessage *m, const struct wire_limits *limits, char *err,
                      size_t err_len)
{
        const ProtobufCMessageDescriptor *d = m->descriptor;

        for (unsigned i = 0; i < d->n_fields; i++) {
                const ProtobufCFieldDescriptor *f = &d->fields[i];
                const void *member = (const char *)m + f->offset;
                size_t count = 1;
                int r;

                if (f->label == PROTOBUF_C_LABEL_REPEATED) {
                        count = *(const size_t *)((const char *)m + f->quantifier_offset);
                        if (count > limits->max_repeated)
                                return too_large(err, err_len, "field %s: %zu items, limit %zu",
                                                 f->name, count, limits->max_repeated);
                } else if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
                        /* Only the member the oneof case names is valid memory to look at. */
                        if (*(const uint32_t *)((const char *)m + f->quantifier_offset) != f->id)
                                continue;
                }
                if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_BYTES &&
                    f->type != PROTOBUF_C_TYPE_MESSAGE)
                        continue;
                r = check_field(f, member, count, limits, err, err_len);
                if (r != 0)
                        return r;
        }
        return 0;
}

int wire_decode(const void *buf, size_t len, const struct wire_limits *limits,
                Aqua__Envelope **ret, char *err, size_t err_len)
{
        Aqua__Envelope *e;
        int r;

        if (len > limits->max_message) {
                if (err)
                        snprintf(err, err_len, "message of %zu bytes, limit %zu", len,
                                 limits->max_message);
                return WIRE_E_TOO_LARGE;
        }
        e = aqua__envelope__unpack(NULL, len, buf);
        if (!e) {
                if (err)
                        snprintf(err, err_len, "%zu bytes that do not decode as an aqua Envelope", len);
                return WIRE_E_MALFORMED;
        }
        if (AQUA_PROTOCOL_MAJOR(e->version) != AQUA_PROTOCOL_MAJOR(AQUA_PROTOCOL_VERSION)) {
                if (err)
                        snprintf(err, err_len, "protocol version %u, this side speaks %u",
                                 e->version, AQUA_PROTOCOL_VERSION);
                r = WIRE_E_VERSION;
                goto fail;
        }
        if (e->body_case == AQUA__ENVELOPE__BODY__NOT_SET) {
                if (err)
                        snprintf(err, err_len, "envelope without a body");
                r = WIRE_E_EMPTY;
                goto fail;
        }
        r = wire_check_limits(&e->base, limits, err, err_len);
        if (r != 0)
                goto fail;
        *ret = e;
        return 0;
fail:
        aqua__envelope__free_unpacked(e, NULL);
        return r;
}

int wire_encode(Aqua__Envelope *e, void **ret_buf, size_t *ret_len)
{
        size_t len;
        void *buf;

        e->version = AQUA_PROTOCOL_VERSION;
        len = aqua__envelope__get_packed_size(e);
        buf = malloc(len ? len : 1);
        if (!buf)
                return -ENOMEM;
        aqua__envelope__pack(e, buf);
        *ret_buf = buf;
        *ret_len = len;
        return 0;
}

Aqua__ErrorCode wire_error_code(int outcome)
{
        switch (outcome) {
        case WIRE_E_TOO_LARGE:
                return AQUA__ERROR_CODE__ERROR_CODE_TOO_LARGE;
        case WIRE_E_VERSION:
                return AQUA__ERROR_CODE__ERROR_CODE_VERSION;
        case WIRE_E_MALFORMED:
        case WIRE_E_EMPTY:
                return AQUA__ERROR_CODE__ERROR_CODE_MALFORMED;
        default:
                return AQUA__ERROR_CODE__ERROR_CODE_INTERNAL;
        }
}

const char *wire_body_name(const Aqua__Envelope *e)
{
        const ProtobufCFieldDescriptor *f;

        if (e->body_case == AQUA__ENVELOPE__BODY__NOT_SET)
                return "empty";
        f = protobuf_c_message_descriptor_get_field(&aqua__envelope__descriptor, e->body_case);
        return f ? f->name : "unknown";
}
