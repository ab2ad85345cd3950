"""bench/run vllm (bench/vllm_bench.py): aqua.vllm against baselines measured in the same run (bench/README.md).

1. Store + load throughput: the aqua spec's worker (AquaOffloadingWorker, one aqua copy batch
   per job) moving GPU blocks to and from its slots, against each of the same blocks memcpy'd
   to and from a host tensor laid out as vLLM's CPU tier lays out its chunks.
   vLLM's own CPUOffloadingWorker cannot be built here: it asserts CUDA tensors and needs a
   CUDA platform (see python/README.md).
2. Per-step overhead: a step of vLLM's Scheduler with the OffloadingConnector and the aqua spec
   on both sides, a request decoding with nothing to move, against the same harness without a
   connector; of the difference, the time in the spec's own per-step code and, in separate
   runs, in vLLM's OffloadingConnector (scheduler and worker side, the spec's part taken out).
Prints "name value" lines; bench/run turns them into BENCH lines.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python" / "tests"))

import conftest  # noqa: E402  (simcuda machine, aquad and agents, as the tests use them)
import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (  # noqa: E402
    OffloadingConnector)
from vllm.v1.kv_offload.base import GPULoadStoreSpec  # noqa: E402
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec  # noqa: E402
from vllm_engine import Engine  # noqa: E402

from aqua.vllm import AquaOffloadingWorker  # noqa: E402

BS = 16
CHUNK = 64


def spec(capacity: int) -> dict[str, object]:
    return {"spec_name": "AquaOffloadingSpec", "spec_module_path": "aqua.vllm",
            "block_size": CHUNK, "capacity_bytes": capacity}


def throughput(rounds: int) -> None:
    # Llama-3-8B-like pages: 8 KV heads x 128 x fp16, K and V, 16 tokens: 64 KiB per layer.
    layers, blocks = 4, 512
    page = 2 * BS * 8 * 128 * 2
    e = Engine(spec(2 * layers * blocks * page), num_gpu_blocks=blocks, layers=layers,
               kv_heads=8, head_size=128)
    try:
        w = e.worker.connector_worker.worker  # type: ignore[union-attr]
        assert isinstance(w, AquaOffloadingWorker)
        for layer in e.kv_caches.values():
            layer.normal_()
        bpc = CHUNK // BS
        n_chunks = blocks // bpc
        rng = np.random.default_rng(1)
        gpu_ids = rng.permutation(blocks).tolist()  # scattered blocks, as a running engine has
        slot_ids = rng.permutation(w.num_slots)[:n_chunks].tolist()
        gspec = GPULoadStoreSpec(gpu_ids, group_sizes=[blocks], block_indices=[0])
        sspec = CPULoadStoreSpec(slot_ids)
        nbytes = layers * blocks * page
        # The CPU tier's layout and copy: per layer a (chunks, bpc * page) host tensor.
        tier = [torch.empty((w.num_slots, bpc * page), dtype=torch.int8) for _ in range(layers)]
        views = [t.view(torch.int8).view(blocks, page) for t in e.kv_caches.values()]
        gidx = torch.tensor(gpu_ids, dtype=torch.int64)
        sidx = torch.tensor(slot_ids, dtype=torch.int64)

        def aqua_round() -> float:
            t0 = time.perf_counter()
            w.submit_store(1, gspec, sspec)
            w.wait({1})
            w.submit_load(2, sspec, gspec)
            w.wait({2})
            t = time.perf_counter() - t0
            while w._jobs:  # collect both results
                w.get_finished()
            return t

        # The baseline: each block memcpy'd between the KV caches and a host tensor laid out
        # as vLLM's CPU tier lays out its chunks, the same (dst, src, bytes) pieces.
        pieces: list[tuple[int, int]] = []
        for v, c in zip(views, tier):
            dst = ((sidx[:, None] * bpc + torch.arange(bpc)[None, :]).flatten() * page
                   + c.data_ptr()).tolist()
            src = (gidx * page + v.data_ptr()).tolist()
            pieces += zip(dst, src)

        def memcpy_round() -> float:
            t0 = time.perf_counter()
            for d, s in pieces:
                ctypes.memmove(d, s, page)
            for d, s in pieces:
                ctypes.memmove(s, d, page)
            return time.perf_counter() - t0

        aqua_round()
        memcpy_round()
        a, b = [], []
        for _ in range(rounds):  # alternate, so that drift hits both alike
            a.append(aqua_round())
            b.append(memcpy_round())
        ta, tb = statistics.median(a), statistics.median(b)
        print(f"store_load_bytes {2 * nbytes}")
        print(f"store_load_blocks {blocks * layers}")
        print(f"aqua_gbps {2 * nbytes / ta / 1e9:.2f}")
        print(f"cpu_tier_gbps {2 * nbytes / tb / 1e9:.2f}")
        print(f"store_load_ratio {tb / ta:.3f}")
    finally:
        e.shutdown()


def timed_methods(objs: list[object], names: list[str], spent: list[float]) -> None:
    """Wrap each public method of these objects so that its time adds to spent[0]; a call made
    inside another wrapped call is not counted twice."""
    depth = [0]

    def wrap(f):  # type: ignore[no-untyped-def]
        def timed(*a, **k):  # type: ignore[no-untyped-def]
            depth[0] += 1
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    spent[0] += time.perf_counter() - t
        return timed

    for o in objs:
        for name in names:
            f = getattr(o, name, None)
            if callable(f) and not name.startswith("_"):
                setattr(o, name, wrap(f))


def step_time(extra: dict[str, object] | None, steps: int,
              attribute: bool = False) -> tuple[float, float, float]:
    """Seconds per step; of them in the aqua spec's own per-step code (the worker's
    get_finished(), which polls aqua); and, with attribute (whose wrappers cost time of their
    own, so its step time is not compared), in vLLM's OffloadingConnector on both sides."""
    e = Engine(extra)
    spent, connector = [0.0], [0.0]
    if e.worker is not None:
        w = e.worker.connector_worker.worker  # type: ignore[union-attr]
        assert isinstance(w, AquaOffloadingWorker)
        timed_methods([w], ["get_finished"], spent)
        if attribute:
            names = [n for n in dir(OffloadingConnector) if callable(getattr(OffloadingConnector, n))]
            timed_methods([e.connector, e.worker], names, connector)
    try:
        e.add(list(range(10, 10 + 100)), max_tokens=steps + 50)
        for _ in range(20):
            e.step()
        spent[0] = connector[0] = 0.0
        t0 = time.perf_counter()
        for _ in range(steps):
            e.step()
        return ((time.perf_counter() - t0) / steps, spent[0] / steps,
                (connector[0] - spent[0]) / steps)
    finally:
        from vllm.v1.request import RequestStatus
        e.scheduler.finish_requests(list(e.prompts), RequestStatus.FINISHED_ABORTED)
        e.shutdown()


def overhead(rounds: int, steps: int) -> None:
    with_spec, without, own, vllm_own = [], [], [], []
    for _ in range(rounds):  # alternate, so that drift hits both alike
        t, o, _ = step_time(spec(64 << 20), steps)
        with_spec.append(t)
        own.append(o)
        without.append(step_time(None, steps)[0])
        vllm_own.append(step_time(spec(64 << 20), steps, attribute=True)[2])
    ts, tn, to = statistics.median(with_spec), statistics.median(without), statistics.median(own)
    tv = statistics.median(vllm_own)
    print(f"step_us_aqua {ts * 1e6:.1f}")
    print(f"step_us_none {tn * 1e6:.1f}")
    print(f"step_us_spec_own {to * 1e6:.2f}")
    print(f"step_us_vllm_connector {tv * 1e6:.1f}")
    print(f"step_overhead {ts / tn - 1:.4f}")
    print(f"step_spec_own_share {to / tn:.4f}")
    print(f"step_vllm_connector_share {tv / tn:.4f}")


def main() -> None:
    d = conftest.Aquad("dram-budget: 4GiB\nreclaim-deadline: 10s\n")
    os.environ["AQUA_ENDPOINT"], os.environ["AQUA_SIDE_PATH"] = d.endpoint, d.side_path
    producer = conftest.Agent()
    try:
        producer.exec("ctx = aqua.Producer(1, client_name='bench-producer')")
        producer.eval("ctx.offer(512 << 20)")
        throughput(int(os.environ.get("AQUA_BENCH_ROUNDS", "9")))
        overhead(int(os.environ.get("AQUA_BENCH_STEP_ROUNDS", "5")), 400)
    finally:
        producer.stop()
        d.stop()
        conftest.pytest_sessionfinish(None, 0)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
