"""Each error path raises the exception of its outcome or errno, keeping the code."""

import errno
import os
import signal
import subprocess
import time

import pytest

import aqua
from conftest import Agent, MiB


def test_no_daemon_at_the_endpoint_is_not_connected(tmp_path):
    with pytest.raises(aqua.NotConnectedError) as e:
        aqua.Consumer(0, endpoint=f"ipc://{tmp_path}/aquad.sock", timeout=1)
    assert e.value.errno in (errno.ENOENT, errno.ECONNREFUSED) and e.value.call == "aqua_open"


def test_nothing_to_lend_is_no_memory(aquad):
    with aqua.Consumer(0) as ctx:
        with pytest.raises(aqua.NoMemoryError) as e:
            ctx.borrow(64 * MiB)
        assert e.value.outcome == aqua.Outcome.NO_MEMORY and e.value.errno is None
        assert e.value.code == 3 and "aqua_borrow" in str(e.value)


def test_a_gpu_another_process_registered_is_busy_with_the_daemons_reason(aquad, agents):
    other = Agent()
    agents.append(other)
    other.exec("ctx = aqua.Consumer(0)")
    with pytest.raises(aqua.BusyError) as e:
        aqua.Consumer(0)
    assert e.value.errno == errno.EBUSY and e.value.detail  # what libaqua logged


@pytest.mark.parametrize("aquad_config", ["reclaim-deadline: 200ms\n"])
def test_a_consumer_that_missed_a_reclaim_deadline_is_barred(producer):
    producer.eval("ctx.offer(256 << 20)")
    with aqua.Consumer(0) as ctx:
        ctx.borrow(64 * MiB)
        producer.exec("ctx.reclaim_async(aqua.ALL)")
        time.sleep(1.5)  # no poll(): the deadline passes
        with pytest.raises(aqua.BarredError) as e:
            producer.eval("ctx.offer(256 << 20)")
            ctx.borrow(64 * MiB)
        assert e.value.outcome == aqua.Outcome.BARRED


@pytest.mark.parametrize("aquad_config", ["limits:\n  leases: 1\n"])
def test_the_daemons_lease_limit_is_a_limit_error(producer):
    producer.eval("ctx.offer(256 << 20)")
    with aqua.Consumer(0) as ctx:
        ctx.borrow(32 * MiB)
        with pytest.raises(aqua.LimitError) as e:
            ctx.borrow(32 * MiB)
        assert e.value.outcome == aqua.Outcome.LIMIT


def test_an_offer_for_a_gpu_an_operator_drained_is_a_draining_error(aquad):
    aquactl = [os.path.join(os.environ["AQUA_BUILD"], "aquactl", "aquactl")]
    with aqua.Producer(1, chunk_bytes=2 * MiB) as ctx:
        ctx.offer(8 * MiB)
        subprocess.run(aquactl + ["drain", "1"], check=True, capture_output=True)
        with pytest.raises(aqua.DrainingError) as e:
            ctx.offer(8 * MiB)
        assert e.value.outcome == aqua.Outcome.DRAINING and "aqua_offer" in str(e.value)
        assert "aquactl undrain" in str(e.value)
        subprocess.run(aquactl + ["undrain", "1"], check=True, capture_output=True)
        assert ctx.offer(8 * MiB) == 8 * MiB


@pytest.mark.parametrize("aquad_config", ["limits:\n  request-rate: 1\n  request-burst: 2\n"])
def test_too_many_requests_are_throttled(aquad):
    with aqua.Consumer(0) as ctx:
        with pytest.raises(aqua.ThrottledError) as e:
            for _ in range(20):
                try:
                    ctx.borrow(32 * MiB)
                except aqua.NoMemoryError:
                    pass
        assert e.value.outcome == aqua.Outcome.THROTTLED


def test_a_daemon_that_does_not_answer_times_out(aquad):
    with aqua.Consumer(0, timeout=0.3) as ctx:
        aquad.signal(signal.SIGSTOP)
        try:
            with pytest.raises(aqua.DaemonTimeoutError) as e:
                ctx.borrow(32 * MiB)
            assert e.value.errno == errno.ETIMEDOUT
        finally:
            aquad.signal(signal.SIGCONT)


def test_bad_arguments(aquad):
    with aqua.Consumer(0) as ctx:
        with pytest.raises(aqua.InvalidArgumentError) as e:
            ctx.tensor(64 * MiB, chunk_bytes=MiB)  # not a multiple of the 2 MiB granularity
        assert e.value.errno == errno.EINVAL and isinstance(e.value, ValueError)
        with pytest.raises(ValueError):
            ctx.borrow(32 * MiB, 64 * MiB)  # min_bytes > nbytes: refused before libaqua
        with pytest.raises(ValueError):
            ctx.borrow(-1)


def test_a_pool_lease_backing_a_tensor_is_busy_until_the_tensor_is_freed(producer):
    producer.eval("ctx.offer(64 << 20)")
    with aqua.Consumer(0) as ctx:
        lease = ctx.borrow(64 * MiB, tensors=True).lease
        t = ctx.tensor(64 * MiB)
        t.grow(32 * MiB)
        with pytest.raises(aqua.BusyError):
            lease.give_back()
        assert not lease.closed
        t.free()
        lease.give_back()
        assert lease.closed
        with pytest.raises(aqua.ClosedError) as e:
            lease.give_back()
        assert e.value.errno == errno.EBADF


def test_a_give_back_the_daemon_did_not_hear_still_releases_the_lease(producer, aquad):
    producer.eval("ctx.offer(64 << 20)")
    with aqua.Consumer(0, timeout=0.5) as ctx:
        lease = ctx.borrow(32 * MiB).lease
        aquad.signal(signal.SIGSTOP)
        try:
            with pytest.raises((aqua.DaemonTimeoutError, aqua.NotConnectedError)):
                lease.give_back()
        finally:
            aquad.signal(signal.SIGCONT)
        assert lease.closed and ctx.info().borrowed_bytes == 0


# Custody by identity, item 10: integers are range-checked before ctypes, which would wrap them.
def test_a_device_ordinal_past_a_c_int_is_refused_not_wrapped(aquad):
    with pytest.raises(aqua.InvalidArgumentError) as e:
        aqua.Consumer(2**32 + 2)
    assert "device" in str(e.value) and str(2**32 + 2) in str(e.value)
    with pytest.raises(aqua.InvalidArgumentError, match="device"):
        aqua.Consumer(-1)
    with pytest.raises(aqua.InvalidArgumentError, match="timeout"):
        aqua.Consumer(0, timeout=float("nan"))


@pytest.mark.parametrize("call, words", [
    (lambda c, t: t.grow(2**70), "end"),
    (lambda c, t: t.trim(-5, -1), "begin"),
    (lambda c, t: t.trim(2**64, 2**64 + 1), "begin"),
    (lambda c, t: t.range_at(-1), "offset"),
    (lambda c, t: t.read(-1, 16), "offset"),
    (lambda c, t: c.layers(2**32 + 3), "n_layers"),
    (lambda c, t: c.borrow(2**64), "nbytes"),
    (lambda c, t: c.borrow(1 << 20, -1), "min_bytes"),
    (lambda c, t: c.copy([(t.dptr, 2**64 + t.dptr, 16)]), "src"),
    (lambda c, t: c.poll(float("nan")), "timeout"),
    (lambda c, t: c.report_load(float("nan")), "load"),
])
def test_integers_out_of_range_are_refused_naming_them(aquad, call, words):
    with aqua.Consumer(0) as ctx:
        t = ctx.tensor(64 * MiB, tier=aqua.Tier.LOCAL)
        t.grow(8 * MiB)
        before = t.info()
        with pytest.raises(aqua.InvalidArgumentError) as e:
            call(ctx, t)
        assert words in str(e.value)
        assert t.info() == before, "nothing changed"


def test_close_wakes_a_thread_blocked_in_poll(aquad):
    import threading

    ctx = aqua.Consumer(0)
    raised = []

    def waiter():
        try:
            ctx.poll(None)
        except aqua.ClosedError as exc:
            raised.append(exc)

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.3)
    ctx.close()
    th.join(5)
    assert not th.is_alive(), "poll(None) stayed blocked after close()"
    assert raised, "poll() did not say the context was closed"


def test_a_borrow_aquad_cannot_journal_is_a_journal_error_and_changes_nothing(aquad, producer):
    """aquad's disk is full (its journal may grow no more): the borrow is refused and undone, and
    the engine can tell that from a broken disk of its own (AQUA_JOURNAL, not -EIO)."""
    import resource
    producer.eval("ctx.offer(256 << 20)")
    with aqua.Consumer(0) as ctx:
        size = os.path.getsize(os.path.join(aquad.dir, "journal"))
        resource.prlimit(aquad.proc.pid, resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))
        with pytest.raises(aqua.JournalError) as e:
            ctx.borrow(32 * MiB)
        assert e.value.outcome == aqua.Outcome.JOURNAL and e.value.errno is None
        assert "durable" in str(e.value)
        assert ctx.info().borrowed_bytes == 0
        resource.prlimit(aquad.proc.pid, resource.RLIMIT_FSIZE,
                         (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        for _ in range(100):  # aquad tries its journal again within a second
            try:
                ctx.borrow(32 * MiB)
                break
            except aqua.JournalError:
                time.sleep(0.05)
        assert ctx.info().borrowed_bytes == 32 * MiB
