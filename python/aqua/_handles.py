"""CUDA streams and events from the caller, as the raw handles libaqua takes.

Accepted without importing torch, cupy or cuda-python: None (libaqua's own stream, or no
event), a raw CUstream / CUevent handle as an int, or an object that exposes one: the CUDA
stream protocol ``__cuda_stream__()`` returning ``(version, handle)`` (cuda.core, cuda.bindings),
``.cuda_stream`` (torch.cuda.Stream) or ``.cuda_event`` (torch.cuda.Event), ``.ptr``
(cupy.cuda.Stream and cupy.cuda.Event), or ctypes' ``_as_parameter_``.
"""

from __future__ import annotations

import ctypes
from typing import Any, Protocol, Union, runtime_checkable


@runtime_checkable
class CudaStreamProtocol(Protocol):
    def __cuda_stream__(self) -> tuple[int, int]: ...


#: What a ``stream=`` parameter accepts.
StreamLike = Union[None, int, CudaStreamProtocol, Any]
#: What an ``*_event=`` parameter accepts.
EventLike = Union[None, int, Any]


def _as_int(value: object, what: str, obj: object) -> int:
    if isinstance(value, ctypes.c_void_p):
        value = value.value or 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} of {type(obj).__name__} is {type(value).__name__}, not an int")
    if value < 0 or value >= 1 << 64:
        raise ValueError(f"{what} {value:#x} is not a handle")
    return value


def stream_handle(stream: StreamLike) -> int | None:
    """The CUstream for stream (None: libaqua's own)."""
    if stream is None:
        return None
    if isinstance(stream, ctypes.c_void_p):
        return stream.value or None
    if isinstance(stream, int) and not isinstance(stream, bool):
        return _as_int(stream, "handle", stream) or None
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        if not (isinstance(value, tuple) and len(value) == 2):
            raise TypeError(f"{type(stream).__name__}.__cuda_stream__() must return (version, handle)")
        return _as_int(value[1], "__cuda_stream__()", stream) or None
    for attr in ("cuda_stream", "ptr", "_as_parameter_"):
        if hasattr(stream, attr):
            return _as_int(getattr(stream, attr), attr, stream) or None
    raise TypeError(
        f"{type(stream).__name__} is not a CUDA stream: pass an int handle or an object with "
        "__cuda_stream__(), .cuda_stream or .ptr"
    )


def event_handle(event: EventLike) -> int | None:
    """The CUevent for event (None: no event)."""
    if event is None:
        return None
    if isinstance(event, ctypes.c_void_p):
        return event.value or None
    if isinstance(event, int) and not isinstance(event, bool):
        return _as_int(event, "handle", event) or None
    for attr in ("cuda_event", "ptr", "_as_parameter_"):
        if hasattr(event, attr):
            return _as_int(getattr(event, attr), attr, event) or None
    raise TypeError(
        f"{type(event).__name__} is not a CUDA event: pass an int handle or an object with "
        ".cuda_event or .ptr"
    )
