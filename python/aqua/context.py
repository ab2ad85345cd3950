"""Contexts (Producer, Consumer), leases, copy batches and layer-wise transfers."""

from __future__ import annotations

import ctypes
import errno
import os
import select
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional, TypeVar

from . import _args, _ffi, errors, log
from ._handles import EventLike, StreamLike, event_handle, stream_handle
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
    Tier,
    UnknownEvent,
)
from .tensor import Tensor

# ------------------------------------------------------------- the events that carry objects


@dataclass(frozen=True)
class Migrated(Event):
    """Consumer: a reclaim moved the chunk at lease offset to DRAM (see Lease.chunks())."""

    lease: "Lease"
    offset: int
    nbytes: int


@dataclass(frozen=True)
class ReclaimFailed(Event):
    """Consumer: a reclaim notice could not be honoured; errno says why."""

    lease: "Optional[Lease]"
    tensor: "Optional[Tensor]"
    errno: int


@dataclass(frozen=True)
class LeaseLost(Event):
    """Consumer: the daemon no longer knows this lease (after its restart); its chunks were
    moved to DRAM like a reclaim. Give it back."""

    lease: "Lease"


@dataclass(frozen=True)
class TensorMigrated(Event):
    """Consumer: chunks of a tensor changed tier outside a call on it (a reclaim). host is
    None when the device address still holds the run, else the host address of its first byte."""

    tensor: "Tensor"
    offset: int
    nbytes: int
    tier: Tier
    host: Optional[int]


_T = TypeVar("_T")
_POLL_BATCH = 64
_FOREVER = -1


def _timeout_ms(timeout: Optional[float], call: str = "timeout") -> int:
    t = _args.seconds(timeout, "timeout", call)
    if t is None:
        return _FOREVER
    return int(min(t * 1000, _args.I32_MAX))


def _u64(value: int, what: str, call: str = "aqua") -> int:
    return _args.u64(value, what, call)


def _pieces(pieces: Iterable[Any]) -> tuple[Any, int]:
    """A ctypes array of struct aqua_copy_piece from (dst, src, nbytes) triples, or such an
    array as it is (made from a buffer of uint64 triples, for batches built with numpy)."""
    if isinstance(pieces, ctypes.Array) and pieces._type_ is _ffi.CopyPiece:
        if not len(pieces):
            raise ValueError("a copy batch needs at least one piece")
        return pieces, len(pieces)
    items = [p if isinstance(p, CopyPiece) else CopyPiece(*p) for p in pieces]
    if not items:
        raise ValueError("a copy batch needs at least one piece")
    arr = (_ffi.CopyPiece * len(items))()
    for i, (dst, src, nbytes) in enumerate(items):
        arr[i].dst = _args.u64(dst, f"piece {i}: dst", "copy")
        arr[i].src = _args.u64(src, f"piece {i}: src", "copy")
        arr[i].bytes = _args.u64(nbytes, f"piece {i}: nbytes", "copy")
    return arr, len(items)


class Context:
    """One libaqua context: one GPU of this process, registered with aquad in one role.

    Use Producer or Consumer; Context itself registers a neutral GPU. Close it with close() or
    a with block: that unmaps and releases everything it holds. Objects it handed out (leases,
    tensors, tickets, layers) raise ClosedError once it is closed. Calls on one context are
    serialized by a lock; an engine makes them from its scheduler thread.
    """

    role: Role = Role.NEUTRAL

    def __init__(
        self,
        device: int = 0,
        *,
        endpoint: Optional[str] = None,
        side_path: Optional[str] = None,
        client_name: Optional[str] = None,
        timeout: Optional[float] = None,
        chunk_bytes: int = 0,
        library: Optional[str | os.PathLike[str]] = None,
    ) -> None:
        """Connect to aquad and register CUDA device ordinal ``device``.

        Args:
            endpoint: aquad's ZeroMQ endpoint (default: $AQUA_ENDPOINT, else
                ipc:///run/aqua/aquad.sock).
            side_path: its side channel (default: $AQUA_SIDE_PATH, else from the endpoint).
            client_name: shown to operators (default: the program's name).
            timeout: seconds for connecting and for each blocking request (default 5).
            chunk_bytes: producer: the size of each offered chunk (default 32 MiB).
            library: the libaqua.so.0 to load, if not loaded yet (see load_library()).

        Raises:
            NotConnectedError: no daemon at the endpoint. BusyError: the GPU is registered by
            another live process. AquaError: any other refusal (errno EACCES, EUSERS, ENODEV,
            ELIBACC...); its ``detail`` has the daemon's words where it gave a reason.
        """
        self._h: Optional[int] = None
        self._lock = threading.RLock()
        self._leases: dict[int, Lease] = {}
        self._tensors: dict[int, Tensor] = {}
        self._layers: dict[int, Layers] = {}
        self._fd: Optional[int] = None
        # poll()'s buffers, made once: an engine polls every iteration.
        self._poll_events = (_ffi.Event * _POLL_BATCH)()
        self._poll_n = ctypes.c_size_t()
        self._lib = _ffi.load(library) if library is not None else _ffi.lib()
        self.device = _args.integer(device, "device", 0, _args.I32_MAX, type(self).__name__)
        self._wake: Optional[tuple[int, int]] = None
        self._opts = _ffi.Options(
            size=ctypes.sizeof(_ffi.Options),
            endpoint=endpoint.encode() if endpoint else None,
            side_path=os.fsencode(side_path) if side_path else None,
            client_name=client_name.encode() if client_name else None,
            timeout_ms=0 if timeout is None else max(1, _timeout_ms(timeout, type(self).__name__)),
            chunk_bytes=_u64(chunk_bytes, "chunk_bytes", type(self).__name__),
        )
        h = ctypes.c_void_p()
        with log.capture() as messages:
            r = self._lib.aqua_open(self.device, int(self.role), ctypes.byref(self._opts),
                                    ctypes.byref(h))
        if r != 0:
            raise errors.error("aqua_open", r, "; ".join(messages) or None)
        self._h = h.value
        # close() from another thread wakes a poll() blocked on fileno() through this pipe.
        self._wake = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    # ----------------------------------------------------------------------- plumbing

    def _handle(self) -> int:
        h = self._h
        if h is None:
            raise errors.ClosedError(f"{self!r} is closed")
        return h

    def _call(self, name: str, *args: Any) -> int:
        """Call name(ctx, *args) under the lock and return its result (not checked)."""
        with self._lock:
            return getattr(self._lib, name)(self._handle(), *args)

    def _check(self, name: str, *args: Any) -> None:
        errors.check(name, self._call(name, *args))

    @property
    def closed(self) -> bool:
        return self._h is None

    def close(self) -> None:
        """Unmap and release every lease, tensor and chunk this context holds, then disconnect.
        The daemon sees the disconnect at once. Closing twice does nothing."""
        with self._lock:
            if self._h is None:
                return
            for layers in list(self._layers.values()):
                layers._release()
            for tensor in self._tensors.values():
                tensor._h = None
            for lease in self._leases.values():
                lease._h = None
            self._tensors.clear()
            self._leases.clear()
            h, self._h = self._h, None
            self._lib.aqua_close(h)
            if self._wake is not None:
                r, w = self._wake
                self._wake = None
                os.write(w, b"x")
                os.close(w)
                os.close(r)

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_h", None) is not None:
            warnings.warn(f"unclosed {self!r}", ResourceWarning, stacklevel=2)
            try:
                self.close()
            except Exception:
                pass

    def __repr__(self) -> str:
        state = "closed" if self._h is None else f"0x{self._h:x}"
        return f"<aqua.{type(self).__name__} device {getattr(self, 'device', '?')} {state}>"

    # ----------------------------------------------------------------------- both roles

    def info(self) -> Info:
        """The context's state as last known locally (no round trip)."""
        buf = _ffi.InfoBuffer()
        self._check("aqua_get_info", ctypes.byref(buf))
        i = buf.info
        return Info(
            device=i.device, role=Role(i.role), gpu_uuid=i.gpu_uuid.decode(),
            paired_with=i.paired_with.decode() or None, capacity=i.capacity,
            granularity=i.granularity, chunk_bytes=i.chunk_bytes, client_id=i.client_id,
            connected=bool(i.connected), dram_budget=i.dram_budget,
            reclaim_deadline=i.reclaim_deadline_ms / 1000, offered_bytes=i.offered_bytes,
            borrowed_bytes=i.borrowed_bytes, dram_bytes=i.dram_bytes,
            tensor_peer_bytes=i.tensor_peer_bytes, tensor_local_bytes=i.tensor_local_bytes,
            tensor_dram_bytes=i.tensor_dram_bytes, pool_free_bytes=i.pool_free_bytes,
            dram_granted=i.dram_granted,
        )

    def device_memory(self) -> tuple[int, int]:
        """The device's (free, total) bytes as its driver reports them: device-wide, every
        process's allocations counted (aqua_device_memory)."""
        free_b, total = ctypes.c_uint64(), ctypes.c_uint64()
        self._check("aqua_device_memory", ctypes.byref(free_b), ctypes.byref(total))
        return free_b.value, total.value

    def fileno(self) -> int:
        """A descriptor that becomes readable when poll() has work: give it to select,
        selectors or asyncio's loop.add_reader(). It is edge-like: call poll() until it returns
        nothing before waiting again. Do not read from it or close it."""
        if self._fd is None:
            fd = ctypes.c_int()
            self._check("aqua_fd", ctypes.byref(fd))
            self._fd = fd.value
        self._handle()
        return self._fd

    def report_load(self, load: float, used_bytes: int = 0, free_bytes: int = 0) -> None:
        """Tell the daemon the engine's load (0..1) without waiting for an answer.

        Raises NotConnectedError when the daemon is away (report again after Reconnected),
        AquaError with errno EAGAIN when the outgoing queue is full."""
        if isinstance(load, bool) or not isinstance(load, (int, float)) or not 0.0 <= load <= 1.0:
            raise errors.InvalidArgumentError("report_load", -errno.EINVAL,
                                              f"load must be within 0..1, not {load!r}")
        ld = _ffi.Load(load=load, used_bytes=_u64(used_bytes, "used_bytes", "report_load"),
                       free_bytes=_u64(free_bytes, "free_bytes", "report_load"))
        self._check("aqua_report_load", ctypes.byref(ld))

    def poll(self, timeout: Optional[float] = 0.0) -> list[Event]:
        """Handle what the daemon has sent and return the events, oldest first.

        Reclaim notices are honoured in here (a consumer's affected chunks are copied to DRAM
        at the same addresses), so call it at a safe point of each engine iteration, when no
        kernel uses memory a reclaim could move. timeout 0 (the default) never blocks; a
        positive timeout (seconds; None: no limit) waits on fileno() until an event arrives.
        """
        timeout = _args.seconds(timeout, "timeout", "poll")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            events = self._drain()
            if events:
                return events
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return events
            wake = self._wake
            if wake is None:
                raise errors.ClosedError(f"{self!r} is closed")
            try:
                select.select([self.fileno(), wake[0]], [], [], left)
            except (OSError, ValueError):
                # close() in another thread closed the descriptors under us.
                if self._h is None:
                    raise errors.ClosedError(f"{self!r} was closed while polling") from None
                raise

    def _drain(self) -> list[Event]:
        out: list[Event] = []
        arr, n = self._poll_events, self._poll_n
        with self._lock:
            while True:
                self._check("aqua_poll", arr, _POLL_BATCH, ctypes.byref(n))
                out.extend(self._event(arr[i]) for i in range(n.value))
                if n.value < _POLL_BATCH:
                    return out

    def _event(self, e: Any) -> Event:
        lease = self._leases.get(e.lease) if e.lease else None
        tensor = self._tensors.get(e.tensor) if e.tensor else None
        t = e.type
        if t == 1:
            return Reclaimed(e.bytes)
        if t == 2 and lease is not None:
            return Migrated(lease, e.offset, e.bytes)
        if t == 3:
            return ReclaimFailed(lease, tensor, -e.error)
        if t == 4 and lease is not None:
            return LeaseLost(lease)
        if t == 5:
            return PairChanged()
        if t == 6:
            return DaemonStopping()
        if t == 7 and tensor is not None:
            return TensorMigrated(tensor, e.offset, e.bytes, Tier(e.tier), e.host or None)
        if t == 8:
            return Disconnected()
        if t == 9:
            return Reconnected()
        return UnknownEvent(t)

    def copy(
        self,
        pieces: Iterable[CopyPiece | tuple[int, int, int]],
        *,
        stream: StreamLike = None,
        wait_event: EventLike = None,
        done_event: EventLike = None,
    ) -> Ticket:
        """Copy (dst, src, nbytes) pieces asynchronously as one batch.

        Addresses are device addresses or host addresses (pinned or pageable), any tier to any
        tier. The batch runs on stream (None: libaqua's own), after wait_event, and records
        done_event when complete; streams and events are raw handles (int) or torch / cupy /
        cuda-python objects. Memory the pieces name must stay mapped (and host buffers alive)
        until the batch completes: see Ticket.wait().
        """
        arr, n = _pieces(pieces)
        ticket = ctypes.c_uint64()
        self._check("aqua_copy_batch", arr, n, stream_handle(stream), event_handle(wait_event),
                    event_handle(done_event), ctypes.byref(ticket))
        return Ticket(self, ticket.value)

    def layers(self, n_layers: int, *, offload_stream: StreamLike = None,
               prefetch_stream: StreamLike = None) -> Layers:
        """Layer-wise offload and prefetch for n_layers layers, on the given streams (None:
        libaqua creates its own). Free it with close() or a with block (the context's close()
        frees it too)."""
        n_layers = _args.integer(n_layers, "n_layers", 1, _args.U32_MAX, "layers")
        h = ctypes.c_void_p()
        self._check("aqua_layers_new", n_layers, stream_handle(offload_stream),
                    stream_handle(prefetch_stream), ctypes.byref(h))
        layers = Layers(self, h.value, int(n_layers), (offload_stream, prefetch_stream))
        self._layers[h.value] = layers  # type: ignore[index]
        return layers


class Producer(Context):
    """A context that lends memory of its GPU: offer() it, reclaim() it when the engine's own
    load rises."""

    role = Role.PRODUCER

    def offer(self, nbytes: int) -> int:
        """Allocate nbytes (whole chunks) on the GPU and offer them to the daemon's pool.
        Returns the bytes offered (less when the GPU ran out). Raises NoMemoryError-like
        AquaError (errno ENOMEM) when not one chunk fits, LimitError at the daemon's limit."""
        offered = ctypes.c_uint64()
        self._check("aqua_offer", _u64(nbytes, "nbytes", "offer"), ctypes.byref(offered))
        return offered.value

    def reclaim(self, nbytes: int = ALL, timeout: Optional[float] = None) -> ReclaimResult:
        """Take back nbytes (ALL: everything offered) and free them on the GPU, waiting up to
        timeout seconds (None: no limit) while consumers move off leased chunks. With the
        timeout passed the result is incomplete; the rest arrives as Reclaimed events."""
        freed = ctypes.c_uint64()
        r = self._call("aqua_reclaim", _u64(nbytes, "nbytes", "reclaim"), _timeout_ms(timeout, "reclaim"),
                       ctypes.byref(freed))
        if r not in (0, errors.Outcome.TIMEOUT):
            raise errors.error("aqua_reclaim", r)
        return ReclaimResult(freed.value, r == 0)

    def reclaim_async(self, nbytes: int = ALL) -> None:
        """Ask for nbytes back without waiting: each freed chunk is reported by poll() as a
        Reclaimed event."""
        r = self._call("aqua_reclaim_async", _u64(nbytes, "nbytes", "reclaim_async"))
        if r not in (0, errors.Outcome.PENDING):
            raise errors.error("aqua_reclaim_async", r)


class Consumer(Context):
    """A context that borrows peer GPU memory for its GPU: plain leases (borrow()) or capacity
    for aqua tensors (borrow(tensors=True), then tensor())."""

    role = Role.CONSUMER

    def borrow(self, nbytes: int, min_bytes: int = 0, *, allow_dram: bool = False,
               tensors: bool = False) -> Grant:
        """Borrow nbytes of peer GPU memory, accepting no less than min_bytes.

        allow_dram: a DRAM budget may make up what peers cannot. tensors: the lease becomes
        capacity for aqua tensors (its grant's dptr is 0). Blocks for at most the context's
        timeout. Raises NoMemoryError (nothing granted), BarredError, LimitError,
        ThrottledError, NotConnectedError, DaemonTimeoutError.
        """
        nbytes = _u64(nbytes, "nbytes", "borrow")
        min_bytes = _args.integer(min_bytes, "min_bytes", 0, nbytes, "borrow")
        flags = (1 if allow_dram else 0) | (2 if tensors else 0)
        g = _ffi.Grant()
        self._check("aqua_borrow", nbytes, min_bytes, flags, ctypes.byref(g))
        lease = None
        if g.lease:
            lease = Lease(self, g.lease, g.dptr, g.bytes, tensors)
            self._leases[g.lease] = lease
        return Grant(self, lease, g.dptr, g.bytes, g.dram_bytes, bool(g.partial))

    def give_back(self, lease: Lease) -> None:
        """Return a lease: unmap its range, release its chunks, tell the daemon. The lease is
        gone locally afterwards even when the daemon could not be told (NotConnectedError,
        DaemonTimeoutError: it reconciles later). BusyError: a tensor still uses one of a
        tensor pool lease's chunks; the lease stays."""
        if lease.context is not self:
            raise ValueError(f"{lease!r} belongs to another context")
        with self._lock:
            h = lease._handle()
            r = self._call("aqua_return", h)
            if r == -errno.EBUSY:
                raise errors.error("aqua_return", r)
            lease._h = None
            self._leases.pop(h, None)
        if r != 0:
            raise errors.error("aqua_return", r)

    def return_dram(self, nbytes: int) -> None:
        """Give back nbytes of DRAM budget (the caller unpinned that much host memory)."""
        self._check("aqua_return_dram", _u64(nbytes, "nbytes", "return_dram"))

    def tensor(self, max_bytes: int, *, chunk_bytes: int = 0, tier: Optional[Tier] = None,
               allow_local: bool = False, reclaim_local: bool = False) -> Tensor:
        """Reserve max_bytes (whole chunks) of device addresses for an aqua tensor; nothing is
        mapped until Tensor.grow().

        chunk_bytes: a multiple of the GPU's granularity (0: the first tensor pool lease's
        chunk size, else 32 MiB). tier: only that tier (None: automatic placement: free chunks
        of tensor pool leases, then local memory if allow_local, then DRAM within the granted
        budget). reclaim_local: a reclaim moves chunks to free local memory first.
        """

        opts = _ffi.TensorOptions(
            size=ctypes.sizeof(_ffi.TensorOptions), chunk_bytes=_u64(chunk_bytes, "chunk_bytes"),
            tier=int(Tier(tier)) if tier is not None else 0,
            flags=(1 if allow_local else 0) | (2 if reclaim_local else 0),
        )
        h = ctypes.c_void_p()
        self._check("aqua_tensor_new", _u64(max_bytes, "max_bytes"), ctypes.byref(opts),
                    ctypes.byref(h))
        t = Tensor(self, h.value)  # type: ignore[arg-type]
        self._tensors[h.value] = t  # type: ignore[index]
        return t

    def promote(self, *, include_local: bool = False, max_bytes: Optional[int] = None) -> int:
        """Move DRAM chunks (and local ones with include_local) of every tensor to free chunks
        of tensor pool leases, at most max_bytes (None: no limit). Returns the bytes moved."""
        moved = ctypes.c_uint64()
        self._check("aqua_tensor_promote", None, bool(include_local),
                    ALL if max_bytes is None else _u64(max_bytes, "max_bytes"),
                    ctypes.byref(moved))
        return moved.value


class Lease:
    """Borrowed peer memory mapped at dptr .. dptr + nbytes on the consumer's GPU.

    Owned by its context until give_back() (or a with block, or the context's close()); a
    reclaim moves its chunks to DRAM at the same addresses inside Consumer.poll().
    """

    def __init__(self, ctx: Consumer, h: int, dptr: int, nbytes: int, tensors: bool) -> None:
        self.context = ctx
        self._h: Optional[int] = h
        self.dptr = dptr  #: 0 for a tensor pool lease (its range is libaqua's)
        self.nbytes = nbytes
        self.for_tensors = tensors

    def _handle(self) -> int:
        self.context._handle()
        if self._h is None:
            raise errors.ClosedError(f"{self!r} was given back")
        return self._h

    @property
    def closed(self) -> bool:
        return self._h is None or self.context.closed

    def info(self) -> LeaseInfo:
        li = _ffi.LeaseInfo()
        with self.context._lock:
            self.context._check("aqua_lease_get_info", self._handle(), ctypes.byref(li))
        return LeaseInfo(li.lease_id, li.dptr, li.bytes, li.peer_bytes, li.dram_bytes,
                         li.n_chunks, li.chunk_bytes)

    def chunks(self) -> list[Chunk]:
        """Every chunk of the lease, where it lives now."""
        out = []
        ci = _ffi.ChunkInfo()
        with self.context._lock:
            for i in range(self.info().n_chunks):
                self.context._check("aqua_lease_get_chunk", self._handle(), i, ctypes.byref(ci))
                out.append(Chunk(ci.chunk_id, ci.offset, ci.bytes, Tier(ci.tier),
                                 ci.host or None))
        return out

    def give_back(self) -> None:
        """Consumer.give_back(self)."""
        self.context.give_back(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.closed:
            self.give_back()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.nbytes} bytes at 0x{self.dptr:x}"
        return f"<aqua.Lease {state}>"


@dataclass(frozen=True)
class Grant:
    """What Consumer.borrow() granted: a lease (None when only DRAM budget was granted) and
    a DRAM budget. As a with block it gives both back at its end."""

    context: Consumer
    lease: Optional[Lease]
    dptr: int  #: where the lease is mapped; 0 without one or for a tensor pool
    nbytes: int  #: peer memory mapped at dptr
    dram_bytes: int  #: DRAM budget granted: host memory the caller may pin
    partial: bool  #: less than asked for

    def __enter__(self) -> Grant:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.context.closed:
            return
        if self.lease is not None and not self.lease.closed:
            self.lease.give_back()
        if self.dram_bytes:
            self.context.return_dram(self.dram_bytes)


class Ticket:
    """A copy batch in flight (Context.copy())."""

    def __init__(self, ctx: Context, ticket: int) -> None:
        self.context = ctx
        self.id = ticket

    def done(self) -> bool:
        """True once the batch has completed."""
        r = self.context._call("aqua_copy_query", self.id)
        if r not in (0, errors.Outcome.PENDING):
            raise errors.error("aqua_copy_query", r)
        return r == 0

    def wait(self) -> None:
        """Block until the batch has completed."""
        self.context._check("aqua_copy_wait", self.id)

    def __repr__(self) -> str:
        return f"<aqua.Ticket {self.id}>"


class Layers:
    """Layer-by-layer offload (working memory -> tensor) and prefetch (tensor -> working
    memory) on two streams, with one completion event per layer (Context.layers())."""

    def __init__(self, ctx: Context, h: int, n: int, streams: tuple[object, object]) -> None:
        self.context = ctx
        self._h: Optional[int] = h
        self._n = n
        self._streams = streams  # the caller's stream objects live as long as libaqua uses them

    def __len__(self) -> int:
        return self._n

    def _handle(self) -> int:
        self.context._handle()
        if self._h is None:
            raise errors.ClosedError(f"{self!r} is closed")
        return self._h

    def _layer(self, layer: int) -> int:
        layer = _args.integer(layer, "layer", -(1 << 63), 1 << 63, "Layers")
        if not 0 <= layer < self._n:
            raise IndexError(f"layer {layer} out of range 0 .. {self._n - 1}")
        return layer

    def _do(self, name: str, *args: Any) -> int:
        with self.context._lock:
            return getattr(self.context._lib, name)(self._handle(), *args)

    def offload(self, layer: int, pieces: Iterable[CopyPiece | tuple[int, int, int]],
                computed: EventLike = None) -> None:
        """Queue layer's offload; it starts once the computed event has completed."""
        arr, n = _pieces(pieces)
        errors.check("aqua_layers_offload",
                     self._do("aqua_layers_offload", self._layer(layer), arr, n,
                              event_handle(computed)))

    def prefetch(self, layer: int, pieces: Iterable[CopyPiece | tuple[int, int, int]],
                 after: EventLike = None) -> None:
        """Queue layer's prefetch, after the event after (e.g. the compute freeing its
        destination). Make the compute stream wait for event(layer) before the layer runs."""
        arr, n = _pieces(pieces)
        errors.check("aqua_layers_prefetch",
                     self._do("aqua_layers_prefetch", self._layer(layer), arr, n,
                              event_handle(after)))

    def event(self, layer: int) -> int:
        """The CUevent (an int handle) recorded after layer's last queued transfer; valid until
        the Layers is closed."""
        ev = ctypes.c_void_p()
        errors.check("aqua_layers_event",
                     self._do("aqua_layers_event", self._layer(layer), ctypes.byref(ev)))
        return ev.value or 0

    def done(self, layer: int) -> bool:
        """True when layer's last queued transfer has completed (or none was queued)."""
        r = self._do("aqua_layers_query", self._layer(layer))
        if r not in (0, errors.Outcome.PENDING):
            raise errors.error("aqua_layers_query", r)
        return r == 0

    def wait(self, layer: int) -> None:
        """Block until layer's last queued transfer has completed."""
        errors.check("aqua_layers_wait", self._do("aqua_layers_wait", self._layer(layer)))

    def _release(self) -> None:
        if self._h is not None:
            self.context._lib.aqua_layers_free(self._h)
            self.context._layers.pop(self._h, None)
            self._h = None

    def close(self) -> None:
        """Free the streams libaqua created and the events; closing twice does nothing."""
        with self.context._lock:
            self._release()

    def __enter__(self) -> Layers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<aqua.Layers {self._n} layers{' closed' if self._h is None else ''}>"

