/* libaqua's log lines in the examples' own log (common/log.h), warnings and errors only. */
#pragma once

/* Route libaqua's warnings and errors to log.h, prefixed "libaqua: ". Call before aqua_open. */
void examples_aqua_log_setup(void);
