/* Numbers, sizes and durations as the examples' options and files write them. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* "128KiB", "2 GiB", "1.5GB", "4096" (bytes): 0, -EINVAL, -ERANGE. */
int parse_size(const char *s, uint64_t *ret_bytes);
/* "40us", "8ms", "2s", "1.5" (seconds), "1m", "1h": nanoseconds. */
int parse_duration(const char *s, uint64_t *ret_ns);
/* A whole string as an integer (base 10; base 0 also takes 0x and 0 prefixes) or a number. */
int parse_int64(const char *s, int base, int64_t *ret);
int parse_double(const char *s, double *ret);
/* "1.50 GiB", "512 MiB", "100 B". */
char *format_size(char *buf, size_t len, uint64_t bytes);
