/*
 * Server-sent events as OpenAI-compatible servers stream them: the event splitter
 * (data lines joined, dispatched at a blank line), and the meaning of one payload
 * (a token, usage, a finish reason, an error).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One line, or one event's data, longer than this is not an event. */
#define SSE_MAX_LINE (1u << 20)

struct sse {
        char *line; /* the line being read */
        size_t len, cap;
        char *data; /* the event being read: its data lines, joined by "\n" */
        size_t dlen, dcap;
        bool has_data;
        bool after_cr; /* the last byte was a CR: a LF right after it ends nothing */
        char type[32]; /* the event's "event:" field, "" for the default (message) */
};

/*
 * Feed len bytes. on_event is called with each complete event that has data: its
 * type ("" unless an "event:" line named one) and its data (the "data:" lines'
 * values without the one leading space, joined by "\n", NUL-terminated). Lines end
 * at LF, CR or CRLF. An event ends at a blank line, and also where a data line
 * follows a data line that was a whole JSON value or [DONE] (servers that leave out
 * the blank line). A negative return from on_event stops and is returned; -E2BIG
 * for a line or event over SSE_MAX_LINE.
 */
int sse_feed(struct sse *s, const char *data, size_t len,
             int (*on_event)(const char *type, const char *data, void *userdata), void *userdata);
/* The end of the stream: dispatches an event the stream left without its blank line. */
int sse_finish(struct sse *s, int (*on_event)(const char *type, const char *data, void *userdata),
               void *userdata);
void sse_done(struct sse *s);

enum sse_api {
        SSE_API_COMPLETIONS, /* tokens in choices[0].text */
        SSE_API_CHAT,        /* tokens in choices[0].delta.content */
};

enum sse_finish {
        SSE_FINISH_NONE,   /* no finish_reason in this chunk (null or absent) */
        SSE_FINISH_LENGTH, /* max_tokens reached */
        SSE_FINISH_STOP,   /* end of sequence or a stop string */
        SSE_FINISH_OTHER,  /* anything else a server names (abort, content_filter, ...) */
};

struct sse_event {
        bool done;                 /* the [DONE] marker */
        bool token;                /* carries generated text */
        bool usage;                /* has a usage object */
        int finish;                /* enum sse_finish of choices[0] */
        int64_t prompt_tokens;     /* from usage; 0 if absent */
        int64_t completion_tokens; /* from usage; 0 if absent */
        char *error;               /* the server's error object as JSON text; caller frees */
};

/* Interpret one payload. Returns 0, or -EBADMSG if it is not JSON (nor [DONE]). */
int sse_event_parse(const char *payload, int api, struct sse_event *ret);
