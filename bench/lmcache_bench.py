"""bench/run lmcache (bench/lmcache_bench.py): aqua.lmcache against LMCache's own L2 adapters,
all measured by LMCache's own benchmark (`lmcache bench l2`) in the same run (bench/README.md).

1. Batch set + get throughput: the same keys and sizes stored and loaded through aqua's adapter
   (on a simulated machine: a lender's peer memory is host memory, as DRAM is) and through
   LMCache's `fs` adapter on tmpfs (/dev/shm) and its `mock` adapter (objects cloned in memory,
   its bandwidth limit set far above memcpy's). The figure is the bytes of one round's store and
   its load over the time both took, averaged over the measured rounds.
2. The share of the adapter's task time spent in aqua's adapter code rather than in the copies
   or in LMCache's code it calls (the base class's _notify_keys_* accounting, the event
   notifiers that wake LMCache's controllers): its task thread times each task and, inside it,
   those two (AQUA_LMCACHE_STATS); the median of the three runs' shares.
Prints "name value" lines; bench/run turns them into BENCH lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python" / "tests"))

import conftest  # noqa: E402  (simcuda machine, aquad and agents, as the tests use them)

KEYS, KB, ROUNDS = 64, 256, 5


def bench(adapter: dict, stats: str = "") -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "bench.json"
        env = dict(os.environ, LMCACHE_DISABLE_BANNER="1")
        if stats:
            env["AQUA_LMCACHE_STATS"] = stats
        subprocess.run([sys.executable, "-m", "lmcache.cli.main", "bench", "l2", "-q",
                        "--format", "json", "--output", str(out), "--l2-adapter",
                        json.dumps(adapter), "--num-keys", str(KEYS), "--data-size-kb", str(KB),
                        "--rounds", str(ROUNDS), "--warmup-rounds", "1",
                        "--lookup-max-hit-rate", "1.0"],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        m = json.loads(out.read_text())["metrics"]
    ops = {v["operation"]: v for k, v in m.items() if k.startswith("op_")}
    for op in ("Store", "Load"):
        assert ops[op]["total_success"] == ops[op]["total_keys"], (adapter, ops[op])
    round_bytes = KEYS * KB * 1024
    ms = ops["Store"]["duration_avg_ms"] + ops["Load"]["duration_avg_ms"]
    return {"gbps": 2 * round_bytes / (ms / 1000) / 1e9, "ms": ms}


def own_share(st: dict) -> float:
    """Of the adapter's task time, the share neither in aqua's copies nor in LMCache's code."""
    return (st["task_ns"] - st["copy_ns"] - st["engine_ns"]) / st["task_ns"] if st["task_ns"] \
        else 0.0


def main() -> None:
    os.environ.setdefault("AQUA_SIM_DEVICES", "2x4GiB")
    d = conftest.Aquad("dram-budget: 4GiB\nlog-level: warning\n")
    os.environ["AQUA_ENDPOINT"], os.environ["AQUA_SIDE_PATH"] = d.endpoint, d.side_path
    producer = conftest.Agent()
    try:
        producer.exec("ctx = aqua.Producer(1, client_name='bench-producer', chunk_bytes=32 << 20)")
        producer.eval("ctx.offer(256 << 20)")
        aqua_spec = {"type": "plugin", "module_path": "aqua.lmcache",
                     "class_name": "AquaL2Adapter",
                     "adapter_params": {"capacity_bytes": "128MiB", "device": 0,
                                        "allow_dram": False}}
        with tempfile.TemporaryDirectory(dir="/dev/shm") as fs_dir, \
                tempfile.NamedTemporaryFile(suffix=".json") as stats:
            runs = {"mock": [], "fs": [], "aqua": []}
            for _ in range(3):  # interleaved, medians: the machine is shared
                runs["mock"].append(bench({"type": "mock", "max_size_gb": 1,
                                           "mock_bandwidth_gb": 10000}))
                runs["fs"].append(bench({"type": "fs", "base_path": fs_dir}))
                # The last run's chunks come back dirty: the lender scrubs them in its poll.
                producer.eval("[ctx.poll(0.1) for _ in range(10)] and None")
                runs["aqua"].append(bench(aqua_spec, stats.name))
                runs["aqua"][-1]["stats"] = json.loads(Path(stats.name).read_text())
    finally:
        producer.stop()
        d.stop()
    med = {k: sorted(r["gbps"] for r in v)[1] for k, v in runs.items()}
    # The adapter's figures of the run with the median share of its own code.
    st = sorted((r["stats"] for r in runs["aqua"]), key=own_share)[1]
    print(f"keys {KEYS}")
    print(f"object_kb {KB}")
    for k, v in med.items():
        print(f"{k}_gbps {v:.3f}")
    print(f"aqua_vs_fs {med['aqua'] / med['fs']:.3f}")
    print(f"aqua_vs_mock {med['aqua'] / med['mock']:.3f}")
    print(f"aqua_peer_bytes {st['peer_bytes']}")
    print(f"aqua_engine_share {st['engine_ns'] / st['task_ns'] if st['task_ns'] else 0:.3f}")
    print(f"aqua_own_share {own_share(st):.3f}")
    own_ns = st["task_ns"] - st["copy_ns"] - st["engine_ns"]
    print(f"aqua_own_us_per_object {own_ns / 1000 / max(st['stores'] + st['loads'], 1):.2f}")


if __name__ == "__main__":
    main()
