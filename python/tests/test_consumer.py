"""A consumer in this process, a producer in another (an agent), a real aquad: borrow, give
back, information, load reports, poll() and fileno(), and a reclaim observed through poll()
with the data intact at the same address."""

import ctypes
import logging
import os
import select
import time

import pytest

import aqua
from conftest import MiB, wait_for


def test_borrows_a_lease_mapped_at_one_address_and_gives_it_back(producer, caplog):
    caplog.set_level(logging.INFO, logger="aqua")
    assert producer.eval("ctx.offer(1 << 30)") == 1 << 30
    with aqua.Consumer(0, client_name="pytest-consumer") as ctx:
        assert "registered with aquad" in caplog.text  # libaqua's log, through logging
        grant = ctx.borrow(256 * MiB)
        lease = grant.lease
        assert lease is not None and grant.dptr == lease.dptr != 0
        assert grant.nbytes == lease.nbytes == 256 * MiB and not grant.partial
        li = lease.info()
        assert (li.dptr, li.nbytes, li.peer_bytes, li.dram_bytes) == (grant.dptr, 256 * MiB,
                                                                        256 * MiB, 0)
        assert li.n_chunks == 8 and li.chunk_bytes == 32 * MiB and li.id > 0
        chunks = lease.chunks()
        assert [c.offset for c in chunks] == [i * 32 * MiB for i in range(8)]
        assert all(c.tier == aqua.Tier.PEER and c.host is None for c in chunks)
        assert ctx.info().borrowed_bytes == 256 * MiB
        lease.give_back()
        assert lease.closed and ctx.info().borrowed_bytes == 0
        with pytest.raises(aqua.ClosedError):
            lease.info()


def test_a_grant_with_less_than_asked_is_partial_and_a_with_block_gives_it_back(producer):
    producer.eval("ctx.offer(64 << 20)")
    with aqua.Consumer(0) as ctx:
        with ctx.borrow(256 * MiB, 32 * MiB) as grant:
            assert grant.partial and grant.nbytes == 64 * MiB
            assert ctx.info().borrowed_bytes == 64 * MiB
        assert grant.lease is not None and grant.lease.closed
        assert ctx.info().borrowed_bytes == 0


def test_info_describes_the_registered_gpu(aquad):
    with aqua.Consumer(0, endpoint=aquad.endpoint, side_path=aquad.side_path,
                       timeout=5) as ctx:
        i = ctx.info()
        assert i.device == 0 and i.role == aqua.Role.CONSUMER and i.connected
        assert i.gpu_uuid.startswith("GPU-") and i.capacity == 16 << 30
        assert i.granularity == 2 * MiB and i.client_id > 0
        assert i.reclaim_deadline == 10.0
        assert repr(ctx).startswith("<aqua.Consumer device 0")


def test_reports_load(aquad):
    with aqua.Consumer(0) as ctx:
        ctx.report_load(0.5, used_bytes=8 << 30, free_bytes=4 << 30)
        ctx.report_load(1.0)
        with pytest.raises(ValueError):
            ctx.report_load(1.5)


def test_a_dram_only_grant_has_no_lease_and_its_budget_goes_back(aquad):
    with aqua.Consumer(0) as ctx:
        grant = ctx.borrow(256 * MiB, 64 * MiB, allow_dram=True)
        assert grant.lease is None and grant.dptr == 0 and grant.dram_bytes >= 64 * MiB
        assert ctx.info().dram_granted == grant.dram_bytes
        ctx.return_dram(grant.dram_bytes)
        assert ctx.info().dram_granted == 0


def test_a_reclaim_is_observed_through_poll_with_the_data_intact_at_the_same_address(producer):
    producer.eval("ctx.offer(1 << 30)")
    with aqua.Consumer(0) as ctx:
        lease = ctx.borrow(128 * MiB).lease
        assert lease is not None
        data = os.urandom(128 * MiB)
        # simcuda: device memory is host memory, so the CPU writes through the mapping.
        ctypes.memmove(lease.dptr, data, len(data))

        # The producer blocks in reclaim() until this poll() has moved the lease off its GPU.
        producer.send(eval="ctx.reclaim(aqua.ALL, timeout=60)")
        moved = 0
        deadline = time.monotonic() + 60
        while moved < 128 * MiB and time.monotonic() < deadline:
            for ev in ctx.poll(timeout=1):
                if isinstance(ev, aqua.Migrated):
                    assert ev.lease is lease and ev.offset % (32 * MiB) == 0
                    moved += ev.nbytes
                else:
                    assert isinstance(ev, aqua.PairChanged)
        assert moved == 128 * MiB
        result = producer.reply()
        assert result == {"type": "ReclaimResult", "freed": 1 << 30, "complete": True}

        # DRAM mapped at the same address (host None), every byte where it was.
        assert all(c.tier == aqua.Tier.DRAM and c.host is None for c in lease.chunks())
        back = ctypes.create_string_buffer(len(data))
        ctx.copy([(ctypes.addressof(back), lease.dptr, len(data))]).wait()  # the CPU may not
        assert back.raw == data  # touch DRAM mapped for the device only: the driver copies
        assert lease.info().dram_bytes == moved
        assert ctx.info().dram_bytes == moved
        lease.give_back()


def test_fileno_wakes_select_when_poll_has_work(producer):
    producer.eval("ctx.offer(256 << 20)")
    with aqua.Consumer(0) as ctx:
        lease = ctx.borrow(64 * MiB).lease
        fd = ctx.fileno()
        assert fd == ctx.fileno() and fd >= 0
        while ctx.poll():
            pass
        producer.exec("ctx.reclaim_async(aqua.ALL)")
        ready, _, _ = select.select([fd], [], [], 30)
        assert ready == [fd]
        events = []
        wait_for(lambda: events.extend(ctx.poll(timeout=1)) or
                 sum(e.nbytes for e in events if isinstance(e, aqua.Migrated)) == 64 * MiB)
        assert sum(e.nbytes for e in events if isinstance(e, aqua.Migrated)) == 64 * MiB
        assert all(c.tier == aqua.Tier.DRAM for c in lease.chunks())


def test_poll_reports_the_daemon_going_and_coming_back(producer, aquad):
    producer.eval("ctx.offer(256 << 20)")
    with aqua.Consumer(0) as ctx:
        lease = ctx.borrow(64 * MiB).lease
        aquad.kill()
        events = ctx.poll(timeout=10)
        assert aqua.Disconnected() in events
        aquad.start()
        seen = list(events)
        wait_for(lambda: seen.extend(ctx.poll(timeout=1)) or aqua.Reconnected() in seen)
        assert aqua.Reconnected() in seen
        assert ctx.info().connected and not lease.closed
        assert ctx.info().borrowed_bytes == 64 * MiB


def test_poll_reports_a_daemon_stopping(aquad):
    with aqua.Consumer(0) as ctx:
        assert aquad.stop() == 0
        seen = []
        wait_for(lambda: seen.extend(ctx.poll(timeout=1)) or aqua.Disconnected() in seen)
        assert aqua.DaemonStopping() in seen or aqua.Disconnected() in seen
