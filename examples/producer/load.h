/* A producer's load over time, read from a file: (time, load 0..1) steps. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define LOAD_MAX_POINTS 1000000

struct load_point {
        uint64_t time_ns;
        double load; /* 0..1 of the producer's profiled peak */
};

struct load_trace {
        struct load_point *p;
        size_t n;
};

void load_trace_clear(struct load_trace *t);

/*
 * CSV "time_s,load", times non-decreasing, load in [0, 1]; '#' comments,
 * blank lines and a header line (starting with a letter) are skipped.
 * Errors: -EINVAL with a heap message "name:line: problem" in *ret_error.
 */
int load_parse_csv(const char *name, const char *data, size_t size, struct load_trace *ret,
                   char **ret_error);
/* YAML: "load: [{time: 0s, load: 0.2}, ...]". */
int load_parse_yaml(const char *name, const char *data, size_t size, struct load_trace *ret,
                    char **ret_error);
/* Read a file; ".yaml"/".yml" are YAML, anything else CSV. */
int load_trace_load(const char *path, struct load_trace *ret, char **ret_error);

/* The load in force at t: the last point at or before t (the first point's before it). */
double load_at(const struct load_trace *t, uint64_t time_ns);
