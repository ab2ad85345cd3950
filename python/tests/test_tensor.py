"""Aqua tensors: new, grow, trim, ranges, info, read and write, promote, free; a reclaim that
moves a tensor's chunks to DRAM at the same address, seen through poll()."""

import ctypes
import os

import pytest

import aqua
from conftest import MiB, wait_for


def test_a_new_tensor_reserves_addresses_and_maps_nothing(aquad):
    with aqua.Consumer(0) as ctx, ctx.tensor(100 * MiB, chunk_bytes=32 * MiB) as t:
        i = t.info()
        assert t.dptr == i.dptr != 0 and t.max_bytes == i.max_bytes == 128 * MiB
        assert t.chunk_bytes == 32 * MiB and i.begin == i.end == 0
        assert list(t.ranges()) == [aqua.TensorRange(0, 128 * MiB, aqua.Tier.NONE, None)]


def test_grows_trims_and_walks_local_chunks(aquad):
    with aqua.Consumer(0) as ctx:
        t = ctx.tensor(8 * 4 * MiB, chunk_bytes=4 * MiB, tier=aqua.Tier.LOCAL)
        t.grow(10 * MiB)  # rounded up to whole chunks
        i = t.info()
        assert (i.begin, i.end, i.local_bytes) == (0, 12 * MiB, 12 * MiB)
        assert ctx.info().tensor_local_bytes == 12 * MiB
        t.grow(4 * MiB)  # less than the end: nothing
        assert t.info().end == 12 * MiB
        t.trim(4 * MiB, 8 * MiB)
        i = t.info()
        assert (i.begin, i.end, i.local_bytes) == (4 * MiB, 8 * MiB, 4 * MiB)
        assert list(t.ranges()) == [
            aqua.TensorRange(0, 4 * MiB, aqua.Tier.NONE, None),
            aqua.TensorRange(4 * MiB, 4 * MiB, aqua.Tier.LOCAL, None),
            aqua.TensorRange(8 * MiB, 24 * MiB, aqua.Tier.NONE, None),
        ]
        assert t.range_at(5 * MiB).tier == aqua.Tier.LOCAL
        t.grow(16 * MiB)  # grows at its end again; the start stays
        assert (t.info().begin, t.info().end) == (4 * MiB, 16 * MiB)
        t.free()
        assert t.closed and ctx.info().tensor_local_bytes == 0


def test_reads_and_writes_through_copy_batches(aquad):
    with aqua.Consumer(0) as ctx:
        t = ctx.tensor(16 * MiB, chunk_bytes=4 * MiB, tier=aqua.Tier.LOCAL)
        t.grow(16 * MiB)
        data = os.urandom(6 * MiB)
        t.write(3 * MiB, data)
        assert t.read(3 * MiB, len(data)) == data
        out = bytearray(MiB)
        t.read_into(5 * MiB, memoryview(out))
        assert out == data[2 * MiB:3 * MiB]
        t.write(0, bytearray(b"x" * 4096))  # writable buffers are not copied first
        assert ctypes.string_at(t.dptr, 4096) == b"x" * 4096  # simcuda: the same address
        with pytest.raises(aqua.OutOfRangeError):
            t.write(15 * MiB, data)


def test_places_chunks_in_a_tensor_pool_lease_and_moves_them_to_dram_on_reclaim(producer):
    producer.eval("ctx.offer(128 << 20)")
    with aqua.Consumer(0) as ctx:
        pool = ctx.borrow(128 * MiB, tensors=True, allow_dram=True)
        assert pool.lease is not None and pool.dptr == 0 and pool.lease.for_tensors
        assert ctx.info().pool_free_bytes == 128 * MiB
        t = ctx.tensor(256 * MiB)
        assert t.chunk_bytes == 32 * MiB  # the pool's chunk size
        t.grow(128 * MiB)
        assert t.info().peer_bytes == 128 * MiB and ctx.info().pool_free_bytes == 0
        data = os.urandom(128 * MiB)
        t.write(0, data)

        producer.send(eval="ctx.reclaim(aqua.ALL, timeout=60)")
        moved = []
        wait_for(lambda: moved.extend(e for e in ctx.poll(timeout=0.5)
                                      if isinstance(e, aqua.TensorMigrated)) or
                 sum(e.nbytes for e in moved) >= 128 * MiB, 60)
        assert sum(e.nbytes for e in moved) == 128 * MiB
        assert all(e.tensor is t and e.tier == aqua.Tier.DRAM and e.host is None for e in moved)
        assert producer.reply()["complete"]
        i = t.info()
        assert i.dptr == t.dptr and i.dram_bytes == 128 * MiB and i.peer_bytes == 0
        assert t.read(0, len(data)) == data  # the driver reads DRAM mapped for the device

        # The producer lends again: promote() brings the chunks back to peer memory in place.
        producer.eval("ctx.offer(128 << 20)")
        ctx.borrow(128 * MiB, tensors=True)
        assert t.promote(max_bytes=32 * MiB) == 32 * MiB
        assert ctx.promote() == 96 * MiB
        assert t.info().peer_bytes == 128 * MiB and t.info().dram_bytes == 0
        assert t.read(0, len(data)) == data


def test_a_grow_without_room_raises_no_memory_and_leaves_the_tensor_as_it_was(producer):
    producer.eval("ctx.offer(64 << 20)")
    with aqua.Consumer(0) as ctx:
        ctx.borrow(64 * MiB, tensors=True)
        t = ctx.tensor(256 * MiB)
        t.grow(64 * MiB)
        with pytest.raises(aqua.NoMemoryError) as e:
            t.grow(128 * MiB)
        assert e.value.outcome == aqua.Outcome.NO_MEMORY and e.value.call == "aqua_tensor_grow"
        assert t.info().end == 64 * MiB and t.info().peer_bytes == 64 * MiB
        with pytest.raises(aqua.OutOfRangeError):
            t.grow(512 * MiB)
        with pytest.raises(aqua.OutOfRangeError):
            t.range_at(256 * MiB)
