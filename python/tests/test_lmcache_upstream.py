"""LMCache's own check of an L2 adapter, unchanged, with aqua's adapter in place.

lmcache 0.5.6 ships no pytest suite for its L2 adapters; what it ships is its check mode
(lmcache/v1/check/check_mode_test_l2_adapter.py: absent keys, a batch store, lookup-and-lock,
load and a byte-for-byte comparison, through an adapter made from its JSON by its own factory),
its fault-injecting adapter (l2_adapters/fault_inject_l2_adapter.py) and `lmcache bench l2` with
verification. Each runs here as LMCache runs it, from the installed wheel, in a process of its
own, against a real aquad and a lender on the simulated machine; the only thing of aqua's is the
adapter JSON naming aqua.lmcache. The check mode prints its results and exits 0 whatever they are,
so each case reads its "Validation" lines; LMCache's mock adapter runs the same check first, so
that a change of the kit's output shows as that case failing, not as aqua passing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

AQUA = {"type": "plugin", "module_path": "aqua.lmcache", "class_name": "AquaL2Adapter",
        "adapter_params": {"capacity_bytes": "64MiB", "device": 0}}
MOCK = {"type": "mock", "max_size_gb": 1, "mock_bandwidth_gb": 100}


@pytest.fixture
def aquad_config() -> str:
    return "reclaim-deadline: 10s\ndram-budget: 4GiB\n"


def lmcache(*args: str, timeout: float = 300) -> str:
    env = dict(os.environ, LMCACHE_DISABLE_BANNER="1")
    p = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                       timeout=timeout)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    return out


def check_mode(adapter: dict, num_keys: int, kv_dtype: str = "bfloat16") -> list[tuple]:
    """LMCache's check mode on one adapter: its Validation lines as (what, good, total)."""
    cls = {"plugin": "AquaL2Adapter", "mock": "MockL2Adapter",
           "fault_inject": "FaultInjectL2Adapter"}[adapter["type"]]
    out = lmcache("-m", "lmcache.v1.basic_check", "--mode", "test_l2_adapter",
                  "--l2-adapter", json.dumps(adapter), "--num-keys", str(num_keys),
                  "--kv-dtype", kv_dtype)
    assert "Test Failed" not in out, out
    assert f"=== Testing L2 adapter #0 ({cls}) ===" in out, out
    found = re.findall(r"Validation( \((?:loaded|content)\))?: (\d+)/(\d+)", out)
    assert len(found) == 4, out
    return [(what.strip(" ()") or "phase", int(g), int(n)) for what, g, n in found]


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float32", "uint8"])
def test_lmcaches_check_mode_passes_on_its_mock_and_on_aqua(aquad, producer, kv_dtype):
    producer.eval("ctx.offer(128 << 20)")
    assert check_mode(MOCK, 16, kv_dtype) == [("phase", 16, 16), ("phase", 16, 16),
                                              ("loaded", 16, 16), ("content", 16, 16)]
    assert check_mode(AQUA, 16, kv_dtype) == [("phase", 16, 16), ("phase", 16, 16),
                                              ("loaded", 16, 16), ("content", 16, 16)]


def test_lmcaches_fault_injection_around_aqua_drops_only_what_it_says(aquad, producer):
    """fault_inject clears load bits of the keys it picks (gap 2, a quarter by hash): those are
    reported not loaded, and every key reported loaded has its bytes."""
    producer.eval("ctx.offer(128 << 20)")
    faulty = {"type": "fault_inject", "inner": AQUA, "rate": 0.25, "seed": 1,
              "gap_indices": [2]}
    res = check_mode(faulty, 16)
    assert res[:2] == [("phase", 16, 16), ("phase", 16, 16)], res
    (_, loaded, n), (_, content, _) = res[2], res[3]
    assert n == 16 and 0 < loaded < 16 and content == loaded, res


def test_lmcaches_l2_bench_verifies_every_byte_through_aqua(aquad, producer):
    producer.eval("ctx.offer(128 << 20)")
    out = lmcache("-m", "lmcache.cli.main", "bench", "l2", "--l2-adapter", json.dumps(AQUA),
                  "--num-keys", "32", "--data-size-kb", "256", "--rounds", "2",
                  "--lookup-max-hit-rate", "1.0", "--no-skip-verify")
    assert re.search(r"All \d+ keys data verified OK", out), out
