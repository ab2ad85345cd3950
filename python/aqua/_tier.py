"""What the engine integrations (aqua.vllm, aqua.lmcache) share: one aqua tensor over memory
borrowed as tensor capacity (peer HBM, then DRAM within the granted budget), whose device
addresses are fixed for its life; what a reclaim moved to host memory the range does not map; the
aqua events such a tier follows; and giving everything back."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np

from . import kvcopy
from .context import Consumer, Grant
from .errors import AquaError
from ._values import (Disconnected, Event, LeaseLost, Reconnected, ReclaimFailed,
                      TensorMigrated)


@dataclass
class Followed:
    """What a tier's poll saw: counts of the aqua events it followed."""
    migrations: int = 0
    bytes_migrated: int = 0
    leases_lost: int = 0
    reclaims_failed: int = 0
    disconnects: int = 0
    reconnects: int = 0


@dataclass
class Tier:
    """An aqua tensor of nbytes or more on ctx, mapped whole. name prefixes every message."""
    ctx: Consumer
    name: str
    grants: list[Grant] = field(default_factory=list)
    #: Runs of the tensor a reclaim moved to host memory the device address range does not map
    #: (drivers that cannot map host memory): offset -> (nbytes, host address).
    moved: dict[int, tuple[int, int]] = field(default_factory=dict)

    def open(self, nbytes: int, *, allow_dram: bool, chunk_bytes: int = 0) -> None:
        """Borrow, then make the tensor: its chunks are then the lease's (a lender's chunk size
        is its own), and the first borrow's rounding to whole chunks is topped up. On failure
        everything borrowed is given back before the exception leaves (NoMemoryError: peers and
        the DRAM budget could not back it; its held_bytes and dram_bytes say what they did)."""
        want = max(nbytes, 1)
        self.tensor = None
        try:
            self.grants.append(self.ctx.borrow(want, allow_dram=allow_dram, tensors=True))
            lease = self.grants[0].lease
            lease_chunk = lease.info().chunk_bytes if lease is not None else 0
            if chunk_bytes and lease_chunk and chunk_bytes != lease_chunk:
                raise RuntimeError(
                    f"{self.name}: 'chunk_bytes' ({chunk_bytes}) is not the lease's chunk size "
                    f"({lease_chunk} bytes, the lender's) on device {self.ctx.device}: an aqua "
                    "tensor maps whole lease chunks; leave 'chunk_bytes' unset to take the "
                    "lease's")
            self.tensor = self.ctx.tensor(want, chunk_bytes=chunk_bytes)
            size = self.tensor.info().max_bytes
            granted = sum(g.nbytes + g.dram_bytes for g in self.grants)
            if granted < size:
                self.grants.append(self.ctx.borrow(size - granted, allow_dram=allow_dram,
                                                   tensors=True))
            self.tensor.grow(size)
        except BaseException as e:
            if isinstance(e, AquaError):
                e.held_bytes = sum(g.nbytes for g in self.grants)  # type: ignore[attr-defined]
                e.dram_bytes = sum(g.dram_bytes for g in self.grants)  # type: ignore[attr-defined]
            self.give_back()
            raise
        self.dptr = self.tensor.dptr

    def relocate(self, col: np.ndarray) -> None:
        """Point the tensor's addresses in col that a reclaim moved to host memory there."""
        if self.moved:
            kvcopy.relocate(col, self.dptr, self.moved)

    def follow(self, events: list[Event], seen: Followed, log: logging.Logger) -> None:
        """Follow what aqua's poll returned: moved runs, lost leases (their chunks are in host
        memory; the lease is given back), reclaims that could not be honoured, aquad gone and
        back. Counted into seen."""
        for e in events:
            if isinstance(e, TensorMigrated) and e.tensor is self.tensor:
                seen.migrations += 1
                seen.bytes_migrated += e.nbytes
                if e.host is not None:
                    self.moved[e.offset] = (e.nbytes, e.host)
                else:
                    self.moved.pop(e.offset, None)
            elif isinstance(e, LeaseLost):
                seen.leases_lost += 1
                try:  # its chunks are in host memory now; the lease itself is of no more use
                    e.lease.give_back()
                except AquaError as err:
                    log.info("%s: a lost lease stays until its chunks are free: %s", self.name,
                             err)
            elif isinstance(e, ReclaimFailed):
                seen.reclaims_failed += 1
                log.warning("%s: a reclaim could not be honoured (%s); what is stored stays "
                            "where it is", self.name, os.strerror(e.errno))
            elif isinstance(e, Disconnected):
                seen.disconnects += 1
                log.warning("%s: aquad is gone; what is stored stays mapped", self.name)
            elif isinstance(e, Reconnected):
                seen.reconnects += 1
                log.info("%s: reconnected to aquad", self.name)

    def give_back(self, log: logging.Logger | None = None) -> None:
        """Free the tensor, then return the leases and the DRAM budget borrowed for it, so that
        a tier on a shared consumer leaves nothing behind."""
        log = log or logging.getLogger(self.name)
        if getattr(self, "tensor", None) is not None and not self.tensor.closed:
            self.tensor.free()
        for g in self.grants:
            if g.lease is not None and not g.lease.closed and not self.ctx.closed:
                try:
                    g.lease.give_back()
                except AquaError as err:
                    log.info("%s: a lease stays until aquad hears of it: %s", self.name, err)
            if g.dram_bytes and not self.ctx.closed:
                try:
                    self.ctx.return_dram(g.dram_bytes)
                except AquaError as err:
                    log.info("%s: DRAM budget stays until aquad hears of it: %s", self.name,
                             err)
        self.grants = []
