"""aqua: lend idle GPU memory to a paired GPU, or borrow it, through the aquad daemon.

A Python binding of libaqua's public ABI (libaqua/include/aqua/aqua.h) through ctypes: no
compiled extension, no dependencies. libaqua.so.0 is found on first use (see load_library()).

    import aqua

    with aqua.Consumer(0, client_name="my-engine") as ctx:
        grant = ctx.borrow(1 << 30, tensors=True, allow_dram=True)
        kv = ctx.tensor(8 << 30)
        kv.grow(256 << 20)              # kernels use kv.dptr .. kv.dptr + 256 MiB
        for event in ctx.poll():        # at a safe point of each step: reclaims happen here
            ...
"""

from __future__ import annotations

import os
from typing import Optional

from . import _ffi
from ._ffi import ABI_VERSION, LibraryNotFoundError, LibraryVersionError
from ._handles import event_handle, stream_handle
from ._values import (
    ALL,
    Chunk,
    CopyPiece,
    DaemonStopping,
    Disconnected,
    Event,
    Info,
    LeaseInfo,
    PairChanged,
    Reclaimed,
    ReclaimResult,
    Reconnected,
    Role,
    TensorInfo,
    TensorRange,
    Tier,
    UnknownEvent,
)
from .context import (Consumer, Context, Grant, Layers, Lease, LeaseLost, Migrated, Producer,
                      ReclaimFailed, TensorMigrated, Ticket)
from .errors import (
    AquaError,
    BarredError,
    BusyError,
    ClosedError,
    DaemonTimeoutError,
    DrainingError,
    JournalError,
    InvalidArgumentError,
    LimitError,
    NoMemoryError,
    NotConnectedError,
    OutOfRangeError,
    Outcome,
    ThrottledError,
    strerror,
)
from .log import LogLevel, set_log_level
from .tensor import Tensor

__version__ = "0.1.0"


def load_library(path: Optional[str | os.PathLike[str]] = None) -> str:
    """Load libaqua.so.0 now and return the path it was loaded from.

    Without a path the first of these that loads is used: $AQUA_LIBRARY; the installed
    library (the loader's cache, as ldconfig knows it, then pkg-config's libdir for aqua);
    the build tree ($AQUA_BUILD/libaqua, the build folder a virtual environment sits in such as
    build/venv, the build/ folder of the checkout this package comes from). Raises
    LibraryNotFoundError naming everything tried, or LibraryVersionError when aqua_version()
    is not the ABI this package was written for (ABI_VERSION). Loading happens once per process;
    Context() and version() load the default library when nothing was loaded yet.
    """
    _ffi.load(path)
    return _ffi.loaded_path() or ""


def version() -> str:
    """libaqua's version, "major.minor.patch" (aqua_version())."""
    return _ffi.lib().aqua_version().decode()


__all__ = [
    "ABI_VERSION", "ALL", "AquaError", "BarredError", "BusyError", "Chunk", "ClosedError",
    "Consumer", "Context", "CopyPiece", "DaemonStopping", "DaemonTimeoutError", "Disconnected",
    "DrainingError",
    "Event", "Grant", "Info", "InvalidArgumentError", "JournalError", "Layers", "Lease", "LeaseInfo",
    "LeaseLost", "LibraryNotFoundError", "LibraryVersionError", "LimitError", "LogLevel",
    "Migrated", "NoMemoryError", "NotConnectedError", "OutOfRangeError", "Outcome",
    "PairChanged", "Producer", "Reclaimed", "ReclaimFailed", "ReclaimResult", "Reconnected",
    "Role", "Tensor", "TensorInfo", "TensorMigrated", "TensorRange", "ThrottledError", "Ticket",
    "Tier", "UnknownEvent", "event_handle", "load_library", "set_log_level", "stream_handle",
    "strerror", "version",
]
