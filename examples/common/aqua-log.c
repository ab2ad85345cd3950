/* libaqua's log lines in the examples' own log (example-log.h), warnings and errors only. */
#include "aqua-log.h"
#include "aqua/aqua.h"
#include "example-log.h"

static void aqua_log(enum aqua_log_level level, const char *message, void *userdata)
{
        log_internal(level == AQUA_LOG_ERROR ? LOG_LEVEL_ERROR : LOG_LEVEL_WARNING, 0,
                     "libaqua: %s", message);
}

void examples_aqua_log_setup(void)
{
        aqua_set_log(aqua_log, NULL, AQUA_LOG_WARNING);
}
