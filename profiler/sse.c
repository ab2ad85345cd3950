/* Splitting a server-sent event stream into payloads, and reading OpenAI-style chunks with json-c. */
#include "sse.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static int line_append(struct sse *s, const char *p, size_t n)
{
        if (s->len + n + 1 > SSE_MAX_LINE)
                return -E2BIG;
        if (s->len + n + 1 > s->cap) {
                size_t cap = MAX(s->cap * 2, s->len + n + 1);
                char *d = realloc(s->line, cap);
                if (!d)
                        return -ENOMEM;
                s->line = d;
                s->cap = cap;
        }
        memcpy(s->line + s->len, p, n);
        s->len += n;
        s->line[s->len] = 0;
        return 0;
}

int sse_feed(struct sse *s, const char *data, size_t len,
             int (*on_data)(const char *payload, void *userdata), void *userdata)
{
        for (size_t i = 0; i < len;) {
                const char *nl = memchr(data + i, '\n', len - i);
                size_t n = nl ? (size_t)(nl - (data + i)) : len - i;
                int r;

                r = line_append(s, data + i, n);
                if (r < 0)
                        return r;
                i += n;
                if (!nl)
                        break;
                i++;
                if (s->len > 0 && s->line[s->len - 1] == '\r')
                        s->line[--s->len] = 0;
                /* Only data lines matter; comments, "event:" and blank separators do not. */
                if (s->len >= 5 && memcmp(s->line, "data:", 5) == 0) {
                        /* The payload ends at the first NUL a hostile stream may carry. */
                        r = on_data(s->line + 5 + strspn(s->line + 5, " "), userdata);
                        if (r < 0)
                                return r;
                }
                s->len = 0;
        }
        return 0;
}

void sse_done(struct sse *s)
{
        free(s->line);
        *s = (struct sse){0};
}

static bool nonempty_string(json_object *o, const char *key)
{
        json_object *v;

        return o && json_object_object_get_ex(o, key, &v) &&
               json_object_is_type(v, json_type_string) && json_object_get_string_len(v) > 0;
}

int sse_event_parse(const char *payload, int api, struct sse_event *ret)
{
        struct sse_event ev = {0};
        json_object *root, *choices, *c0, *field, *v;

        if (strcmp(payload, "[DONE]") == 0) {
                *ret = (struct sse_event){.done = true};
                return 0;
        }
        root = json_tokener_parse(payload);
        if (!root)
                return -EBADMSG;
        if (json_object_object_get_ex(root, "error", &field)) {
                ev.error = strdup(json_object_to_json_string_ext(field, JSON_C_TO_STRING_PLAIN));
                if (!ev.error) {
                        json_object_put(root);
                        return -ENOMEM;
                }
        }
        if (json_object_object_get_ex(root, "choices", &choices) &&
            json_object_is_type(choices, json_type_array) &&
            json_object_array_length(choices) > 0) {
                c0 = json_object_array_get_idx(choices, 0);
                if (json_object_is_type(c0, json_type_object)) {
                        if (api == SSE_API_CHAT)
                                ev.token = json_object_object_get_ex(c0, "delta", &field) &&
                                           json_object_is_type(field, json_type_object) &&
                                           nonempty_string(field, "content");
                        else
                                ev.token = nonempty_string(c0, "text");
                }
        }
        if (json_object_object_get_ex(root, "usage", &field) &&
            json_object_is_type(field, json_type_object) &&
            json_object_object_get_ex(field, "prompt_tokens", &v) &&
            json_object_is_type(v, json_type_int) && json_object_get_int64(v) > 0)
                ev.prompt_tokens = json_object_get_int64(v);
        json_object_put(root);
        *ret = ev;
        return 0;
}
