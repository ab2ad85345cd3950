#!/usr/bin/env python3
"""A Python engine's use of aqua: borrow peer GPU memory, keep data in it, poll at each step,
survive a reclaim with the data intact, give the memory back.

    AQUA_ENDPOINT=ipc:///tmp/aqua/aquad.sock \\
    AQUA_CUDA_LIBRARY=build/simcuda/libcuda.so.1 python3 examples/python/engine.py

It uses the aqua package (python/, `pip install ./python`). Blocks go in and out with
ctx.copy() (libaqua's copy batches through the driver), as on a real GPU, where the CPU cannot
touch device memory, nor DRAM the driver maps for the device only.
"""
import argparse
import ctypes
import select
import sys
import time

import aqua

BLOCK = 64 << 10  # one KV block here


def pattern(i):
    return bytes((i * 131 + j * 7) & 0xFF for j in range(256)) * (BLOCK // 256)


def address_of(lease, offset):
    """Where the byte at offset of the lease is now: the device range, or a host copy (after a
    reclaim on a driver that cannot map host memory into the range)."""
    for c in lease.chunks():
        if c.offset <= offset < c.offset + c.nbytes:
            return (c.host + offset - c.offset) if c.host else lease.dptr + offset
    raise ValueError(offset)


def copy_blocks(ctx, pieces):
    """Copy (dst, src, nbytes) pieces as one batch and wait for it."""
    ctx.copy(pieces).wait()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--borrow", type=int, default=256 << 20, help="bytes to borrow")
    p.add_argument("--blocks", type=int, default=64, help="blocks to write")
    p.add_argument("--wait-reclaim", type=float, default=0,
                   help="seconds to wait for a reclaim (0: just poll a few times)")
    a = p.parse_args()

    print(f"libaqua {aqua.version()} from {aqua.load_library()}", flush=True)
    with aqua.Consumer(a.device, client_name="python-engine") as ctx:
        info = ctx.info()
        print(f"GPU {info.device} {info.gpu_uuid} paired with {info.paired_with or 'nobody'}",
              flush=True)
        try:
            lease = ctx.borrow(a.borrow).lease
        except aqua.NoMemoryError:
            lease = None
        if lease is None:
            print("nothing to borrow: is a producer offering memory?", flush=True)
            return 1
        print(f"borrowed {lease.nbytes >> 20} MiB at 0x{lease.dptr:x}", flush=True)
        # Write blocks spread over the lease (every chunk gets some), as an engine swapping out.
        n = min(a.blocks, lease.nbytes // BLOCK)
        step = lease.nbytes // n // BLOCK * BLOCK
        src = [ctypes.create_string_buffer(pattern(i), BLOCK) for i in range(n)]
        copy_blocks(ctx, [(address_of(lease, i * step), ctypes.addressof(src[i]), BLOCK)
                          for i in range(n)])
        print(f"wrote {n} blocks of {BLOCK >> 10} KiB", flush=True)

        moved = 0
        deadline = time.monotonic() + a.wait_reclaim
        if a.wait_reclaim:
            print("waiting for a reclaim", flush=True)
        fd = ctx.fileno()
        while True:
            for ev in ctx.poll():  # the engine's safe point: reclaims are honoured in here
                if isinstance(ev, aqua.Migrated):
                    moved += ev.nbytes
                    print(f"reclaim moved {ev.nbytes >> 20} MiB at offset {ev.offset >> 20} MiB "
                          "to DRAM", flush=True)
            left = deadline - time.monotonic()
            if (a.wait_reclaim and moved) or left <= 0:
                break
            select.select([fd], [], [], min(left, 0.05))

        tiers = {}
        for c in lease.chunks():
            name = c.tier.name.lower()
            tiers[name] = tiers.get(name, 0) + c.nbytes
        print("lease now: " + ", ".join(f"{b >> 20} MiB {t}" for t, b in tiers.items()),
              flush=True)

        back = ctypes.create_string_buffer(n * BLOCK)
        copy_blocks(ctx, [(ctypes.addressof(back) + i * BLOCK, address_of(lease, i * step), BLOCK)
                          for i in range(n)])
        bad = sum(back.raw[i * BLOCK:(i + 1) * BLOCK] != pattern(i) for i in range(n))
        print(f"read back {n} blocks: {bad} bad", flush=True)
        lease.give_back()
        print("returned the lease", flush=True)
        if bad or (a.wait_reclaim and not moved):
            print("FAILED", flush=True)
            return 1
        print(f"ok moved={moved}", flush=True)
        return 0


if __name__ == "__main__":
    sys.exit(main())
