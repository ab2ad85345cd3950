"""The PyTorch half of tests/gpu/device-check (needs torch with CUDA; no vLLM): a producer on the
same GPU lends; this borrows it and

- allocates tensors in an aqua.torch.MemPool over that memory;
- stores blocks of real CUDA KV-cache tensors into slots of an aqua tensor through
  aqua.kvcopy, aqua.vllm's transfer path (a copy batch on a torch stream of its own, after an
  event of the compute stream), and loads them back;

then prints "ready", and tests/gpu/device-check has the producer reclaim. After the reclaim the
pool's tensors are in DRAM at the same addresses and a matmul over them gives the same result,
and the stored KV blocks come back byte for byte from DRAM. One "check NAME ok|FAIL" per part."""

import sys
import time

import numpy as np
import torch

import aqua
import aqua.torch
from aqua import kvcopy

MiB = 1 << 20
PAGE = 64 << 10  # bytes of one block of one layer
BLOCKS, BPC, SLOTS = 256, 4, 32


def kv_job(regions, dptr, ids, slots, store):
    rows, _ = kvcopy.rows(regions, [[(0, PAGE), (1, PAGE)]], dptr, BPC, ids, slots, [len(ids)],
                          [0], store)
    return rows


with aqua.Consumer(0, client_name="torch-check") as ctx:
    ctx.borrow(320 * MiB, tensors=True, allow_dram=True)
    pool = aqua.torch.MemPool(ctx, 256 * MiB)
    with torch.cuda.use_mem_pool(pool.torch_pool()):
        a = torch.randn(2048, 2048, device="cuda:0")
        b = torch.randn(2048, 2048, device="cuda:0")
    torch.cuda.synchronize()
    lo, hi = pool.tensor.dptr, pool.tensor.dptr + pool.tensor.max_bytes
    inside = all(lo <= t.data_ptr() < hi for t in (a, b))
    print(f"info torch pool: {pool.info()}, a and b inside the aqua tensor: {inside}")
    before = (a @ b).cpu()
    print(f"info torch tensor tiers before: {pool.tensor.info()}")

    # Two KV layers of BLOCKS blocks on the GPU, written by the compute stream.
    layers = [torch.randint(-128, 127, (BLOCKS, PAGE), dtype=torch.int8, device="cuda:0")
              for _ in range(2)]
    regions, nbytes = kvcopy.regions_for([(t, PAGE) for t in layers], BPC, SLOTS)
    slots_t = ctx.tensor(nbytes)
    slots_t.grow(slots_t.info().max_bytes)
    copier = kvcopy.Copier(ctx)
    ids = np.array([3, 4, 5, 6, 40, 41, 42, 43, 200, 201, 202, 203])
    slot_ids = np.array([0, 7, 31])
    saved = [t[ids].clone() for t in layers]
    copier.submit(kv_job(regions, slots_t.dptr, ids, slot_ids, True)).wait()
    for t in layers:
        t[ids] = 0  # on the compute stream: the load below must wait for it
    copier.submit(kv_job(regions, slots_t.dptr, ids, slot_ids, False)).wait()
    torch.cuda.synchronize()
    kv_peer = all(torch.equal(t[ids], s) for t, s in zip(layers, saved))
    kv_tiers = slots_t.info()
    for t in layers:
        t[ids] = 0
    torch.cuda.synchronize()
    print(f"info kvcopy: {len(ids)} blocks x 2 layers stored and loaded back from "
          f"{kv_tiers.peer_bytes // MiB} MiB peer / {kv_tiers.dram_bytes // MiB} MiB DRAM: "
          f"{kv_peer}")
    print("ready", flush=True)

    deadline = time.monotonic() + 120
    while (pool.tensor.info().peer_bytes or slots_t.info().peer_bytes) and \
            time.monotonic() < deadline:
        pool.poll()
        time.sleep(0.01)
    info = pool.tensor.info()
    after = (a @ b).cpu()
    same = torch.equal(before, after)
    ok = inside and info.peer_bytes == 0 and info.dram_bytes > 0 and same
    print(f"check torch {'ok' if ok else 'FAIL'} a matmul over tensors the reclaim moved to "
          f"DRAM ({info.dram_bytes // MiB} MiB) at the same addresses gives the same result: "
          f"{same}", flush=True)

    copier.submit(kv_job(regions, slots_t.dptr, ids, slot_ids, False)).wait()
    torch.cuda.synchronize()
    kv_dram = all(torch.equal(t[ids], s) for t, s in zip(layers, saved))
    kv_after = slots_t.info()
    ok = kv_peer and kv_dram and kv_tiers.peer_bytes > 0 and kv_after.peer_bytes == 0
    print(f"check kvcopy {'ok' if ok else 'FAIL'} KV blocks of CUDA tensors stored through "
          f"aqua.kvcopy on a torch stream came back from peer memory ({kv_peer}) and, after the "
          f"reclaim, from DRAM ({kv_dram}; {kv_after.dram_bytes // MiB} MiB there)", flush=True)
    del a, b
    torch.cuda.synchronize()
    slots_t.free()
    pool.close()
sys.exit(0)
