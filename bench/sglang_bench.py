"""bench/run sglang (bench/sglang_bench.py): aqua.sglang against SGLang's own host-memory storage
path, HiCacheFile on tmpfs, in the same run (bench/README.md).

1. Batch set + get throughput: rounds of 64 pages of 256 KiB (16 tokens of 4 layers, 8 heads of
   128, bfloat16, page_first) written from SGLang's own host KV pool to the backend and read
   back into it, each backend called as SGLang's HiCache controller calls it: aqua's through
   the zero-copy interface (batch_set_v1 / batch_get_v1 over the pool's page addresses, what
   `interface_v1` selects), HiCacheFile through the generic one (flat pages: batch_set of the
   pool's pages, batch_get into the pool's dummy pages, then set_from_flat_data_page). Fresh
   keys every round; the figure is a round's bytes written and read over the time both took.
   On a simulated machine a lender's peer memory is host memory, as tmpfs is.
2. The share of the backend's call time spent in aqua.sglang's own code rather than in aqua's
   copies (its call_ns and copy_ns counters).
Prints "name value" lines; bench/run turns them into BENCH lines.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python" / "tests"))

import conftest  # noqa: E402  (simcuda machine, aquad and agents, as the tests use them)
import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import (  # noqa: E402
    _mha_host_inputs)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402

from aqua.sglang import AquaHiCacheStorage  # noqa: E402

PAGES, PS, ROUNDS = 64, 16, 5


def host_pool():
    kv = MHATokenToKVPool(size=4 * PAGES * PS, page_size=PS, dtype=torch.bfloat16, head_num=8,
                          head_dim=128, layer_num=4, device="cpu", enable_memory_saver=False)
    cls, info, kw = _mha_host_inputs(kv)
    return cls(info, 1.0, 0, PS, "page_first", pin_memory=False, **kw)


def config(extra: dict) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=False,
                                enable_storage_metrics=False, is_page_first_layout=True,
                                model_name="bench", extra_config=extra)


def rounds(pool, src, dst, write, read) -> float:
    """Seconds of each measured round's write and read, after a warm-up round."""
    page_bytes = pool.get_dummy_flat_data_page().numel() * 2
    times = []
    for r in range(ROUNDS + 1):
        keys = [f"r{r}p{i}" for i in range(PAGES)]
        t0 = time.perf_counter()
        write(keys, src)
        read(keys, dst)
        times.append(time.perf_counter() - t0)
        if r == 0:  # every byte read is the byte written
            for i in range(0, PAGES * PS, PS):
                a = pool.get_data_page(int(src[i]), flat=True)
                b = pool.get_data_page(int(dst[i]), flat=True)
                assert torch.equal(a, b), "a page read back is not the page written"
    secs = sorted(times[1:])[ROUNDS // 2]
    return 2 * PAGES * page_bytes / secs / 1e9


def bench_aqua(pool, src, dst) -> tuple[float, dict]:
    b = AquaHiCacheStorage(config({"interface_v1": 1, "aqua": {
        "capacity_bytes": "256MiB", "device": 0, "allow_dram": False}}))
    try:
        b.register_mem_pool_host(pool)

        def write(keys, idx):
            assert all(b.batch_set_v1(keys, idx))

        def read(keys, idx):
            assert all(b.batch_get_v1(keys, idx))
        gbps = rounds(pool, src, dst, write, read)
        return gbps, b.report()
    finally:
        b.close()


def bench_file(pool, src, dst, folder: str) -> float:
    os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = folder
    b = HiCacheFile(config({}))
    b.register_mem_pool_host(pool)

    def write(keys, idx):  # the controller's _generic_page_set
        data = [pool.get_data_page(idx[i * PS]) for i in range(len(keys))]
        assert b.batch_set(keys, data)

    def read(keys, idx):  # the controller's _generic_page_get
        pages = b.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys])
        for i, p in enumerate(pages):
            assert p is not None
            pool.set_from_flat_data_page(idx[i * PS], p)
    return rounds(pool, src, dst, write, read)


def main() -> None:
    os.environ.setdefault("AQUA_SIM_DEVICES", "2x4GiB")
    d = conftest.Aquad("dram-budget: 4GiB\nlog-level: warning\n")
    os.environ["AQUA_ENDPOINT"], os.environ["AQUA_SIDE_PATH"] = d.endpoint, d.side_path
    producer = conftest.Agent()
    pool = host_pool()
    src, dst = pool.alloc(PAGES * PS), pool.alloc(PAGES * PS)
    g = torch.Generator().manual_seed(1)
    for i in range(0, PAGES * PS, PS):
        n = pool.get_dummy_flat_data_page().numel()
        pool.set_from_flat_data_page(int(src[i]),
                                     torch.randn(n, generator=g).to(torch.bfloat16))
    try:
        producer.exec("ctx = aqua.Producer(1, client_name='bench-producer', chunk_bytes=32 << 20)")
        producer.eval("ctx.offer(512 << 20)")
        runs: dict[str, list[float]] = {"aqua": [], "file": []}
        for _ in range(3):  # interleaved, medians: the machine is shared
            with tempfile.TemporaryDirectory(dir="/dev/shm") as folder:
                runs["file"].append(bench_file(pool, src, dst, folder))
            # The last run's chunks come back dirty: the lender scrubs them in its poll.
            producer.eval("[ctx.poll(0.1) for _ in range(10)] and None")
            gbps, st = bench_aqua(pool, src, dst)
            runs["aqua"].append(gbps)
    finally:
        producer.stop()
        d.stop()
    med = {k: sorted(v)[1] for k, v in runs.items()}
    print(f"pages {PAGES}")
    print(f"page_kb {pool.get_dummy_flat_data_page().numel() * 2 // 1024}")
    for k, v in med.items():
        print(f"{k}_gbps {v:.3f}")
    print(f"aqua_vs_file {med['aqua'] / med['file']:.3f}")
    print(f"aqua_peer_bytes {st['peer_bytes']}")
    own = (st["call_ns"] - st["copy_ns"]) / st["call_ns"] if st["call_ns"] else 0.0
    print(f"aqua_own_share {own:.3f}")


if __name__ == "__main__":
    main()
