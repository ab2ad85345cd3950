"""aqua.vllm with tensor parallelism: two worker ranks (GPUs 0 and 1 of a simulated machine of
four, a file of its own since simcuda reads the machine once per process), each in a process of
its own with its own KV caches, worker connector, aqua consumer and tensor, under one vLLM
Scheduler whose outputs vLLM's KVOutputAggregator joins, as vLLM's multiprocess executor does. Two producers (GPUs 2 and 3) lend, one to
each rank's GPU."""

from __future__ import annotations

import os

import pytest

os.environ["AQUA_SIM_DEVICES"] = "4x16GiB"

import aqua  # noqa: E402
from aqua.vllm import AquaStats  # noqa: E402
from conftest import Agent  # noqa: E402
from test_vllm import (CHUNK_TOKENS, BS, Engine, Model, forget_gpu_cache,  # noqa: E402
                       prompt, spec, step_until_reply)


def lender(agents: list[Agent], gpu: int) -> Agent:
    a = Agent()
    agents.append(a)
    a.exec(f"ctx = aqua.Producer({gpu}, client_name='lender-{gpu}', chunk_bytes=32 << 20)")
    a.eval("ctx.offer(256 << 20)")
    return a


def rank_stats(e: Engine, r: int) -> tuple[AquaStats, int, int, int]:
    """A rank's aqua.vllm worker: its stats, slots, device and tensor bytes."""
    return e.ranks[r].call("stats")


def test_each_rank_offloads_its_own_kv_and_loads_it_back_after_a_reclaim(aquad, agents):
    """Each rank's worker connector runs in a process of its own (as under vLLM's multiprocess
    executor), with its own aqua consumer; vLLM's KVOutputAggregator joins their outputs."""
    producers = [lender(agents, 2), lender(agents, 3)]
    # capacity_bytes counts every rank's share, as vLLM's cpu_bytes_to_use does.
    e = Engine(spec(capacity_bytes="128MiB"), tensor_parallel=2,
               rank_extra=[{"device": 0}, {"device": 1}], processes=True)
    try:
        assert not e.workers and len(e.ranks) == 2
        assert len({r.proc.pid for r in e.ranks} | {os.getpid()}) == 3
        stats = [rank_stats(e, r) for r in range(2)]
        assert [dev for _, _, dev, _ in stats] == [0, 1]
        assert stats[0][1] == stats[1][1] > 0
        model = Model(e)
        first = [prompt(i, 8 * CHUNK_TOKENS + 5) for i in range(3)]
        for p in first:
            e.add(p)
        e.run(model)
        for r in range(2):
            st = rank_stats(e, r)[0]
            assert st.stores > 0 and st.peer_bytes > 0 and st.dram_bytes == 0, st
        stored = rank_stats(e, 0)[0].bytes_stored
        assert rank_stats(e, 1)[0].bytes_stored == stored
        # Both lenders take their memory back while the engine steps (each rank polls aqua
        # in its own process at get_finished).
        for p in producers:
            p.send(eval="ctx.reclaim(aqua.ALL, timeout=60)")
        for p in producers:
            assert step_until_reply(e, p)["complete"]
        for r in range(2):
            st, _, _, size = rank_stats(e, r)
            assert st.peer_bytes == 0 and st.dram_bytes == size, st
        forget_gpu_cache(e)
        for p in first:
            e.add(p[: 8 * CHUNK_TOKENS] + prompt(99, 20))
        e.run(model)
        hits = [e.log.external_hits[str(i)] for i in range(3, 6)]
        assert hits == [8 * CHUNK_TOKENS] * 3, hits
        # Every loaded block of every rank held what that rank computed (its own heads).
        assert model.checked_per_rank == [3 * 8 * CHUNK_TOKENS // BS] * 2
        loaded = [rank_stats(e, r)[0].bytes_loaded for r in range(2)]
        assert loaded[0] == loaded[1] > 0
        # vLLM's connector metrics count what all ranks moved (aggregated worker metadata).
        assert e.counters["vllm:kv_offload_store_bytes"] == 2 * stored
        assert e.counters["vllm:kv_offload_load_bytes"] == sum(loaded)
    finally:
        e.shutdown()


def test_a_rank_that_dies_is_reported_naming_it(aquad, agents):
    """A rank's process killed mid-run: the engine's next step fails saying which rank died,
    and aquad, which saw its client go, stays up for the others."""
    lender(agents, 2)
    e = Engine(spec(capacity_bytes="64MiB"), tensor_parallel=2,
               rank_extra=[{"device": 0}, {"device": 1}], processes=True)
    try:
        e.ranks[1].proc.kill()
        e.ranks[1].proc.join()
        e.add(prompt(0, 2 * CHUNK_TOKENS))
        with pytest.raises(RuntimeError, match="rank 1 died"):
            e.run(Model(e))
    finally:
        e.shutdown()
    with aqua.Consumer(1) as ctx:  # its GPU is free again
        assert ctx.info() is not None


def test_two_ranks_on_one_gpu_are_refused_naming_the_holder(aquad, agents: list[Agent]):
    """Two ranks configured onto one GPU: the second cannot register it with aquad, and the
    error says which client holds it."""
    lender(agents, 2)
    with pytest.raises(aqua.BusyError, match="is already registered by vllm-.*-rank0"):
        Engine(spec(capacity_bytes="64MiB"), tensor_parallel=2,
               rank_extra=[{"device": 0}, {"device": 0}])
