"""vLLM's KV cache offloading into aqua: an offloading spec for vLLM's OffloadingConnector.

Written against vllm==0.33.0 (python/requirements-vllm.txt). Configure it with

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "AquaOffloadingSpec",
        "spec_module_path": "aqua.vllm", "capacity_bytes": "8GiB"}}'

Scheduler side: vLLM's own CPUOffloadingManager decides which blocks are offloaded, into which
slot, and what is evicted (LRU or ARC, as for vLLM's CPU tier), over slots that are laid out and
counted as vLLM's CPU tier counts its chunks, so that the same capacity makes the same
decisions. Worker side: AquaOffloadingWorker keeps every slot in one aqua tensor per worker GPU
(peer HBM from aquad leases, then DRAM within the granted budget) whose device addresses are fixed
for its life, moves each job as one aqua copy batch and polls aqua at vLLM's per-step point
(get_finished), where reclaims move the tensor's chunks between tiers without the manager
noticing. What each aqua event does is in python/README.md ("vLLM").
"""

from __future__ import annotations

import logging
import math
import os
import select
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np
import torch
from vllm.utils.math_utils import round_up
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingManager,
    OffloadingMetricMetadata,
    OffloadingSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.common import CPUOffloadingInfo
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

import aqua
from aqua import kvcopy
from aqua._tier import Followed, Tier
from aqua._args import SizeError, parse_size

__all__ = ["AquaOffloadingSpec", "AquaOffloadingWorker", "AquaSettings", "AquaStats"]

logger = logging.getLogger("aqua.vllm")

#: The spec's own keys of kv_connector_extra_config.
AQUA_KEYS = ("capacity_bytes", "chunk_bytes", "endpoint", "side_path", "device", "allow_dram",
             "client_name", "timeout")
#: Keys vLLM 0.33's OffloadingConnector, OffloadingSpec and CPUOffloadingManager read.
VLLM_KEYS = ("spec_name", "spec_module_path", "block_size", "blocks_per_chunk",
             "canonical_layout", "sync_load_budget_bytes", "self_describing_kv_events",
             "offload_prompt_only", "eviction_policy", "cache_policy_module_path",
             "store_threshold", "max_tracker_size")

def _bytes(key: str, value: Any) -> int:
    """A size in bytes: an int, or a string such as "8GiB" or "512 MB" (aqua._args.parse_size,
    the grammar of aquad's config)."""
    if isinstance(value, bool):
        raise ValueError(f"aqua.vllm: '{key}' must be a size in bytes, not {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        try:
            n = parse_size(value)
        except SizeError as e:
            raise ValueError(f"aqua.vllm: '{key}' must be a size such as 8GiB (README.md, "
                             f"\"Sizes\"): {e}") from None
    else:
        raise ValueError(f"aqua.vllm: '{key}' must be a size in bytes, not {value!r}")
    if n < 0:
        raise ValueError(f"aqua.vllm: '{key}' must not be negative")
    if n > (1 << 64) - 1:
        raise ValueError(f"aqua.vllm: '{key}' of {n} bytes does not fit 64 bits")
    return n


def _count(key: str, value: Any, lo: int, hi: int = (1 << 63) - 1) -> int:
    """A whole number in lo .. hi (never a bool, a float or a string)."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"aqua.vllm: '{key}' must be an integer in {lo} .. {hi}, not {value!r}")
    return value


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"aqua.vllm: '{key}' must be true or false, not {value!r}")


@dataclass(frozen=True)
class AquaSettings:
    """The spec's keys of kv_connector_extra_config, checked."""

    #: Bytes of offloaded KV over all workers, as vLLM's cpu_bytes_to_use counts them.
    capacity_bytes: int
    #: The aqua tensor's chunk size (0: the lease's, else libaqua's default, 32 MiB).
    chunk_bytes: int = 0
    #: aquad's endpoint and side channel (None: $AQUA_ENDPOINT / $AQUA_SIDE_PATH or libaqua's
    #: defaults).
    endpoint: Optional[str] = None
    side_path: Optional[str] = None
    #: The CUDA device ordinal the worker registers (None: torch's current device, else 0).
    device: Optional[int] = None
    #: Whether DRAM budget may make up what peer GPUs cannot lend.
    allow_dram: bool = True
    client_name: Optional[str] = None
    #: Seconds for connecting to aquad and for each request to it (None: libaqua's default).
    timeout: Optional[float] = None

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any]) -> "AquaSettings":
        """Check every key; an unknown or bad one raises ValueError naming it."""
        for key in extra:
            if key == "cpu_bytes_to_use":
                raise ValueError("aqua.vllm: 'cpu_bytes_to_use' is the CPU spec's key; "
                                 "AquaOffloadingSpec takes 'capacity_bytes'")
            if key not in AQUA_KEYS and key not in VLLM_KEYS:
                raise ValueError(f"aqua.vllm: unknown key '{key}' in kv_connector_extra_config "
                                 f"(the spec's keys: {', '.join(AQUA_KEYS)})")
        if _bool("canonical_layout", extra.get("canonical_layout", False)):
            raise ValueError("aqua.vllm: 'canonical_layout' is not supported by "
                             "AquaOffloadingSpec")
        if "capacity_bytes" not in extra:
            raise ValueError("aqua.vllm: 'capacity_bytes' is required in "
                             "kv_connector_extra_config")
        capacity = _bytes("capacity_bytes", extra["capacity_bytes"])
        if capacity == 0:
            raise ValueError("aqua.vllm: 'capacity_bytes' must be more than 0")
        strings: dict[str, Optional[str]] = {}
        for key in ("endpoint", "side_path", "client_name"):
            value = extra.get(key)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"aqua.vllm: '{key}' must be a non-empty string")
            strings[key] = value
        device = extra.get("device")
        if device is not None and (isinstance(device, bool) or not isinstance(device, int)
                                   or not 0 <= device <= (1 << 31) - 1):
            raise ValueError(f"aqua.vllm: 'device' must be a CUDA device ordinal, not {device!r}")
        timeout = extra.get("timeout")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, (int, float))
                                    or not math.isfinite(timeout) or timeout <= 0
                                    or timeout * 1000 > (1 << 31) - 1):
            raise ValueError(f"aqua.vllm: 'timeout' must be finite seconds > 0 (at most "
                             f"{((1 << 31) - 1) // 1000}), not {timeout!r}")
        # vLLM's own keys this spec uses: checked here, so that a bad one is named.
        for key, lo in (("block_size", 1), ("blocks_per_chunk", 1), ("store_threshold", 0),
                        ("max_tracker_size", 1)):
            if key in extra:
                _count(key, extra[key], lo)
        if "sync_load_budget_bytes" in extra:
            _bytes("sync_load_budget_bytes", extra["sync_load_budget_bytes"])
        for key in ("eviction_policy", "cache_policy_module_path"):
            value = extra.get(key)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"aqua.vllm: '{key}' must be a non-empty string")
        return cls(capacity_bytes=capacity,
                   chunk_bytes=_bytes("chunk_bytes", extra.get("chunk_bytes", 0)),
                   endpoint=strings["endpoint"], side_path=strings["side_path"],
                   device=device, allow_dram=_bool("allow_dram", extra.get("allow_dram", True)),
                   client_name=strings["client_name"],
                   timeout=None if timeout is None else float(timeout))


@dataclass
class AquaStats:
    """What one worker's aqua tensor did (AquaOffloadingWorker.stats())."""

    stores: int = 0
    loads: int = 0
    bytes_stored: int = 0
    bytes_loaded: int = 0
    #: Chunks' tier changes seen at the per-step poll (a reclaim, a lost lease), and their bytes.
    migrations: int = 0
    bytes_migrated: int = 0
    leases_lost: int = 0
    reclaims_failed: int = 0
    disconnects: int = 0
    reconnects: int = 0
    #: The tensor's bytes per tier now.
    peer_bytes: int = 0
    dram_bytes: int = 0
    local_bytes: int = 0
    #: Slots and the bytes of one slot on this worker.
    slots: int = 0
    slot_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class AquaOffloadingSpec(OffloadingSpec):
    """vLLM OffloadingSpec whose offloaded blocks live in aqua tensors."""

    #: Slots are counted as vLLM's CPU tier counts chunks (padded to this many bytes over all
    #: workers), so that the same capacity holds the same number of chunks.
    BLOCK_SIZE_ALIGNMENT = CPUOffloadingSpec.BLOCK_SIZE_ALIGNMENT

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]
                                 ) -> dict[str, OffloadingMetricMetadata]:
        # The scheduler side is vLLM's CPUOffloadingManager: the same metrics.
        return CPUOffloadingSpec.build_metric_definitions(extra_config)

    @classmethod
    def config_info_keys(cls, extra_config: dict[str, Any]) -> tuple[str, ...]:
        return CPUOffloadingInfo.config_info_keys()

    def __init__(self, config: OffloadingConfig):
        super().__init__(config)
        self.settings = AquaSettings.from_extra_config(self.extra_config)
        world_size = config.parallel.world_size
        self.num_slots = 0
        self.kv_bytes_per_chunk = 0
        # vLLM sets replicated_layout where every rank's KV is the same (a pure MLA model under
        # tensor parallelism only): its CPU spec then keeps and counts one copy, and so does
        # this one, so that capacity_bytes makes as many slots. Every rank still stores its own
        # copy in its own tensor (no memory is shared by the ranks' GPUs): each asks aquad for
        # capacity_bytes. self.replicated_layout stays False, so that vLLM has every rank write.
        copies = 1 if config.replicated_layout else world_size
        if config.worker_kv_bytes_per_block > 0 and world_size > 0:
            all_workers = config.worker_kv_bytes_per_block * copies * self.blocks_per_chunk
            self.kv_bytes_per_chunk = round_up(all_workers, self.BLOCK_SIZE_ALIGNMENT)
            self.num_slots = self.settings.capacity_bytes // self.kv_bytes_per_chunk
            if self.num_slots == 0:
                raise ValueError(
                    f"aqua.vllm: 'capacity_bytes' ({self.settings.capacity_bytes}) is less than "
                    f"one offloaded chunk ({self.kv_bytes_per_chunk} bytes)")
        self.info = CPUOffloadingInfo.from_config(config, self.num_slots,
                                                  self.kv_bytes_per_chunk)
        self._manager: Optional[OffloadingManager] = None
        self._worker: Optional[AquaOffloadingWorker] = None

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            extra = self.extra_config
            self._manager = CPUOffloadingManager(
                num_chunks=self.num_slots,
                cache_policy=extra.get("eviction_policy", "lru"),
                cache_policy_module_path=extra.get("cache_policy_module_path"),
                enable_events=self.kv_events_config.enable_kv_cache_events,
                store_threshold=int(extra.get("store_threshold", 0)),
                max_tracker_size=int(extra.get("max_tracker_size", 64_000)),
                info=self.info,
            )
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            rank = self.config.parallel.rank
            s = self.settings
            name = s.client_name or f"vllm-{self.config.engine_id[:8]}-rank{rank}"
            self._worker = AquaOffloadingWorker(
                kv_caches, blocks_per_chunk=self.blocks_per_chunk, num_slots=self.num_slots,
                settings=s if s.client_name else _replace_name(s, name))
        return self._worker


def _replace_name(s: AquaSettings, name: str) -> AquaSettings:
    from dataclasses import replace
    return replace(s, client_name=name)


@dataclass
class _Job:
    job_id: int
    ticket: Optional[aqua.Ticket]  #: None: a job with nothing to copy
    nbytes: int
    store: bool
    start: float
    expedited: bool = False


class AquaOffloadingWorker(OffloadingWorker):
    """The worker side: GPU blocks <-> slots of one aqua tensor, one copy batch per job."""

    def __init__(self, kv_caches: CanonicalKVCaches, *, blocks_per_chunk: int, num_slots: int,
                 settings: AquaSettings, consumer: Optional[aqua.Consumer] = None,
                 streams: Optional[tuple[Any, Any]] = None):
        """streams: (transfers, synchronous loads), raw handles or torch streams; None: two
        torch CUDA streams of the worker's own (the second of high priority), else, without
        CUDA, libaqua's own stream for both."""
        self.blocks_per_chunk = blocks_per_chunk
        self.num_slots = num_slots
        self.settings = settings
        self._stats = AquaStats(slots=num_slots)
        self.regions, offset = kvcopy.regions_for(
            [(t.tensor, t.page_size_bytes) for t in kv_caches.tensors], blocks_per_chunk,
            num_slots)
        self.groups = [[(r.tensor_idx, r.page_size_bytes) for r in refs]
                       for refs in kv_caches.group_data_refs]
        self._stats.slot_bytes = sum(r.slot_stride for r in self.regions)
        self.nbytes = offset
        self._jobs: deque[_Job] = deque()
        self._tickets: dict[int, _Job] = {}
        device = settings.device
        if device is None:
            device = torch.cuda.current_device() if torch.cuda.is_available() else 0
        self._own_ctx = consumer is None
        try:
            self.ctx = consumer or aqua.Consumer(device, endpoint=settings.endpoint,
                                                 side_path=settings.side_path,
                                                 client_name=settings.client_name,
                                                 timeout=settings.timeout)
        except aqua.NotConnectedError as e:
            endpoint = (settings.endpoint or os.environ.get("AQUA_ENDPOINT")
                        or "ipc:///run/aqua/aquad.sock")
            raise RuntimeError(
                f"aqua.vllm: no aquad at {endpoint} for device {device} ({e}); start aquad, or "
                "set 'endpoint' in kv_connector_extra_config (or $AQUA_ENDPOINT) to its "
                "endpoint") from e
        try:
            self._open_tensor()
        except BaseException:
            if self._own_ctx:
                self.ctx.close()
            raise
        # aqua_fd() is readable when aqua_poll() has work: a step whose last poll found
        # nothing and whose fd is quiet skips the call (aqua.h's aqua_poll() and aqua_fd()).
        self._fd_poll = select.poll()
        self._fd_poll.register(self.ctx.fileno(), select.POLLIN)
        self._poll_due = True
        # Streams of the worker's, each job waiting for the engine's compute stream first:
        # stores and loads in the order they were asked for on one, and synchronous
        # (expedited) loads, which vLLM waits for within the step, on another, so that they
        # do not queue behind stores (as vLLM's CPU worker gives them a stream of their own).
        transfer, sync = streams if streams is not None else (None, None)
        self._copier = kvcopy.Copier(self.ctx, transfer)
        self._sync_copier = kvcopy.Copier(self.ctx, sync, priority=-1)

    def _open_tensor(self) -> None:
        """The tier's tensor of the slots' bytes (aqua._tier: borrowed, then mapped whole)."""
        s = self.settings
        self.tier = Tier(self.ctx, "aqua.vllm")
        try:
            self.tier.open(self.nbytes, allow_dram=s.allow_dram, chunk_bytes=s.chunk_bytes)
        except aqua.NoMemoryError as e:
            held, dram = e.held_bytes, e.dram_bytes  # type: ignore[attr-defined]
            raise RuntimeError(
                f"aqua.vllm: aquad could not back {max(self.nbytes, held + dram)} bytes of "
                f"offloaded KV on device {self.ctx.device} ('capacity_bytes' "
                f"{s.capacity_bytes}, 'allow_dram' {s.allow_dram}): peers lent {held} bytes and "
                f"the DRAM budget {dram}; lower capacity_bytes, offer more from a producer, or "
                f"raise aquad's dram-budget ({e})") from e
        self.tensor = self.tier.tensor
        self.dptr = self.tier.dptr
        size = self.tensor.info().max_bytes
        self._refresh_tiers()
        logger.info("aqua.vllm: %d slots of %d bytes in an aqua tensor of %d bytes at %#x "
                    "(peer %d, DRAM %d)", self.num_slots, self._stats.slot_bytes, size, self.dptr,
                    self._stats.peer_bytes, self._stats.dram_bytes)

    # -------------------------------------------------------------------------- addresses

    def _pieces(self, gpu_spec: GPULoadStoreSpec, slots: BlockIDsLoadStoreSpec,
                store: bool) -> tuple[np.ndarray, int]:
        """(dst, src, nbytes) rows for a job (aqua.kvcopy.rows), slot addresses moved to host
        memory by a reclaim pointed there."""
        rows, nbytes = kvcopy.rows(self.regions, self.groups, self.dptr, self.blocks_per_chunk,
                                   gpu_spec.block_ids, slots.block_ids, gpu_spec.group_sizes,
                                   gpu_spec.block_indices, store)
        self.tier.relocate(rows[:, 0 if store else 1])
        return rows, nbytes

    # --------------------------------------------------------------------------- transfers

    def _submit(self, job_id: int, gpu_spec: LoadStoreSpec, slots: LoadStoreSpec,
                store: bool, expedited: bool = False) -> bool:
        assert isinstance(gpu_spec, GPULoadStoreSpec)
        assert isinstance(slots, BlockIDsLoadStoreSpec)
        rows, nbytes = self._pieces(gpu_spec, slots, store)
        start = time.perf_counter()
        ticket = (self._sync_copier if expedited else self._copier).submit(rows)
        job = _Job(job_id, ticket, nbytes, store, start, expedited)
        self._jobs.append(job)
        self._tickets[job_id] = job
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec,
                     dst_spec: LoadStoreSpec) -> bool:
        return self._submit(job_id, src_spec, dst_spec, store=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec,
                    expedited: bool = False) -> bool:
        return self._submit(job_id, dst_spec, src_spec, store=False, expedited=expedited)

    def _finish(self, job: _Job) -> TransferResult:
        del self._tickets[job.job_id]
        s = self._stats
        if job.store:
            s.stores += 1
            s.bytes_stored += job.nbytes
        else:
            s.loads += 1
            s.bytes_loaded += job.nbytes
        return TransferResult(job_id=job.job_id, success=True, transfer_size=job.nbytes,
                              transfer_time=time.perf_counter() - job.start)

    def get_finished(self) -> list[TransferResult]:
        """vLLM calls this once per step: the safe point where aqua is polled."""
        self.poll()
        done: list[TransferResult] = []
        # Jobs on one stream complete in the order they were submitted, but a synchronous load
        # (its own stream) may finish before stores submitted ahead of it.
        pending: deque[_Job] = deque()
        for job in self._jobs:
            if job.ticket is None or job.ticket.done():
                done.append(self._finish(job))
            else:
                pending.append(job)
        self._jobs = pending
        return done

    def wait(self, job_ids: set[int]) -> None:
        for job_id in job_ids:
            job = self._tickets.get(job_id)
            if job is not None and job.ticket is not None:
                job.ticket.wait()

    # ------------------------------------------------------------------------------- aqua

    def poll(self) -> list[aqua.Event]:
        """Handle what aquad sent: reclaims move the tensor's chunks here (libaqua waits for
        copy batches in flight first). Skipped while aqua's fd is quiet after an empty poll."""
        if not self._poll_due and not self._fd_poll.poll(0):
            return []
        events = self.ctx.poll(0)
        self._poll_due = bool(events)  # until a poll finds nothing, as the fd is edge-like
        if not events:
            return events
        seen = Followed()
        self.tier.follow(events, seen, logger)
        s = self._stats
        s.migrations += seen.migrations
        s.bytes_migrated += seen.bytes_migrated
        s.leases_lost += seen.leases_lost
        s.reclaims_failed += seen.reclaims_failed
        s.disconnects += seen.disconnects
        s.reconnects += seen.reconnects
        self._refresh_tiers()
        logger.info("aqua.vllm: %s", self._stats)
        return events

    def _refresh_tiers(self) -> None:
        info = self.tensor.info()
        self._stats.peer_bytes = info.peer_bytes
        self._stats.dram_bytes = info.dram_bytes
        self._stats.local_bytes = info.local_bytes

    def stats(self) -> AquaStats:
        """A copy of the counters, with the tensor's bytes per tier now."""
        self._refresh_tiers()
        return AquaStats(**asdict(self._stats))

    def read_slot(self, slot: int) -> bytes:
        """The bytes of one slot, region after region (for tests and debugging)."""
        out = bytearray()
        for r in self.regions:
            out += self.tensor.read(r.offset + slot * r.slot_stride, r.slot_stride)
        return bytes(out)

    def shutdown(self) -> None:
        for job in self._jobs:
            if job.ticket is not None:
                job.ticket.wait()
        self._jobs.clear()
        self._tickets.clear()
        if not self.tensor.closed:
            self.tensor.free()
        self._give_back()
        if self._own_ctx and not self.ctx.closed:
            self.ctx.close()

    def _give_back(self) -> None:
        """Return the leases the worker borrowed (once its tensor is gone), so that a worker
        on a shared consumer leaves nothing behind."""
        if getattr(self, "tier", None) is not None:
            self.tier.give_back(logger)
