"""aqua.sglang: SGLang's HiCacheStorage over an aqua tensor, made by SGLang's own backend factory
(its `dynamic` backend) over SGLang's own host KV pools on the CPU, with a lender on the
simulated machine's GPU 1 and the backend's consumer on GPU 0."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, HiCacheStorageConfig,
                                                  HiCacheStorageFailureInjector, PoolHitPolicy,
                                                  PoolName, PoolTransfer)
from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _mha_host_inputs
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from aqua.sglang import AquaHiCacheStorage, AquaSettings
from conftest import assert_signatures, wait_for

PS = 4  # tokens per page
LAYOUTS = ("layer_first", "page_first", "page_first_direct")


@pytest.fixture
def aquad_config() -> str:
    return "reclaim-deadline: 10s\ndram-budget: 4GiB\n"


def host_pool(layout: str = "page_first", dtype: torch.dtype = torch.bfloat16,
              tokens: int = 256) -> Any:
    """SGLang's host KV pool for its own device pool, both on the CPU (2 heads of 16, 3 layers:
    a page is 1536 bytes in bfloat16)."""
    kv = MHATokenToKVPool(size=tokens, page_size=PS, dtype=dtype, head_num=2, head_dim=16,
                          layer_num=3, device="cpu", enable_memory_saver=False)
    cls, info, kw = _mha_host_inputs(kv)
    return cls(info, 2.0, 0, PS, layout, pin_memory=False, **kw)


def make(pool: Any = None, v1: bool = True, model: str = "m", tp_rank: int = 0,
         **aqua_keys: Any) -> AquaHiCacheStorage:
    """A backend made as SGLang makes one from --hicache-storage-backend dynamic and its extra
    config, with pool registered as SGLang's controller registers its host pool."""
    extra = {"backend_name": "aqua", "module_path": "aqua.sglang",
             "class_name": "AquaHiCacheStorage", "interface_v1": int(v1),
             "aqua": {"capacity_bytes": "8MiB", "device": 0, **aqua_keys}}
    cfg = HiCacheStorageConfig(tp_rank=tp_rank, tp_size=2, pp_rank=0, pp_size=1,
                               attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
                               enable_storage_metrics=False, is_page_first_layout=True,
                               model_name=model, extra_config=json.loads(json.dumps(extra)))
    b = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    assert isinstance(b, AquaHiCacheStorage)
    if pool is not None:
        b.register_mem_pool_host(pool)
    return b


def fill(pool: Any, pages: int, seed: int) -> torch.Tensor:
    """Host indices of pages freshly allocated in pool, their KV filled from seed."""
    idx = pool.alloc(pages * PS)
    assert idx is not None
    g = torch.Generator().manual_seed(seed)
    for i in range(pages):
        data = torch.randn(pool.get_dummy_flat_data_page().numel(), generator=g)
        pool.set_from_flat_data_page(int(idx[i * PS]), data.to(pool.dtype))
    return idx


def pages_of(pool: Any, idx: torch.Tensor) -> list[torch.Tensor]:
    return [pool.get_data_page(int(idx[i]), flat=True).clone()
            for i in range(0, idx.numel(), PS)]


def keys(n: int, tag: str = "k") -> list[str]:
    return [f"{tag}{i:04d}" for i in range(n)]


def test_the_class_matches_every_method_of_sglangs_interface():
    """A release that changes HiCacheStorage fails here before it fails in an engine: every
    abstract method, and the zero-copy and v2 ones SGLang calls on a backend that has them."""
    abstract = {n for n, v in vars(HiCacheStorage).items()
                if getattr(v, "__isabstractmethod__", False)}
    assert abstract >= {"get", "batch_get", "set", "batch_set", "exists"}
    assert not AquaHiCacheStorage.__abstractmethods__
    assert_signatures(AquaHiCacheStorage, HiCacheStorage,
                      abstract | {"batch_exists", "batch_get_v1", "batch_set_v1", "batch_get_v2",
                                  "batch_set_v2", "batch_exists_v2", "register_mem_pool_host",
                                  "register_mem_host_pool_v2", "clear"})


def test_a_bad_extra_config_is_refused_by_name():
    for aq, words in [(None, "needs an object \"aqua\""), ({}, "capacity_bytes"),
                      ({"capacity_bytes": "lots"}, "capacity_bytes"),
                      ({"capacity_bytes": -5}, "capacity_bytes"),
                      ({"capacity_bytes": str(1 << 64)}, "capacity_bytes"),
                      ({"capacity_bytes": "1GiB", "device": "x"}, "device"),
                      ({"capacity_bytes": "1GiB", "allow_dram": "yes"}, "allow_dram"),
                      ({"capacity_bytes": "1GiB", "timeout": -1}, "timeout"),
                      ({"capacity_bytes": "1GiB", "colour": 1}, "colour")]:
        with pytest.raises(ValueError, match=words):
            AquaSettings.from_extra_config({} if aq is None else {"aqua": aq})
    with pytest.raises(TypeError, match="HiCacheStorageConfig"):
        AquaHiCacheStorage({"aqua": {"capacity_bytes": 1}})


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("v1", [True, False], ids=["zero-copy", "flat-pages"])
def test_pages_round_trip_before_and_after_the_lender_takes_all_back(aquad, producer, layout, v1):
    """Peer HBM first; the lender takes everything back mid-run and the pages move to DRAM;
    every page read is the page written, byte for byte, before and after."""
    producer.eval("ctx.offer(64 << 20)")
    pool = host_pool(layout)
    b = make(pool, v1=v1)
    try:
        assert b.report()["peer_bytes"] > 0
        idx = fill(pool, 16, seed=1)
        want = pages_of(pool, idx)
        ks = keys(16)
        if v1:
            assert b.batch_set_v1(ks, idx) == [True] * 16
        else:
            assert b.batch_set(ks, pages_of(pool, idx))
        assert b.batch_exists(ks) == 16

        def read_back() -> list[torch.Tensor]:
            if v1:
                dst = pool.alloc(16 * PS)
                assert b.batch_get_v1(ks, dst) == [True] * 16
                got = pages_of(pool, dst)
                pool.free(dst)
                return got
            bufs = [pool.get_dummy_flat_data_page() for _ in ks]
            assert all(x is t for x, t in zip(b.batch_get(ks, bufs), bufs))
            return bufs

        assert all(torch.equal(g, w) for g, w in zip(read_back(), want))
        producer.send(eval="ctx.reclaim(aqua.ALL, timeout=20)")
        assert wait_for(lambda: b.report()["peer_bytes"] == 0, 30), b.report()
        assert producer.reply()["complete"]
        r = b.report()
        assert r["dram_bytes"] > 0 and r["migrations"] > 0, r
        assert b.batch_exists(ks) == 16
        assert all(torch.equal(g, w) for g, w in zip(read_back(), want))
    finally:
        b.close()


def test_never_a_wrong_page(aquad, producer):
    """The same page hash of another model, TP rank or namespace is another key; a page of
    another dtype, layout or form of writing is a miss, and the buffer is left as it was."""
    producer.eval("ctx.offer(64 << 20)")
    pool = host_pool("page_first")
    b = make(pool, v1=True, namespace="a")
    try:
        idx = fill(pool, 2, seed=2)
        assert b.batch_set_v1(keys(2), idx) == [True, True]
        assert b.batch_exists(keys(2)) == 2
        for other in ({"model": "other"}, {"tp_rank": 1}, {"namespace": "b"}):
            o = make(pool, v1=True, **({"namespace": "a"} | other))
            try:
                assert o.batch_exists(keys(2)) == 0, other
                dst = pool.alloc(2 * PS)
                assert o.batch_get_v1(keys(2), dst) == [False, False], other
            finally:
                o.close()
        # float16 pages of the same size: the same bytes would be another page.
        half = host_pool("page_first", dtype=torch.float16)
        h = make(half, v1=True, namespace="a")
        try:
            assert h.batch_exists(keys(2)) == 0
            dst = half.alloc(2 * PS)
            before = pages_of(half, dst)
            assert h.batch_get_v1(keys(2), dst) == [False, False]
            assert all(torch.equal(x, y) for x, y in zip(pages_of(half, dst), before))
        finally:
            h.close()
        # Written zero-copy (pieces of the page in its layout's order), read as a flat page:
        # the bytes are in another order, so a miss; so is a buffer of another size.
        f = make(pool, v1=False, namespace="a")
        try:
            assert f.batch_exists(keys(2)) == 0
            assert f.get(keys(1)[0], pool.get_dummy_flat_data_page()) is None
        finally:
            f.close()
        assert b.get(keys(1)[0], torch.zeros(10, dtype=torch.bfloat16)) is None
        assert b.report()["read_misses"] >= 2
    finally:
        b.close()


def test_eviction_is_visible_at_once_and_least_recently_used_first(aquad, producer):
    producer.eval("ctx.offer(64 << 20)")
    pool = host_pool("page_first")
    b = make(pool, v1=True, slot_bytes=1536, capacity_bytes=4 * 1536)
    try:
        assert b.report()["slots"] == 4
        idx = fill(pool, 5, seed=3)
        ks = keys(5)
        assert b.batch_set_v1(ks[:4], idx[:4 * PS]) == [True] * 4
        dst = pool.alloc(PS)
        assert b.batch_get_v1(ks[:1], dst) == [True]  # k0 is now the most recent
        assert b.batch_set_v1(ks[4:], idx[4 * PS:]) == [True]
        assert [b.exists(k) for k in ks] == [True, False, True, True, True]
        assert b.batch_exists(ks) == 1, "a longest prefix stops at the evicted page"
        assert b.batch_get_v1(ks[1:2], dst) == [False]
        assert b.report()["evictions"] == 1
        b.clear()
        assert b.batch_exists(ks) == 0 and b.report()["pages"] == 0
    finally:
        b.close()


def test_extra_pools_answer_by_their_hit_policy(aquad, producer):
    """batch_exists_v2 as HiCacheFile answers it: the KV prefix, cut where an all-pages pool
    stops, or to the lengths whose trailing pages a trailing-pages pool holds."""
    producer.eval("ctx.offer(64 << 20)")
    pool, swa = host_pool("page_first"), host_pool("page_first")
    b = make(pool, v1=False)
    try:
        b.register_mem_host_pool_v2(swa, PoolName.SWA)
        idx, sidx = fill(pool, 4, seed=4), fill(swa, 4, seed=5)
        ks = keys(4)
        assert b.batch_set(ks, pages_of(pool, idx))
        got = b.batch_set_v2([PoolTransfer(name=PoolName.SWA, host_indices=sidx[2 * PS:],
                                           keys=ks[2:])])
        assert got == {PoolName.SWA.value: [True, True]}
        r = b.batch_exists_v2(ks, [PoolTransfer(name=PoolName.SWA, keys=ks[2:],
                                                hit_policy=PoolHitPolicy.TRAILING_PAGES)])
        assert (r.kv_hit_pages, r.restorable_prefix_pages) == (4, [4]), "pages 2 and 3"
        r = b.batch_exists_v2(ks, [PoolTransfer(name=PoolName.SWA, keys=ks[3:],
                                                hit_policy=PoolHitPolicy.TRAILING_PAGES)])
        assert (r.kv_hit_pages, r.restorable_prefix_pages) == (4, [3, 4]), "a window of one"
        r = b.batch_exists_v2(ks, [PoolTransfer(name=PoolName.SWA, keys=ks,
                                                hit_policy=PoolHitPolicy.ALL_PAGES)])
        assert r.kv_hit_pages == 0
        dst = swa.alloc(2 * PS)
        assert b.batch_get_v2([PoolTransfer(name=PoolName.SWA, host_indices=dst,
                                            keys=ks[2:])]) == {"swa": [True, True]}
        assert all(torch.equal(x, y) for x, y in zip(pages_of(swa, dst),
                                                     pages_of(swa, sidx[2 * PS:])))
        with pytest.raises(RuntimeError, match="no host pool 'mamba'"):
            b.batch_get_v2([PoolTransfer(name=PoolName.MAMBA, host_indices=dst, keys=ks[:2])])
    finally:
        b.close()


def test_bad_calls_say_what_is_wrong_and_a_closed_backend_misses(aquad, producer):
    producer.eval("ctx.offer(64 << 20)")
    pool = host_pool("page_first")
    b = make(pool, v1=True, slot_bytes=1024)  # smaller than a page
    idx = fill(pool, 2, seed=6)
    try:
        with pytest.raises(TypeError, match="page hash"):
            b.exists(b"k")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="page hash"):
            b.batch_set_v1([7], idx[:PS])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="2 keys for 4 host indices"):
            b.batch_set_v1(keys(2), idx[:PS])
        with pytest.raises(ValueError, match="2 keys for 1 values"):
            b.batch_set(keys(2), [torch.zeros(4)])
        with pytest.raises(TypeError, match="contiguous host tensor"):
            b.set("k", "not a tensor")
        assert b.batch_set_v1(keys(2), idx) == [False, False], "larger than a slot"
        assert b.report()["pages_refused"] == 2 and b.batch_exists(keys(2)) == 0
        assert b.set("small", torch.ones(256, dtype=torch.bfloat16))
        assert b.exists("small") is False, "another identity than the KV pool's page"
    finally:
        b.close()
    b.close()  # twice: nothing
    assert b.batch_exists(keys(2)) == 0
    assert b.batch_get_v1(keys(2), idx) == [False, False]
    assert b.batch_set_v1(keys(2), idx) == [False, False]
    assert b.get("small", torch.ones(256, dtype=torch.bfloat16)) is None
    assert b.report()["closed"]


def test_backends_of_one_device_share_one_tier(aquad, producer):
    """SGLang makes a backend per attach; aqua allows one consumer per GPU and process."""
    producer.eval("ctx.offer(64 << 20)")
    pool = host_pool("page_first")
    a, b = make(pool), make(pool)
    try:
        idx = fill(pool, 1, seed=7)
        assert a.batch_set_v1(keys(1), idx) == [True]
        assert b.batch_exists(keys(1)) == 1
        with pytest.raises(ValueError, match="share one tier"):
            make(pool, capacity_bytes="4MiB")
        a.close()
        assert b.batch_exists(keys(1)) == 1, "the tier stays while a backend uses it"
    finally:
        a.close()
        b.close()
    assert b.report()["closed"]


def test_sglangs_failure_injector_around_aqua_fails_only_what_it_says(aquad, producer):
    """HiCacheStorageFailureInjector fails a share of the calls it forwards: each failed call
    is SGLang's failure value, every other one reads the page written."""
    producer.eval("ctx.offer(64 << 20)")
    pool = host_pool("page_first")
    b = make(pool)
    inj = HiCacheStorageFailureInjector(b, 0.0, 0.5)
    try:
        idx = fill(pool, 8, seed=8)
        want = pages_of(pool, idx)
        written = set()
        for i, k in enumerate(keys(8)):
            if inj.batch_set_v1([k], idx[i * PS:(i + 1) * PS]) == [True]:
                written.add(i)
        assert b.report()["pages_written"] == len(written)
        dst = pool.alloc(PS)
        good = 0
        for i, k in enumerate(keys(8)):
            if inj.batch_get_v1([k], dst) == [True]:
                assert i in written and torch.equal(pages_of(pool, dst)[0], want[i])
                good += 1
        assert good <= len(written)
    finally:
        b.close()


def test_aquad_gone_and_the_lender_gone_lose_nothing(aquad, producer):
    """aquad is killed: the pages stay mapped and read; it comes back and the tier registers
    again. The lender dies: its chunks move to DRAM and every page still reads."""
    producer.eval("ctx.offer(64 << 20)")
    pool = host_pool("layer_first")
    b = make(pool)
    try:
        idx = fill(pool, 8, seed=9)
        want = pages_of(pool, idx)
        ks = keys(8)
        assert b.batch_set_v1(ks, idx) == [True] * 8

        def check() -> None:
            dst = pool.alloc(8 * PS)
            assert b.batch_get_v1(ks, dst) == [True] * 8
            assert all(torch.equal(g, w) for g, w in zip(pages_of(pool, dst), want))
            pool.free(dst)

        aquad.kill()
        check()
        aquad.start()
        assert wait_for(lambda: b.report()["aquad_connected"], 30)
        check()
        producer.kill()
        assert wait_for(lambda: b.report()["peer_bytes"] == 0, 30), b.report()
        check()
        assert b.batch_exists(ks) == 8
    finally:
        b.close()


def test_no_aquad_is_an_error_that_names_where_it_was_looked_for(monkeypatch, tmp_path):
    monkeypatch.setenv("AQUA_ENDPOINT", f"ipc://{tmp_path}/none.sock")
    monkeypatch.setenv("AQUA_SIDE_PATH", f"{tmp_path}/none.side")
    with pytest.raises(RuntimeError, match=r"no aquad at ipc://.*none.sock for device 0.*"
                                           r"'endpoint' in \"aqua\" of the extra config"):
        make(host_pool(), timeout=1)
