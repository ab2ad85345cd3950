"""libaqua's messages, routed to Python's logging as the logger "aqua".

libaqua never prints; aqua_set_log() gives it a callback, set up when the library is loaded.
Levels map ERROR -> ERROR, WARNING -> WARNING, NOTICE and INFO -> INFO, DEBUG -> DEBUG.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from enum import IntEnum

from . import _ffi

logger = logging.getLogger("aqua")
# A library's logger: silent until the application configures logging.
logger.addHandler(logging.NullHandler())


class LogLevel(IntEnum):
    """aqua.h's enum aqua_log_level."""

    ERROR = 0
    WARNING = 1
    NOTICE = 2
    INFO = 3
    DEBUG = 4


_TO_LOGGING = {
    LogLevel.ERROR: logging.ERROR,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.NOTICE: logging.INFO,
    LogLevel.INFO: logging.INFO,
    LogLevel.DEBUG: logging.DEBUG,
}

# Messages of ERROR and WARNING level logged on this thread since capture() started: the
# reason an open was refused, attached to the exception.
_local = threading.local()


def _receive(level: int, message: bytes | None, userdata: object) -> None:
    try:
        text = message.decode(errors="replace") if message else ""
        captured = getattr(_local, "captured", None)
        if captured is not None and level <= LogLevel.WARNING:
            captured.append(text)
        logger.log(_TO_LOGGING.get(LogLevel(level), logging.DEBUG), "%s", text)
    except Exception:  # never let an exception unwind into C
        pass


_callback = _ffi.LOG_FN(_receive)  # kept alive for the process's life
_max_level = LogLevel.DEBUG


def set_log_level(max_level: LogLevel) -> None:
    """Have libaqua format only messages of max_level and more severe (default: all of them;
    the "aqua" logger's level filters them further). Process-wide: call it while no other
    thread is inside libaqua."""
    global _max_level
    _max_level = LogLevel(max_level)
    if _ffi._lib is not None:
        _ffi._lib.aqua_set_log(_callback, None, int(_max_level))


def _install(lib: ctypes.CDLL) -> None:
    lib.aqua_set_log(_callback, None, int(_max_level))


_ffi._hooks.append(_install)


class capture:
    """Collect libaqua's errors and warnings logged on this thread inside the with block."""

    def __enter__(self) -> list[str]:
        self.saved = getattr(_local, "captured", None)
        _local.captured = []
        return _local.captured

    def __exit__(self, *exc: object) -> None:
        _local.captured = self.saved
