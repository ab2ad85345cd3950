/* Splitting event streams however the bytes arrive, and reading OpenAI-style chunks. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sse.h"

struct seen {
        char payloads[8][64];
        int n;
};

static int collect(const char *payload, void *userdata)
{
        struct seen *s = userdata;

        cr_assert(s->n < 8);
        snprintf(s->payloads[s->n++], 64, "%s", payload);
        return 0;
}

Test(sse, payloads_come_out_whole_whatever_the_chunking)
{
        const char *stream = ": comment\r\nevent: x\r\ndata: {\"a\":1}\r\n\r\ndata:[DONE]\n\n";
        size_t len = strlen(stream);

        for (size_t step = 1; step <= len; step++) {
                struct sse s = {0};
                struct seen seen = {0};

                for (size_t i = 0; i < len; i += step)
                        cr_assert_eq(sse_feed(&s, stream + i, i + step > len ? len - i : step,
                                              collect, &seen),
                                     0);
                cr_assert_eq(seen.n, 2, "step %zu", step);
                cr_assert_str_eq(seen.payloads[0], "{\"a\":1}");
                cr_assert_str_eq(seen.payloads[1], "[DONE]");
                sse_done(&s);
        }
}

Test(sse, an_endless_line_is_refused)
{
        struct sse s = {0};
        struct seen seen = {0};
        char *big = malloc(SSE_MAX_LINE);

        memset(big, 'x', SSE_MAX_LINE);
        cr_assert_eq(sse_feed(&s, big, SSE_MAX_LINE, collect, &seen), -E2BIG);
        free(big);
        sse_done(&s);
}

Test(sse, chunks_are_tokens_usage_errors_or_the_end)
{
        struct sse_event ev;

        cr_assert_eq(sse_event_parse("{\"choices\":[{\"text\":\"hi\"}]}", SSE_API_COMPLETIONS, &ev),
                     0);
        cr_assert(ev.token && !ev.done && !ev.error);
        cr_assert_eq(sse_event_parse("{\"choices\":[{\"text\":\"\"}]}", SSE_API_COMPLETIONS, &ev),
                     0);
        cr_assert(!ev.token, "an empty text is not a token");
        cr_assert_eq(sse_event_parse("{\"choices\":[{\"delta\":{\"content\":\"x\"}}]}",
                                     SSE_API_CHAT, &ev),
                     0);
        cr_assert(ev.token);
        cr_assert_eq(sse_event_parse("{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}",
                                     SSE_API_CHAT, &ev),
                     0);
        cr_assert(!ev.token, "the role announcement is not a token");
        cr_assert_eq(sse_event_parse("{\"choices\":[],\"usage\":{\"prompt_tokens\":17}}",
                                     SSE_API_CHAT, &ev),
                     0);
        cr_assert_eq(ev.prompt_tokens, 17);
        cr_assert_eq(sse_event_parse("{\"error\":{\"message\":\"too long\"}}", SSE_API_CHAT, &ev),
                     0);
        cr_assert(ev.error && strstr(ev.error, "too long"));
        free(ev.error);
        cr_assert_eq(sse_event_parse("[DONE]", SSE_API_CHAT, &ev), 0);
        cr_assert(ev.done);
        cr_assert_eq(sse_event_parse("{not json", SSE_API_CHAT, &ev), -EBADMSG);
}
