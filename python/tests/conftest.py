"""Fixtures for the aqua package's tests: a real aquad on a private endpoint (as
tests/harness.c starts it), client processes (agent.py), and simcuda for this process.

Every pytest process (one per test file under meson) is its own simulated machine of two
16 GiB GPUs (AQUA_SIM_MACHINE unique to it, its memory in a private folder): simcuda reads the
machine when the driver is first initialised, once per process, so the tests of one file share
it; each test gets a fresh aquad. Agents started by a test run on the same machine.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

GiB = 1 << 30
MiB = 1 << 20
HERE = Path(__file__).resolve().parent

_runtime = tempfile.mkdtemp(prefix="aqua-py-sim.", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
os.environ.update(AQUA_SIM_MACHINE=f"pytest-{os.getpid()}", AQUA_SIM_DEVICES="2x16GiB",
                  AQUA_SIM_RUNTIME_DIR=_runtime)
os.environ.pop("AQUA_SIM_TOPOLOGY", None)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_runtime, ignore_errors=True)


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: a child of a crashed test goes with it.
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)


def native_env(**extra: str) -> dict[str, str]:
    """The environment for native programs (aquad): without the sanitizer preload and the
    options run-tests set for Python."""
    env = dict(os.environ, **extra)
    env.pop("LD_PRELOAD", None)
    if "AQUA_NATIVE_ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] = env["AQUA_NATIVE_ASAN_OPTIONS"]
    return env


class Aquad:
    """aquad on DIR/aquad.sock, DIR/aquad.side, journal DIR/journal; its log in DIR/aquad.log."""

    def __init__(self, extra_yaml: str = "") -> None:
        self.dir = tempfile.mkdtemp(prefix="aqua-py.")
        self.endpoint = f"ipc://{self.dir}/aquad.sock"
        self.side_path = f"{self.dir}/aquad.side"
        self.config = f"{self.dir}/aquad.yaml"
        self.log = f"{self.dir}/aquad.log"
        with open(self.config, "w") as f:
            f.write(f"endpoint: {self.endpoint}\nside-socket: {self.side_path}\n"
                    f"journal: {self.dir}/journal\n{extra_yaml}")
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.rc = -1
        self.start()

    def start(self) -> None:
        sock = Path(self.dir) / "aquad.sock"
        sock.unlink(missing_ok=True)
        binary = os.environ.get("AQUAD") or str(HERE.parents[1] / "build" / "daemon" / "aquad")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([binary, "-c", self.config], stdout=log, stderr=log,
                                         env=native_env(), preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 20
        while not sock.exists():  # aquad binds its endpoint last
            if self.proc.poll() is not None:
                raise RuntimeError(f"aquad exited with {self.proc.returncode}:\n{self.log_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError("aquad did not start:\n" + self.log_text())
            time.sleep(0.02)

    def log_text(self) -> str:
        try:
            return Path(self.log).read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> int:
        """SIGTERM and wait; aquad's exit status (0: a clean stop, no leak under ASan)."""
        rc = self.rc
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
        elif self.proc is not None:
            rc = self.proc.returncode
        self.proc, self.rc = None, rc
        return rc

    def kill(self) -> None:
        """SIGKILL, as a crash; start() brings it back on the same journal."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.proc, self.rc = None, 0

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)


class AgentError(Exception):
    def __init__(self, reply: dict[str, Any]) -> None:
        super().__init__(f"{reply['err']}: {reply['msg']}")
        self.reply = reply
        self.type = reply["err"]


class Agent:
    """A separate client process (agent.py) on the same simulated machine and aquad."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-P", str(HERE / "agent.py")], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=dict(os.environ), preexec_fn=_die_with_parent)

    def send(self, **req: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float = 60) -> Any:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError("the agent did not answer")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the agent died (status {self.proc.wait()})")
        r = json.loads(line)
        if "err" in r:
            raise AgentError(r)
        return r["ok"]

    def exec(self, code: str, timeout: float = 60) -> None:
        self.send(exec=code)
        self.reply(timeout)

    def eval(self, expr: str, timeout: float = 60) -> Any:
        self.send(eval=expr)
        return self.reply(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def aquad_config() -> str:
    """Extra top-level keys for the test's aquad; override in a module or with parametrize."""
    return "reclaim-deadline: 10s\ndram-budget: 4GiB\n"


@pytest.fixture
def aquad(monkeypatch: pytest.MonkeyPatch, aquad_config: str) -> Iterator[Aquad]:
    """A fresh aquad for the test; AQUA_ENDPOINT and AQUA_SIDE_PATH name it, so that contexts
    opened without an endpoint (here and in agents) connect to it. It must stop cleanly."""
    d = Aquad(aquad_config)
    monkeypatch.setenv("AQUA_ENDPOINT", d.endpoint)
    monkeypatch.setenv("AQUA_SIDE_PATH", d.side_path)
    yield d
    rc = d.stop()
    text = d.log_text()
    shutil.rmtree(d.dir, ignore_errors=True)
    assert rc == 0, f"aquad exited with {rc}:\n{text}"


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    """Start agents with agents.append(Agent()); all are stopped after the test."""
    started: list[Agent] = []
    yield started
    for a in started:
        a.stop()


@pytest.fixture
def producer(aquad: Aquad, agents: list[Agent]) -> Agent:
    """An agent with a Producer on GPU 1 (as `ctx`), not offering yet."""
    a = Agent()
    agents.append(a)
    a.exec("ctx = aqua.Producer(1, client_name='pytest-producer', chunk_bytes=32 << 20)")
    return a


def assert_signatures(cls: Any, base: Any, names: Any) -> None:
    """Each method of names takes the parameters base's does, in order, and only ones with
    defaults after them: an engine release that changes its interface fails here first."""
    import inspect
    for name in sorted(names):
        want = inspect.signature(getattr(base, name))
        got = inspect.signature(getattr(cls, name))
        assert list(got.parameters)[:len(want.parameters)] == list(want.parameters), name
        for p in list(got.parameters.values())[len(want.parameters):]:
            assert p.default is not inspect.Parameter.empty, (name, p)


def wait_for(cond: Any, timeout: float = 30, step: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(step)
