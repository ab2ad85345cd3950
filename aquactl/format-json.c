/* Protobuf messages to JSON by walking their descriptors, so new proto fields appear by themselves.
 */
#include "format-json.h"

#include <errno.h>
#include <json-c/json.h>
#include <string.h>

#include "text.h"

DEFINE_TRIVIAL_CLEANUP_FUNC(struct json_object *, json_object_put);

static struct json_object *json_from_scalar(const ProtobufCFieldDescriptor *f, const void *v)
{
        char buf[64];

        switch (f->type) {
        case PROTOBUF_C_TYPE_INT32:
        case PROTOBUF_C_TYPE_SINT32:
        case PROTOBUF_C_TYPE_SFIXED32:
                return json_object_new_int64(*(const int32_t *)v);
        case PROTOBUF_C_TYPE_UINT32:
        case PROTOBUF_C_TYPE_FIXED32:
                return json_object_new_int64(*(const uint32_t *)v);
        case PROTOBUF_C_TYPE_INT64:
        case PROTOBUF_C_TYPE_SINT64:
        case PROTOBUF_C_TYPE_SFIXED64:
                return json_object_new_int64(*(const int64_t *)v);
        case PROTOBUF_C_TYPE_UINT64:
        case PROTOBUF_C_TYPE_FIXED64:
                return json_object_new_uint64(*(const uint64_t *)v);
        case PROTOBUF_C_TYPE_FLOAT:
                return json_object_new_double(*(const float *)v);
        case PROTOBUF_C_TYPE_DOUBLE:
                return json_object_new_double(*(const double *)v);
        case PROTOBUF_C_TYPE_BOOL:
                return json_object_new_boolean(*(const protobuf_c_boolean *)v);
        case PROTOBUF_C_TYPE_ENUM:
                return json_object_new_string(
                    format_enum(f->descriptor, *(const int *)v, buf, sizeof(buf)));
        case PROTOBUF_C_TYPE_STRING: {
                /* json-c escapes control characters but passes any bytes on: a name a client
                 * chose must not make the document unparseable. */
                const char *s = *(const char *const *)v;
                _cleanup_free_ char *valid = text_utf8_valid(s ? s : "");

                return valid ? json_object_new_string(valid) : NULL;
        }
        case PROTOBUF_C_TYPE_BYTES: {
                const ProtobufCBinaryData *b = v;
                _cleanup_free_ char *hex = malloc(b->len * 2 + 1);

                if (!hex)
                        return NULL;
                for (size_t i = 0; i < b->len; i++)
                        snprintf(hex + 2 * i, 3, "%02x", b->data[i]);
                hex[b->len * 2] = '\0';
                return json_object_new_string(hex);
        }
        default:
                return NULL;
        }
}

/*
 * One value into *ret. json-c spells JSON null as a NULL object, so an absent sub-message
 * (null: an empty object would be ambiguous) is told apart from running out of memory here.
 */
static int json_from_value(const ProtobufCFieldDescriptor *f, const void *v,
                           struct json_object **ret)
{
        if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
                const ProtobufCMessage *sub = *(const ProtobufCMessage *const *)v;

                *ret = NULL;
                if (sub && !(*ret = json_from_message(sub)))
                        return -ENOMEM;
                return 0;
        }
        *ret = json_from_scalar(f, v);
        return *ret ? 0 : -ENOMEM;
}

static size_t value_size(const ProtobufCFieldDescriptor *f)
{
        switch (f->type) {
        case PROTOBUF_C_TYPE_INT64:
        case PROTOBUF_C_TYPE_SINT64:
        case PROTOBUF_C_TYPE_SFIXED64:
        case PROTOBUF_C_TYPE_UINT64:
        case PROTOBUF_C_TYPE_FIXED64:
                return 8;
        case PROTOBUF_C_TYPE_DOUBLE:
                return sizeof(double);
        case PROTOBUF_C_TYPE_BOOL:
                return sizeof(protobuf_c_boolean);
        case PROTOBUF_C_TYPE_STRING:
        case PROTOBUF_C_TYPE_MESSAGE:
                return sizeof(void *);
        case PROTOBUF_C_TYPE_BYTES:
                return sizeof(ProtobufCBinaryData);
        default:
                return 4;
        }
}

/* One field's JSON value into *ret: an array for a repeated field. */
static int json_from_field(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f,
                           struct json_object **ret)
{
        const char *member = (const char *)m + f->offset;
        _cleanup_(json_object_putp) struct json_object *v = NULL;
        const char *items;
        size_t n;

        if (f->label != PROTOBUF_C_LABEL_REPEATED)
                return json_from_value(f, member, ret);
        n = *(const size_t *)((const char *)m + f->quantifier_offset);
        items = *(const char *const *)member;
        v = json_object_new_array_ext((int)MIN(n, (size_t)INT32_MAX));
        if (!v)
                return -ENOMEM;
        for (size_t k = 0; k < n; k++) {
                struct json_object *item;

                if (json_from_value(f, items + k * value_size(f), &item) < 0)
                        return -ENOMEM;
                if (json_object_array_add(v, item) < 0) {
                        json_object_put(item);
                        return -ENOMEM;
                }
        }
        *ret = TAKE_PTR(v);
        return 0;
}

/* Add m's field f to o under its proto name. */
static int add_field(struct json_object *o, const ProtobufCMessage *m,
                     const ProtobufCFieldDescriptor *f)
{
        struct json_object *v;

        if (json_from_field(m, f, &v) < 0)
                return -ENOMEM;
        if (json_object_object_add(o, f->name, v) < 0) {
                json_object_put(v);
                return -ENOMEM;
        }
        return 0;
}

struct json_object *json_from_message(const ProtobufCMessage *m)
{
        const ProtobufCMessageDescriptor *d = m->descriptor;
        _cleanup_(json_object_putp) struct json_object *o = json_object_new_object();

        if (!o)
                return NULL;
        for (unsigned i = 0; i < d->n_fields; i++) {
                const ProtobufCFieldDescriptor *f = &d->fields[i];

                /* Of a oneof, only the member its case names is valid memory. */
                if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF &&
                    *(const uint32_t *)((const char *)m + f->quantifier_offset) != f->id)
                        continue;
                if (add_field(o, m, f) < 0)
                        return NULL;
        }
        return TAKE_PTR(o);
}

static int print_object(FILE *out, struct json_object *o)
{
        const char *s = json_object_to_json_string_ext(
            o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE);

        if (!s)
                return -ENOMEM;
        fprintf(out, "%s\n", s);
        return ferror(out) ? -EIO : 0;
}

/* Add reply's field `name` to doc under the same key (nothing when reply is NULL). */
static int add_reply_field(struct json_object *doc, const Aqua__AdminReply *reply, const char *name)
{
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field_by_name(&aqua__admin_reply__descriptor, name);

        if (!f)
                return -EINVAL;
        return reply ? add_field(doc, &reply->base, f) : 0;
}

int json_print_view(FILE *out, enum view v, const Aqua__AdminReply *data,
                    const Aqua__AdminReply *gpus)
{
        _cleanup_(json_object_putp) struct json_object *doc = json_object_new_object();
        int r;

        if (!doc)
                return -ENOMEM;
        if (v == VIEW_STATUS) {
                r = add_reply_field(doc, data, "status");
                if (r == 0)
                        r = add_reply_field(doc, gpus, "gpus");
        } else {
                const char *name = view_to_string(v);

                r = name ? add_reply_field(doc, data, name) : -EINVAL;
                /* Whether aquad cut the list at its limits: scripts must not take a part for
                 * the whole. */
                if (r == 0)
                        r = add_reply_field(doc, data, "truncated");
        }
        if (r < 0)
                return r;
        return print_object(out, doc);
}

int json_print_message(FILE *out, const ProtobufCMessage *m)
{
        _cleanup_(json_object_putp) struct json_object *o = json_from_message(m);

        if (!o)
                return -ENOMEM;
        return print_object(out, o);
}
