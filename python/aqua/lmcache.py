"""LMCache's L2 tier in aqua: an L2 adapter for LMCache's multi-process server.

Written against lmcache==0.5.6 (python/requirements-lmcache.txt). LMCache loads it through its
`plugin` L2 adapter type:

    {"type": "plugin", "module_path": "aqua.lmcache", "class_name": "AquaL2Adapter",
     "adapter_params": {"capacity_bytes": "8GiB", "device": 0}}

Each stored object is one slot of one aqua tensor (peer HBM from aquad leases, then DRAM within
the granted budget) whose device addresses are fixed for its life; an index maps each key to its
slot, with the bytes' identity (size, shape, dtype, format) beside it, and evicts the least
recently used unlocked slot when the tensor is full. One thread of the adapter's runs the tasks
in the order they were submitted and polls aqua between them, where reclaims move the tensor's
chunks to DRAM without LMCache noticing; LMCache's controllers are woken through the adapter's
three event fds, as with every L2 adapter. What each aqua event does, and what LMCache sees of
each failure, is in python/README.md ("LMCache").
"""

from __future__ import annotations

import collections
import json
import logging
import os
import select
import threading
import time
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface, L2TaskId
from lmcache.v1.distributed.l2_adapters.config import L2AdapterConfigBase
from lmcache.v1.platform import create_event_notifier

import aqua
from aqua._tier import Followed, Tier, open_consumer, tier_settings

__all__ = ["AquaL2Adapter", "AquaL2AdapterConfig"]

logger = logging.getLogger("aqua.lmcache")

_KEYS = ("capacity_bytes", "slot_bytes", "device", "endpoint", "side_path", "client_name",
         "allow_dram", "timeout")


class AquaL2AdapterConfig(L2AdapterConfigBase):
    """adapter_params of the plugin: capacity_bytes (required) and slot_bytes (the largest
    object stored; default: the size of the first one), device (CUDA ordinal, default 0),
    endpoint, side_path, client_name, allow_dram (default true), timeout (seconds)."""

    def __init__(self, capacity_bytes: int, slot_bytes: int = 0, device: int = 0,
                 endpoint: Optional[str] = None, side_path: Optional[str] = None,
                 client_name: str = "lmcache", allow_dram: bool = True,
                 timeout: Optional[float] = None) -> None:
        self.capacity_bytes = capacity_bytes
        self.slot_bytes = slot_bytes
        self.device = device
        self.endpoint = endpoint
        self.side_path = side_path
        self.client_name = client_name
        self.allow_dram = allow_dram
        self.timeout = timeout

    @classmethod
    def from_dict(cls, d: dict) -> "AquaL2AdapterConfig":
        if not isinstance(d, dict):
            raise ValueError(f"aqua.lmcache: adapter_params must be an object, not {d!r}")
        unknown = sorted(set(d) - set(_KEYS))
        if unknown:
            raise ValueError(f"aqua.lmcache: unknown adapter_params {unknown}; known: "
                             f"{list(_KEYS)}")
        if "capacity_bytes" not in d:
            raise ValueError("aqua.lmcache: adapter_params needs 'capacity_bytes' (such as "
                             "\"8GiB\"): the bytes of KV this tier keeps")
        return cls(**tier_settings("aqua.lmcache", d, device=0, client_name="lmcache"))

    @classmethod
    def help(cls) -> str:
        return ("aqua (peer GPU memory lent through aquad, then DRAM): "
                "{\"type\": \"plugin\", \"module_path\": \"aqua.lmcache\", \"class_name\": "
                "\"AquaL2Adapter\", \"adapter_params\": {\"capacity_bytes\": \"8GiB\", "
                "\"device\": 0}}")


class _Page(NamedTuple):
    """A slot and what identifies its bytes besides their key: (size, shape, dtype, format). A
    load into an object of another identity is a miss, never a wrong page."""
    slot: int
    ident: tuple


def _identity(obj: Any) -> tuple:
    m = obj.metadata  # one property call: it takes the object's lock
    return (obj.get_size(), m.shape, m.dtype, m.fmt)


@dataclass
class AquaL2Stats:
    stores: int = 0
    stored_bytes: int = 0
    store_refused: int = 0  #: objects not stored (larger than a slot, or no slot free)
    lookups: int = 0
    hits: int = 0
    loads: int = 0
    loaded_bytes: int = 0
    load_misses: int = 0  #: keys asked for that were gone or did not match the object
    evictions: int = 0
    task_ns: int = 0  #: time the task thread spent on tasks ...
    copy_ns: int = 0  #: ... of it in aqua's copies ...
    engine_ns: int = 0  #: ... and in LMCache's accounting (the rest is the adapter's own code)


class AquaL2Adapter(L2AdapterInterface):
    """LMCache's L2 adapter interface over one aqua tensor (module docstring)."""

    def __init__(self, config: AquaL2AdapterConfig, l1_memory_desc: Any = None,
                 consumer: Optional[aqua.Consumer] = None) -> None:
        if not isinstance(config, AquaL2AdapterConfig):
            config = AquaL2AdapterConfig.from_dict(config)
        super().__init__(max_capacity_bytes=config.capacity_bytes)
        self.config = config
        self.stats = AquaL2Stats()
        self._lock = threading.Lock()
        self._index: collections.OrderedDict[Any, _Page] = collections.OrderedDict()
        self._locks: dict[Any, int] = {}  #: key -> lookups that locked it, not yet unlocked
        self._free: list[int] = []
        self._slot_bytes = config.slot_bytes
        self._n_slots = 0
        self._next_task = 0
        self._stores: dict[L2TaskId, L2StoreResult] = {}
        self._lookups: dict[L2TaskId, Bitmap] = {}
        self._loads: dict[L2TaskId, Bitmap] = {}
        self._queue: collections.deque[tuple] = collections.deque()
        self._closed = False
        self.followed = Followed()
        self._own_ctx = consumer is None
        self.ctx = consumer or open_consumer(
            "aqua.lmcache", config.device, endpoint=config.endpoint,
            side_path=config.side_path, client_name=config.client_name, timeout=config.timeout,
            where="in adapter_params")
        try:
            self._open_tensor()
        except BaseException:
            if self._own_ctx:
                self.ctx.close()
            raise
        self._store_efd = create_event_notifier()
        self._lookup_efd = create_event_notifier()
        self._load_efd = create_event_notifier()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="aqua.lmcache", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------------------- setup

    def _open_tensor(self) -> None:
        c = self.config
        self.tier = Tier(self.ctx, "aqua.lmcache")
        self.tier.open_capacity(c.capacity_bytes, allow_dram=c.allow_dram)
        self.tensor = self.tier.tensor
        self.dptr = self.tier.dptr
        i = self.tensor.info()
        # Slots within capacity_bytes (the tensor is whole chunks, maybe more).
        self._tensor_bytes = min(i.max_bytes, c.capacity_bytes)
        if self._slot_bytes:
            self._carve(self._slot_bytes)
        logger.info("aqua.lmcache: an aqua tensor of %d bytes at %#x (peer %d, DRAM %d) on "
                    "device %d", i.max_bytes, self.dptr, i.peer_bytes, i.dram_bytes, c.device)

    def _carve(self, slot_bytes: int) -> None:
        self._slot_bytes = slot_bytes
        self._n_slots = self._tensor_bytes // slot_bytes
        self._free = list(range(self._n_slots - 1, -1, -1))

    # ------------------------------------------------------------------------ event fds

    def get_store_event_fd(self) -> int:
        return self._store_efd.fileno()

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._lookup_efd.fileno()

    def get_load_event_fd(self) -> int:
        return self._load_efd.fileno()

    # ---------------------------------------------------------------------------- tasks

    def _submit(self, kind: str, *args: Any) -> L2TaskId:
        with self._lock:
            if self._closed:
                raise RuntimeError("aqua.lmcache: the adapter is closed")
            self._next_task += 1
            task = self._next_task
            self._queue.append((kind, task, *args))
        os.eventfd_write(self._wake, 1)
        return task

    def submit_store_task(self, keys: list, objects: list) -> L2TaskId:
        if len(keys) != len(objects):
            raise ValueError(f"aqua.lmcache: {len(keys)} keys for {len(objects)} objects")
        return self._submit("store", list(keys), list(objects))

    def pop_completed_store_tasks(self) -> dict[L2TaskId, L2StoreResult]:
        with self._lock:
            done, self._stores = self._stores, {}
        return done

    def submit_lookup_and_lock_task(self, keys: list, group_layout_descs: Optional[dict] = None
                                    ) -> L2TaskId:
        return self._submit("lookup", list(keys), group_layout_descs or {})

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Optional[Bitmap]:
        with self._lock:
            return self._lookups.pop(task_id, None)

    def submit_unlock(self, keys: list) -> None:
        # At once: an unlock has no task and is never retried, and it only counts down.
        with self._lock:
            locks = self._locks
            for k in keys:
                n = locks.get(k, 0)
                if n > 1:
                    locks[k] = n - 1
                else:
                    locks.pop(k, None)

    def submit_load_task(self, keys: list, objects: list) -> L2TaskId:
        if len(keys) != len(objects):
            raise ValueError(f"aqua.lmcache: {len(keys)} keys for {len(objects)} objects")
        return self._submit("load", list(keys), list(objects))

    def query_load_result(self, task_id: L2TaskId) -> Optional[Bitmap]:
        with self._lock:
            return self._loads.pop(task_id, None)

    def delete(self, keys: list) -> None:
        gone, sizes = [], []
        with self._lock:
            for k in keys:
                p = self._index.pop(k, None)
                if p is not None:
                    self._free.append(p.slot)
                    gone.append(k)
                    sizes.append(p.ident[0])
        if gone:
            self._notify_keys_deleted(gone, sizes)

    def report_status(self) -> dict:
        i = self.tensor.info() if not self.tensor.closed else None
        connected = not self.ctx.closed and self.ctx.info().connected
        return {"is_healthy": not self._closed, "aquad_connected": connected,
                "stored_objects": len(self._index), "slots": self._n_slots,
                "slot_bytes": self._slot_bytes, "peer_bytes": i.peer_bytes if i else 0,
                "dram_bytes": i.dram_bytes if i else 0, **vars(self.stats),
                **vars(self.followed)}

    # ------------------------------------------------------------------- the task thread

    def _run(self) -> None:
        p = select.poll()
        p.register(self._wake, select.POLLIN)
        p.register(self.ctx.fileno(), select.POLLIN)
        poll_due = True
        while True:
            with self._lock:
                task = self._queue.popleft() if self._queue else None
                closed = self._closed
            if task is None and closed:
                return
            if task is None:
                ready = p.poll(None if not poll_due else 50)
                if any(fd == self._wake for fd, _ in ready):
                    try:
                        os.eventfd_read(self._wake)
                    except BlockingIOError:
                        pass
                poll_due = self._poll_aqua() or bool(ready)
                continue
            t0 = time.perf_counter_ns()
            try:
                getattr(self, "_do_" + task[0])(*task[1:])
            except Exception:  # a failed task is a failed task, never a dead thread
                logger.exception("aqua.lmcache: a %s task failed", task[0])
                self._fail(task)
            self.stats.task_ns += time.perf_counter_ns() - t0
            # Between tasks: reclaims are followed while LMCache keeps submitting.
            poll_due = self._poll_aqua()

    def _engine(self, fn: Any, *args: Any) -> None:
        """Call LMCache's code (its accounting, its event notifiers, which wake its
        controllers), timed apart from the adapter's own code."""
        t0 = time.perf_counter_ns()
        fn(*args)
        self.stats.engine_ns += time.perf_counter_ns() - t0

    def _fail(self, task: tuple) -> None:
        kind, tid = task[0], task[1]
        with self._lock:
            if kind == "store":
                self._stores[tid] = L2StoreResult(False, 0)
            else:
                (self._lookups if kind == "lookup" else self._loads)[tid] = Bitmap(len(task[2]))
        (self._store_efd if kind == "store" else
         self._lookup_efd if kind == "lookup" else self._load_efd).notify()

    def _poll_aqua(self) -> bool:
        try:
            events = self.ctx.poll(0)
        except aqua.AquaError as e:
            logger.warning("aqua.lmcache: poll failed: %s", e)
            return False
        self.tier.follow(events, self.followed, logger)
        return bool(events)

    def _copy(self, rows: list[tuple[int, int, int]], to_tensor: bool) -> None:
        self.stats.copy_ns += self.tier.copy_rows(rows, to_tensor=to_tensor)

    def _do_store(self, tid: L2TaskId, keys: list, objects: list) -> None:
        stored, sizes, rows, evicted, evicted_sizes = [], [], [], [], []
        total = 0
        with self._lock:
            if not self._slot_bytes and objects:
                self._carve(min(max(objects[0].get_size(), 1), self._tensor_bytes))
            index, free, locks = self._index, self._free, self._locks
            base, slot_bytes = self.dptr, self._slot_bytes
            for k, obj in zip(keys, objects):
                ident = _identity(obj)
                nbytes = ident[0]
                if k in index:  # the same key names the same bytes: nothing to write
                    index.move_to_end(k)
                    continue
                if nbytes > slot_bytes:
                    self.stats.store_refused += 1
                    logger.warning("aqua.lmcache: an object of %d bytes is larger than a slot "
                                   "(%d bytes, 'slot_bytes'); not stored", nbytes, slot_bytes)
                    continue
                if not free:
                    victim = next((v for v in index if not locks.get(v)), None)
                    if victim is None:
                        self.stats.store_refused += 1
                        continue
                    p = index.pop(victim)
                    free.append(p.slot)
                    evicted.append(victim)
                    evicted_sizes.append(p.ident[0])
                slot = free.pop()
                index[k] = _Page(slot, ident)
                rows.append((base + slot * slot_bytes, obj.data_ptr, nbytes))
                stored.append(k)
                sizes.append(nbytes)
                total += nbytes
        self.stats.evictions += len(evicted)
        if evicted:
            self._engine(self._notify_keys_deleted, evicted, evicted_sizes)
        try:
            self._copy(rows, to_tensor=True)
        except aqua.AquaError:
            with self._lock:  # nothing half-written stays findable
                for k in stored:
                    p = self._index.pop(k, None)
                    if p is not None:
                        self._free.append(p.slot)
            raise
        self.stats.stores += len(stored)
        self.stats.stored_bytes += total
        if stored:
            self._engine(self._notify_keys_stored, stored, sizes)
        with self._lock:
            self._stores[tid] = L2StoreResult(True, total)
        self._engine(self._store_efd.notify)

    def _matches(self, p: _Page, layouts: dict, key: Any) -> bool:
        d = layouts.get(getattr(key, "object_group_id", 0)) if layouts else None
        if d is None or not getattr(d, "shapes", None):
            return True
        return p.ident[1] in d.shapes and (not d.dtypes or p.ident[2] in d.dtypes)

    def _do_lookup(self, tid: L2TaskId, keys: list, layouts: dict) -> None:
        bm = Bitmap(len(keys))
        hits = 0
        with self._lock:
            index, locks = self._index, self._locks
            for i, k in enumerate(keys):
                p = index.get(k)
                if p is None or (layouts and not self._matches(p, layouts, k)):
                    continue
                bm.set(i)
                locks[k] = locks.get(k, 0) + 1
                hits += 1
            self.stats.hits += hits
            self.stats.lookups += len(keys)
            self._lookups[tid] = bm
        self._engine(self._lookup_efd.notify)

    def _do_load(self, tid: L2TaskId, keys: list, objects: list) -> None:
        bm = Bitmap(len(keys))
        rows, hit, hit_keys = [], [], []
        total = 0
        with self._lock:
            index, base, slot_bytes = self._index, self.dptr, self._slot_bytes
            for i, (k, obj) in enumerate(zip(keys, objects)):
                p = index.get(k)
                if p is None or p.ident != _identity(obj):
                    continue
                index.move_to_end(k)
                nbytes = p.ident[0]
                rows.append((obj.data_ptr, base + p.slot * slot_bytes, nbytes))
                hit.append(i)
                hit_keys.append(k)
                total += nbytes
        self._copy(rows, to_tensor=False)
        for i in hit:
            bm.set(i)
        self.stats.load_misses += len(keys) - len(hit)
        self.stats.loads += len(hit)
        self.stats.loaded_bytes += total
        if hit_keys:
            self._engine(self._notify_keys_accessed, hit_keys)
        with self._lock:
            self._loads[tid] = bm
        self._engine(self._load_efd.notify)

    # ----------------------------------------------------------------------- lifetime

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        os.eventfd_write(self._wake, 1)
        self._thread.join()
        for n in (self._store_efd, self._lookup_efd, self._load_efd):
            n.close()
        os.close(self._wake)
        stats = os.environ.get("AQUA_LMCACHE_STATS")
        if stats:  # for bench/run lmcache, which runs LMCache's bench in a process of its own
            with open(stats, "w") as f:
                json.dump(self.report_status(), f)
        self._give_back()
        if self._own_ctx and not self.ctx.closed:
            self.ctx.close()

    def _give_back(self) -> None:
        if getattr(self, "tier", None) is not None:
            self.tier.give_back(logger)
