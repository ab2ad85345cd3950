/* The library's only way to say something: the callback set with aqua_set_log(). */
#pragma once

#include "aqua.pb-c.h"
#include "aqua/aqua.h"
#include "util.h"

void alog_internal(enum aqua_log_level level, const char *fmt, ...) _printf_(2, 3);

#define alog_error(...)   alog_internal(AQUA_LOG_ERROR, __VA_ARGS__)
#define alog_warning(...) alog_internal(AQUA_LOG_WARNING, __VA_ARGS__)
#define alog_notice(...)  alog_internal(AQUA_LOG_NOTICE, __VA_ARGS__)
#define alog_info(...)    alog_internal(AQUA_LOG_INFO, __VA_ARGS__)
#define alog_debug(...)   alog_internal(AQUA_LOG_DEBUG, __VA_ARGS__)

/* The public result for an Error reply from the daemon: an AQUA_* outcome or a negative errno. */
int error_from_code(Aqua__ErrorCode code);
/* The errno aqua_open() returns for a side-channel refusal with this reason. */
int error_from_reject(Aqua__SideFrame__RejectReason reason);
