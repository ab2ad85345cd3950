/*
 * Server-sent events as OpenAI-compatible servers stream them: a line splitter
 * for "data:" payloads, and the meaning of one payload (a token, usage, an error).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One line longer than this is not an event. */
#define SSE_MAX_LINE (1u << 20)

struct sse {
        char *line;
        size_t len, cap;
};

/*
 * Feed len bytes; on_data is called with each complete "data:" payload (leading
 * spaces dropped, trailing CR removed, NUL-terminated). A negative return from
 * on_data stops and is returned. -E2BIG for a line over SSE_MAX_LINE.
 */
int sse_feed(struct sse *s, const char *data, size_t len,
             int (*on_data)(const char *payload, void *userdata), void *userdata);
void sse_done(struct sse *s);

enum sse_api {
        SSE_API_COMPLETIONS, /* tokens in choices[0].text */
        SSE_API_CHAT,        /* tokens in choices[0].delta.content */
};

struct sse_event {
        bool done;              /* the [DONE] marker */
        bool token;             /* carries generated text */
        int64_t prompt_tokens;  /* from usage; 0 if absent */
        char *error;            /* the server's error object as JSON text; caller frees */
};

/* Interpret one payload. Returns 0, or -EBADMSG if it is not JSON (nor [DONE]). */
int sse_event_parse(const char *payload, int api, struct sse_event *ret);
