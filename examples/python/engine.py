#!/usr/bin/env python3
"""A Python engine's use of aqua: borrow peer GPU memory, keep data in it, poll at each step,
survive a reclaim with the data intact, give the memory back.

    AQUA_ENDPOINT=ipc:///tmp/aqua/aquad.sock \\
    AQUA_CUDA_LIBRARY=build/simcuda/libcuda.so.1 python3 examples/python/engine.py

Reading and writing are copies through the CUDA driver (cuMemcpy, unified addressing), as an
engine's own would be: the CPU cannot touch device memory, nor DRAM that a reclaim mapped into
the range for the GPU.
"""
import argparse
import ctypes
import os
import select
import sys
import time

import aqua

BLOCK = 64 << 10  # one KV block here


def pattern(i):
    return bytes((i * 131 + j * 7) & 0xFF for j in range(256)) * (BLOCK // 256)


class Cuda:
    """The few Driver API calls the example copies with, on device's primary context."""

    def __init__(self, device):
        self.lib = ctypes.CDLL(os.environ.get("AQUA_CUDA_LIBRARY") or "libcuda.so.1")
        ctx = ctypes.c_void_p()
        self.call("cuInit", 0)
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), device)
        self.call("cuCtxSetCurrent", ctx)

    def call(self, name, *args):
        r = getattr(self.lib, name)(*args)
        if r != 0:
            raise RuntimeError(f"{name}: CUDA error {r}")

    def copy(self, dst, src, n):
        self.call("cuMemcpy", ctypes.c_uint64(dst), ctypes.c_uint64(src), ctypes.c_size_t(n))


def address_of(ctx, lease, grant, offset):
    """Where the byte at offset of the lease is now: the device range, or a host copy (after a
    reclaim on a driver that cannot map host memory into the range)."""
    for c in ctx.chunks(lease):
        if c.offset <= offset < c.offset + c.bytes:
            return (c.host + offset - c.offset) if c.host else grant.dptr + offset
    raise ValueError(offset)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--borrow", type=int, default=256 << 20, help="bytes to borrow")
    p.add_argument("--blocks", type=int, default=64, help="blocks to write")
    p.add_argument("--wait-reclaim", type=float, default=0,
                   help="seconds to wait for a reclaim (0: just poll a few times)")
    a = p.parse_args()

    print(f"libaqua {aqua.lib.aqua_version().decode()} via ctypes", flush=True)
    with aqua.Context(a.device, aqua.ROLE_CONSUMER, client_name="python-engine") as ctx:
        info = ctx.info()
        print(f"GPU {info.device} {info.gpu_uuid.decode()} paired with "
              f"{info.paired_with.decode() or 'nobody'}", flush=True)
        g = ctx.borrow(a.borrow)
        if g is None or not g.lease:
            print("nothing to borrow: is a producer offering memory?", flush=True)
            return 1
        print(f"borrowed {g.bytes >> 20} MiB at 0x{g.dptr:x}", flush=True)
        cuda = Cuda(a.device)
        buf = ctypes.create_string_buffer(BLOCK)

        # Write blocks spread over the lease (every chunk gets some), as an engine swapping out.
        n = min(a.blocks, g.bytes // BLOCK)
        step = g.bytes // n // BLOCK * BLOCK
        for i in range(n):
            buf.raw = pattern(i)
            cuda.copy(address_of(ctx, g.lease, g, i * step), ctypes.addressof(buf), BLOCK)
        print(f"wrote {n} blocks of {BLOCK >> 10} KiB", flush=True)

        moved = 0
        deadline = time.monotonic() + a.wait_reclaim
        if a.wait_reclaim:
            print("waiting for a reclaim", flush=True)
        fd = ctx.fd()
        while True:
            for ev in ctx.poll():  # the engine's safe point: reclaims are honoured in here
                if ev.type == aqua.EVENT_MIGRATED:
                    moved += ev.bytes
                    print(f"reclaim moved {ev.bytes >> 20} MiB at offset {ev.offset >> 20} MiB "
                          "to DRAM", flush=True)
            left = deadline - time.monotonic()
            if (a.wait_reclaim and moved) or left <= 0:
                break
            select.select([fd], [], [], min(left, 0.05))

        tiers = {}
        for c in ctx.chunks(g.lease):
            name = aqua.TIER_NAMES.get(c.tier, "?")
            tiers[name] = tiers.get(name, 0) + c.bytes
        print("lease now: " + ", ".join(f"{b >> 20} MiB {t}" for t, b in tiers.items()),
              flush=True)

        bad = 0
        for i in range(n):
            cuda.copy(ctypes.addressof(buf), address_of(ctx, g.lease, g, i * step), BLOCK)
            if buf.raw != pattern(i):
                bad += 1
        print(f"read back {n} blocks: {bad} bad", flush=True)
        r = ctx.give_back(g.lease)
        print(f"returned the lease ({aqua.strerror(r)})", flush=True)
        if bad or (a.wait_reclaim and not moved):
            print("FAILED", flush=True)
            return 1
        print(f"ok moved={moved}", flush=True)
        return 0


if __name__ == "__main__":
    sys.exit(main())
