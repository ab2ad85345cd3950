"""The few CUDA driver calls the tests make themselves (streams, events, host functions),
through ctypes on the driver libaqua uses ($AQUA_CUDA_LIBRARY: simcuda)."""

import ctypes
import os
import threading

cu = ctypes.CDLL(os.environ["AQUA_CUDA_LIBRARY"])
HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
CUDA_ERROR_NOT_READY = 600


def ok(r: int) -> None:
    assert r == 0, f"CUDA error {r}"


def use_device(device: int) -> None:
    d, c = ctypes.c_int(), ctypes.c_void_p()
    ok(cu.cuInit(0))
    ok(cu.cuDeviceGet(ctypes.byref(d), device))
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(c), d))
    ok(cu.cuCtxSetCurrent(c))


def stream() -> int:
    s = ctypes.c_void_p()
    ok(cu.cuStreamCreate(ctypes.byref(s), 1))  # CU_STREAM_NON_BLOCKING
    return s.value


def event() -> int:
    e = ctypes.c_void_p()
    ok(cu.cuEventCreate(ctypes.byref(e), 0))
    return e.value


def record(ev: int, st: int) -> None:
    ok(cu.cuEventRecord(ctypes.c_void_p(ev), ctypes.c_void_p(st)))


def event_done(ev: int) -> bool:
    r = cu.cuEventQuery(ctypes.c_void_p(ev))
    assert r in (0, CUDA_ERROR_NOT_READY), r
    return r == 0


class Gate:
    """A host function queued on a stream that holds everything queued after it until open()."""

    def __init__(self, st: int) -> None:
        self._open = threading.Event()
        self._fn = HOST_FN(lambda _: self._open.wait(30) and None)
        ok(cu.cuLaunchHostFunc(ctypes.c_void_p(st), self._fn, None))

    def open(self) -> None:
        self._open.set()
