/* Logging for programs (aquad, aquactl, aqua-place, aqua-profile). Libraries never log through this. */
#pragma once

#include <stdarg.h>

#include "util.h"

enum log_level {
        LOG_LEVEL_ERROR,
        LOG_LEVEL_WARNING,
        LOG_LEVEL_NOTICE,
        LOG_LEVEL_INFO,
        LOG_LEVEL_DEBUG,
        _LOG_LEVEL_MAX,
        _LOG_LEVEL_INVALID = -EINVAL,
};

/* Program name shown in front of each line, and the most verbose level printed. */
void log_setup(const char *program, enum log_level max_level);
void log_set_max_level(enum log_level level);
enum log_level log_get_max_level(void);
/* Parse "error", "warning", "notice", "info" or "debug". */
enum log_level log_level_from_string(const char *s);

/*
 * Print one line to stderr. Under systemd (JOURNAL_STREAM set) lines carry a
 * <N> priority prefix for journald. With error != 0, "%m" expands to
 * strerror(-error) and the function returns error (always negative), so
 * callers can write: return log_error_errno(r, "Failed to open %s: %m", path);
 */
int log_internal(enum log_level level, int error, const char *fmt, ...) _printf_(3, 4);

#define log_error(...)   log_internal(LOG_LEVEL_ERROR, 0, __VA_ARGS__)
#define log_warning(...) log_internal(LOG_LEVEL_WARNING, 0, __VA_ARGS__)
#define log_notice(...)  log_internal(LOG_LEVEL_NOTICE, 0, __VA_ARGS__)
#define log_info(...)    log_internal(LOG_LEVEL_INFO, 0, __VA_ARGS__)
#define log_debug(...)   log_internal(LOG_LEVEL_DEBUG, 0, __VA_ARGS__)
#define log_error_errno(e, ...)   log_internal(LOG_LEVEL_ERROR, -abs(e), __VA_ARGS__)
#define log_warning_errno(e, ...) log_internal(LOG_LEVEL_WARNING, -abs(e), __VA_ARGS__)
