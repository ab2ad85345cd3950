"""The KV a made-up model computes, for aqua.vllm's tests: what each block of a request holds
is a function of its prefix (and of the tensor-parallel rank: each holds other heads) only, so
that any request with that prefix expects the same bytes, and a block loaded from offloaded KV
can be checked against what the model would have computed.

Split in two so that ranks in processes of their own can do their part: plan() reads vLLM's
scheduler output and block tables (the scheduler's side), apply() writes and checks one rank's
KV caches. Imports neither pytest nor the tests' conftest (which would make another simulated
machine of a rank's process)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch


def kv_value(tokens: list[int], shape: torch.Size, rank: int = 0) -> torch.Tensor:
    key = str(tokens) + (f"@{rank}" if rank else "")
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).half()


@dataclass
class Work:
    """One scheduled request of a step: its tokens, its GPU blocks, the tokens computed before
    this step (start: those below it of a new request were hits) and those scheduled now."""

    tokens: list[int]
    blocks: list[int]
    start: int
    n: int
    new: bool


def plan(out: Any, prompts: dict[str, list[int]], block_ids: Any) -> list[Work]:
    """The step's work from vLLM's SchedulerOutput; block_ids(rid) gives a request's blocks."""
    starts = {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs}
    cached = out.scheduled_cached_reqs
    starts.update(zip(cached.req_ids, cached.num_computed_tokens))
    new = {r.req_id for r in out.scheduled_new_reqs}
    return [Work(prompts[rid], block_ids(rid), starts[rid], n, rid in new)
            for rid, n in out.num_scheduled_tokens.items()]


def apply(work: list[Work], caches: dict[str, torch.Tensor], rank: int, block_size: int) -> int:
    """Check the hit blocks of new requests (loaded, or in the GPU prefix cache), then write
    the KV of the blocks computed now; the number of blocks checked. AssertionError names a
    block that differs."""
    checked = 0
    bs = block_size
    for w in work:
        if w.new:
            for b in range(w.start // bs):
                for name, layer in caches.items():
                    want = kv_value(w.tokens[: (b + 1) * bs], layer[w.blocks[b]].shape, rank)
                    assert torch.equal(layer[w.blocks[b]], want), (
                        f"rank {rank}: block {w.blocks[b]} of {name} differs")
                checked += 1
        for b in range(w.start // bs, min(w.start + w.n, len(w.tokens)) // bs):
            for layer in caches.values():
                layer[w.blocks[b]] = kv_value(w.tokens[: (b + 1) * bs], layer[w.blocks[b]].shape,
                                              rank)
    return checked
