"""aqua.vllm with tensor parallelism: two worker ranks (GPUs 0 and 1 of a simulated machine of
four, a file of its own since simcuda reads the machine once per process), each with its own KV
caches, worker connector and aqua tensor, under one vLLM Scheduler whose outputs vLLM's
KVOutputAggregator joins, as vLLM's executors do. Two producers (GPUs 2 and 3) lend, one to
each rank's GPU."""

from __future__ import annotations

import os

import pytest

os.environ["AQUA_SIM_DEVICES"] = "4x16GiB"

import aqua  # noqa: E402
from conftest import Agent  # noqa: E402
from test_vllm import (CHUNK_TOKENS, BS, Engine, Model, aqua_worker, forget_gpu_cache,  # noqa
                       prompt, spec, step_until_reply)


def lender(agents: list[Agent], gpu: int) -> Agent:
    a = Agent()
    agents.append(a)
    a.exec(f"ctx = aqua.Producer({gpu}, client_name='lender-{gpu}', chunk_bytes=32 << 20)")
    a.eval("ctx.offer(256 << 20)")
    return a


def test_each_rank_offloads_its_own_kv_and_loads_it_back_after_a_reclaim(aquad, agents):
    producers = [lender(agents, 2), lender(agents, 3)]
    # capacity_bytes counts every rank's share, as vLLM's cpu_bytes_to_use does.
    e = Engine(spec(capacity_bytes="128MiB"), tensor_parallel=2,
               rank_extra=[{"device": 0}, {"device": 1}])
    try:
        ws = [aqua_worker(e, r) for r in range(2)]
        assert [w.ctx.device for w in ws] == [0, 1]
        assert ws[0].num_slots == ws[1].num_slots > 0
        model = Model(e)
        first = [prompt(i, 8 * CHUNK_TOKENS + 5) for i in range(3)]
        for p in first:
            e.add(p)
        e.run(model)
        for w in ws:
            st = w.stats()
            assert st.stores > 0 and st.peer_bytes > 0 and st.dram_bytes == 0, st
        stored = ws[0].stats().bytes_stored
        assert ws[1].stats().bytes_stored == stored
        # Both lenders take their memory back while the engine steps.
        for p in producers:
            p.send(eval="ctx.reclaim(aqua.ALL, timeout=60)")
        for p in producers:
            assert step_until_reply(e, p)["complete"]
        for w in ws:
            st = w.stats()
            assert st.peer_bytes == 0 and st.dram_bytes == w.tensor.info().max_bytes, st
        forget_gpu_cache(e)
        for p in first:
            e.add(p[: 8 * CHUNK_TOKENS] + prompt(99, 20))
        e.run(model)
        hits = [e.log.external_hits[str(i)] for i in range(3, 6)]
        assert hits == [8 * CHUNK_TOKENS] * 3, hits
        # Every loaded block of every rank held what that rank computed (its own heads).
        assert model.checked_blocks == 3 * 8 * CHUNK_TOKENS // BS
        loaded = [w.stats().bytes_loaded for w in ws]
        assert loaded[0] == loaded[1] > 0
        # vLLM's connector metrics count what all ranks moved (aggregated worker metadata).
        assert e.counters["vllm:kv_offload_store_bytes"] == 2 * stored
        assert e.counters["vllm:kv_offload_load_bytes"] == sum(loaded)
    finally:
        e.shutdown()


def test_two_ranks_on_one_gpu_are_refused_naming_the_holder(aquad, agents: list[Agent]):
    """Two ranks configured onto one GPU: the second cannot register it with aquad, and the
    error says which client holds it."""
    lender(agents, 2)
    with pytest.raises(aqua.BusyError, match="is already registered by vllm-.*-rank0"):
        Engine(spec(capacity_bytes="64MiB"), tensor_parallel=2,
               rank_extra=[{"device": 0}, {"device": 0}])
