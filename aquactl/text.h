/*
 * Text a client chose (its name, and aquad's messages that quote it), made safe to show: valid
 * UTF-8 for JSON, and no control characters for a terminal to act on.
 */
#pragma once

/*
 * A copy of s in which each ill-formed UTF-8 sequence (its maximal subpart, as Unicode 3.9
 * counts them) is replaced by U+FFFD. NULL when out of memory; free() it.
 */
char *text_utf8_valid(const char *s);

/*
 * A copy of s for a terminal: C0 and C1 control characters, DEL and bytes that are not valid
 * UTF-8 are written as "\xNN", the rest (valid UTF-8 included) as it is. NULL when out of
 * memory; free() it.
 */
char *text_printable(const char *s);
