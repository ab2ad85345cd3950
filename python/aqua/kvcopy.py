"""Block-granular copies between an engine's KV-cache blocks on the GPU and slots of one aqua
tensor: the transfer path of aqua.vllm, without vLLM.

An engine's KV cache is one or more tensors of fixed-size pages (one page per block, per tensor);
offloaded blocks live in slots of ``blocks_per_chunk`` pages of an aqua tensor, region after region
(one region per KV tensor). A job is one copy batch of (dst, src, bytes) rows on a stream of the
copier's own that first waits for the engine's compute stream, as vLLM's CPU worker orders its
copies. aqua.vllm builds on this; tests/gpu runs it on real CUDA tensors where vLLM is absent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

import aqua
from aqua import _ffi


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Region:
    """One KV tensor: its blocks on the GPU, its slot pages in the aqua tensor."""

    gpu_base: int
    gpu_row_stride: int
    page_bytes: int
    offset: int  #: of its first slot page in the aqua tensor
    slot_stride: int  #: blocks_per_chunk * page_bytes
    refs_bytes: list[int] = field(default_factory=list)


def regions_for(tensors: Sequence[tuple[torch.Tensor, int]], blocks_per_chunk: int,
                num_slots: int) -> tuple[list[Region], int]:
    """The regions of KV tensors given as (tensor, page_size_bytes), and the bytes they need."""
    regions: list[Region] = []
    offset = 0
    for tensor, page in tensors:
        view = tensor.view(torch.int8).view((-1, page))
        regions.append(Region(gpu_base=view.data_ptr(), gpu_row_stride=view.stride(0),
                              page_bytes=page, offset=offset,
                              slot_stride=page * blocks_per_chunk))
        offset += num_slots * page * blocks_per_chunk
    return regions, offset


def rows(regions: Sequence[Region], groups: Sequence[Sequence[tuple[int, int]]], dptr: int,
         blocks_per_chunk: int, gpu_ids: np.ndarray, slot_ids: np.ndarray,
         group_sizes: Sequence[int], block_indices: Sequence[int],
         store: bool) -> tuple[np.ndarray, int]:
    """(dst, src, nbytes) rows for a job, paired as vLLM's CPU worker pairs blocks and slots: per
    KV-cache group, its blocks in order against the pages of its slots, the group's first slot
    entered part-way (block_indices). groups[g] lists (region index, bytes of a block's data)."""
    gpu_ids = gpu_ids.astype(np.uint64)
    slot_ids = slot_ids.astype(np.uint64)
    bpc = blocks_per_chunk
    parts: list[np.ndarray] = []
    nbytes = 0
    gpu_off = slot_off = 0
    for g, (size, first) in enumerate(zip(group_sizes, block_indices)):
        if size == 0:
            continue
        skip = first % bpc
        count = cdiv(size + skip, bpc)
        g_blocks = gpu_ids[gpu_off:gpu_off + size]
        g_slots = slot_ids[slot_off:slot_off + count]
        gpu_off += size
        slot_off += count
        sub = (g_slots[:, None] * bpc + np.arange(bpc, dtype=np.uint64)[None, :]).ravel()
        sub = sub[skip:skip + size]
        for t_idx, ref_bytes in groups[g]:
            r = regions[t_idx]
            gpu = np.uint64(r.gpu_base) + g_blocks * np.uint64(r.gpu_row_stride)
            slot = np.uint64(dptr + r.offset) + sub * np.uint64(r.page_bytes)
            out = np.empty((size, 3), dtype=np.uint64)
            out[:, 0], out[:, 1] = (slot, gpu) if store else (gpu, slot)
            out[:, 2] = ref_bytes
            parts.append(out)
            nbytes += size * ref_bytes
    if gpu_off != len(gpu_ids) or slot_off != len(slot_ids):
        raise ValueError(f"aqua: a job of {len(gpu_ids)} GPU blocks and {len(slot_ids)} slots "
                         "does not match its groups")
    all_rows = np.concatenate(parts) if parts else np.empty((0, 3), dtype=np.uint64)
    return all_rows, nbytes


def relocate(col: np.ndarray, dptr: int, moved: dict[int, tuple[int, int]]) -> None:
    """Point slot addresses in runs a reclaim moved to host memory the tensor's range does not
    map (offset -> (nbytes, host address)) at that memory."""
    for off, (n, host) in moved.items():
        lo, hi = dptr + off, dptr + off + n
        hit = (col >= lo) & (col < hi)
        col[hit] = col[hit] - np.uint64(lo) + np.uint64(host)


class Copier:
    """Copy batches of rows on one stream, each waiting first for what the current (compute)
    stream has queued. stream: a raw handle or a torch stream; None: a new torch CUDA stream of
    the given priority where torch has CUDA, else libaqua's own stream."""

    def __init__(self, ctx: aqua.Consumer, stream: Any = None, *, priority: int = 0):
        self.ctx = ctx
        self.cuda = torch.cuda.is_available()
        if stream is None and self.cuda:
            stream = torch.cuda.Stream(priority=priority)
        self.stream = stream

    def submit(self, job_rows: np.ndarray) -> Optional[aqua.Ticket]:
        """One batch for the rows; None when there are none."""
        if not len(job_rows):
            return None
        job_rows = np.ascontiguousarray(job_rows, dtype=np.uint64)
        arr = (_ffi.CopyPiece * len(job_rows)).from_buffer(job_rows.data)
        wait = None
        if self.cuda:
            # Stores read what the compute stream wrote; loads must not overtake its writes
            # (zeroing) to their destination blocks.
            wait = torch.cuda.Event()
            wait.record(torch.cuda.current_stream())
        return self.ctx.copy(arr, stream=self.stream, wait_event=wait)
