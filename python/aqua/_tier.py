"""What the engine integrations (aqua.vllm, aqua.lmcache) share: one aqua tensor over memory
borrowed as tensor capacity (peer HBM, then DRAM within the granted budget), whose device
addresses are fixed for its life; what a reclaim moved to host memory the range does not map; the
aqua events such a tier follows; and giving everything back."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from . import kvcopy
from ._ffi import CopyPiece
from ._args import SizeError, parse_size
from .context import Consumer, Grant, LeaseLost, ReclaimFailed, TensorMigrated
from .errors import AquaError, NoMemoryError, NotConnectedError
from ._values import Disconnected, Event, Reconnected


def config_size(name: str, key: str, value: Any) -> int:
    """A size from an engine's config (an int, or a string such as "8GiB"), more than 0 bytes;
    ValueError naming name and key otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{name}: '{key}' must be a size in bytes such as 8GiB, not {value!r}")
    if isinstance(value, str):
        try:
            value = parse_size(value)
        except SizeError as e:
            raise ValueError(f"{name}: '{key}': {e}") from None
    if value <= 0 or value >= 1 << 63:
        raise ValueError(f"{name}: '{key}' must be more than 0 bytes, not {value}")
    return value


def tier_settings(name: str, d: dict, *, device: int, client_name: str,
                  strings: tuple[str, ...] = ()) -> dict:
    """The settings every engine's tier takes, from its config object d (unknown keys and a
    missing capacity_bytes are the caller's to refuse): capacity_bytes and slot_bytes (sizes),
    device (CUDA ordinal, default device), endpoint, side_path, client_name (default
    client_name), allow_dram (default true), timeout (seconds), and the engine's own strings.
    ValueError naming name and the key."""
    dev = d.get("device", device)
    if isinstance(dev, bool) or not isinstance(dev, int) or dev < 0:
        raise ValueError(f"{name}: 'device' must be a CUDA ordinal, not {dev!r}")
    allow_dram = d.get("allow_dram", True)
    if not isinstance(allow_dram, bool):
        raise ValueError(f"{name}: 'allow_dram' must be true or false, not {allow_dram!r}")
    timeout = d.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or
                                not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ValueError(f"{name}: 'timeout' must be seconds, not {timeout!r}")
    for k in ("endpoint", "side_path", "client_name", *strings):
        if d.get(k) is not None and not isinstance(d[k], str):
            raise ValueError(f"{name}: '{k}' must be a string, not {d[k]!r}")
    return {"capacity_bytes": config_size(name, "capacity_bytes", d["capacity_bytes"]),
            "slot_bytes": config_size(name, "slot_bytes", d["slot_bytes"])
            if d.get("slot_bytes") else 0,
            "device": dev, "endpoint": d.get("endpoint"), "side_path": d.get("side_path"),
            "client_name": d.get("client_name") or client_name, "allow_dram": allow_dram,
            "timeout": timeout, **{k: d.get(k) or "" for k in strings}}


def open_consumer(name: str, device: int, *, endpoint: Optional[str], side_path: Optional[str],
                  client_name: str, timeout: Optional[float], where: str) -> Consumer:
    """A consumer on device; with no aquad there, a RuntimeError that says where aquad was
    looked for and where the engine's config names it (where)."""
    try:
        return Consumer(device, endpoint=endpoint, side_path=side_path, client_name=client_name,
                        timeout=timeout)
    except NotConnectedError as e:
        at = endpoint or os.environ.get("AQUA_ENDPOINT") or "ipc:///run/aqua/aquad.sock"
        raise RuntimeError(f"{name}: no aquad at {at} for device {device} ({e}); start aquad, "
                           f"or set 'endpoint' {where} (or $AQUA_ENDPOINT)") from e


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

    def open_capacity(self, nbytes: int, *, allow_dram: bool) -> None:
        """open(), with aquad's refusal said as an engine's operator can act on it."""
        try:
            self.open(nbytes, allow_dram=allow_dram)
        except NoMemoryError as e:
            raise RuntimeError(
                f"{self.name}: aquad could not back {nbytes} bytes on device {self.ctx.device} "
                f"('allow_dram' {allow_dram}): lower capacity_bytes, offer more from a "
                f"producer, or raise aquad's dram-budget ({e})") from e

    def copy_rows(self, rows: list[tuple[int, int, int]], *, to_tensor: bool) -> int:
        """Copy (dst, src, nbytes) rows as one aqua copy batch and wait for it; the tensor's
        side (dst to_tensor, else src) is relocated first. Returns the nanoseconds the copy
        took."""
        if not rows:
            return 0
        a = np.ascontiguousarray(np.array(rows, dtype=np.uint64))
        self.relocate(a[:, 0 if to_tensor else 1])
        t0 = time.perf_counter_ns()
        self.ctx.copy((CopyPiece * len(rows)).from_buffer(a.data)).wait()
        return time.perf_counter_ns() - t0

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
