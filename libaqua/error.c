/* Results as text, the version, and the log callback. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "alog.h"

static aqua_log_fn alog_fn;
static void *alog_userdata;
static enum aqua_log_level alog_max = AQUA_LOG_WARNING;

_public_ void aqua_set_log(aqua_log_fn fn, void *userdata, enum aqua_log_level max_level)
{
        alog_fn = fn;
        alog_userdata = userdata;
        alog_max = max_level;
}

void alog_internal(enum aqua_log_level level, const char *fmt, ...)
{
        char buf[512];
        va_list ap;

        if (!alog_fn || level > alog_max)
                return;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        alog_fn(level, buf, alog_userdata);
}

_public_ const char *aqua_version(void)
{
        return AQUA_VERSION_STRING;
}

static const char *const outcome_text[_AQUA_OUTCOME_MAX] = {
    [0] = "success",
    [AQUA_PENDING] = "accepted, the result follows as events",
    [AQUA_TIMEOUT] = "timed out before completion",
    [AQUA_NO_MEMORY] = "no memory available to lend",
    [AQUA_BARRED] = "barred from new leases after a missed reclaim deadline",
    [AQUA_LIMIT] = "a limit of the daemon was reached",
    [AQUA_THROTTLED] = "too many requests in flight",
    [AQUA_DRAINING] = "drained by an operator: no offers until aquactl undrain",
    [AQUA_JOURNAL] = "aquad could not make the change durable: refused and undone",
};

_public_ const char *aqua_strerror(int r)
{
        if (r >= 0 && r < _AQUA_OUTCOME_MAX)
                return outcome_text[r];
        if (r > 0)
                return "unknown outcome";
        switch (r) {
        /* The errors whose generic text would mislead in libaqua's context. */
        case -ECONNREFUSED:
        case -ENOENT:
                return "aquad is not listening at the endpoint";
        case -ENOTCONN:
                return "not connected to aquad";
        case -EACCES:
                return "aquad refused this user";
        case -EUSERS:
                return "aquad has as many clients as its limits allow";
        case -ESHUTDOWN:
                return "aquad is stopping";
        case -ELIBACC:
                return "no usable CUDA driver";
        case -EPERM:
                return "not allowed for this context's role";
        case -ENOKEY:
                return "the driver does not permit fabric memory: no IMEX channel";
        default:
                /* strerror() returns static text for every errno glibc knows. */
                return strerror(-r);
        }
}

int error_from_code(Aqua__ErrorCode code)
{
        switch (code) {
        case AQUA__ERROR_CODE__ERROR_CODE_NONE:
                return 0;
        case AQUA__ERROR_CODE__ERROR_CODE_MALFORMED:
        case AQUA__ERROR_CODE__ERROR_CODE_SIDE_CHANNEL:
                return -EPROTO;
        case AQUA__ERROR_CODE__ERROR_CODE_TOO_LARGE:
                return -EMSGSIZE;
        case AQUA__ERROR_CODE__ERROR_CODE_VERSION:
                return -EPROTONOSUPPORT;
        case AQUA__ERROR_CODE__ERROR_CODE_NOT_REGISTERED:
                return -ENOTCONN;
        case AQUA__ERROR_CODE__ERROR_CODE_PERMISSION:
                return -EACCES;
        case AQUA__ERROR_CODE__ERROR_CODE_INVALID:
                return -EINVAL;
        case AQUA__ERROR_CODE__ERROR_CODE_UNKNOWN_GPU:
                return -ENODEV;
        case AQUA__ERROR_CODE__ERROR_CODE_UNKNOWN_LEASE:
        case AQUA__ERROR_CODE__ERROR_CODE_UNKNOWN_CHUNK:
                return -ENOENT;
        case AQUA__ERROR_CODE__ERROR_CODE_LIMIT:
                return AQUA_LIMIT;
        case AQUA__ERROR_CODE__ERROR_CODE_WRONG_ROLE:
                return -EPERM;
        case AQUA__ERROR_CODE__ERROR_CODE_NO_MEMORY:
                return AQUA_NO_MEMORY;
        case AQUA__ERROR_CODE__ERROR_CODE_BARRED:
                return AQUA_BARRED;
        case AQUA__ERROR_CODE__ERROR_CODE_THROTTLED:
                return AQUA_THROTTLED;
        case AQUA__ERROR_CODE__ERROR_CODE_BUSY:
                return -EBUSY;
        case AQUA__ERROR_CODE__ERROR_CODE_DRAINING:
                return AQUA_DRAINING;
        case AQUA__ERROR_CODE__ERROR_CODE_STOPPING:
                return -ESHUTDOWN;
        case AQUA__ERROR_CODE__ERROR_CODE_JOURNAL:
                return AQUA_JOURNAL;
        case AQUA__ERROR_CODE__ERROR_CODE_INTERNAL:
                /* aquad failed (out of memory, say), not this host's I/O: told apart from -EIO. */
                return -EREMOTEIO;
        default:
                /* A code of a newer aquad: a failure, not one this library can name. */
                return -EPROTO;
        }
}

int error_from_reject(Aqua__SideFrame__RejectReason reason)
{
        switch (reason) {
        case AQUA__SIDE_FRAME__REJECT_REASON__REJECT_REASON_CLIENT_LIMIT:
                return -EUSERS;
        case AQUA__SIDE_FRAME__REJECT_REASON__REJECT_REASON_STOPPING:
                return -ESHUTDOWN;
        default:
                /* PERMISSION, and whatever an aquad without reasons refuses. */
                return -EACCES;
        }
}
