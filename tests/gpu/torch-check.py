"""The PyTorch half of tests/gpu/device-check (needs torch with CUDA): tensors allocated in an
aqua.torch.MemPool over memory a producer on the same GPU lends; after the reclaim that
tests/gpu/device-check starts when this prints "ready", their bytes are in DRAM at the same
addresses and a matmul over them gives the same result."""

import sys
import time

import torch

import aqua
import aqua.torch

MiB = 1 << 20

with aqua.Consumer(0, client_name="torch-check") as ctx:
    ctx.borrow(256 * MiB, tensors=True, allow_dram=True)
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
    print("ready", flush=True)

    deadline = time.monotonic() + 120
    while pool.tensor.info().peer_bytes and time.monotonic() < deadline:
        pool.poll()
        time.sleep(0.01)
    info = pool.tensor.info()
    after = (a @ b).cpu()
    same = torch.equal(before, after)
    ok = inside and info.peer_bytes == 0 and info.dram_bytes > 0 and same
    print(f"check torch {'ok' if ok else 'FAIL'} a matmul over tensors the reclaim moved to "
          f"DRAM ({info.dram_bytes // MiB} MiB) at the same addresses gives the same result: "
          f"{same}", flush=True)
    del a, b
    torch.cuda.synchronize()
    pool.close()
sys.exit(0)
