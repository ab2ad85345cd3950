/* Line-oriented logging to stderr, journald-aware. */
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *log_program = "aqua";
static enum log_level log_max = LOG_LEVEL_INFO;

static const char *const level_names[_LOG_LEVEL_MAX] = {
        [LOG_LEVEL_ERROR] = "error",   [LOG_LEVEL_WARNING] = "warning",
        [LOG_LEVEL_NOTICE] = "notice", [LOG_LEVEL_INFO] = "info",
        [LOG_LEVEL_DEBUG] = "debug",
};

/* syslog priorities, for the <N> prefix journald understands. */
static const int level_prio[_LOG_LEVEL_MAX] = {3, 4, 5, 6, 7};

void log_setup(const char *program, enum log_level max_level)
{
        const char *env = getenv("AQUA_LOG_LEVEL");

        log_program = program;
        log_max = max_level;
        if (env && log_level_from_string(env) >= 0)
                log_max = log_level_from_string(env);
}

void log_set_max_level(enum log_level level)
{
        log_max = level;
}

enum log_level log_get_max_level(void)
{
        return log_max;
}

enum log_level log_level_from_string(const char *s)
{
        for (int i = 0; i < _LOG_LEVEL_MAX; i++)
                if (strcmp(s, level_names[i]) == 0)
                        return i;
        return _LOG_LEVEL_INVALID;
}

int log_internal(enum log_level level, int error, const char *fmt, ...)
{
        char msg[2048];
        va_list ap;
        int saved_errno = errno;

        if (level > log_max)
                return error;

        /* %m in our format strings names the error we were given, not errno. */
        errno = error ? -error : 0;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        errno = saved_errno;

        if (getenv("JOURNAL_STREAM"))
                fprintf(stderr, "<%d>%s\n", level_prio[level], msg);
        else
                fprintf(stderr, "%s: %s%s%s\n", log_program,
                        level <= LOG_LEVEL_WARNING ? level_names[level] : "",
                        level <= LOG_LEVEL_WARNING ? ": " : "", msg);
        return error;
}
