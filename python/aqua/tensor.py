"""Aqua tensors: one fixed device address range backed chunk by chunk by peer, local or DRAM
memory, that keeps its address through reclaims."""

from __future__ import annotations

import ctypes
import errno
from collections.abc import Iterator
from typing import Any, Optional, Protocol, Union

from . import _args, _ffi, errors
from ._values import ALL, Tier, TensorInfo, TensorRange


class _Owner(Protocol):
    """What a Tensor uses of the Consumer that made it (context.Consumer), named here so that
    this module imports nothing of the context's: the context imports this one."""

    _lock: Any
    _lib: Any
    _tensors: dict[int, Tensor]

    @property
    def closed(self) -> bool: ...

    def _handle(self) -> int: ...

    def _check(self, name: str, *args: object) -> None: ...

    def copy(self, pieces: Any) -> Any: ...


Buffer = Union[bytes, bytearray, memoryview]


class Tensor:
    """An aqua tensor of a Consumer (Consumer.tensor()).

    ``dptr`` never changes for the tensor's life: kernels on the consumer's GPU read and write
    dptr + offset wherever a chunk is mapped (the window [begin, end) of info()). A reclaim
    moves the chunks it takes to DRAM mapped at the same address (reported by poll() as
    TensorMigrated). Free it with free() or a with block; the context's close() frees it too.
    """

    def __init__(self, ctx: _Owner, h: int) -> None:
        self.context = ctx
        self._h: Optional[int] = h
        i = self.info()
        self.dptr: int = i.dptr
        self.max_bytes: int = i.max_bytes
        self.chunk_bytes: int = i.chunk_bytes

    def _handle(self) -> int:
        self.context._handle()
        if self._h is None:
            raise errors.ClosedError(f"{self!r} was freed")
        return self._h

    @property
    def closed(self) -> bool:
        return self._h is None or self.context.closed

    def _check(self, name: str, *args: object) -> None:
        with self.context._lock:
            self.context._check(name, self._handle(), *args)

    def info(self) -> TensorInfo:
        ti = _ffi.TensorInfo()
        self._check("aqua_tensor_get_info", ctypes.byref(ti))
        return TensorInfo(ti.dptr, ti.max_bytes, ti.chunk_bytes, ti.begin, ti.end,
                          ti.peer_bytes, ti.local_bytes, ti.dram_bytes)

    def grow(self, end: int) -> None:
        """Map chunks so that the window reaches end bytes (rounded up to a chunk); all or
        nothing. Raises NoMemoryError (no allowed tier has room; the tensor is as before),
        OutOfRangeError (end > max_bytes)."""
        self._check("aqua_tensor_grow", _args.u64(end, "end", "Tensor.grow"))

    def trim(self, begin: int, end: int) -> None:
        """Shrink the window to [begin, end): release whole chunks entirely outside it. The
        chunks in between keep their data and address."""
        begin = _args.u64(begin, "begin", "Tensor.trim")
        end = _args.u64(end, "end", "Tensor.trim")
        if begin > end:
            raise errors.InvalidArgumentError("Tensor.trim", -errno.EINVAL,
                                              f"begin {begin} is past end {end}")
        self._check("aqua_tensor_trim", begin, end)

    def range_at(self, offset: int) -> TensorRange:
        """The run of same-tier chunks holding offset. OutOfRangeError past max_bytes."""
        r = _ffi.TensorRange()
        self._check("aqua_tensor_get_range", _args.u64(offset, "offset", "Tensor.range_at"),
                    ctypes.byref(r))
        return TensorRange(r.offset, r.bytes, Tier(r.tier), r.host or None)

    def ranges(self) -> Iterator[TensorRange]:
        """Every run of the tensor's range, in order (unmapped runs have Tier.NONE)."""
        offset = 0
        while offset < self.max_bytes:
            r = self.range_at(offset)
            yield r
            offset = r.offset + r.nbytes

    def promote(self, *, include_local: bool = False, max_bytes: Optional[int] = None) -> int:
        """Move this tensor's DRAM chunks (and local ones with include_local) to free chunks of
        tensor pool leases, at most max_bytes (None: no limit), at the same addresses. Returns
        the bytes moved (0 when nothing could move)."""
        moved = ctypes.c_uint64()
        self._check("aqua_tensor_promote", bool(include_local),
                    ALL if max_bytes is None else _args.u64(max_bytes, "max_bytes", "Tensor.promote"),
                    ctypes.byref(moved))
        return moved.value

    # ------------------------------------------------------------------ host convenience

    def _window(self, call: str, offset: int, nbytes: int) -> None:
        offset = _args.u64(offset, "offset", call)
        i = self.info()
        if offset < i.begin or offset + nbytes > i.end:
            raise errors.OutOfRangeError(
                call, -errno.ERANGE,
                f"bytes [{offset}, {offset + nbytes}) are outside the mapped window "
                f"[{i.begin}, {i.end})")

    def write(self, offset: int, data: Buffer) -> None:
        """Copy data (any bytes-like object) to dptr + offset and wait for it: one
        aqua_copy_batch() from host memory, so it works on a real GPU as on simcuda. The bytes
        must lie in the mapped window."""
        view = memoryview(data).cast("B")
        n = view.nbytes
        self._window("Tensor.write", offset, n)
        if n == 0:
            return
        if view.readonly:
            buf = (ctypes.c_char * n).from_buffer_copy(view)
        else:
            buf = (ctypes.c_char * n).from_buffer(view)
        self.context.copy([(self.dptr + offset, ctypes.addressof(buf), n)]).wait()

    def read(self, offset: int, nbytes: int) -> bytes:
        """Copy nbytes at dptr + offset to host memory and return them (aqua_copy_batch(),
        then its wait)."""
        buf = bytearray(_args.integer(nbytes, "nbytes", 0, _args.I32_MAX, "Tensor.read"))
        self.read_into(offset, buf)
        return bytes(buf)

    def read_into(self, offset: int, out: Union[bytearray, memoryview]) -> None:
        """Copy len(out) bytes at dptr + offset into the writable buffer out."""
        view = memoryview(out).cast("B")
        n = view.nbytes
        self._window("Tensor.read", offset, n)
        if n == 0:
            return
        buf = (ctypes.c_char * n).from_buffer(view)
        self.context.copy([(ctypes.addressof(buf), self.dptr + offset, n)]).wait()

    # ------------------------------------------------------------------ lifetime

    def free(self) -> None:
        """Unmap and release every chunk (peer chunks go back to their lease) and the range.
        Waits for libaqua's copies still in flight. Freeing twice does nothing."""
        ctx = self.context
        with ctx._lock:
            if self._h is None or ctx.closed:
                self._h = None
                return
            ctx._lib.aqua_tensor_free(ctx._handle(), self._h)
            ctx._tensors.pop(self._h, None)
            self._h = None

    def __enter__(self) -> Tensor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "freed" if self.closed else f"{self.max_bytes} bytes at 0x{self.dptr:x}"
        return f"<aqua.Tensor {state}>"
