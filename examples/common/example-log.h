/* The examples' log: "program: [error: ]message" lines on stderr. */
#pragma once

#include "example-util.h"

enum log_level {
        LOG_LEVEL_ERROR,
        LOG_LEVEL_WARNING,
        LOG_LEVEL_INFO,
        LOG_LEVEL_DEBUG,
};

/* The name in front of each line and the most verbose level printed ($AQUA_LOG_LEVEL=debug
 * prints debug lines too). */
void log_setup(const char *program, enum log_level max_level);

/* One line; with error != 0, %m is strerror(-error) and error (negative) is returned. */
int log_internal(enum log_level level, int error, const char *fmt, ...) _printf_(3, 4);

#define log_error(...)          log_internal(LOG_LEVEL_ERROR, 0, __VA_ARGS__)
#define log_warning(...)        log_internal(LOG_LEVEL_WARNING, 0, __VA_ARGS__)
#define log_info(...)           log_internal(LOG_LEVEL_INFO, 0, __VA_ARGS__)
#define log_debug(...)          log_internal(LOG_LEVEL_DEBUG, 0, __VA_ARGS__)
#define log_error_errno(e, ...) log_internal(LOG_LEVEL_ERROR, -abs(e), __VA_ARGS__)
