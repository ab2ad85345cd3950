"""Loading libaqua (search order, the ABI check), the C declarations against aqua.h, errors,
logging and stream handles: no daemon needed."""

import ctypes
import errno
import json
import logging
import os
import subprocess
import sys
import sysconfig

import pytest

import aqua
from aqua import _ffi


def run_python(code, **env):
    """code in a fresh interpreter (outside this virtual environment) that imports the
    installed package; returns (exit status, output)."""
    e = {k: v for k, v in os.environ.items()
         if k not in ("AQUA_LIBRARY", "AQUA_BUILD", "LD_LIBRARY_PATH")}
    e.update(env)
    e["PYTHONPATH"] = sysconfig.get_paths()["purelib"]
    p = subprocess.run([sys._base_executable, "-P", "-c", code], env=e, capture_output=True,
                       text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def test_loads_the_library_that_aqua_library_names():
    assert aqua.load_library() == os.environ["AQUA_LIBRARY"]
    assert aqua.version().startswith("0.1.")


def test_loads_an_explicit_path():
    rc, out = run_python("import aqua; print(aqua.load_library(%r))" % os.environ["AQUA_LIBRARY"])
    assert rc == 0, out
    assert out.strip() == os.environ["AQUA_LIBRARY"]


def test_finds_the_build_tree_by_aqua_build():
    rc, out = run_python("import aqua; print(aqua.load_library(), aqua.version())",
                         AQUA_BUILD=os.environ["AQUA_BUILD"])
    assert rc == 0, out
    path = os.path.join(os.environ["AQUA_BUILD"], "libaqua", "libaqua.so.0")
    if "ldconfig" not in out:  # an installed libaqua would come first
        assert out.split()[0] in (path, "libaqua.so.0") or out.startswith("/")


def test_finds_the_build_folder_its_virtual_environment_sits_in():
    # This interpreter is $AQUA_BUILD/venv's: without $AQUA_LIBRARY it finds the build's library.
    e = {k: v for k, v in os.environ.items()
         if k not in ("AQUA_LIBRARY", "AQUA_BUILD", "LD_LIBRARY_PATH")}
    p = subprocess.run([sys.executable, "-P", "-c", "import aqua; print(aqua.load_library())"],
                       env=e, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    found = p.stdout.strip()
    assert found == os.path.join(os.environ["AQUA_BUILD"], "libaqua", "libaqua.so.0") or \
        "libaqua" in found  # an installed libaqua.so.0 (ldconfig, pkg-config) comes first


def test_names_everything_it_tried_when_nothing_loads():
    rc, out = run_python("import aqua; aqua.version()", AQUA_LIBRARY="/nonexistent/libaqua.so.0",
                         PKG_CONFIG_PATH="/nonexistent")
    if "ldconfig: /" in out or "ldconfig: libaqua" in out:
        pytest.skip("libaqua is installed on this machine")
    assert rc != 0
    assert "LibraryNotFoundError" in out
    assert "$AQUA_LIBRARY: /nonexistent/libaqua.so.0 does not exist" in out
    assert "ldconfig:" in out and "pkg-config aqua:" in out
    assert "the checkout's build folder:" in out


def test_an_explicit_path_that_does_not_exist_is_named():
    rc, out = run_python("import aqua; aqua.load_library('/nonexistent/x.so')")
    assert rc != 0
    assert "explicit path: /nonexistent/x.so does not exist" in out


def test_refuses_a_library_of_another_abi():
    rc, out = run_python("import aqua; aqua.load_library(%r)"
                         % os.environ["AQUA_TEST_FAKE_LIBRARY"])
    assert rc != 0
    assert "LibraryVersionError" in out and "libaqua 9.0.0" in out and "ABI 0.1" in out


@pytest.mark.parametrize("version,ok", [("0.1.0", True), ("0.1.7", True), ("0.2.0", False),
                                        ("1.1.0", False), ("0", False), ("x.y", False)])
def test_the_abi_check_takes_the_same_minor_while_major_is_zero(version, ok):
    if ok:
        _ffi.check_version(version)
    else:
        with pytest.raises(aqua.LibraryVersionError):
            _ffi.check_version(version)


@pytest.fixture(scope="module")
def layout():
    out = subprocess.run([os.environ["AQUA_TEST_LAYOUT"]], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


def test_every_structure_has_the_layout_of_aqua_h(layout):
    for name, st in _ffi.STRUCTS.items():
        c = layout["structs"][name]
        assert ctypes.sizeof(st) == c["size"], name
        fields = {f[0]: getattr(st, f[0]).offset for f in st._fields_}
        assert fields == c["fields"], name


def test_constants_match_aqua_h(layout):
    c = layout["constants"]
    assert aqua.ABI_VERSION == (c["AQUA_VERSION_MAJOR"], c["AQUA_VERSION_MINOR"])
    for o in aqua.Outcome:
        assert c["AQUA_" + o.name] == o
    for r in aqua.Role:
        assert c["AQUA_ROLE_" + r.name] == r
    for t in aqua.Tier:
        assert c["AQUA_TIER_" + t.name] == t
    for level in aqua.LogLevel:
        assert c["AQUA_LOG_" + level.name] == level
    assert c["AQUA_BORROW_ALLOW_DRAM"] == 1 and c["AQUA_BORROW_TENSORS"] == 2
    assert c["AQUA_TENSOR_ALLOW_LOCAL"] == 1 and c["AQUA_TENSOR_RECLAIM_LOCAL"] == 2
    events = ["RECLAIMED", "MIGRATED", "RECLAIM_FAILED", "LEASE_LOST", "PAIR_CHANGED",
              "DAEMON_STOPPING", "TENSOR_MIGRATED", "DISCONNECTED", "RECONNECTED"]
    assert [c["AQUA_EVENT_" + e] for e in events] == list(range(1, 10))


def test_strerror_and_errors_keep_the_code():
    assert aqua.strerror(0)
    e = aqua.errors.error("aqua_borrow", aqua.Outcome.NO_MEMORY)
    assert isinstance(e, aqua.NoMemoryError) and e.outcome == aqua.Outcome.NO_MEMORY
    assert e.errno is None and e.code == 3 and "aqua_borrow" in str(e)
    e = aqua.errors.error("aqua_return", -errno.ENOTCONN)
    assert isinstance(e, aqua.NotConnectedError) and e.errno == errno.ENOTCONN
    assert e.outcome is None and "ENOTCONN" in str(e)
    e = aqua.errors.error("aqua_open", -errno.ENOENT)
    assert isinstance(e, aqua.NotConnectedError)
    e = aqua.errors.error("aqua_tensor_grow", -errno.ERANGE)
    assert isinstance(e, aqua.OutOfRangeError) and isinstance(e, IndexError)
    assert isinstance(aqua.errors.error("x", -errno.EINVAL), ValueError)
    assert type(aqua.errors.error("x", -errno.EIO)) is aqua.AquaError


class TorchLikeStream:
    cuda_stream = 0x1234


class CudaCoreLikeStream:
    def __cuda_stream__(self):
        return (0, 0x5678)


class CupyLikeEvent:
    ptr = 0x9ABC


class TorchLikeEvent:
    cuda_event = 0xDEF0


def test_streams_and_events_are_taken_from_ints_and_the_protocols():
    from aqua import event_handle, stream_handle

    assert stream_handle(None) is None and stream_handle(0) is None
    assert stream_handle(0x42) == 0x42
    assert stream_handle(TorchLikeStream()) == 0x1234
    assert stream_handle(CudaCoreLikeStream()) == 0x5678
    assert stream_handle(ctypes.c_void_p(0x77)) == 0x77
    assert event_handle(CupyLikeEvent()) == 0x9ABC
    assert event_handle(TorchLikeEvent()) == 0xDEF0
    with pytest.raises(TypeError):
        stream_handle("stream")
    with pytest.raises(TypeError):
        stream_handle(True)
    with pytest.raises(ValueError):
        event_handle(-1)
