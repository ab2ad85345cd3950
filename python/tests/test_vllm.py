"""aqua.vllm against the pinned vLLM: vLLM's Scheduler and OffloadingConnector drive
AquaOffloadingSpec (vllm_engine.py), with a real aquad and a real producer process. Blocks are
stored, a reclaim moves the aqua tensor's chunks to DRAM mid-run, later requests whose prefix
hits load them back byte for byte; again with aquad killed and restarted; and the hit/miss
decisions equal those of vLLM's CPU offloading spec for the same capacity."""

from __future__ import annotations

import os
import select
import time
from typing import Any

import pytest
import torch
import kv_model
from conftest import MiB, wait_for
from vllm_engine import Engine

import aqua
from aqua.vllm import AquaOffloadingSpec, AquaOffloadingWorker, AquaSettings

BS = 16  # tokens per GPU block
CHUNK_TOKENS = 64  # tokens per offloaded chunk: 4 GPU blocks


def spec(**extra: Any) -> dict[str, Any]:
    return {"spec_name": "AquaOffloadingSpec", "spec_module_path": "aqua.vllm",
            "block_size": CHUNK_TOKENS, "capacity_bytes": "64MiB", **extra}


def prompt(seed: int, n_tokens: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, 900, (2048,), generator=g).tolist()[:n_tokens]


class Model:
    """Stands for the forward pass (kv_model.py): writes each computed block's KV into the
    request's GPU blocks of every rank, and checks that blocks the connector loaded hold what
    was computed for them. With ranks in processes of their own, the engine ships plan()'s work
    to them and adds what they checked (checked_per_rank)."""

    def __init__(self, engine: Engine) -> None:
        self.e = engine
        self.checked_blocks = 0
        self.checked_per_rank = [0] * engine.tensor_parallel

    def plan(self, out: Any) -> list[kv_model.Work]:
        return kv_model.plan(out, self.e.prompts, self.e.block_ids)

    def add_checked(self, per_rank: list[int]) -> None:
        for r, n in enumerate(per_rank):
            self.checked_per_rank[r] += n
        self.checked_blocks += per_rank[0]

    def __call__(self, out: Any) -> None:
        work = self.plan(out)
        self.add_checked([kv_model.apply(work, caches, rank, BS)
                          for rank, caches in enumerate(self.e.kv_caches_of)])


def aqua_worker(e: Engine, rank: int = 0) -> AquaOffloadingWorker:
    c = e.workers[rank].connector_worker
    assert c is not None
    w = c.worker
    assert isinstance(w, AquaOffloadingWorker)
    return w


def forget_gpu_cache(e: Engine) -> None:
    """As if the GPU blocks were reused for other work: the next hits must come from aqua."""
    assert e.scheduler.reset_prefix_cache()
    e.zero_kv()


def step_until_reply(e: Engine, agent: Any, timeout: float = 60) -> Any:
    """Run idle engine steps (each polls aqua) until the agent answers."""
    end = time.monotonic() + timeout
    out = agent.proc.stdout
    while time.monotonic() < end:
        e.step()
        if select.select([out], [], [], 0.01)[0]:
            return agent.reply()
    raise TimeoutError("no answer from the producer")


def run_prefix_scenario(e: Engine, producer: Any, between: Any) -> None:
    model = Model(e)
    first = [prompt(i, 8 * CHUNK_TOKENS + 5) for i in range(3)]
    for p in first:
        e.add(p)
    e.run(model)
    w = aqua_worker(e)
    st = w.stats()
    assert st.stores > 0 and st.bytes_stored > 0
    assert st.peer_bytes > 0 and st.dram_bytes == 0, st
    between()
    forget_gpu_cache(e)
    # The same prefixes with new tails: every full chunk of the first requests hits.
    for p in first:
        e.add(p[: 8 * CHUNK_TOKENS] + prompt(99, 20))
    e.run(model)
    st = w.stats()
    assert st.loads > 0 and st.bytes_loaded > 0
    hits = [e.log.external_hits[str(i)] for i in range(3, 6)]
    assert hits == [8 * CHUNK_TOKENS] * 3, hits
    assert model.checked_blocks == 3 * 8 * CHUNK_TOKENS // BS
    # What the worker moved reaches vLLM's connector metrics.
    assert e.counters["vllm:kv_offload_store_bytes"] == st.bytes_stored
    assert e.counters["vllm:kv_offload_load_bytes"] == st.bytes_loaded


def reclaim_all(e: Engine, producer: Any) -> None:
    """The producer takes back all it lent while the engine steps (and so polls aqua)."""
    w = aqua_worker(e)
    producer.send(eval="ctx.reclaim(aqua.ALL, timeout=60)")
    assert step_until_reply(e, producer)["complete"]
    st = w.stats()
    assert st.peer_bytes == 0 and st.dram_bytes == w.tensor.info().max_bytes, st
    assert st.migrations > 0 and st.bytes_migrated > 0
    assert w.tensor.dptr == w.dptr  # the slots' addresses did not move


def test_blocks_survive_a_reclaim_mid_run_and_load_back_identical(aquad, producer):
    producer.eval("ctx.offer(256 << 20)")
    e = Engine(spec())
    try:
        run_prefix_scenario(e, producer, lambda: reclaim_all(e, producer))
    finally:
        e.shutdown()


def wait_reconnected(e: Engine, w: AquaOffloadingWorker, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while w.stats().reconnects == 0 and time.monotonic() < end:
        e.step()
        time.sleep(0.05)
    st = w.stats()
    assert st.disconnects >= 1 and st.reconnects >= 1, st


def test_blocks_survive_aquad_killed_and_restarted(aquad, producer):
    producer.eval("ctx.offer(256 << 20)")
    e = Engine(spec())
    try:
        w = aqua_worker(e)

        def restart_then_reclaim() -> None:
            aquad.kill()
            for _ in range(5):
                e.step()
            aquad.start()
            wait_reconnected(e, w)
            producer.eval("poll_until(ctx, 'Reconnected')")
            reclaim_all(e, producer)

        run_prefix_scenario(e, producer, restart_then_reclaim)
    finally:
        e.shutdown()


def test_a_lease_aquad_forgot_moves_to_dram_and_its_blocks_load_back_identical(aquad, producer):
    """aquad comes back without the lease (its journal is gone, as after --repair-journal cut
    it): libaqua moves the tensor's chunks to DRAM at the same addresses (LEASE_LOST), the
    worker gives the lease back, and the blocks stored before still load byte for byte."""
    producer.eval("ctx.offer(256 << 20)")
    e = Engine(spec())
    try:
        w = aqua_worker(e)

        def restart_without_journal() -> None:
            aquad.kill()
            os.unlink(os.path.join(aquad.dir, "journal"))
            aquad.start()
            wait_reconnected(e, w)
            st = w.stats()
            assert st.leases_lost == 1, st
            assert st.peer_bytes == 0 and st.dram_bytes == w.tensor.info().max_bytes, st
            assert w.tensor.dptr == w.dptr
            assert w.ctx.info().borrowed_bytes == 0  # the worker gave the lost lease back

        run_prefix_scenario(e, producer, restart_without_journal)
    finally:
        e.shutdown()


def decisions(extra: dict[str, Any], worker_extra: dict[str, Any] | None) -> dict[str, int]:
    """Tokens each request of a fixed sequence took from the offloaded cache (the GPU prefix
    cache is forgotten before each), where the capacity holds fewer chunks than the requests
    offload, so that eviction decides too."""
    e = Engine(extra, worker_extra=worker_extra)
    try:
        model = Model(e)
        seeds = [0, 1, 0, 2, 3, 1, 4, 0, 5, 6, 2, 0, 7, 1, 3, 0]
        for i, seed in enumerate(seeds):
            forget_gpu_cache(e)
            e.add(prompt(seed, (3 + i % 4) * CHUNK_TOKENS + 3))
            e.run(model)
        return e.log.external_hits
    finally:
        e.shutdown()


def test_hits_and_misses_equal_those_of_vllms_cpu_spec(aquad, producer):
    producer.eval("ctx.offer(256 << 20)")
    capacity = 16 * (CHUNK_TOKENS // BS) * 2 * 2 * BS * 4 * 64 * 2  # 16 chunks: 2 layers, K+V
    aqua_hits = decisions(spec(capacity_bytes=capacity), None)
    # vLLM's CPU spec decides on the scheduler side; its worker cannot be built without a CUDA
    # platform, so the same worker (AquaOffloadingSpec) moves the bytes it asks for.
    cpu = {"spec_name": "CPUOffloadingSpec", "block_size": CHUNK_TOKENS,
           "cpu_bytes_to_use": capacity}
    cpu_hits = decisions(cpu, spec(capacity_bytes=capacity))
    assert aqua_hits == cpu_hits, (aqua_hits, cpu_hits)
    assert any(v > 0 for v in aqua_hits.values()) and any(v == 0 for v in aqua_hits.values())


def test_slots_are_counted_as_vllms_cpu_tier_counts_chunks(aquad):
    e = Engine(spec(capacity_bytes="3MiB"))
    try:
        w = aqua_worker(e)
        page = e.page_bytes
        assert w.stats().slot_bytes == len(e.layer_names) * page * CHUNK_TOKENS // BS
        assert w.num_slots == 3 * MiB // w.stats().slot_bytes
        assert isinstance(e.worker.connector_worker.spec, AquaOffloadingSpec)  # type: ignore
    finally:
        e.shutdown()


@pytest.mark.parametrize("bad, words", [
    ({"capacity_byte": 1}, "unknown key 'capacity_byte'"),
    ({"cpu_bytes_to_use": 1}, "'cpu_bytes_to_use' is the CPU spec's key"),
    ({"capacity_bytes": "lots"}, "'capacity_bytes' must be a size"),
    ({"allow_dram": "maybe"}, "'allow_dram' must be true or false"),
    ({"device": -1}, "'device' must be a CUDA device ordinal"),
    ({"timeout": 0}, "'timeout' must be finite seconds"),
    ({"timeout": float("nan")}, "'timeout' must be finite seconds"),
    ({"device": 2**32}, "'device' must be a CUDA device ordinal"),
    ({"capacity_bytes": 2**70}, "'capacity_bytes' of 1180591620717411303424 bytes does not fit"),
    ({"canonical_layout": True}, "'canonical_layout' is not supported"),
])
def test_bad_keys_are_named_when_vllm_builds_the_connector(aquad, bad, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        Engine(spec(**bad))


# Custody by identity, item 10: every key, vLLM's own that the spec reads too, is checked and
# named (vLLM would divide by a block size of 0, or take -16).
@pytest.mark.parametrize("bad, words", [
    ({"block_size": -16}, "'block_size' must be an integer in 1 .."),
    ({"block_size": 0}, "'block_size' must be an integer in 1 .."),
    ({"blocks_per_chunk": "4"}, "'blocks_per_chunk' must be an integer"),
    ({"store_threshold": -1}, "'store_threshold' must be an integer in 0 .."),
    ({"max_tracker_size": 0}, "'max_tracker_size' must be an integer in 1 .."),
    ({"sync_load_budget_bytes": "much"}, "'sync_load_budget_bytes' must be a size"),
    ({"eviction_policy": 3}, "'eviction_policy' must be a non-empty string"),
    ({"chunk_bytes": 2**64}, "'chunk_bytes' of 18446744073709551616 bytes does not fit"),
])
def test_vllms_own_keys_are_checked_and_named(bad, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        AquaSettings.from_extra_config({"capacity_bytes": "1GiB", **bad})


def test_missing_capacity_is_named():
    with pytest.raises(ValueError, match="'capacity_bytes' is required"):
        AquaSettings.from_extra_config({"spec_name": "AquaOffloadingSpec"})
    assert AquaSettings.from_extra_config({"capacity_bytes": "2GiB"}).capacity_bytes == 2 << 30


@pytest.mark.parametrize("aquad_config", ["dram-budget: 1MiB\n"])
def test_capacity_aquad_cannot_back_fails_at_start_naming_it(aquad):
    with pytest.raises(RuntimeError, match="could not back .* .'capacity_bytes'"):
        Engine(spec(capacity_bytes="64MiB"))
    # Nothing was left registered: the GPU can be opened again.
    with aqua.Consumer(0) as ctx:
        assert ctx.info() is not None


def test_steps_with_nothing_to_move_skip_aqua_poll_while_its_fd_is_quiet(aquad, monkeypatch):
    e = Engine(spec())
    try:
        w = aqua_worker(e)
        e.step()  # the first step polls; it finds nothing
        calls = []
        real = w.ctx.poll
        monkeypatch.setattr(w.ctx, "poll", lambda timeout=0: calls.append(timeout) or real(0))
        for _ in range(3):
            e.step()
        assert calls == []
        aquad.kill()  # the connection drops: the fd wakes, and the next step polls
        assert wait_for(lambda: (e.step(), calls)[1], timeout=10) and calls[0] == 0
        assert w.stats().disconnects == 1
        aquad.start()
    finally:
        e.shutdown()
