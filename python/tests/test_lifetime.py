"""close() and garbage-collection ordering: what a context handed out raises ClosedError once
the context is closed, and never reaches libaqua with a freed handle."""

import gc
import warnings

import pytest

import aqua
from conftest import MiB


def test_everything_a_closed_context_handed_out_raises_closed(producer):
    producer.eval("ctx.offer(128 << 20)")
    ctx = aqua.Consumer(0)
    lease = ctx.borrow(32 * MiB).lease
    tensor = ctx.tensor(16 * MiB, chunk_bytes=4 * MiB, tier=aqua.Tier.LOCAL)
    tensor.grow(8 * MiB)
    ticket = ctx.copy([(tensor.dptr, tensor.dptr + 4 * MiB, 4096)])
    layers = ctx.layers(2)
    ctx.close()
    assert ctx.closed and lease.closed and tensor.closed
    calls = [ctx.info, ctx.fileno, ctx.poll, lambda: ctx.borrow(MiB), lease.info, lease.chunks,
             lease.give_back, tensor.info, lambda: tensor.grow(16 * MiB),
             lambda: tensor.trim(0, 0), lambda: list(tensor.ranges()), tensor.promote,
             lambda: tensor.read(0, 16), ticket.done, ticket.wait, lambda: layers.done(0),
             lambda: layers.event(1), lambda: ctx.copy([(1, 2, 3)]),
             lambda: ctx.report_load(0.1)]
    for call in calls:
        with pytest.raises(aqua.ClosedError):
            call()
    ctx.close()  # twice: nothing
    tensor.free()  # freed with the context: nothing
    layers.close()
    with ctx:  # exits closing again
        pass


def test_freed_and_given_back_objects_raise_closed(aquad):
    with aqua.Consumer(0) as ctx:
        t = ctx.tensor(8 * MiB, chunk_bytes=4 * MiB, tier=aqua.Tier.LOCAL)
        t.free()
        t.free()
        with pytest.raises(aqua.ClosedError):
            t.grow(4 * MiB)
        with ctx.layers(1) as layers:
            pass
        with pytest.raises(aqua.ClosedError):
            layers.wait(0)
        assert not ctx.closed


def test_a_context_dropped_while_its_lease_lives_stays_open_for_the_lease(producer):
    producer.eval("ctx.offer(128 << 20)")
    lease = aqua.Consumer(0).borrow(32 * MiB).lease  # no name keeps the context
    gc.collect()
    assert lease is not None and not lease.closed
    assert lease.info().nbytes == 32 * MiB  # the lease keeps its context alive
    ctx = lease.context
    ctx.close()
    with pytest.raises(aqua.ClosedError):
        lease.info()


def test_a_garbage_collected_context_is_closed_with_a_resource_warning(producer):
    producer.eval("ctx.offer(128 << 20)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ctx = aqua.Consumer(0)
        t = ctx.tensor(8 * MiB, chunk_bytes=4 * MiB, tier=aqua.Tier.LOCAL)
        ctx.borrow(32 * MiB)
        del ctx, t  # a cycle: context <-> its lease and tensor
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) for w in caught)
    # The daemon saw the disconnect: the 32 MiB go back to its pool once the producer has
    # scrubbed them (in its poll()), and another consumer gets them.
    with aqua.Consumer(0) as again:
        assert again.borrow(128 * MiB, 0).nbytes >= 96 * MiB
        producer.eval("poll_until(ctx, 'None', 1)")
        assert again.info().borrowed_bytes + again.borrow(32 * MiB).nbytes == 128 * MiB


def test_a_neutral_context_registers_without_a_role(aquad):
    with aqua.Context(1) as ctx:
        assert ctx.role == aqua.Role.NEUTRAL and ctx.info().role == aqua.Role.NEUTRAL
        assert not hasattr(ctx, "borrow") and not hasattr(ctx, "offer")
