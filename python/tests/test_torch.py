"""aqua.torch without torch: the pluggable allocator's entry points (libaqua-torch.so) called as
torch calls them, on a pool whose memory a producer lends; a reclaim seen through the pool's
poll() moves the pieces' bytes to DRAM at the same addresses."""

import ctypes
import os

import pytest

import aqua
import aqua.torch
from conftest import MiB, wait_for


def test_pieces_come_from_the_pool_and_go_back(aquad):
    with aqua.Consumer(0) as ctx, aqua.torch.MemPool(ctx, 64 * MiB, chunk_bytes=4 * MiB,
                                                   tier=aqua.Tier.LOCAL) as pool:
        a = pool.alloc(3 * MiB)
        b = pool.alloc(5 * MiB)
        assert a == pool.tensor.dptr and b == a + 3 * MiB
        i = pool.info()
        assert (i.pieces, i.bytes, i.mapped_bytes) == (2, 8 * MiB, 8 * MiB)
        pool.free(b)
        assert pool.info().mapped_bytes == 4 * MiB
        with pytest.raises(aqua.NoMemoryError):
            pool.alloc(65 * MiB)
        with pytest.raises(aqua.BusyError):
            aqua.torch.MemPool(ctx, 4 * MiB)
    assert pool.closed


def test_a_reclaim_moves_the_pools_bytes_to_dram_at_the_same_addresses(producer):
    producer.eval("ctx.offer(64 << 20)")
    with aqua.Consumer(0) as ctx:
        ctx.borrow(64 * MiB, tensors=True, allow_dram=True)
        pool = aqua.torch.MemPool(ctx, 64 * MiB)
        data = os.urandom(48 * MiB)
        p = pool.alloc(len(data))
        ctypes.memmove(p, data, len(data))  # simcuda: device memory is host memory
        assert pool.tensor.info().peer_bytes > 0

        producer.send(eval="ctx.reclaim(aqua.ALL, timeout=60)")
        moved = []
        wait_for(lambda: moved.extend(e for e in pool.poll()
                                      if isinstance(e, aqua.TensorMigrated)) or
                 pool.tensor.info().peer_bytes == 0, 60)
        assert producer.reply()["complete"]
        assert pool.tensor.info().dram_bytes >= len(data)
        assert pool.tensor.read(p - pool.tensor.dptr, len(data)) == data  # via the driver
        pool.free(p)
        pool.close()


def test_a_closed_pool_or_context_refuses_and_the_allocator_gives_null(aquad):
    ctx = aqua.Consumer(0)
    pool = aqua.torch.MemPool(ctx, 8 * MiB, tier=aqua.Tier.LOCAL, chunk_bytes=4 * MiB)
    shim = ctypes.CDLL(aqua.torch.library_path())
    shim.aqua_torch_alloc.restype = ctypes.c_void_p
    shim.aqua_torch_alloc.argtypes = (ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
    assert shim.aqua_torch_alloc(MiB, 1, None) is None, "another device"
    assert shim.aqua_torch_alloc(MiB, 0, None)
    pool.close()
    assert shim.aqua_torch_alloc(MiB, 0, None) is None, "nothing bound"
    with pytest.raises(aqua.ClosedError):
        pool.alloc(MiB)
    ctx.close()
