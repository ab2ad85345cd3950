"""Finding libaqua.so.0, checking its version, and its C declarations (aqua.h) for ctypes.

Nothing here is public: the rest of the package calls ``lib()`` for the loaded library and uses
the structures below, which mirror ``libaqua/include/aqua/aqua.h`` field for field.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

#: The ABI this package was written for: aqua.h's AQUA_VERSION_MAJOR and AQUA_VERSION_MINOR.
ABI_VERSION = (0, 1)

SONAME = "libaqua.so.0"

c_u64 = ctypes.c_uint64
c_enum = ctypes.c_int
c_p = ctypes.c_void_p
P = ctypes.POINTER


class LibraryNotFoundError(ImportError):
    """libaqua.so.0 could not be loaded; ``tried`` lists each place and why it failed."""

    def __init__(self, tried: list[str]) -> None:
        self.tried = tried
        super().__init__(
            f"{SONAME} not found; tried:\n  " + "\n  ".join(tried) + "\n"
            "Build it (make build), install it (meson install -C build), set $AQUA_LIBRARY "
            "to its path, or call aqua.load_library(path)."
        )


class LibraryVersionError(ImportError):
    """The library's version is not the ABI this package was written for."""


class Options(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("endpoint", ctypes.c_char_p),
        ("side_path", ctypes.c_char_p),
        ("client_name", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int),
        ("chunk_bytes", c_u64),
        ("server_key", ctypes.c_char_p),
        ("public_key", ctypes.c_char_p),
        ("secret_key", ctypes.c_char_p),
    ]


class Info(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_int),
        ("role", c_enum),
        ("gpu_uuid", ctypes.c_char * 48),
        ("paired_with", ctypes.c_char * 48),
        ("capacity", c_u64),
        ("granularity", c_u64),
        ("chunk_bytes", c_u64),
        ("client_id", c_u64),
        ("connected", ctypes.c_bool),
        ("dram_budget", c_u64),
        ("reclaim_deadline_ms", c_u64),
        ("offered_bytes", c_u64),
        ("borrowed_bytes", c_u64),
        ("dram_bytes", c_u64),
        ("tensor_peer_bytes", c_u64),
        ("tensor_local_bytes", c_u64),
        ("tensor_dram_bytes", c_u64),
        ("pool_free_bytes", c_u64),
        ("dram_granted", c_u64),
    ]


class InfoBuffer(ctypes.Structure):
    # struct aqua_info has no size field: the library writes all of its own. The reserve keeps
    # a later minor version's added fields from writing past the buffer.
    _fields_ = [("info", Info), ("_reserve", c_u64 * 32)]


class Grant(ctypes.Structure):
    _fields_ = [
        ("lease", c_p),
        ("dptr", c_u64),
        ("bytes", c_u64),
        ("dram_bytes", c_u64),
        ("partial", ctypes.c_bool),
    ]


class LeaseInfo(ctypes.Structure):
    _fields_ = [
        ("lease_id", c_u64),
        ("dptr", c_u64),
        ("bytes", c_u64),
        ("peer_bytes", c_u64),
        ("dram_bytes", c_u64),
        ("n_chunks", ctypes.c_size_t),
        ("chunk_bytes", c_u64),
    ]


class ChunkInfo(ctypes.Structure):
    _fields_ = [
        ("chunk_id", c_u64),
        ("offset", c_u64),
        ("bytes", c_u64),
        ("tier", c_enum),
        ("host", c_p),
    ]


class Load(ctypes.Structure):
    _fields_ = [("load", ctypes.c_double), ("used_bytes", c_u64), ("free_bytes", c_u64)]


class Event(ctypes.Structure):
    _fields_ = [
        ("type", c_enum),
        ("lease", c_p),
        ("offset", c_u64),
        ("bytes", c_u64),
        ("error", ctypes.c_int),
        ("tensor", c_p),
        ("tier", c_enum),
        ("host", c_p),
    ]


class TensorOptions(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("chunk_bytes", c_u64),
        ("tier", c_enum),
        ("flags", ctypes.c_uint),
    ]


class TensorInfo(ctypes.Structure):
    _fields_ = [
        ("dptr", c_u64),
        ("max_bytes", c_u64),
        ("chunk_bytes", c_u64),
        ("begin", c_u64),
        ("end", c_u64),
        ("peer_bytes", c_u64),
        ("local_bytes", c_u64),
        ("dram_bytes", c_u64),
    ]


class TensorRange(ctypes.Structure):
    _fields_ = [("offset", c_u64), ("bytes", c_u64), ("tier", c_enum), ("host", c_p)]


class CopyPiece(ctypes.Structure):
    _fields_ = [("dst", c_u64), ("src", c_u64), ("bytes", c_u64)]


#: The structures whose layout tests compare with the C compiler's (python/tests/layout.c).
STRUCTS = {
    "aqua_options": Options,
    "aqua_info": Info,
    "aqua_grant": Grant,
    "aqua_lease_info": LeaseInfo,
    "aqua_chunk_info": ChunkInfo,
    "aqua_load": Load,
    "aqua_event": Event,
    "aqua_tensor_options": TensorOptions,
    "aqua_tensor_info": TensorInfo,
    "aqua_tensor_range": TensorRange,
    "aqua_copy_piece": CopyPiece,
}

LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, c_p)

i32 = ctypes.c_int
u64p = P(c_u64)
# name: (restype, argtypes)
PROTOTYPES: dict[str, tuple[object, tuple[object, ...]]] = {
    "aqua_strerror": (ctypes.c_char_p, (i32,)),
    "aqua_version": (ctypes.c_char_p, ()),
    "aqua_set_log": (None, (LOG_FN, c_p, i32)),
    "aqua_open": (i32, (i32, i32, P(Options), P(c_p))),
    "aqua_close": (c_p, (c_p,)),
    "aqua_get_info": (i32, (c_p, P(InfoBuffer))),
    "aqua_device_memory": (i32, (c_p, u64p, u64p)),
    "aqua_offer": (i32, (c_p, c_u64, u64p)),
    "aqua_reclaim": (i32, (c_p, c_u64, i32, u64p)),
    "aqua_reclaim_async": (i32, (c_p, c_u64)),
    "aqua_borrow": (i32, (c_p, c_u64, c_u64, ctypes.c_uint, P(Grant))),
    "aqua_return": (i32, (c_p, c_p)),
    "aqua_return_dram": (i32, (c_p, c_u64)),
    "aqua_lease_get_info": (i32, (c_p, c_p, P(LeaseInfo))),
    "aqua_lease_get_chunk": (i32, (c_p, c_p, ctypes.c_size_t, P(ChunkInfo))),
    "aqua_report_load": (i32, (c_p, P(Load))),
    "aqua_poll": (i32, (c_p, P(Event), ctypes.c_size_t, P(ctypes.c_size_t))),
    "aqua_fd": (i32, (c_p, P(i32))),
    "aqua_tensor_new": (i32, (c_p, c_u64, P(TensorOptions), P(c_p))),
    "aqua_tensor_free": (c_p, (c_p, c_p)),
    "aqua_tensor_dptr": (c_u64, (c_p,)),
    "aqua_tensor_get_info": (i32, (c_p, c_p, P(TensorInfo))),
    "aqua_tensor_grow": (i32, (c_p, c_p, c_u64)),
    "aqua_tensor_trim": (i32, (c_p, c_p, c_u64, c_u64)),
    "aqua_tensor_get_range": (i32, (c_p, c_p, c_u64, P(TensorRange))),
    "aqua_tensor_promote": (i32, (c_p, c_p, ctypes.c_bool, c_u64, u64p)),
    "aqua_copy_batch": (i32, (c_p, P(CopyPiece), ctypes.c_size_t, c_p, c_p, c_p, u64p)),
    "aqua_copy_query": (i32, (c_p, c_u64)),
    "aqua_copy_wait": (i32, (c_p, c_u64)),
    "aqua_layers_new": (i32, (c_p, ctypes.c_uint, c_p, c_p, P(c_p))),
    "aqua_layers_free": (c_p, (c_p,)),
    "aqua_layers_offload": (i32, (c_p, ctypes.c_uint, P(CopyPiece), ctypes.c_size_t, c_p)),
    "aqua_layers_prefetch": (i32, (c_p, ctypes.c_uint, P(CopyPiece), ctypes.c_size_t, c_p)),
    "aqua_layers_event": (i32, (c_p, ctypes.c_uint, P(c_p))),
    "aqua_layers_query": (i32, (c_p, ctypes.c_uint)),
    "aqua_layers_wait": (i32, (c_p, ctypes.c_uint)),
}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_path: str | None = None
_hooks: list = []  # called with the library once it is loaded (logging)


def check_version(version: str, path: str = SONAME) -> None:
    """Raise LibraryVersionError unless version ("major.minor.patch") has the ABI of
    ABI_VERSION: the same major, and a minor at least ours (the same minor while major is 0,
    where every minor may change the ABI)."""
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        raise LibraryVersionError(f"{path}: unreadable version {version!r}") from None
    want_major, want_minor = ABI_VERSION
    ok = major == want_major and (minor == want_minor if major == 0 else minor >= want_minor)
    if not ok:
        raise LibraryVersionError(
            f"{path} is libaqua {version}; this aqua package was written for ABI "
            f"{want_major}.{want_minor} (aqua.h AQUA_VERSION_MAJOR.MINOR)"
        )


def _candidates() -> list[tuple[str, str | None, str]]:
    """(how, path or None, why not) in search order; path None means nothing to try there."""
    out: list[tuple[str, str | None, str]] = []
    env = os.environ.get("AQUA_LIBRARY")
    out.append(("$AQUA_LIBRARY", env or None, "unset"))

    # Installed: the dynamic loader's cache (ldconfig), then pkg-config's libdir for aqua.pc.
    found = ctypes.util.find_library("aqua")
    out.append(("ldconfig", found, "no libaqua in the loader cache"))
    why = "pkg-config not installed"
    libdir = None
    if shutil.which("pkg-config"):
        try:
            libdir = subprocess.run(
                ["pkg-config", "--variable=libdir", "aqua"],
                capture_output=True, text=True, timeout=10, check=True,
            ).stdout.strip() or None
        except (subprocess.SubprocessError, OSError):
            why = "pkg-config knows no aqua.pc"
    out.append(("pkg-config aqua", os.path.join(libdir, SONAME) if libdir else None, why))

    # The build tree: $AQUA_BUILD; the build folder a virtual environment sits in (build/venv);
    # the checkout this package's source is in (python/aqua -> build/).
    builds = []
    if os.environ.get("AQUA_BUILD"):
        builds.append(("$AQUA_BUILD", Path(os.environ["AQUA_BUILD"])))
    if sys.prefix != sys.base_prefix:
        builds.append(("the virtual environment's build folder", Path(sys.prefix).parent))
    builds.append(("the checkout's build folder", Path(__file__).resolve().parents[2] / "build"))
    for how, build in builds:
        out.append((how, str(build / "libaqua" / SONAME), ""))
    return out


def load(path: str | os.PathLike[str] | None = None) -> ctypes.CDLL:
    """Load libaqua (once per process): path if given, else the first of _candidates() that
    loads. Checks aqua_version() against ABI_VERSION and declares every prototype."""
    global _lib, _path
    with _lock:
        if _lib is not None:
            if path is not None and os.path.realpath(path) != os.path.realpath(_path or ""):
                raise RuntimeError(f"libaqua is already loaded from {_path}")
            return _lib
        tried: list[str] = []
        if path is not None:
            cands = [("explicit path", os.fspath(path), "")]
        else:
            cands = _candidates()
        lib = None
        for how, p, why in cands:
            if p is None:
                tried.append(f"{how}: {why}")
                continue
            if os.path.sep in p and not os.path.exists(p):
                tried.append(f"{how}: {p} does not exist")
                continue
            try:
                lib = ctypes.CDLL(p)
            except OSError as e:
                tried.append(f"{how}: {p}: {e}")
                continue
            break
        if lib is None:
            raise LibraryNotFoundError(tried)
        where = getattr(lib, "_name", p) or SONAME
        try:
            lib.aqua_version.restype = ctypes.c_char_p
            lib.aqua_version.argtypes = ()
        except AttributeError:
            raise LibraryVersionError(f"{where} has no aqua_version(): not libaqua") from None
        check_version(lib.aqua_version().decode(), where)
        for name, (restype, argtypes) in PROTOTYPES.items():
            try:
                f = getattr(lib, name)
            except AttributeError:
                raise LibraryVersionError(f"{where} lacks {name}()") from None
            f.restype = restype
            f.argtypes = argtypes
        _lib, _path = lib, where
        for hook in _hooks:
            hook(lib)
        return lib


def lib() -> ctypes.CDLL:
    """The loaded library, loading it from the default places on first use."""
    return _lib if _lib is not None else load()


def loaded_path() -> str | None:
    return _path
