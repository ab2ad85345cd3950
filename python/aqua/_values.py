"""The plain values the API returns: roles, tiers, information records and events (those that
carry a lease or a tensor are context.py's). Imports nothing of this package."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple, Optional

#: "Everything", for Producer.reclaim() and friends (aqua.h's AQUA_ALL).
ALL = (1 << 64) - 1


class Role(IntEnum):
    """What a context does with its GPU's memory (aqua.h's enum aqua_role)."""

    PRODUCER = 1
    CONSUMER = 2
    NEUTRAL = 3


class Tier(IntEnum):
    """Where a chunk of a lease or a tensor lives now (aqua.h's enum aqua_tier)."""

    NONE = 0
    PEER = 1
    DRAM = 2
    LOCAL = 3


class CopyPiece(NamedTuple):
    """One piece of a copy batch: nbytes from src to dst (device or host addresses)."""

    dst: int
    src: int
    nbytes: int


@dataclass(frozen=True)
class Info:
    """A context's state as last known locally (no round trip)."""

    device: int
    role: Role
    gpu_uuid: str
    paired_with: Optional[str]  #: uuid of the paired GPU; None when unpaired
    capacity: int
    granularity: int
    chunk_bytes: int
    client_id: int  #: the daemon's id for this context; 0 while disconnected
    connected: bool
    dram_budget: int  #: the DRAM budget aquad held granted to this GPU when it registered
    reclaim_deadline: float  #: seconds
    offered_bytes: int
    borrowed_bytes: int
    dram_bytes: int
    tensor_peer_bytes: int
    tensor_local_bytes: int
    tensor_dram_bytes: int
    pool_free_bytes: int
    dram_granted: int


@dataclass(frozen=True)
class LeaseInfo:
    id: int  #: the daemon's lease id
    dptr: int
    nbytes: int
    peer_bytes: int
    dram_bytes: int
    n_chunks: int
    chunk_bytes: int


@dataclass(frozen=True)
class Chunk:
    """One chunk of a lease. host is None when the bytes are at the lease's dptr + offset
    (also after a reclaim moved them to DRAM mapped there), else the host address holding them."""

    id: int
    offset: int
    nbytes: int
    tier: Tier
    host: Optional[int]


@dataclass(frozen=True)
class TensorInfo:
    dptr: int
    max_bytes: int
    chunk_bytes: int
    begin: int  #: the mapped window is [begin, end), whole chunks
    end: int
    peer_bytes: int
    local_bytes: int
    dram_bytes: int


@dataclass(frozen=True)
class TensorRange:
    """A run of neighbouring chunks of one tier. host None: the run is at dptr + offset."""

    offset: int
    nbytes: int
    tier: Tier
    host: Optional[int]


@dataclass(frozen=True)
class ReclaimResult:
    freed: int  #: bytes freed during the call
    complete: bool  #: False: the timeout passed first; the rest arrives as Reclaimed events


# ------------------------------------------------------------------------------------ events


@dataclass(frozen=True)
class Event:
    """Base class of what Context.poll() returns."""


@dataclass(frozen=True)
class Reclaimed(Event):
    """Producer: nbytes of reclaimed memory were released on the GPU and are free now."""

    nbytes: int


@dataclass(frozen=True)
class PairChanged(Event):
    """The daemon paired this GPU with another one, or unpaired it (see Context.info())."""


@dataclass(frozen=True)
class DaemonStopping(Event):
    """The daemon is shutting down."""


@dataclass(frozen=True)
class Disconnected(Event):
    """The connection to the daemon was lost; poll() reconnects. Mappings stay valid."""


@dataclass(frozen=True)
class Reconnected(Event):
    """Connected and re-registered again, with what this context holds."""


@dataclass(frozen=True)
class UnknownEvent(Event):
    """An event type newer than this package."""

    type: int
