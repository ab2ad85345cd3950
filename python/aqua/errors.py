"""Exceptions: every failure of a libaqua call raises an AquaError that keeps what aqua.h
returned, as an errno (``.errno``) or an expected outcome (``.outcome``)."""

from __future__ import annotations

import errno as _errno
import os
from enum import IntEnum

from . import _ffi


class Outcome(IntEnum):
    """aqua.h's expected outcomes (positive return values)."""

    PENDING = 1
    TIMEOUT = 2
    NO_MEMORY = 3
    BARRED = 4
    LIMIT = 5
    THROTTLED = 6
    DRAINING = 7
    JOURNAL = 8


def strerror(code: int) -> str:
    """libaqua's short description of a return value: 0, a negative errno or an Outcome."""
    return _ffi.lib().aqua_strerror(int(code)).decode()


class AquaError(Exception):
    """A libaqua call failed.

    Attributes:
        code: what the C function returned (a negative errno, or a positive Outcome).
        errno: the positive errno (``errno.ENOTCONN`` ...) for failures, None for outcomes.
        outcome: the Outcome for expected outcomes (no memory, barred, ...), None for errnos.
        call: the C function that returned it (``"aqua_borrow"``).
        detail: what libaqua logged about it during the call (the daemon's words for a
            refused open, for instance), or None.
    """

    def __init__(self, call: str, code: int, detail: str | None = None) -> None:
        self.call = call
        self.code = code
        self.errno: int | None = -code if code < 0 else None
        self.outcome: Outcome | None = None
        if code > 0 and code in Outcome._value2member_map_:
            self.outcome = Outcome(code)
        self.detail = detail
        try:
            text = strerror(code)
        except ImportError:
            text = os.strerror(-code) if code < 0 else f"outcome {code}"
        if code < 0:
            name = _errno.errorcode.get(-code, "")
        else:
            name = self.outcome.name if self.outcome is not None else ""
        msg = f"{call}: {text} ({name})" if name else f"{call}: {text}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class NoMemoryError(AquaError):
    """AQUA_NO_MEMORY: nothing (not even min_bytes) could be granted or placed."""


class BarredError(AquaError):
    """AQUA_BARRED: this consumer missed a reclaim deadline and gets no new leases."""


class LimitError(AquaError):
    """AQUA_LIMIT: a limit of the daemon (chunks, leases, clients) was reached."""


class ThrottledError(AquaError):
    """AQUA_THROTTLED: too many requests in flight; try again later."""


class DrainingError(AquaError):
    """AQUA_DRAINING: an operator drained this producer's GPU; nothing is offered until
    ``aquactl undrain`` ends the drain (it outlives this process)."""


class JournalError(AquaError):
    """AQUA_JOURNAL: aquad could not make the change durable (its journal could not be
    written): the request was refused and undone, nothing changed; it may succeed once aquad
    can write again."""


class NotConnectedError(AquaError):
    """No daemon: -ENOTCONN, or at open -ECONNREFUSED / -ENOENT (nothing at the endpoint) and
    -ESHUTDOWN (the daemon is stopping)."""


class DaemonTimeoutError(AquaError):
    """-ETIMEDOUT: the daemon did not answer within the context's timeout."""


class BusyError(AquaError):
    """-EBUSY: the GPU is registered by another process, or a lease still backs a tensor."""


class InvalidArgumentError(AquaError, ValueError):
    """-EINVAL: libaqua refused an argument."""


class OutOfRangeError(AquaError, IndexError):
    """-ERANGE: an offset or size past the end (of a tensor's range, a lease's chunks)."""


class ClosedError(AquaError, ValueError):
    """The object was used after it, or its context, was closed, freed or given back. Raised
    by the package itself, before anything reaches libaqua; ``errno`` is EBADF."""

    def __init__(self, what: str) -> None:
        Exception.__init__(self, what)
        self.call = ""
        self.code = -_errno.EBADF
        self.errno = _errno.EBADF
        self.outcome = None
        self.detail = None


_BY_OUTCOME: dict[int, type[AquaError]] = {
    Outcome.NO_MEMORY: NoMemoryError,
    Outcome.BARRED: BarredError,
    Outcome.LIMIT: LimitError,
    Outcome.THROTTLED: ThrottledError,
    Outcome.DRAINING: DrainingError,
    Outcome.JOURNAL: JournalError,
}
_BY_ERRNO: dict[int, type[AquaError]] = {
    _errno.ENOTCONN: NotConnectedError,
    _errno.ECONNREFUSED: NotConnectedError,
    _errno.ESHUTDOWN: NotConnectedError,
    _errno.ETIMEDOUT: DaemonTimeoutError,
    _errno.EBUSY: BusyError,
    _errno.EINVAL: InvalidArgumentError,
    _errno.ERANGE: OutOfRangeError,
}


def error(call: str, code: int, detail: str | None = None) -> AquaError:
    """The exception for a non-zero return value of call."""
    if code > 0:
        cls = _BY_OUTCOME.get(code, AquaError)
    elif call == "aqua_open" and code == -_errno.ENOENT:
        cls = NotConnectedError
    else:
        cls = _BY_ERRNO.get(-code, AquaError)
    return cls(call, code, detail)


def check(call: str, code: int) -> int:
    """Return code when it is 0 (success), else raise error(call, code)."""
    if code != 0:
        raise error(call, code)
    return code
