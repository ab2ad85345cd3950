#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "example-log.h"

static const char *program = "aqua-example";
static enum log_level max_level = LOG_LEVEL_INFO;

void log_setup(const char *name, enum log_level level)
{
        const char *env = getenv("AQUA_LOG_LEVEL");
        program = name;
        max_level = env && strcmp(env, "debug") == 0 ? LOG_LEVEL_DEBUG : level;
}

int log_internal(enum log_level level, int error, const char *fmt, ...)
{
        static const char *const prefix[] = {"error: ", "warning: ", "", ""};
        char msg[2048];
        int saved = errno;
        va_list ap;

        if (level > max_level)
                return error;
        errno = error ? -error : 0; /* what %m shows */
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        errno = saved;
        fprintf(stderr, "%s: %s%s\n", program, prefix[level], msg);
        return error;
}
