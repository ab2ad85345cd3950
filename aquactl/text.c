/* Text a client chose, made safe for JSON (valid UTF-8) and for terminals (no control codes). */
#include "text.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * The UTF-8 sequence at s: its length when it is well-formed (the code point in *ret_cp), else
 * minus the length of its maximal subpart (the bytes that are replaced together).
 */
static int utf8_next(const unsigned char *s, uint32_t *ret_cp)
{
        unsigned char lo = 0x80, hi = 0xbf;
        uint32_t cp;
        int n;

        if (s[0] < 0x80) {
                *ret_cp = s[0];
                return 1;
        }
        if (s[0] >= 0xc2 && s[0] <= 0xdf)
                n = 2, cp = s[0] & 0x1f;
        else if (s[0] >= 0xe0 && s[0] <= 0xef)
                n = 3, cp = s[0] & 0x0f;
        else if (s[0] >= 0xf0 && s[0] <= 0xf4)
                n = 4, cp = s[0] & 0x07;
        else
                return -1;
        /* The second byte's range rules out overlong forms, surrogates and values past U+10FFFF. */
        if (s[0] == 0xe0)
                lo = 0xa0;
        else if (s[0] == 0xed)
                hi = 0x9f;
        else if (s[0] == 0xf0)
                lo = 0x90;
        else if (s[0] == 0xf4)
                hi = 0x8f;
        for (int i = 1; i < n; i++) {
                if (s[i] < lo || s[i] > hi)
                        return -i;
                cp = cp << 6 | (s[i] & 0x3f);
                lo = 0x80, hi = 0xbf;
        }
        *ret_cp = cp;
        return n;
}

static bool is_control(uint32_t cp)
{
        return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f);
}

/* A copy of s: ill-formed sequences as U+FFFD (for_json), or with control characters as \xNN. */
static char *rewrite(const char *s, bool for_json)
{
        const unsigned char *p = (const unsigned char *)s;
        /* At worst every byte becomes "\xNN" (4 bytes) or U+FFFD (3 bytes). */
        size_t len = strlen(s), used = 0;
        char *out = malloc(len * 4 + 1);

        if (!out)
                return NULL;
        while (*p) {
                uint32_t cp = 0;
                int n = utf8_next(p, &cp);

                if (n > 0 && (for_json || !is_control(cp))) {
                        memcpy(out + used, p, (size_t)n);
                        used += (size_t)n;
                } else if (for_json) {
                        memcpy(out + used, "\xef\xbf\xbd", 3);
                        used += 3;
                } else {
                        for (int i = 0; i < (n > 0 ? n : -n); i++)
                                used += (size_t)sprintf(out + used, "\\x%02x", p[i]);
                }
                p += n > 0 ? n : -n;
        }
        out[used] = '\0';
        return out;
}

char *text_utf8_valid(const char *s)
{
        return rewrite(s, true);
}

char *text_printable(const char *s)
{
        return rewrite(s, false);
}
