"""A producer in this process, a consumer in another (an agent): offer, reclaim (blocking, with
a timeout, asynchronous) and the events a producer sees."""

import pytest

import aqua
from conftest import Agent, MiB, wait_for


@pytest.fixture
def consumer(aquad, agents):
    a = Agent()
    agents.append(a)
    a.exec("ctx = aqua.Consumer(0, client_name='pytest-consumer')")
    return a


def events_until(ctx, cond, timeout=30):
    seen = []
    wait_for(lambda: seen.extend(ctx.poll(timeout=0.5)) or cond(seen), timeout)
    return seen


def test_offers_and_takes_back_unleased_memory_at_once(aquad):
    with aqua.Producer(1, chunk_bytes=32 * MiB) as p:
        assert p.offer(100 * MiB) == 128 * MiB  # whole chunks
        i = p.info()
        assert i.role == aqua.Role.PRODUCER and i.offered_bytes == 128 * MiB
        assert i.chunk_bytes == 32 * MiB
        assert p.reclaim(64 * MiB, timeout=5) == aqua.ReclaimResult(64 * MiB, True)
        assert p.reclaim() == aqua.ReclaimResult(64 * MiB, True)
        assert p.info().offered_bytes == 0


def test_device_memory_counts_what_it_offered(aquad):
    with aqua.Producer(1, chunk_bytes=32 * MiB) as p:
        free, total = p.device_memory()
        assert total == p.info().capacity and 0 < free <= total
        p.offer(128 * MiB)
        assert p.device_memory() == (free - 128 * MiB, total)
        p.reclaim()
        assert p.device_memory() == (free, total)


def test_a_blocking_reclaim_waits_for_the_consumer_to_move_off(consumer):
    with aqua.Producer(1) as p:
        p.offer(256 * MiB)
        assert consumer.eval("ctx.borrow(128 << 20).nbytes") == 128 * MiB
        seen = events_until(p, lambda s: aqua.PairChanged() in s, 10)
        assert p.info().paired_with == consumer.eval("ctx.info().gpu_uuid")
        # The consumer polls for up to 30 s while this process blocks in reclaim().
        consumer.send(eval="poll_until(ctx, 'Migrated')")
        assert p.reclaim(aqua.ALL, timeout=30) == aqua.ReclaimResult(256 * MiB, True)
        seen_there = consumer.reply()
        assert sum(e["nbytes"] for e in seen_there if e["type"] == "Migrated") == 128 * MiB
        assert p.info().offered_bytes == 0
        assert seen is not None


def test_a_reclaim_past_its_timeout_finishes_in_poll_as_reclaimed_events(consumer):
    with aqua.Producer(1) as p:
        p.offer(256 * MiB)
        consumer.eval("ctx.borrow(64 << 20).nbytes")
        r = p.reclaim(aqua.ALL, timeout=0.2)  # the consumer does not poll yet
        assert not r.complete and r.freed == 192 * MiB
        consumer.eval("poll_until(ctx, 'Migrated')")  # its 64 MiB to DRAM
        seen = events_until(p, lambda s: sum(e.nbytes for e in s
                                             if isinstance(e, aqua.Reclaimed)) >= 64 * MiB)
        assert sum(e.nbytes for e in seen if isinstance(e, aqua.Reclaimed)) == 64 * MiB


def test_an_asynchronous_reclaim_reports_every_freed_chunk(consumer):
    with aqua.Producer(1) as p:
        p.offer(128 * MiB)
        consumer.eval("ctx.borrow(32 << 20).nbytes")
        assert p.reclaim_async(aqua.ALL) is None
        consumer.eval("poll_until(ctx, 'Migrated')")
        seen = events_until(p, lambda s: sum(e.nbytes for e in s
                                             if isinstance(e, aqua.Reclaimed)) >= 128 * MiB)
        assert sum(e.nbytes for e in seen if isinstance(e, aqua.Reclaimed)) == 128 * MiB
        assert p.info().offered_bytes == 0


def test_reports_load(aquad):
    with aqua.Producer(1) as p:
        p.report_load(0.25, used_bytes=4 << 30, free_bytes=8 << 30)
