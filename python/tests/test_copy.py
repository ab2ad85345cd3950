"""Copy batches with tickets, on the caller's streams (raw handles and objects of the stream
protocols) after and before the caller's events, and layer-wise offload and prefetch."""

import os

import pytest

import aqua
import simcuda
from conftest import MiB


class TorchLikeStream:
    def __init__(self, handle):
        self.cuda_stream = handle


class CudaCoreLikeStream:
    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


class TorchLikeEvent:
    def __init__(self, handle):
        self.cuda_event = handle


@pytest.fixture
def ctx(aquad):
    with aqua.Consumer(0) as c:
        simcuda.use_device(0)
        yield c


@pytest.fixture
def tensor(ctx):
    t = ctx.tensor(32 * MiB, chunk_bytes=4 * MiB, tier=aqua.Tier.LOCAL)
    t.grow(32 * MiB)
    return t


def host(data):
    import ctypes

    buf = (ctypes.c_char * len(data)).from_buffer(data)
    return ctypes.addressof(buf), buf


def test_a_batch_of_pieces_completes_under_its_ticket(ctx, tensor):
    src = bytearray(os.urandom(4 * MiB))
    src_addr, _keep = host(src)
    # Scattered 64 KiB pieces, some continuing each other (libaqua merges those).
    pieces = [aqua.CopyPiece(tensor.dptr + i * 128 * 1024, src_addr + i * 64 * 1024, 64 * 1024)
              for i in range(64)]
    ticket = ctx.copy(pieces)
    assert isinstance(ticket, aqua.Ticket) and ticket.id > 0
    ticket.wait()
    assert ticket.done()
    for i in range(64):
        assert tensor.read(i * 128 * 1024, 64 * 1024) == src[i * 64 * 1024:(i + 1) * 64 * 1024]
    later = ctx.copy([(tensor.dptr, src_addr, 1024)])
    assert later.id > ticket.id
    later.wait()
    with pytest.raises(ValueError):
        ctx.copy([])


@pytest.mark.parametrize("wrap", [int, TorchLikeStream, CudaCoreLikeStream])
def test_runs_on_the_callers_stream_after_the_work_queued_there(ctx, tensor, wrap):
    st = simcuda.stream()
    gate = simcuda.Gate(st)  # holds the stream
    src = bytearray(b"s" * MiB)
    src_addr, _keep = host(src)
    done = simcuda.event()
    ticket = ctx.copy([(tensor.dptr, src_addr, MiB)], stream=wrap(st),
                      done_event=TorchLikeEvent(done))
    assert not ticket.done() and not simcuda.event_done(done)
    gate.open()
    ticket.wait()
    assert ticket.done() and simcuda.event_done(done)
    assert tensor.read(0, MiB) == src


def test_starts_after_the_callers_event(ctx, tensor):
    writer = simcuda.stream()
    gate = simcuda.Gate(writer)
    written = simcuda.event()
    simcuda.record(written, writer)  # completes once the gate opens
    src = bytearray(b"w" * MiB)
    src_addr, _keep = host(src)
    ticket = ctx.copy([(tensor.dptr + MiB, src_addr, MiB)], wait_event=written)
    assert not ticket.done()
    gate.open()
    ticket.wait()
    assert tensor.read(MiB, MiB) == src


def test_offloads_and_prefetches_layer_by_layer_on_the_callers_streams(ctx, tensor):
    offload, prefetch = simcuda.stream(), simcuda.stream()
    n, size = 4, MiB
    work = ctx.tensor(8 * MiB, chunk_bytes=4 * MiB, tier=aqua.Tier.LOCAL)  # working memory
    work.grow(8 * MiB)
    data = [os.urandom(size) for _ in range(n)]
    with ctx.layers(n, offload_stream=TorchLikeStream(offload),
                    prefetch_stream=CudaCoreLikeStream(prefetch)) as layers:
        assert len(layers) == n
        gate = simcuda.Gate(offload)
        computed = simcuda.event()
        simcuda.record(computed, simcuda.stream())
        for i in range(n):
            work.write(i * size, data[i])
            layers.offload(i, [(tensor.dptr + i * size, work.dptr + i * size, size)],
                           computed=computed)
        assert not layers.done(0)  # the offload stream is held
        ev = layers.event(0)
        assert ev and not simcuda.event_done(ev)
        gate.open()
        for i in range(n):
            layers.wait(i)
            assert layers.done(i) and simcuda.event_done(layers.event(i))
        for i in range(n):  # back, into the other half of the working memory
            layers.prefetch(i, [(work.dptr + 4 * MiB + i * size, tensor.dptr + i * size, size)])
        for i in range(n):
            layers.wait(i)
            assert work.read(4 * MiB + i * size, size) == data[i]
        with pytest.raises(IndexError):
            layers.wait(n)
    with pytest.raises(aqua.ClosedError):
        layers.done(0)


def test_no_libaqua_stream_is_a_type_error(ctx, tensor):
    with pytest.raises(TypeError):
        ctx.copy([(tensor.dptr, tensor.dptr + MiB, 1)], stream="default")
