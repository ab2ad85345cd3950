"""aqua.lmcache: LMCache's L2 adapter interface over an aqua tensor, loaded the way LMCache loads
it (its `plugin` adapter type through create_l2_adapter), driven as LMCache's controllers drive
an adapter (submit, wait on the event fd, query once), with a lender on the simulated machine's
GPU 1 and the adapter's consumer on GPU 0."""

from __future__ import annotations

import json
import select
import time
from typing import Any

import pytest
import torch
from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
from lmcache.v1.distributed.internal_api import L1MemoryDesc
from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface
from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj
from lmcache.v1.platform import consume_fd

from aqua.lmcache import AquaL2Adapter, AquaL2AdapterConfig
from conftest import assert_signatures, wait_for

MiB = 1 << 20
OBJ = 4096  # float32 elements: 16 KiB objects


@pytest.fixture
def aquad_config() -> str:
    return "reclaim-deadline: 10s\ndram-budget: 4GiB\n"


def make_adapter(capacity: str = "64MiB", **params: Any) -> L2AdapterInterface:
    """An adapter made as LMCache makes one from its JSON (the `plugin` type)."""
    spec = {"type": "plugin", "module_path": "aqua.lmcache", "class_name": "AquaL2Adapter",
            "adapter_params": {"capacity_bytes": capacity, "device": 0, **params}}
    import argparse
    cfg = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[json.dumps(spec)]))
    buf = torch.empty(1024)
    return create_l2_adapter(cfg.adapters[0], l1_memory_desc=L1MemoryDesc(
        ptr=buf.data_ptr(), size=buf.numel() * 4, align_bytes=4))


def key(i: int, model: str = "m", rank: int = 0, salt: str = "") -> ObjectKey:
    return ObjectKey(chunk_hash=i.to_bytes(8, "little"), model_name=model, kv_rank=rank,
                     cache_salt=salt)


def obj(fill: float, n: int = OBJ, dtype: torch.dtype = torch.float32) -> TensorMemoryObj:
    t = torch.empty(n, dtype=dtype)
    t.copy_(torch.arange(n, dtype=torch.float64).to(dtype) + fill if dtype.is_floating_point
            else torch.full((n,), int(fill) % 100, dtype=dtype))
    md = MemoryObjMetadata(shape=torch.Size([n]), dtype=dtype, address=t.data_ptr(),
                           phy_size=n * t.element_size(), fmt=MemoryFormat.KV_2LTD, ref_count=1)
    return TensorMemoryObj(t, md, parent_allocator=None)


def wait_fd(fd: int, timeout: float = 30) -> None:
    p = select.poll()
    p.register(fd, select.POLLIN)
    assert p.poll(int(timeout * 1000)), "the adapter did not signal its event fd"
    try:
        consume_fd(fd)
    except BlockingIOError:
        pass


def store(a: L2AdapterInterface, keys: list, objs: list) -> int:
    tid = a.submit_store_task(keys, objs)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        done = a.pop_completed_store_tasks()
        if tid in done:
            assert done[tid].is_successful()
            return done[tid].bytes_transferred()
        wait_fd(a.get_store_event_fd())
    raise AssertionError("the store did not complete")


def bits(bm: Any, n: int) -> list[int]:
    return [1 if bm.test(i) else 0 for i in range(n)]


def lookup(a: L2AdapterInterface, keys: list, layouts: Any = None) -> list[int]:
    tid = a.submit_lookup_and_lock_task(keys, layouts or {})
    end = time.monotonic() + 30
    while time.monotonic() < end:
        bm = a.query_lookup_and_lock_result(tid)
        if bm is not None:
            assert a.query_lookup_and_lock_result(tid) is None, "a result is given once"
            return bits(bm, len(keys))
        wait_fd(a.get_lookup_and_lock_event_fd())
    raise AssertionError("the lookup did not complete")


def load(a: L2AdapterInterface, keys: list, objs: list) -> list[int]:
    tid = a.submit_load_task(keys, objs)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        bm = a.query_load_result(tid)
        if bm is not None:
            return bits(bm, len(keys))
        wait_fd(a.get_load_event_fd())
    raise AssertionError("the load did not complete")


def test_the_class_matches_every_abstract_method_of_lmcaches_interface():
    """A release that changes L2AdapterInterface fails here before it fails in an engine."""
    abstract = {n for n, v in vars(L2AdapterInterface).items()
                if getattr(v, "__isabstractmethod__", False)}
    assert abstract and not AquaL2Adapter.__abstractmethods__
    assert_signatures(AquaL2Adapter, L2AdapterInterface, abstract)


def test_bad_adapter_params_are_refused_by_name():
    for params, words in [({}, "capacity_bytes"), ({"capacity_bytes": "lots"}, "capacity_bytes"),
                          ({"capacity_bytes": -5}, "capacity_bytes"),
                          ({"capacity_bytes": "1GiB", "device": "x"}, "device"),
                          ({"capacity_bytes": "1GiB", "allow_dram": "yes"}, "allow_dram"),
                          ({"capacity_bytes": "1GiB", "colour": 1}, "colour")]:
        with pytest.raises(ValueError, match=words):
            AquaL2AdapterConfig.from_dict(params)


def test_stores_loads_and_follows_a_reclaim_without_losing_a_byte(aquad, producer):
    """Peer HBM first; the lender takes it all back mid-run and the objects move to DRAM; every
    load returns the bytes stored, before and after, and LMCache's accounting adds up."""
    producer.eval("ctx.offer(64 << 20)")
    a = make_adapter("32MiB")
    try:
        assert a.report_status()["peer_bytes"] > 0
        keys = [key(i, salt="s1" if i % 2 else "") for i in range(16)]
        objs = [obj(i) for i in range(16)]
        assert store(a, keys, objs) == 16 * OBJ * 4
        usage = a.get_usage()
        assert usage.total_bytes_used == 16 * OBJ * 4
        assert usage.bytes_by_cache_salt["s1"] == 8 * OBJ * 4
        assert lookup(a, keys) == [1] * 16
        out = [obj(-1) for _ in range(16)]
        assert load(a, keys, out) == [1] * 16
        assert all(torch.equal(o.tensor, s.tensor) for o, s in zip(out, objs))
        a.submit_unlock(keys)

        producer.send(eval="ctx.reclaim(aqua.ALL, timeout=20)")
        end = time.monotonic() + 30
        while a.report_status()["peer_bytes"] and time.monotonic() < end:
            lookup(a, keys[:1])  # the adapter polls aqua between tasks
            a.submit_unlock(keys[:1])
            time.sleep(0.05)
        assert producer.reply()["complete"]
        st = a.report_status()
        assert st["peer_bytes"] == 0 and st["dram_bytes"] > 0 and st["migrations"] > 0, st
        out = [obj(-1) for _ in range(16)]
        assert load(a, keys, out) == [1] * 16
        assert all(torch.equal(o.tensor, s.tensor) for o, s in zip(out, objs))
        more = [obj(100 + i) for i in range(4)]
        store(a, [key(100 + i) for i in range(4)], more)
        out = [obj(-1) for _ in range(4)]
        assert load(a, [key(100 + i) for i in range(4)], out) == [1] * 4
        assert all(torch.equal(o.tensor, s.tensor) for o, s in zip(out, more))
    finally:
        a.close()


def test_never_a_wrong_page(aquad, producer):
    """A key names one page; the same hash of another model, rank or salt is another key, and a
    load into an object of another dtype, shape or size is a miss, never bytes of another."""
    producer.eval("ctx.offer(64 << 20)")
    a = make_adapter("8MiB")
    try:
        store(a, [key(1)], [obj(1)])
        assert lookup(a, [key(1, model="other"), key(1, rank=1), key(1, salt="x"), key(1)]) \
            == [0, 0, 0, 1]
        a.submit_unlock([key(1)])
        half = obj(7, dtype=torch.float16, n=2 * OBJ)  # the same bytes, another dtype
        assert load(a, [key(1)], [half]) == [0]
        assert torch.equal(half.tensor, obj(7, dtype=torch.float16, n=2 * OBJ).tensor)
        assert load(a, [key(1)], [obj(0, n=OBJ // 2)]) == [0]
        layout = {0: MemoryLayoutDesc([torch.Size([OBJ])], [torch.float16])}
        assert lookup(a, [key(1)], layout) == [0], "a lookup for another dtype misses"
        layout = {0: MemoryLayoutDesc([torch.Size([OBJ])], [torch.float32])}
        assert lookup(a, [key(1)], layout) == [1]
        a.submit_unlock([key(1)])
    finally:
        a.close()


def test_eviction_is_visible_at_once_and_spares_locked_pages(aquad, producer):
    """Full: the least recently used unlocked page goes, LMCache's accounting says so, and a
    lookup no longer finds it; a locked page is never evicted."""
    producer.eval("ctx.offer(64 << 20)")
    a = make_adapter("4MiB", slot_bytes="1MiB")  # four slots
    try:
        assert a.report_status()["slots"] == 4
        store(a, [key(i) for i in range(4)], [obj(i) for i in range(4)])
        assert lookup(a, [key(0)]) == [1]  # locked
        store(a, [key(9)], [obj(9)])
        assert lookup(a, [key(i) for i in range(4)] + [key(9)]) == [1, 0, 1, 1, 1]
        a.submit_unlock([key(0), key(0), key(2), key(3), key(9)])
        assert a.get_usage().total_bytes_used == 4 * OBJ * 4
        assert a.report_status()["evictions"] == 1
        store(a, [key(10), key(11), key(12), key(13)], [obj(10 + i) for i in range(4)])
        assert lookup(a, [key(0), key(9), key(10), key(13)]) == [0, 0, 1, 1]
    finally:
        a.close()


def test_a_refused_object_and_a_closed_adapter_say_so(aquad, producer):
    producer.eval("ctx.offer(64 << 20)")
    a = make_adapter("4MiB", slot_bytes="1MiB")
    try:
        huge = obj(0, n=(2 * MiB) // 4)
        assert store(a, [key(1)], [huge]) == 0, "nothing of it is written"
        assert a.report_status()["store_refused"] == 1
        assert lookup(a, [key(1)]) == [0]
        with pytest.raises(ValueError, match="keys for"):
            a.submit_store_task([key(1), key(2)], [obj(0)])
    finally:
        a.close()
    a.close()  # twice: nothing
    with pytest.raises(RuntimeError, match="closed"):
        a.submit_store_task([key(1)], [obj(0)])


def test_aquad_gone_and_the_lender_gone_lose_nothing(aquad, producer, agents):
    """aquad is killed: stored pages stay mapped and load; it comes back and the adapter
    re-registers. The lender dies: its chunks move to DRAM and every page still loads."""
    producer.eval("ctx.offer(64 << 20)")
    a = make_adapter("16MiB")
    try:
        keys, objs = [key(i) for i in range(8)], [obj(i) for i in range(8)]
        store(a, keys, objs)
        aquad.kill()
        out = [obj(-1) for _ in range(8)]
        assert load(a, keys, out) == [1] * 8
        assert all(torch.equal(o.tensor, s.tensor) for o, s in zip(out, objs))
        aquad.start()
        end = time.monotonic() + 30
        while not a.ctx.info().connected and time.monotonic() < end:
            lookup(a, keys[:1])
            a.submit_unlock(keys[:1])
            time.sleep(0.05)
        assert a.ctx.info().connected
        producer.kill()
        end = time.monotonic() + 30
        while a.report_status()["peer_bytes"] and time.monotonic() < end:
            lookup(a, keys[:1])
            a.submit_unlock(keys[:1])
            time.sleep(0.05)
        assert a.report_status()["peer_bytes"] == 0
        out = [obj(-1) for _ in range(8)]
        assert load(a, keys, out) == [1] * 8
        assert all(torch.equal(o.tensor, s.tensor) for o, s in zip(out, objs))
    finally:
        a.close()


def test_no_aquad_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("AQUA_ENDPOINT", f"ipc://{tmp_path}/none.sock")
    monkeypatch.setenv("AQUA_SIDE_PATH", f"{tmp_path}/none.side")
    with pytest.raises(RuntimeError, match="no aquad at"):
        make_adapter("4MiB", timeout=1)


# ------------------------------------------------- end to end: LMCache's own StorageManager

def storage_manager(l2: dict) -> Any:
    """LMCache's multi-process server's storage layer on the CPU: a 16 MiB L1 in host memory
    and one L2 adapter, every finished write stored to it (store policy "default")."""
    import argparse

    from lmcache.v1.distributed.config import (EvictionConfig, L1ManagerConfig,
                                               L1MemoryManagerConfig, StorageManagerConfig)
    from lmcache.v1.distributed.storage_manager import StorageManager
    mem = L1MemoryManagerConfig(size_in_bytes=16 * MiB, use_lazy=False, align_bytes=4096,
                                shm_name="", use_hugepages=False)
    l2_cfg = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[json.dumps(l2)]))
    return StorageManager(StorageManagerConfig(
        l1_manager_config=L1ManagerConfig(memory_config=mem),
        eviction_config=EvictionConfig(eviction_policy="LRU"), l2_adapter_config=l2_cfg,
        store_policy="default", prefetch_policy="default"))


def payload(k: ObjectKey, n: int) -> torch.Tensor:
    import hashlib
    return torch.frombuffer(bytearray(hashlib.shake_256(k.chunk_hash).digest(n)),
                            dtype=torch.uint8)


def scenario_round(sm: Any, written: list, new: list, missing: list, n: int) -> tuple[str, int]:
    """Write new through L1 (stored to L2 by LMCache's store controller), drop every written key
    from L1, prefetch all of them and missing ones from L2 and compare every byte. Returns the
    hit marks ('2' from L2, '1' from L1, '.' a miss) and the bytes that differed."""
    from lmcache.v1.distributed.api import (GroupedObjectKeys, PrefetchLockMode,
                                            PrefetchTaskSpec)
    layout = MemoryLayoutDesc(shapes=[torch.Size([n])], dtypes=[torch.uint8])
    l2 = sm.l2_adapters()[0][1]
    before = l2.get_usage().total_bytes_used
    reserved = sm.reserve_write(new, layout)
    assert len(reserved) == len(new)
    for k, o in reserved.items():
        o.tensor.view(-1).copy_(payload(k, n))
    sm.finish_write(list(reserved))
    written += new
    assert wait_for(lambda: l2.get_usage().total_bytes_used - before >= len(new) * n), \
        "LMCache's store controller did not store the round to L2"
    assert wait_for(lambda: sm.delete_l1_keys(written)[1] == 0)
    keys = written + missing
    h = sm.submit_prefetch_task(PrefetchTaskSpec(
        key_groups=[GroupedObjectKeys(keys=keys, object_group_id=0, layout_desc=layout)],
        num_kv_readers=1, fetching_policy="full", lock_mode=PrefetchLockMode.LOCK),
        external_request_id="aqua-e2e")
    assert sm.wait_prefetch_status(h, 60)
    res = sm.query_prefetch_status(h)
    hit, l2hit = res.hit_cells[0], res.l2_hit_cells[0]
    marks = "".join(("2" if l2hit.test(i) else "1") if hit.test(i) else "."
                    for i in range(len(keys)))
    hits = [k for i, k in enumerate(keys) if hit.test(i)]
    bad = 0
    if hits:
        try:
            with sm.read_prefetched_results(hits) as objs:
                assert objs is not None
                for k, o in zip(hits, objs):
                    bad += int((o.tensor.reshape(-1).view(torch.uint8)[:n] != payload(k, n)).sum())
        finally:
            sm.finish_read_prefetched(hits)
    return marks, bad


def run_scenario(l2: dict, between: Any = lambda r, sm: None) -> list[str]:
    sm = storage_manager(l2)
    written: list = []
    marks = []
    try:
        for r in range(3):
            new = [key(1000 * r + i, model="e2e") for i in range(48)]
            missing = [key(900_000 + 1000 * r + i, model="e2e") for i in range(8)]
            m, bad = scenario_round(sm, written, new, missing, 24 * 1024)
            assert bad == 0, f"round {r}: {bad} bytes differ"
            marks.append(m)
            between(r, sm)
    finally:
        sm.close()
    return marks


def test_lmcaches_storage_manager_over_aqua_through_two_reclaims(aquad, producer):
    """LMCache's StorageManager with aqua as its L2: three rounds of writes through L1, each
    stored to aqua by LMCache's store controller, dropped from L1 and prefetched back by its
    prefetch controller; the lender takes half its memory back after the first round and the
    rest after the second. Every prefetched byte is what was written, and every hit and miss is
    the one LMCache's own in-memory L2 (its mock adapter, the same capacity) decides."""
    producer.eval("ctx.offer(64 << 20)")
    reference = run_scenario({"type": "mock", "max_size_gb": 64 / 1024,
                              "mock_bandwidth_gb": 100})

    def reclaim(r: int, sm: Any) -> None:
        adapter = sm.l2_adapters()[0][1]
        st = adapter.report_status()
        if r == 0:
            assert st["peer_bytes"] == 64 * MiB and st["dram_bytes"] == 0, st
        if r < 2:
            producer.send(eval=f"ctx.reclaim({'32 << 20' if r == 0 else 'aqua.ALL'}, "
                               "timeout=20).complete")
            assert producer.reply(), "the adapter did not give the lender its memory back"
            st = adapter.report_status()
            assert st["peer_bytes"] == (32 * MiB if r == 0 else 0), st
            assert st["migrations"] >= r + 1, st

    spec = {"type": "plugin", "module_path": "aqua.lmcache", "class_name": "AquaL2Adapter",
            "adapter_params": {"capacity_bytes": "64MiB", "device": 0}}
    got = run_scenario(spec, reclaim)
    assert got == reference
    assert all(m.count("2") == len(m) - 8 and m.endswith("." * 8) for m in got), got
