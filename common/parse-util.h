/* Parsing and formatting of sizes and durations, shared by config files and command lines. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/*
 * "16GiB", "512 MiB", "1.5GB", "8G", "4096" (bytes): a number (digits, optionally a fraction)
 * and a unit, either case: B; K, M, G, T, P (and KB..PB) are powers of 1000; Ki, Mi, Gi, Ti, Pi
 * (and KiB..PiB) powers of 1024. A fraction of a byte is rounded to the nearest. Returns 0,
 * -EINVAL if malformed, -ERANGE if it overflows 64 bits. README.md, "Sizes"; tests/sizes.txt.
 */
int parse_size(const char *s, uint64_t *ret_bytes);
/* "500ms", "2s", "1.5m", "3h", "250us", "10ns"; a bare number is seconds. Returns ns. */
int parse_duration(const char *s, uint64_t *ret_ns);
/* Strict integer parse of a whole string (base 10, or 0x/0 prefixed with base 0). */
int parse_int64(const char *s, int base, int64_t *ret);
int parse_double(const char *s, double *ret);

/* "1.50 GiB", "512 MiB", "4 KiB", "100 B" into buf; returns buf. */
char *format_size(char *buf, size_t len, uint64_t bytes);
/* "1.5 s", "250 ms", "3 us" into buf; returns buf. */
char *format_duration(char *buf, size_t len, uint64_t ns);
