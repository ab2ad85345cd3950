/* Splitting event streams however the bytes arrive, and reading OpenAI-style chunks. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sse.h"

struct seen {
        char payloads[8][64];
        char types[8][16];
        int n;
};

static int collect(const char *type, const char *payload, void *userdata)
{
        struct seen *s = userdata;

        cr_assert(s->n < 8);
        snprintf(s->types[s->n], 16, "%s", type);
        snprintf(s->payloads[s->n++], 64, "%s", payload);
        return 0;
}

/* Feed stream in every chunking, then end it; check it gives want (n payloads, types). */
static void check_stream(const char *stream, int n, const char *const *want,
                         const char *const *types)
{
        size_t len = strlen(stream);

        for (size_t step = 1; step <= len; step++) {
                struct sse s = {0};
                struct seen seen = {0};

                for (size_t i = 0; i < len; i += step)
                        cr_assert_eq(sse_feed(&s, stream + i, i + step > len ? len - i : step,
                                              collect, &seen),
                                     0);
                cr_assert_eq(sse_finish(&s, collect, &seen), 0);
                cr_assert_eq(seen.n, n, "step %zu: %d events", step, seen.n);
                for (int k = 0; k < n; k++) {
                        cr_assert_str_eq(seen.payloads[k], want[k], "step %zu", step);
                        cr_assert_str_eq(seen.types[k], types ? types[k] : "");
                }
                sse_done(&s);
        }
}

Test(sse, payloads_come_out_whole_whatever_the_chunking)
{
        check_stream(": comment\r\nevent: x\r\ndata: {\"a\":1}\r\n\r\ndata:[DONE]\n\n", 2,
                     (const char *[]){"{\"a\":1}", "[DONE]"}, (const char *[]){"x", ""});
}

Test(sse, lines_end_at_lf_cr_or_crlf)
{
        check_stream("data: a\rdata: b\r\rdata: c\r\ndata: d\r\n\r\ndata: e\n\n", 3,
                     (const char *[]){"a\nb", "c\nd", "e"}, NULL);
}

Test(sse, data_lines_join_and_events_carry_their_type)
{
        check_stream("event: error\ndata: {\"a\":\ndata: 1}\n\ndata:x\n\nid: 7\nretry: 5\n\n", 2,
                     (const char *[]){"{\"a\":\n1}", "x"}, (const char *[]){"error", ""});
}

Test(sse, servers_that_leave_out_blank_lines_still_give_one_event_per_chunk)
{
        check_stream("data: {\"a\":1}\ndata: {\"b\":2}\ndata: [DONE]\ndata: {\"c\":3}", 4,
                     (const char *[]){"{\"a\":1}", "{\"b\":2}", "[DONE]", "{\"c\":3}"}, NULL);
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
        cr_assert_eq(sse_event_parse("{\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}],"
                                     "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":9}}",
                                     SSE_API_COMPLETIONS, &ev),
                     0);
        cr_assert(!ev.token && ev.usage && ev.finish == SSE_FINISH_LENGTH);
        cr_assert(ev.prompt_tokens == 3 && ev.completion_tokens == 9);
        cr_assert_eq(sse_event_parse("{\"choices\":[{\"text\":\"x\",\"finish_reason\":null}],"
                                     "\"error\":null}",
                                     SSE_API_COMPLETIONS, &ev),
                     0);
        cr_assert(ev.token && !ev.error && ev.finish == SSE_FINISH_NONE && !ev.usage);
        cr_assert_eq(sse_event_parse("{\"choices\":[{\"finish_reason\":\"abort\"}]}",
                                     SSE_API_COMPLETIONS, &ev),
                     0);
        cr_assert_eq(ev.finish, SSE_FINISH_OTHER);
        cr_assert_eq(sse_event_parse("[1,2]", SSE_API_CHAT, &ev), -EBADMSG, "not an object");
        cr_assert_eq(sse_event_parse("[DONE]", SSE_API_CHAT, &ev), 0);
        cr_assert(ev.done);
        cr_assert_eq(sse_event_parse("{not json", SSE_API_CHAT, &ev), -EBADMSG);
}
