/*
 * Fuzz harness for what aqua-profile reads from outside: ShareGPT JSON, arrival
 * traces and a server's event stream. The first byte picks which.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sse.h"
#include "workload.h"

static int on_event(const char *type, const char *payload, void *userdata)
{
        struct sse_event ev;

        if (sse_event_parse(payload, *(const int *)userdata, &ev) == 0)
                free(ev.error);
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        char *copy, *error = NULL;

        if (size < 1)
                return 0;
        copy = malloc(size);
        if (!copy)
                return 0;
        memcpy(copy, data + 1, size - 1);
        copy[size - 1] = 0;

        switch (data[0] % 3) {
        case 0: {
                struct request_pool pool = {0};
                if (request_pool_parse_sharegpt("fuzz", copy, size - 1, 0, &pool, &error) == 0)
                        request_pool_done(&pool);
                break;
        }
        case 1: {
                double *times = NULL;
                size_t n = 0;
                if (trace_parse("fuzz", copy, &times, &n, &error) == 0)
                        free(times);
                break;
        }
        default: {
                /* Fed in two pieces, so lines split across reads are exercised too. */
                struct sse s = {0};
                int api = data[0] & 4 ? SSE_API_CHAT : SSE_API_COMPLETIONS;
                size_t half = (size - 1) / 2;
                if (sse_feed(&s, (const char *)data + 1, half, on_event, &api) == 0 &&
                    sse_feed(&s, (const char *)data + 1 + half, size - 1 - half, on_event, &api) ==
                        0)
                        sse_finish(&s, on_event, &api);
                sse_done(&s);
        }
        }
        free(error);
        free(copy);
        return 0;
}
