/* Splitting a server-sent event stream into events, and reading OpenAI-style chunks with json-c. */
#include "sse.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static int grow(char **p, size_t *cap, size_t need)
{
        if (need > SSE_MAX_LINE)
                return -E2BIG;
        if (need > *cap) {
                size_t c = MAX(*cap * 2, need);
                char *d = realloc(*p, c);
                if (!d)
                        return -ENOMEM;
                *p = d;
                *cap = c;
        }
        return 0;
}

/* Whether the event's data so far is a whole payload: [DONE] or one complete JSON value. */
static bool data_complete(const struct sse *s)
{
        json_tokener *tok;
        json_object *o;
        bool whole;

        if (strcmp(s->data, "[DONE]") == 0)
                return true;
        tok = json_tokener_new();
        if (!tok)
                return false;
        o = json_tokener_parse_ex(tok, s->data, (int)s->dlen);
        whole = o && json_tokener_get_error(tok) == json_tokener_success &&
                json_tokener_get_parse_end(tok) == s->dlen;
        json_object_put(o);
        json_tokener_free(tok);
        return whole;
}

static int dispatch(struct sse *s, int (*on_event)(const char *, const char *, void *),
                    void *userdata)
{
        int r = 0;

        if (s->has_data)
                r = on_event(s->type, s->data, userdata);
        s->has_data = false;
        s->dlen = 0;
        s->type[0] = 0;
        return r;
}

/* One complete line, in s->line. */
static int take_line(struct sse *s, int (*on_event)(const char *, const char *, void *),
                     void *userdata)
{
        const char *value;
        size_t n, vlen;
        int r;

        if (s->len == 0)
                return dispatch(s, on_event, userdata);
        if (s->line[0] == ':')
                return 0; /* a comment: keep-alive pings */
        value = memchr(s->line, ':', s->len);
        n = value ? (size_t)(value - s->line) : s->len;
        if (value) {
                value++;
                if (*value == ' ')
                        value++;
        } else
                value = s->line + s->len;
        vlen = (size_t)(s->line + s->len - value);
        if (n == 4 && memcmp(s->line, "data", 4) == 0) {
                if (s->has_data && data_complete(s)) {
                        r = dispatch(s, on_event, userdata);
                        if (r < 0)
                                return r;
                }
                r = grow(&s->data, &s->dcap, s->dlen + (s->has_data ? 1 : 0) + vlen + 1);
                if (r < 0)
                        return r;
                if (s->has_data)
                        s->data[s->dlen++] = '\n';
                memcpy(s->data + s->dlen, value, vlen);
                s->dlen += vlen;
                s->data[s->dlen] = 0;
                s->has_data = true;
        } else if (n == 5 && memcmp(s->line, "event", 5) == 0) {
                vlen = MIN(vlen, sizeof(s->type) - 1);
                memcpy(s->type, value, vlen);
                s->type[vlen] = 0;
        }
        /* id:, retry: and unknown fields do not matter here. */
        return 0;
}

int sse_feed(struct sse *s, const char *data, size_t len,
             int (*on_event)(const char *type, const char *data, void *userdata), void *userdata)
{
        for (size_t i = 0; i < len;) {
                size_t n = 0;
                int r;

                if (s->after_cr && data[i] == '\n') {
                        s->after_cr = false;
                        i++;
                        continue;
                }
                s->after_cr = false;
                while (i + n < len && data[i + n] != '\n' && data[i + n] != '\r')
                        n++;
                r = grow(&s->line, &s->cap, s->len + n + 1);
                if (r < 0)
                        return r;
                memcpy(s->line + s->len, data + i, n);
                s->len += n;
                s->line[s->len] = 0;
                i += n;
                if (i == len)
                        break;
                s->after_cr = data[i] == '\r';
                i++;
                /* The line ends at the first NUL a hostile stream may carry. */
                s->len = strlen(s->line);
                r = take_line(s, on_event, userdata);
                s->len = 0;
                if (r < 0)
                        return r;
        }
        return 0;
}

int sse_finish(struct sse *s, int (*on_event)(const char *type, const char *data, void *userdata),
               void *userdata)
{
        int r = 0;

        if (s->len > 0) {
                s->len = strlen(s->line);
                r = take_line(s, on_event, userdata);
                s->len = 0;
        }
        if (r >= 0)
                r = dispatch(s, on_event, userdata);
        return r;
}

void sse_done(struct sse *s)
{
        free(s->line);
        free(s->data);
        *s = (struct sse){0};
}

static bool nonempty_string(json_object *o, const char *key)
{
        json_object *v;

        return o && json_object_object_get_ex(o, key, &v) &&
               json_object_is_type(v, json_type_string) && json_object_get_string_len(v) > 0;
}

static int64_t positive_int(json_object *o, const char *key)
{
        json_object *v;

        if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_int))
                return 0;
        return MAX(json_object_get_int64(v), 0);
}

static int finish_reason(json_object *c0)
{
        json_object *v;
        const char *s;

        if (!json_object_object_get_ex(c0, "finish_reason", &v) ||
            !json_object_is_type(v, json_type_string))
                return SSE_FINISH_NONE;
        s = json_object_get_string(v);
        return strcmp(s, "length") == 0 ? SSE_FINISH_LENGTH
               : strcmp(s, "stop") == 0 ? SSE_FINISH_STOP
                                        : SSE_FINISH_OTHER;
}

int sse_event_parse(const char *payload, int api, struct sse_event *ret)
{
        struct sse_event ev = {0};
        json_object *root, *choices, *c0, *field;

        if (strcmp(payload, "[DONE]") == 0) {
                *ret = (struct sse_event){.done = true};
                return 0;
        }
        root = json_tokener_parse(payload);
        if (!root)
                return -EBADMSG;
        if (!json_object_is_type(root, json_type_object)) {
                json_object_put(root);
                return -EBADMSG;
        }
        if (json_object_object_get_ex(root, "error", &field) &&
            !json_object_is_type(field, json_type_null)) {
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
                        ev.finish = finish_reason(c0);
                }
        }
        if (json_object_object_get_ex(root, "usage", &field) &&
            json_object_is_type(field, json_type_object)) {
                ev.usage = true;
                ev.prompt_tokens = positive_int(field, "prompt_tokens");
                ev.completion_tokens = positive_int(field, "completion_tokens");
        }
        json_object_put(root);
        *ret = ev;
        return 0;
}
