"""libaqua from Python through ctypes: the calls an engine written in Python makes.

No packages needed. The library is $AQUA_LIBRARY, else libaqua.so.0 from the build folder next
to this file's checkout, else the system's. Every function returns what aqua.h says: 0, a
negative errno, or a positive AQUA_* outcome; `check()` turns failures into AquaError.
"""
import ctypes
import ctypes.util
import os

AQUA_PENDING, AQUA_TIMEOUT, AQUA_NO_MEMORY, AQUA_BARRED, AQUA_LIMIT, AQUA_THROTTLED = range(1, 7)
ROLE_PRODUCER, ROLE_CONSUMER, ROLE_NEUTRAL = 1, 2, 3
BORROW_ALLOW_DRAM = 1 << 0
TIER_NAMES = {0: "none", 1: "peer", 2: "dram", 3: "local"}
AQUA_ALL = 2**64 - 1

(EVENT_RECLAIMED, EVENT_MIGRATED, EVENT_RECLAIM_FAILED, EVENT_LEASE_LOST, EVENT_PAIR_CHANGED,
 EVENT_DAEMON_STOPPING) = range(1, 7)


def _load():
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("AQUA_LIBRARY"),
                  os.path.join(here, "..", "..", "build", "libaqua", "libaqua.so.0"),
                  ctypes.util.find_library("aqua")]
    for path in candidates:
        if path and (os.path.exists(path) or not os.path.dirname(path)):
            return ctypes.CDLL(path)
    raise OSError("libaqua.so.0 not found: build it (make build) or set AQUA_LIBRARY")


lib = _load()
_has_tensors = hasattr(lib, "aqua_tensor_new")


class Options(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("endpoint", ctypes.c_char_p),
                ("side_path", ctypes.c_char_p), ("client_name", ctypes.c_char_p),
                ("timeout_ms", ctypes.c_int), ("chunk_bytes", ctypes.c_uint64)]


class Grant(ctypes.Structure):
    _fields_ = [("lease", ctypes.c_void_p), ("dptr", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("dram_bytes", ctypes.c_uint64), ("partial", ctypes.c_bool)]


class LeaseInfo(ctypes.Structure):
    _fields_ = [("lease_id", ctypes.c_uint64), ("dptr", ctypes.c_uint64),
                ("bytes", ctypes.c_uint64), ("peer_bytes", ctypes.c_uint64),
                ("dram_bytes", ctypes.c_uint64), ("n_chunks", ctypes.c_size_t),
                ("chunk_bytes", ctypes.c_uint64)]


class ChunkInfo(ctypes.Structure):
    _fields_ = [("chunk_id", ctypes.c_uint64), ("offset", ctypes.c_uint64),
                ("bytes", ctypes.c_uint64), ("tier", ctypes.c_int), ("host", ctypes.c_void_p)]


class Info(ctypes.Structure):
    # The leading fields of struct aqua_info; the padding leaves room for fields added later,
    # which the library writes and Python does not read.
    _fields_ = [("device", ctypes.c_int), ("role", ctypes.c_int),
                ("gpu_uuid", ctypes.c_char * 48), ("paired_with", ctypes.c_char * 48),
                ("capacity", ctypes.c_uint64), ("granularity", ctypes.c_uint64),
                ("chunk_bytes", ctypes.c_uint64), ("client_id", ctypes.c_uint64),
                ("connected", ctypes.c_bool), ("dram_budget", ctypes.c_uint64),
                ("reclaim_deadline_ms", ctypes.c_uint64), ("offered_bytes", ctypes.c_uint64),
                ("borrowed_bytes", ctypes.c_uint64), ("dram_bytes", ctypes.c_uint64),
                ("_reserved", ctypes.c_uint64 * 32)]


class Event(ctypes.Structure):
    # An array of these is written by aqua_poll(), so the layout must be the library's exactly:
    # libraries with aqua tensors have three more fields.
    _fields_ = [("type", ctypes.c_int), ("lease", ctypes.c_void_p), ("offset", ctypes.c_uint64),
                ("bytes", ctypes.c_uint64), ("error", ctypes.c_int)] + (
                    [("tensor", ctypes.c_void_p), ("tier", ctypes.c_int),
                     ("host", ctypes.c_void_p)] if _has_tensors else [])


def _proto(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = argtypes
    return f


P = ctypes.POINTER
_proto("aqua_strerror", ctypes.c_char_p, ctypes.c_int)
_proto("aqua_version", ctypes.c_char_p)
_proto("aqua_open", ctypes.c_int, ctypes.c_int, ctypes.c_int, P(Options), P(ctypes.c_void_p))
_proto("aqua_close", ctypes.c_void_p, ctypes.c_void_p)
_proto("aqua_get_info", ctypes.c_int, ctypes.c_void_p, P(Info))
_proto("aqua_borrow", ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64,
       ctypes.c_uint, P(Grant))
_proto("aqua_return", ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_proto("aqua_lease_get_info", ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, P(LeaseInfo))
_proto("aqua_lease_get_chunk", ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
       P(ChunkInfo))
_proto("aqua_poll", ctypes.c_int, ctypes.c_void_p, P(Event), ctypes.c_size_t,
       P(ctypes.c_size_t))
_proto("aqua_fd", ctypes.c_int, ctypes.c_void_p, P(ctypes.c_int))
_proto("aqua_offer", ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, P(ctypes.c_uint64))
_proto("aqua_reclaim", ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int,
       P(ctypes.c_uint64))


class AquaError(Exception):
    def __init__(self, what, r):
        super().__init__(f"{what}: {strerror(r)}")
        self.code = r


def strerror(r):
    return lib.aqua_strerror(r).decode()


def check(what, r, ok=(0,)):
    if r not in ok:
        raise AquaError(what, r)
    return r


class Context:
    """One libaqua context (one GPU, one role); close() or use it as a context manager."""

    def __init__(self, device, role, endpoint=None, client_name="python", chunk_bytes=0):
        self._opts = Options(size=ctypes.sizeof(Options),
                             endpoint=endpoint.encode() if endpoint else None,
                             client_name=client_name.encode(), chunk_bytes=chunk_bytes)
        self.ctx = ctypes.c_void_p()
        check("aqua_open", lib.aqua_open(device, role, ctypes.byref(self._opts),
                                         ctypes.byref(self.ctx)))

    def close(self):
        if self.ctx:
            lib.aqua_close(self.ctx)
            self.ctx = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def info(self):
        i = Info()
        check("aqua_get_info", lib.aqua_get_info(self.ctx, ctypes.byref(i)))
        return i

    def fd(self):
        fd = ctypes.c_int()
        check("aqua_fd", lib.aqua_fd(self.ctx, ctypes.byref(fd)))
        return fd.value

    # consumer
    def borrow(self, nbytes, min_bytes=0, flags=0):
        """A Grant, or None when nothing could be granted (AQUA_NO_MEMORY)."""
        g = Grant()
        r = lib.aqua_borrow(self.ctx, nbytes, min_bytes, flags, ctypes.byref(g))
        if r == AQUA_NO_MEMORY:
            return None
        check("aqua_borrow", r)
        return g

    def give_back(self, lease):
        return lib.aqua_return(self.ctx, lease)

    def lease_info(self, lease):
        li = LeaseInfo()
        check("aqua_lease_get_info", lib.aqua_lease_get_info(self.ctx, lease, ctypes.byref(li)))
        return li

    def chunks(self, lease):
        out = []
        for i in range(self.lease_info(lease).n_chunks):
            ci = ChunkInfo()
            check("aqua_lease_get_chunk",
                  lib.aqua_lease_get_chunk(self.ctx, lease, i, ctypes.byref(ci)))
            out.append(ci)
        return out

    def poll(self, max_events=16):
        """Handle what aquad sent (reclaims happen here); the events, as a list."""
        events = (Event * max_events)()
        n = ctypes.c_size_t()
        check("aqua_poll", lib.aqua_poll(self.ctx, events, max_events, ctypes.byref(n)))
        return list(events[:n.value])

    # producer
    def offer(self, nbytes):
        offered = ctypes.c_uint64()
        check("aqua_offer", lib.aqua_offer(self.ctx, nbytes, ctypes.byref(offered)))
        return offered.value

    def reclaim(self, nbytes=AQUA_ALL, timeout_ms=5000):
        freed = ctypes.c_uint64()
        check("aqua_reclaim", lib.aqua_reclaim(self.ctx, nbytes, timeout_ms, ctypes.byref(freed)),
              ok=(0, AQUA_TIMEOUT))
        return freed.value
