/* The profiler's outputs: the profile the placer reads, a full summary, CSV and a gnuplot plot. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "search.h"

/* Named outcomes. */
enum {
        REPORT_E_NO_GNUPLOT = 1, /* gnuplot is not installed; the plot script is written anyway */
        REPORT_E_INCOMPLETE,     /* not enough was measured for a profile; none written */
};

struct report_info {
        const char *model;
        int64_t tp;
        uint64_t gpu_memory; /* per GPU; 0 if unknown */
        const char *target;  /* "http" or "engine-model" */
        const struct search_params *params;
        double plan_burst; /* the burst whose swap need is the consumer's "memory" */
};

/*
 * The profile (format in profiler/README.md): name, role, memory, tp, gpu-memory,
 * where memory is what a producer lends or what a consumer borrows at the plan
 * burst. Returns REPORT_E_INCOMPLETE (and writes nothing) when the search did not
 * get that far.
 */
int report_write_profile(const char *path, const struct report_info *info, const struct search *st);
/* Everything measured, complete or not. */
int report_write_summary(const char *path, const struct report_info *info, const struct search *st);
/* One line per run. */
int report_write_csv(const char *path, const struct search *st);
/*
 * TTFT and TBT against rate from the CSV at csv_path: writes the gnuplot script
 * at script_path and runs gnuplot on it to make image_path (.png or .svg by its
 * extension), with the SLA's limits drawn when sla is not NULL.
 * REPORT_E_NO_GNUPLOT if gnuplot is not on PATH.
 */
int report_plot(const char *csv_path, const char *script_path, const char *image_path,
                const char *title, const struct sla *sla);

/* Write s as a double-quoted YAML scalar. */
void yaml_put_string(FILE *f, const char *s);
/* Write through a temporary file renamed into place, so readers never see half a file. */
int write_file_atomic(const char *path, int (*fill)(FILE *f, const void *userdata),
                      const void *userdata);
