"""aqua.kvcopy, the transfer path of aqua.vllm without vLLM: the rows it pairs and the batches it
copies, on CPU tensors over simcuda (tests/gpu runs the same on CUDA tensors)."""

import numpy as np
import pytest
import torch

import aqua
from aqua import kvcopy
from conftest import MiB

PAGE = 4096


def test_rows_pair_blocks_with_slot_pages_as_vllms_cpu_worker_does():
    kv = [(torch.zeros(8, PAGE, dtype=torch.int8), PAGE), (torch.zeros(8, 2 * PAGE,
                                                                         dtype=torch.int8),
                                                             2 * PAGE)]
    regions, nbytes = kvcopy.regions_for(kv, blocks_per_chunk=4, num_slots=3)
    assert nbytes == 3 * 4 * PAGE + 3 * 4 * 2 * PAGE
    assert [r.offset for r in regions] == [0, 3 * 4 * PAGE]
    groups = [[(0, PAGE), (1, 2 * PAGE)]]
    dptr = 1 << 40
    # Three blocks into slot 2, entered at its second page (block_indices 1).
    rows, moved = kvcopy.rows(regions, groups, dptr, 4, np.array([5, 0, 7]), np.array([2]),
                              [3], [1], store=True)
    assert moved == 3 * PAGE + 3 * 2 * PAGE
    first = regions[0]
    assert rows[0].tolist() == [dptr + (2 * 4 + 1) * PAGE, first.gpu_base + 5 * PAGE, PAGE]
    assert rows[2].tolist() == [dptr + (2 * 4 + 3) * PAGE, first.gpu_base + 7 * PAGE, PAGE]
    second = regions[1]
    assert rows[3].tolist() == [dptr + second.offset + (2 * 4 + 1) * 2 * PAGE,
                                second.gpu_base + 5 * 2 * PAGE, 2 * PAGE]
    loads, _ = kvcopy.rows(regions, groups, dptr, 4, np.array([5, 0, 7]), np.array([2]), [3],
                           [1], store=False)
    assert (loads[:, [1, 0, 2]] == rows).all(), "a load is the store reversed"
    with pytest.raises(ValueError, match="does not match its groups"):
        kvcopy.rows(regions, groups, dptr, 4, np.array([5, 0]), np.array([2, 3]), [2], [0], True)


def test_relocate_points_moved_runs_at_their_host_memory():
    col = np.array([100, 150, 260], dtype=np.uint64)
    kvcopy.relocate(col, 0, {100: (100, 5000)})
    assert col.tolist() == [5000, 5050, 260]


def test_a_store_and_a_load_through_the_copier_keep_every_byte(aquad):
    blocks = torch.randint(-128, 127, (16, PAGE), dtype=torch.int8)
    regions, nbytes = kvcopy.regions_for([(blocks, PAGE)], blocks_per_chunk=2, num_slots=8)
    with aqua.Consumer(0) as ctx:
        tensor = ctx.tensor(nbytes, chunk_bytes=2 * MiB, tier=aqua.Tier.LOCAL)
        tensor.grow(tensor.info().max_bytes)
        copier = kvcopy.Copier(ctx)
        ids = np.array([3, 4, 9, 10])
        saved = blocks[ids].clone()
        rows, _ = kvcopy.rows(regions, [[(0, PAGE)]], tensor.dptr, 2, ids, np.array([5, 6]),
                              [4], [0], store=True)
        copier.submit(rows).wait()
        blocks[ids] = 0
        rows, _ = kvcopy.rows(regions, [[(0, PAGE)]], tensor.dptr, 2, ids, np.array([5, 6]),
                              [4], [0], store=False)
        copier.submit(rows).wait()
        assert torch.equal(blocks[ids], saved)
        assert copier.submit(np.empty((0, 3), dtype=np.uint64)) is None
        tensor.free()
