"""aqua.vllm's worker where a lender, a model or vLLM's scheduler differs from the common case:
a lender whose chunks are not libaqua's default size, an MLA model's KV cache under tensor
parallelism (the same on every rank), and synchronous loads, which must not wait behind stores."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import torch
from conftest import MiB, Agent, wait_for
from simcuda import Gate, stream, use_device
from test_vllm import CHUNK_TOKENS, Engine, Model, aqua_worker, forget_gpu_cache, prompt, spec
from vllm.utils.math_utils import round_up
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec as SlotSpec
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

import aqua
from aqua.vllm import AquaOffloadingSpec, AquaOffloadingWorker, AquaSettings


def lender(agents: list[Agent], chunk_bytes: int, offer: int) -> Agent:
    a = Agent()
    agents.append(a)
    a.exec(f"ctx = aqua.Producer(1, client_name='lender', chunk_bytes={chunk_bytes})")
    a.eval(f"ctx.offer({offer})")
    return a


@pytest.mark.parametrize("chunk_mib", [2, 16, 64])
def test_the_tensor_takes_the_lenders_chunk_size_and_lives_in_its_memory(aquad, agents,
                                                                         chunk_mib):
    """The lender's chunks are not 32 MiB: the worker's tensor is made of chunks of the lease's
    size, so that 64 MiB offered back 40 MiB of slots (no DRAM needed), and blocks stored there
    load back identical."""
    lender(agents, chunk_mib * MiB, 64 * MiB)
    e = Engine(spec(capacity_bytes="40MiB", allow_dram=False))
    try:
        w = aqua_worker(e)
        info = w.tensor.info()
        assert info.chunk_bytes == chunk_mib * MiB
        assert info.max_bytes == round_up(w.nbytes, chunk_mib * MiB)
        assert info.peer_bytes == info.max_bytes and info.dram_bytes == 0, info
        model = Model(e)
        first = [prompt(i, 8 * CHUNK_TOKENS + 5) for i in range(2)]
        for p in first:
            e.add(p)
        e.run(model)
        forget_gpu_cache(e)
        for p in first:
            e.add(p[: 8 * CHUNK_TOKENS] + prompt(99, 20))
        e.run(model)
        assert model.checked_blocks == 2 * 8 * CHUNK_TOKENS // 16
        assert w.stats().bytes_loaded > 0
    finally:
        e.shutdown()


def test_a_chunk_size_set_against_the_lease_is_named_at_start(aquad, agents):
    """chunk_bytes set by hand to other than the lender's: start fails saying so, not asking
    for more DRAM budget."""
    lender(agents, 16 * MiB, 64 * MiB)
    with pytest.raises(RuntimeError, match=r"'chunk_bytes' \(33554432\) is not the lease's "
                                           r"chunk size \(16777216"):
        Engine(spec(capacity_bytes="40MiB", chunk_bytes="32MiB", allow_dram=False))
    with aqua.Consumer(0) as ctx:  # nothing was left registered or borrowed
        assert ctx.info().borrowed_bytes == 0


def test_no_aquad_at_the_endpoint_is_named_at_start(tmp_path):
    where = f"ipc://{tmp_path}/nowhere.sock"
    with pytest.raises(RuntimeError, match=f"no aquad at {where} for device 0"):
        Engine(spec(endpoint=where, timeout=1))


def test_without_a_lender_the_tensor_is_dram_of_the_default_chunk_size(aquad):
    e = Engine(spec(capacity_bytes="40MiB"))
    try:
        info = aqua_worker(e).tensor.info()
        assert info.chunk_bytes == 32 * MiB and info.dram_bytes == info.max_bytes == 64 * MiB
    finally:
        e.shutdown()


# ------------------------------------------------------------------------- MLA under TP

PAGE = 16 * 576 * 2  # an MLA page: 16 tokens of one 576-wide latent (DeepSeek's), fp16


def mla_config(tp: int, rank: int, capacity: int, replicated: bool) -> OffloadingConfig:
    """The OffloadingConfig vLLM's connector makes for one rank of an MLA model with 4 layers,
    blocks of 16 tokens, chunks of 4 blocks: replicated_layout is what vLLM sets for pure-MLA,
    TP-only parallelism."""
    extra = {"spec_name": "AquaOffloadingSpec", "spec_module_path": "aqua.vllm",
             "capacity_bytes": capacity, "block_size": 64}
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(16, tuple(f"layer.{i}" for i in range(4)), 0),),
        worker_kv_bytes_per_block=4 * PAGE, enable_kv_cache_events=False, extra_config=extra,
        engine_id="mla-test", model=OffloadingModelConfig(name="mla", dtype="float16",
                                                          max_model_len=4096),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=4),
        parallel=OffloadingParallelConfig(
            rank=rank, world_size=tp, tp_size=tp, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False),
        replicated_layout=replicated)


def cpu_spec_chunks(config: OffloadingConfig, monkeypatch: pytest.MonkeyPatch) -> int:
    """The chunks vLLM's CPU spec counts for the config on a CUDA machine (where its host
    region is shared by the ranks, and an MLA cache kept once)."""
    extra = dict(config.extra_config, spec_name="CPUOffloadingSpec",
                 cpu_bytes_to_use=config.extra_config["capacity_bytes"])
    del extra["capacity_bytes"]
    monkeypatch.setattr(CPUOffloadingSpec, "_uses_shared_region", lambda self: True)
    from dataclasses import replace
    return CPUOffloadingSpec(replace(config, extra_config=extra)).num_chunks


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_an_mla_cache_under_tp_counts_as_many_slots_as_vllms_cpu_spec(tp, monkeypatch):
    capacity = 8 * round_up(4 * 4 * PAGE, AquaOffloadingSpec.BLOCK_SIZE_ALIGNMENT)
    aqua_spec = AquaOffloadingSpec(mla_config(tp, 0, capacity, replicated=tp > 1))
    assert aqua_spec.num_slots == 8
    assert aqua_spec.num_slots == cpu_spec_chunks(mla_config(tp, 0, capacity, tp > 1),
                                                  monkeypatch)
    # Every rank stores its own copy (aqua has no region the ranks share).
    assert not aqua_spec.replicated_layout


def test_a_head_sharded_cache_under_tp_still_counts_every_ranks_share(monkeypatch):
    capacity = 8 * round_up(4 * 4 * PAGE, AquaOffloadingSpec.BLOCK_SIZE_ALIGNMENT)
    for tp in (2, 4):
        config = mla_config(tp, 0, capacity, replicated=False)
        assert AquaOffloadingSpec(config).num_slots == 8 // tp
        assert AquaOffloadingSpec(config).num_slots == cpu_spec_chunks(config, monkeypatch)


def mla_caches(num_blocks: int) -> tuple[CanonicalKVCaches, list[torch.Tensor]]:
    """A rank's MLA KV cache as vLLM hands it to a worker: one page per block and layer, no K/V
    halves."""
    layers = [torch.zeros((num_blocks, PAGE), dtype=torch.int8) for _ in range(4)]
    tensors = [CanonicalKVCacheTensor(tensor=t, page_size_bytes=PAGE) for t in layers]
    refs = [[CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=PAGE) for i in range(4)]]
    return CanonicalKVCaches(tensors=tensors, group_data_refs=refs), layers


@pytest.mark.parametrize("tp", [2, 4])
def test_each_rank_of_an_mla_model_keeps_every_slot_and_loads_it_back(aquad, tp):
    """Each rank's worker holds all of vLLM's slots of its own copy of the latent cache (one
    process stands for the ranks, one at a time: one GPU each, rank r on GPU 0 here)."""
    capacity = 8 * round_up(4 * 4 * PAGE, AquaOffloadingSpec.BLOCK_SIZE_ALIGNMENT)
    for rank in range(tp):
        s = AquaOffloadingSpec(mla_config(tp, rank, capacity, replicated=True))
        caches, layers = mla_caches(32)
        w = s.get_worker(caches)
        try:
            assert isinstance(w, AquaOffloadingWorker) and w.num_slots == 8
            assert w.stats().slot_bytes == 4 * 4 * PAGE
            g = torch.Generator().manual_seed(rank)
            for t in layers:
                t[:16] = torch.randint(-128, 127, (16, PAGE), generator=g, dtype=torch.int8)
            want = [t[:16].clone() for t in layers]
            slots = SlotSpec([0, 1, 2, 3])
            w.submit_store(1, GPULoadStoreSpec(list(range(16)), [16], [0]), slots)
            w.wait({1})
            for t in layers:
                t.zero_()
            w.submit_load(2, slots, GPULoadStoreSpec(list(range(16, 32)), [16], [0]))
            w.wait({2})
            for t, x in zip(layers, want):
                assert torch.equal(t[16:32], x)
        finally:
            w.shutdown()


# ---------------------------------------------------------------------- expedited loads

@pytest.fixture
def two_streams(aquad: Any) -> Iterator[tuple[AquaOffloadingWorker, int]]:
    """A worker over an engine's KV caches with a store and a sync-load stream of simcuda's
    own (no torch CUDA here), and the store stream, for a gate to hold."""
    use_device(0)
    store_stream, load_stream = stream(), stream()
    e = Engine(spec(capacity_bytes="16MiB"))
    try:
        w0 = aqua_worker(e)
        w = AquaOffloadingWorker(_caches(e), blocks_per_chunk=4, num_slots=w0.num_slots,
                                 settings=AquaSettings(capacity_bytes=16 * MiB),
                                 consumer=w0.ctx, streams=(store_stream, load_stream))
        try:
            yield w, store_stream
        finally:
            w.shutdown()
    finally:
        e.shutdown()


def blocks(lo: int) -> GPULoadStoreSpec:
    return GPULoadStoreSpec(list(range(lo, lo + 4)), [4], [0])


def test_a_sync_load_is_not_queued_behind_a_store(two_streams):
    """vLLM asks for a synchronous (expedited) load and waits for it in the same step: it runs
    on the worker's own load stream, so a store still queued (here held by a gate on the store
    stream) does not delay it; both finish, each reported once."""
    w, store_stream = two_streams
    w.submit_store(1, blocks(0), SlotSpec([0]))
    w.wait({1})
    assert [r.job_id for r in w.get_finished()] == [1]
    gate = Gate(store_stream)
    w.submit_store(2, blocks(4), SlotSpec([1]))
    w.submit_load(3, SlotSpec([0]), blocks(8), expedited=True)
    w.wait({3})
    done = w.get_finished()
    assert [r.job_id for r in done] == [3] and done[0].success
    gate.open()
    assert wait_for(lambda: [r.job_id for r in w.get_finished()], timeout=10) == [2]
    assert w.get_finished() == []


def test_a_plain_load_stays_behind_the_stores_before_it(two_streams):
    """Asynchronous loads keep the store stream's order (vLLM's CPU worker runs them after the
    stores it queued first)."""
    w, store_stream = two_streams
    gate = Gate(store_stream)
    w.submit_store(1, blocks(0), SlotSpec([0]))
    w.submit_load(2, SlotSpec([0]), blocks(4))
    assert w.get_finished() == []
    gate.open()
    w.wait({1, 2})
    assert sorted(r.job_id for r in w.get_finished()) == [1, 2]


def _caches(e: Any) -> CanonicalKVCaches:
    tensors = [t.view(torch.int8).view(t.shape[0], -1) for t in e.kv_caches.values()]
    page = tensors[0].shape[1]
    return CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(tensor=t, page_size_bytes=page) for t in tensors],
        group_data_refs=[[CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=page)
                          for i in range(len(tensors))]])
