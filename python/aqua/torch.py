"""PyTorch tensors in borrowed memory: a ``torch.cuda.MemPool`` whose segments are pieces of an
aqua tensor (libaqua's arena), so that a reclaim moves their bytes to DRAM at the same device
addresses and torch never notices.

    import aqua, aqua.torch, torch
    with aqua.Consumer(0) as ctx:
        ctx.borrow(8 << 30, tensors=True, allow_dram=True)
        pool = aqua.torch.MemPool(ctx, 8 << 30)
        with torch.cuda.use_mem_pool(pool.torch_pool()):
            kv = torch.empty((64, 1 << 20), dtype=torch.float16, device="cuda:0")
        ...
        pool.poll()   # at a safe point of each step, instead of ctx.poll()

torch calls the allocator from its own threads, and libaqua's context is not thread-safe: the
allocator's calls and ``MemPool.poll()`` take one lock (in libaqua-torch.so). While a pool is
bound, poll through it and use the context from one thread. One pool per process.

torch itself is imported only by ``allocator()`` and ``torch_pool()``: everything else works
without it (the tests drive the allocator's entry points directly).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from typing import Any, Optional

from . import _ffi, errors
from ._values import Tier
from .context import Consumer, Event
from .tensor import Tensor

SONAME = "libaqua-torch.so.0"
ALLOC_FN = "aqua_torch_alloc"
FREE_FN = "aqua_torch_free"

_shim: Optional[ctypes.CDLL] = None
_shim_path: Optional[str] = None
_bound: Optional["MemPool"] = None


class ArenaInfo(ctypes.Structure):
    """What the pool holds: pieces handed out, their bytes, and the tensor's mapped bytes."""

    _fields_ = [("pieces", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("mapped_bytes", ctypes.c_uint64)]

    def __repr__(self) -> str:
        return (f"ArenaInfo(pieces={self.pieces}, bytes={self.bytes}, "
                f"mapped_bytes={self.mapped_bytes})")


def library_path() -> str:
    """Where libaqua-torch.so.0 is: beside the loaded libaqua, else where the loader finds it."""
    _ffi.lib()  # libaqua first: the companion library is found beside it
    tried = []
    here = _ffi.loaded_path()
    if here and os.path.sep in here:
        p = os.path.join(os.path.dirname(os.path.realpath(here)), SONAME)
        if os.path.exists(p):
            return p
        tried.append(f"beside {here}: {p} does not exist")
    found = ctypes.util.find_library("aqua-torch")
    if found:
        return found
    tried.append("the loader cache has no libaqua-torch")
    raise _ffi.LibraryNotFoundError(tried)


def _load_shim() -> ctypes.CDLL:
    global _shim, _shim_path
    if _shim is None:
        path = library_path()
        shim = ctypes.CDLL(path)
        p, i32, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_ssize_t
        shim.aqua_torch_bind.restype = i32
        shim.aqua_torch_bind.argtypes = (p, p, i32)
        shim.aqua_torch_alloc.restype = p
        shim.aqua_torch_alloc.argtypes = (sz, i32, p)
        shim.aqua_torch_free.restype = None
        shim.aqua_torch_free.argtypes = (p, sz, i32, p)
        shim.aqua_torch_poll.restype = i32
        shim.aqua_torch_poll.argtypes = (ctypes.POINTER(_ffi.Event), ctypes.c_size_t,
                                         ctypes.POINTER(ctypes.c_size_t))
        shim.aqua_torch_info.restype = i32
        shim.aqua_torch_info.argtypes = (ctypes.POINTER(ArenaInfo),)
        lib = _ffi.lib()
        lib.aqua_arena_new.restype = i32
        lib.aqua_arena_new.argtypes = (p, p, ctypes.c_uint64, ctypes.POINTER(p))
        lib.aqua_arena_free.restype = p
        lib.aqua_arena_free.argtypes = (p,)
        _shim, _shim_path = shim, path
    return _shim


class MemPool:
    """Device memory for PyTorch from an aqua tensor of max_bytes on ctx's GPU.

    The tensor is placed like any (ctx.tensor()): chunks of tensor pool leases
    (ctx.borrow(..., tensors=True)), then local memory if allow_local, then DRAM within the
    granted budget; tier names one tier instead. Pieces are aligned to align bytes.
    """

    def __init__(self, ctx: Consumer, max_bytes: int, *, chunk_bytes: int = 0,
                 tier: Optional[Tier] = None, allow_local: bool = False,
                 align: int = 512) -> None:
        global _bound
        if _bound is not None and not _bound.closed:
            raise errors.error("aqua_torch_bind", -errno.EBUSY, "one MemPool per process")
        shim = _load_shim()
        self.context = ctx
        self.tensor: Tensor = ctx.tensor(max_bytes, chunk_bytes=chunk_bytes, tier=tier,
                                         allow_local=allow_local)
        self._arena = ctypes.c_void_p()
        self.device: int = ctx.info().device
        try:
            with ctx._lock:
                errors.check("aqua_arena_new", _ffi.lib().aqua_arena_new(
                    ctx._handle(), self.tensor._handle(), align, ctypes.byref(self._arena)))
                errors.check("aqua_torch_bind",
                             shim.aqua_torch_bind(ctx._handle(), self._arena, self.device))
        except BaseException:
            self.tensor.free()
            raise
        _bound = self
        self._allocator: Any = None

    @property
    def closed(self) -> bool:
        return self._arena.value is None or self.context.closed

    def allocator(self) -> Any:
        """torch.cuda.memory.CUDAPluggableAllocator over this pool (imports torch)."""
        if self._allocator is None:
            import torch

            assert _shim_path is not None
            self._allocator = torch.cuda.memory.CUDAPluggableAllocator(_shim_path, ALLOC_FN,
                                                                       FREE_FN)
        return self._allocator

    def torch_pool(self) -> Any:
        """A torch.cuda.MemPool for ``with torch.cuda.use_mem_pool(...)`` (imports torch)."""
        import torch

        return torch.cuda.MemPool(self.allocator().allocator())

    def alloc(self, nbytes: int) -> int:
        """The allocator's own entry point: a device address of nbytes, as torch gets it.
        Raises NoMemoryError when the pool cannot give it (torch sees NULL)."""
        self._live()
        dptr = _load_shim().aqua_torch_alloc(nbytes, self.device, None)
        if not dptr:
            raise errors.error("aqua_torch_alloc", int(errors.Outcome.NO_MEMORY),
                               f"no room for {nbytes} bytes in the pool")
        return int(dptr)

    def free(self, dptr: int, nbytes: int = 0) -> None:
        """The allocator's free entry point."""
        self._live()
        _load_shim().aqua_torch_free(dptr, nbytes, self.device, None)

    def info(self) -> ArenaInfo:
        self._live()
        out = ArenaInfo()
        errors.check("aqua_torch_info", _load_shim().aqua_torch_info(ctypes.byref(out)))
        return out

    def poll(self) -> list[Event]:
        """ctx.poll() under the allocator's lock: reclaims move the pool's chunks in here."""
        self._live()
        arr = (_ffi.Event * 64)()
        n = ctypes.c_size_t()
        out: list[Event] = []
        with self.context._lock:
            while True:
                errors.check("aqua_torch_poll",
                             _load_shim().aqua_torch_poll(arr, 64, ctypes.byref(n)))
                out.extend(self.context._event(arr[i]) for i in range(n.value))
                if n.value < 64:
                    return out

    def close(self) -> None:
        """Unbind the allocator (torch must hold none of its memory any more) and free the
        tensor. The context's close() makes the pool unusable too."""
        global _bound
        if self._arena.value is None:
            return
        shim = _load_shim()
        shim.aqua_torch_bind(None, None, -1)
        if not self.context.closed:
            _ffi.lib().aqua_arena_free(self._arena)
            self.tensor.free()
        self._arena = ctypes.c_void_p()
        if _bound is self:
            _bound = None

    def _live(self) -> None:
        if self.closed:
            raise errors.ClosedError("MemPool is closed (or its context is)")

    def __enter__(self) -> "MemPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
