"""A pytest plugin that runs vLLM's own tests (the pinned release's tests/v1, see run) with
aqua's worker doing the offloading connector's copies.

vLLM's connector tests (tests/v1/kv_connector/unit/offloading_connector) drive its real
Scheduler and OffloadingConnector through a RequestRunner whose spec is a mock: its worker
records each job and completes it when the test says so. Here that worker also moves the job's
bytes through an AquaOffloadingWorker (aqua.vllm), over a tensor on memory a producer lends
through a real aquad: every offloaded chunk of vLLM's gets a slot, a store fills its GPU blocks
with fresh random bytes first, and when the test completes a load every GPU block it wrote must
hold the bytes stored for that chunk and block, or the test fails. The mock's own bookkeeping
(what vLLM's assertions read) is left as it is.

The kv_offload suite (tests/v1/kv_offload) tests the manager, policies, capacity accounting and
spec factory aqua.vllm uses as they are; it runs unchanged. Tests that need CUDA, ROCm, Triton or
a package that is not installed skip with vLLM's own reasons; its tests of the CPU tier's
shared region that spawn interpreters skip too (SPAWNS says why), and one of its P2P tier that
waits on the wall clock (WALL_CLOCK).

Also: the fixture and markers vLLM's top-level tests/conftest.py provides (not loaded: it
imports all of vLLM's model machinery) that these suites use.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator

import pytest

# The aqua package's test harness: simcuda for this process, aquad, client agents.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import conftest as harness  # noqa: E402

#: Slots of each runner's aqua tensor: more chunks than any of vLLM's tests offload.
NUM_SLOTS = 1024

_stats = {"stores": 0, "loads": 0, "blocks_checked": 0, "blocks_unchecked": 0}
_session: dict[str, Any] = {}
_workers: list[Any] = []


def pytest_configure(config: pytest.Config) -> None:
    for mark in ("cpu_test", "skip_global_cleanup", "core_model", "distributed"):
        config.addinivalue_line("markers", f"{mark}: vLLM's marker")
    from tests.v1.kv_connector.unit.offloading_connector import utils as runner_utils

    runner_utils.MockOffloadingSpec.get_worker = _aqua_get_worker


#: Tests vLLM runs only on a GPU without marking them so: (module, test) -> why, in vLLM's words.
NEEDS_CUDA = {
    ("test_gpu_worker.py", "test_transfer"): "vLLM's CPUOffloadingWorker takes CUDA tensors "
    "only (vllm/v1/kv_offload/cpu/gpu_worker.py: assert gpu_tensor.is_cuda or gpu_tensor.is_xpu)",
    ("test_gpu_worker.py", "test_transfer_multi_group"): "vLLM's CPUOffloadingWorker takes CUDA "
    "tensors only (vllm/v1/kv_offload/cpu/gpu_worker.py: assert gpu_tensor.is_cuda or "
    "gpu_tensor.is_xpu)",
}


#: vLLM's tests of its SharedOffloadRegion (the CPU tier's shared memory, which aqua's worker
#: does not use) that spawn interpreters: each child imports torch and vLLM, 8 to 35 s of the
#: suite's 90 here, against vLLM's 30 s queue timeouts, which a loaded 2-core machine misses
#: (seen: with both cores busy test_multiprocess_race_construct_and_write fails at 32 s).
SPAWNS = {
    ("test_shared_offload_region.py", name)
    for name in ("test_create_next_worker_view_multiprocess_slots",
                 "test_multiprocess_race_construct_and_write",
                 "test_mp_barrier_unlinks_file_and_survives_sigkill")
}


#: vLLM's tests of its P2P tier's ZeroMQ sessions (a tier aqua's worker does not use) that wait
#: on wall-clock polls of 5 s for TCP connections to come and go (seen: with the machine busy,
#: test_lookup_expiry_allows_zmq_reconnect failed "old TCP connection did not disconnect").
WALL_CLOCK = {
    ("test_manager.py", "test_lookup_expiry_allows_zmq_reconnect"),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    cuda = torch.cuda.is_available()
    for item in items:
        where = (item.path.name, item.originalname)  # type: ignore[attr-defined]
        why = None if cuda else NEEDS_CUDA.get(where)
        if why:
            item.add_marker(pytest.mark.skip(reason=f"requires CUDA: {why}"))
        elif where in SPAWNS:
            item.add_marker(pytest.mark.skip(
                reason="spawns Python interpreters that each import torch and vLLM against "
                "vLLM's 30 s timeouts, which a loaded 2-core machine misses; it tests vLLM's "
                "SharedOffloadRegion, which aqua's worker does not use"))
        elif where in WALL_CLOCK:
            item.add_marker(pytest.mark.skip(
                reason="waits 5 s of wall clock for ZeroMQ TCP connections to come and go, "
                "which a loaded 2-core machine misses; it tests vLLM's P2P tier, which aqua's "
                "worker does not use"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for w in _workers:
        w.close()
    _workers.clear()
    ctx = _session.pop("consumer", None)
    if ctx is not None:
        ctx.close()
    for a in _session.pop("agents", []):
        a.stop()
    d = _session.pop("aquad", None)
    if d is not None:
        rc = d.stop()
        if rc != 0:
            print(f"aqua: aquad exited with {rc}:\n{d.log_text()}", file=sys.stderr)
            session.exitstatus = 1
        shutil.rmtree(d.dir, ignore_errors=True)
    shutil.rmtree(harness._runtime, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    s = _stats
    terminalreporter.write_line(
        f"aqua: {s['stores']} stores and {s['loads']} loads through aqua's worker; "
        f"{s['blocks_checked']} loaded GPU blocks checked byte for byte, "
        f"{s['blocks_unchecked']} loaded from chunks never stored")


@pytest.fixture
def default_vllm_config() -> Iterator[Any]:
    """As vLLM's tests/conftest.py: a default VllmConfig current for the test."""
    from vllm.config import VllmConfig, set_current_vllm_config

    config = VllmConfig()
    with set_current_vllm_config(config):
        yield config


@pytest.fixture
def caplog_vllm(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> Iterator[Any]:
    """As vLLM's tests/conftest.py: caplog that sees vLLM's loggers (they do not propagate to
    the root logger unless told to) at INFO."""
    import logging

    from vllm.logger import DEFAULT_LOGGING_CONFIG

    monkeypatch.setitem(DEFAULT_LOGGING_CONFIG["loggers"]["vllm"], "propagate", True)
    monkeypatch.setattr(logging.getLogger("vllm"), "propagate", True)
    with caplog.at_level(logging.INFO):
        yield caplog


@pytest.fixture(autouse=True)
def _close_aqua_workers() -> Iterator[None]:
    """Each test's workers give their tensors and leases back when it ends."""
    yield
    for w in _workers:
        w.close()
    _workers.clear()


def _consumer() -> Any:
    """The session's aquad, a producer lending 512 MiB of GPU 1, and a consumer on GPU 0 that
    every runner's worker shares (a GPU is one client's)."""
    if "consumer" not in _session:
        import aqua

        d = harness.Aquad("reclaim-deadline: 10s\ndram-budget: 4GiB\n")
        _session["aquad"] = d
        os.environ.update(AQUA_ENDPOINT=d.endpoint, AQUA_SIDE_PATH=d.side_path)
        lender = harness.Agent()
        _session["agents"] = [lender]
        lender.exec("ctx = aqua.Producer(1, client_name='upstream-lender', chunk_bytes=2 << 20)")
        lender.eval("ctx.offer(512 << 20)")
        _session["consumer"] = aqua.Consumer(0, client_name="vllm-upstream")
    return _session["consumer"]


def _aqua_get_worker(self: Any, kv_caches: Any) -> Any:
    """MockOffloadingSpec.get_worker: the mock's worker, with aqua doing its copies."""
    if not isinstance(self.handler, AquaBackedWorker):
        self.handler = AquaBackedWorker(kv_caches, self.blocks_per_chunk)
    return self.handler


def _mock_worker_class() -> type:
    from tests.v1.kv_connector.unit.offloading_connector.utils import MockOffloadingWorker

    return MockOffloadingWorker


class AquaBackedWorker(_mock_worker_class()):  # type: ignore[misc]
    """vLLM's MockOffloadingWorker (its bookkeeping unchanged) whose jobs also move their bytes
    through aqua.vllm's worker, checked when the test completes a load."""

    def __init__(self, kv_caches: Any, blocks_per_chunk: int) -> None:
        super().__init__()
        import torch

        from aqua.vllm import AquaOffloadingWorker, AquaSettings

        self.bpc = blocks_per_chunk
        self.aqua = AquaOffloadingWorker(kv_caches, blocks_per_chunk=blocks_per_chunk,
                                         num_slots=NUM_SLOTS,
                                         settings=AquaSettings(capacity_bytes=1,
                                                               allow_dram=True),
                                         consumer=_consumer())
        _workers.append(self)
        #: Per KV-cache group, its pages: (GPU tensor as rows of pages, bytes of a block).
        self.pages = [[(t.view(torch.int8).view(-1, t_page), ref.page_size_bytes)
                       for t, t_page, ref in
                       ((kv_caches.tensors[r.tensor_idx].tensor,
                         kv_caches.tensors[r.tensor_idx].page_size_bytes, r) for r in refs)]
                      for refs in kv_caches.group_data_refs]
        self.slot_of: OrderedDict[Any, int] = OrderedDict()
        self.free_slots = list(range(NUM_SLOTS - 1, -1, -1))
        #: (offload key, block within the chunk) -> the bytes of each of its group's pages.
        self.stored: dict[tuple[Any, int], list[Any]] = {}
        #: Load jobs not yet checked: job id -> (GPU spec, offload keys).
        self.loads: dict[int, tuple[Any, list[Any]]] = {}
        self.gen = torch.Generator().manual_seed(0)
        self.closed = False

    # ------------------------------------------------------------------ vLLM's worker calls

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        import torch

        keys = list(dst_spec.offload_keys)
        self._quiesce()
        for b, (key, sub), g in self._addresses(src_spec, keys):
            data = []
            for rows, nbytes in self.pages[g]:
                rows[b, :nbytes] = torch.randint(-128, 128, (nbytes,), generator=self.gen,
                                                 dtype=torch.int8)
                data.append(rows[b, :nbytes].clone())
            self.stored[(key, sub)] = data
        self.aqua.submit_store(job_id, src_spec, self._slots(keys))
        _stats["stores"] += 1
        return super().submit_store(job_id, src_spec, dst_spec)

    def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any,
                    expedited: bool = False) -> bool:
        keys = list(src_spec.offload_keys)
        self._quiesce()
        self.aqua.submit_load(job_id, self._slots(keys), dst_spec, expedited=expedited)
        self.loads[job_id] = (dst_spec, keys)
        _stats["loads"] += 1
        return super().submit_load(job_id, src_spec, dst_spec, expedited)

    def complete_jobs(self, job_ids: set[int]) -> None:
        for job_id in job_ids:
            if job_id in self.waiting_jobs:
                self.aqua.wait({job_id})
                if job_id in self.loads:
                    self._check(job_id, *self.loads.pop(job_id))
        super().complete_jobs(job_ids)

    def get_finished(self) -> list[Any]:
        self.aqua.get_finished()  # polls aqua; the mock reports completions as the test says
        return super().get_finished()

    # ------------------------------------------------------------------------------ helpers

    def _quiesce(self) -> None:
        """Wait for the copies in flight, so that a GPU block is never refilled or overwritten
        while a copy still reads or writes it (the bytes checked are then deterministic)."""
        self.aqua.wait(set(self.aqua._tickets))

    def _slots(self, keys: list[Any]) -> Any:
        from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

        out = []
        for key in keys:
            if key in self.slot_of:
                self.slot_of.move_to_end(key)
            else:
                if not self.free_slots:  # the least recently used chunk gives up its slot
                    old, slot = self.slot_of.popitem(last=False)
                    for sub in range(self.bpc):
                        self.stored.pop((old, sub), None)
                    self.free_slots.append(slot)
                self.slot_of[key] = self.free_slots.pop()
            out.append(self.slot_of[key])
        return CPULoadStoreSpec(out)

    def _addresses(self, gpu_spec: Any, keys: list[Any]) -> Iterator[tuple[int, Any, int]]:
        """(GPU block, (offload key, block within its chunk), group) for each block of a job:
        per group, its blocks in order against its chunks' blocks, the group's first chunk
        entered at block_indices[g] % blocks_per_chunk (GPULoadStoreSpec's contract)."""
        ids = [int(b) for b in gpu_spec.block_ids]
        sizes = list(gpu_spec.group_sizes)
        firsts = list(gpu_spec.block_indices)
        pos = key_pos = 0
        for g, (size, first) in enumerate(zip(sizes, firsts)):
            skip = first % self.bpc
            for i in range(size):
                k, sub = divmod(skip + i, self.bpc)
                yield ids[pos + i], (keys[key_pos + k], sub), g
            pos += size
            key_pos += -(-(skip + size) // self.bpc) if size else 0

    def _check(self, job_id: int, gpu_spec: Any, keys: list[Any]) -> None:
        import torch

        for b, addr, g in self._addresses(gpu_spec, keys):
            want = self.stored.get(addr)
            if want is None:
                _stats["blocks_unchecked"] += 1
                continue
            for (rows, nbytes), data in zip(self.pages[g], want):
                assert torch.equal(rows[b, :nbytes], data), (
                    f"aqua: load job {job_id} put other bytes in GPU block {b} (group {g}) than "
                    f"were stored for chunk {addr[0]!r} block {addr[1]}")
            _stats["blocks_checked"] += 1

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.aqua.shutdown()
