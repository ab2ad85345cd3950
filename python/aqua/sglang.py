"""SGLang's HiCache storage tier in aqua: a HiCacheStorage backend.

Written against sglang==0.5.23 (python/requirements-sglang.txt). SGLang loads it through its
`dynamic` storage backend:

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
    '{"backend_name": "aqua", "module_path": "aqua.sglang", "class_name": "AquaHiCacheStorage",
      "interface_v1": 1, "aqua": {"capacity_bytes": "8GiB", "device": 0}}'

Each page is one slot of one aqua tensor (peer HBM from aquad leases, then DRAM within the granted
budget) whose device addresses are fixed for its life. An index maps each page's key to its slot;
the key is the page hash SGLang gives with everything else that identifies the bytes (the model,
the TP, PP, CP, DCP and DP ranks, the pool), and beside it the bytes' own identity (how they were
written, dtype, host layout, page size, size): a read that asks for another identity is a miss,
never another page's bytes, and `exists` says yes only for a page it can read. Full, a write
evicts the least recently written or read page, gone from `exists` at once.

Pages go between SGLang's host pool and the tensor by aqua copies: zero-copy from the host pool's
page addresses with `interface_v1` (batch_get_v1 / batch_set_v1), through flat pages otherwise
and for the extra pools of the v2 calls (SWA, Mamba, ...). All instances on one device in a
process share one tensor and one aqua consumer (SGLang makes a backend per attach; aqua allows
one consumer per GPU and process). A thread of the tier's own waits on aqua's fd and follows what
aquad sends: a reclaim moves the tensor's chunks to DRAM at the same addresses while SGLang's
threads go on; none of them waits on aquad. python/README.md ("SGLang") says what each failure
looks like.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import threading
import time
from dataclasses import dataclass, field
from typing import Any, List, NamedTuple, Optional

import torch
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, HiCacheStorageConfig,
                                                  HiCacheStorageExtraInfo, PoolHitPolicy,
                                                  PoolName, PoolTransfer, PoolTransferResult)

import aqua
from aqua._tier import Followed, Tier, open_consumer, tier_settings

__all__ = ["AquaHiCacheStorage", "AquaSettings"]

logger = logging.getLogger("aqua.sglang")

_KEYS = ("capacity_bytes", "slot_bytes", "device", "endpoint", "side_path", "client_name",
         "allow_dram", "timeout", "namespace")


@dataclass(frozen=True)
class AquaSettings:
    """The "aqua" object of the extra config: capacity_bytes (required), slot_bytes (the
    largest page; default: the largest page of the host pools SGLang registers), device (CUDA
    ordinal; default: the current CUDA device, else 0), endpoint, side_path, client_name,
    allow_dram (default true), timeout (seconds), namespace (a name kept in every key: tiers of
    one process that must not see each other's pages)."""
    capacity_bytes: int
    slot_bytes: int = 0
    device: int = 0
    endpoint: Optional[str] = None
    side_path: Optional[str] = None
    client_name: str = "sglang"
    allow_dram: bool = True
    timeout: Optional[float] = None
    namespace: str = ""

    @classmethod
    def from_extra_config(cls, extra: Optional[dict]) -> "AquaSettings":
        d = (extra or {}).get("aqua")
        if not isinstance(d, dict):
            raise ValueError("aqua.sglang: --hicache-storage-backend-extra-config needs an "
                             "object \"aqua\" with at least \"capacity_bytes\" (such as "
                             f"{{\"aqua\": {{\"capacity_bytes\": \"8GiB\"}}}}), not {d!r}")
        unknown = sorted(set(d) - set(_KEYS))
        if unknown:
            raise ValueError(f"aqua.sglang: unknown keys {unknown} in \"aqua\"; known: "
                             f"{list(_KEYS)}")
        if "capacity_bytes" not in d:
            raise ValueError("aqua.sglang: \"aqua\" needs 'capacity_bytes' (such as \"8GiB\"): "
                             "the bytes of KV pages this tier keeps")
        return cls(**tier_settings("aqua.sglang", d, device=_current_device(),
                                   client_name="sglang", strings=("namespace",)))

    def tier_settings(self) -> tuple:
        """What must agree between backends sharing one store."""
        return (self.capacity_bytes, self.slot_bytes, self.allow_dram, self.client_name)


def _current_device() -> int:
    try:
        return torch.cuda.current_device() if torch.cuda.is_available() else 0
    except Exception:  # no driver: the CUDA ordinal aqua's simcuda or a GPU calls 0
        return 0


class _Page(NamedTuple):
    slot: int
    ident: tuple  #: (form, dtype, layout, page size, bytes): how the bytes were written


@dataclass
class AquaSGLangStats:
    pages_written: int = 0
    bytes_written: int = 0
    pages_refused: int = 0  #: pages not written (larger than a slot)
    pages_read: int = 0
    bytes_read: int = 0
    read_misses: int = 0  #: pages asked for that were gone or of another identity
    evictions: int = 0
    call_ns: int = 0  #: time in the backend's calls ...
    copy_ns: int = 0  #: ... of it in aqua's copies (the rest is this module's own code)


@dataclass
class _Store:
    """One aqua tensor of slots and its index, shared by the backends of one device."""
    settings: AquaSettings
    ctx: aqua.Consumer
    own_ctx: bool
    tier: Tier = field(init=False)
    lock: threading.RLock = field(default_factory=threading.RLock)
    index: collections.OrderedDict = field(default_factory=collections.OrderedDict)
    free: list = field(default_factory=list)
    slot_bytes: int = 0
    slot_hint: int = 0  #: the largest page of the host pools registered so far
    n_slots: int = 0
    users: int = 0
    closed: bool = False
    stats: AquaSGLangStats = field(default_factory=AquaSGLangStats)
    followed: Followed = field(default_factory=Followed)

    def open(self) -> None:
        s = self.settings
        self.tier = Tier(self.ctx, "aqua.sglang")
        self.tier.open_capacity(s.capacity_bytes, allow_dram=s.allow_dram)
        i = self.tier.tensor.info()
        self.tensor_bytes = min(i.max_bytes, s.capacity_bytes)
        if s.slot_bytes:
            self.carve(s.slot_bytes)
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._thread = threading.Thread(target=self._follow, name="aqua.sglang", daemon=True)
        self._thread.start()
        logger.info("aqua.sglang: an aqua tensor of %d bytes at %#x (peer %d, DRAM %d) on "
                    "device %d", i.max_bytes, self.tier.dptr, i.peer_bytes, i.dram_bytes,
                    s.device)

    def carve(self, slot_bytes: int) -> None:
        self.slot_bytes = min(slot_bytes, self.tensor_bytes)
        self.n_slots = self.tensor_bytes // self.slot_bytes
        self.free = list(range(self.n_slots - 1, -1, -1))

    def _follow(self) -> None:
        """Wait on aqua's fd (and the wake fd), poll aqua under the lock: reclaims are followed
        while SGLang's threads only ever wait for this lock, never for aquad."""
        p = select.poll()
        p.register(self._wake, select.POLLIN)
        p.register(self.ctx.fileno(), select.POLLIN)
        while True:
            ready = p.poll(50)
            with self.lock:
                if self.closed:
                    return
                if any(fd == self._wake for fd, _ in ready):
                    try:
                        os.eventfd_read(self._wake)
                    except BlockingIOError:
                        pass
                try:
                    events = self.ctx.poll(0)
                except aqua.AquaError as e:
                    logger.warning("aqua.sglang: poll failed: %s", e)
                    continue
                self.tier.follow(events, self.followed, logger)

    def copy(self, rows: list[tuple[int, int, int]], to_tensor: bool) -> None:
        self.stats.copy_ns += self.tier.copy_rows(rows, to_tensor=to_tensor)

    def find(self, key: tuple, ident: Optional[tuple]) -> Optional[_Page]:
        """The page of key if ident is its identity (None: any identity)."""
        p = self.index.get(key)
        return p if p is not None and (ident is None or p.ident == ident) else None

    def place(self, key: tuple, ident: tuple) -> Optional[int]:
        """A slot for a page of ident under key (replacing what key held), evicting the least
        recently used page when full; None when the page is larger than a slot."""
        if not self.slot_bytes:
            self.carve(max(ident[4], self.slot_hint, 1))
        if ident[4] > self.slot_bytes:
            self.stats.pages_refused += 1
            logger.warning("aqua.sglang: a page of %d bytes is larger than a slot (%d bytes, "
                           "'slot_bytes'); not stored", ident[4], self.slot_bytes)
            return None
        old = self.index.pop(key, None)
        if old is not None:
            return old.slot
        if not self.free:
            victim, p = self.index.popitem(last=False)
            self.stats.evictions += 1
            return p.slot
        return self.free.pop()

    def drop(self, keys: list[tuple]) -> None:
        for k in keys:
            p = self.index.pop(k, None)
            if p is not None:
                self.free.append(p.slot)

    def slot_addr(self, slot: int) -> int:
        return self.tier.dptr + slot * self.slot_bytes

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.index.clear()
        os.eventfd_write(self._wake, 1)
        self._thread.join()
        os.close(self._wake)
        self.tier.give_back(logger)
        if self.own_ctx and not self.ctx.closed:
            self.ctx.close()


_stores: dict[tuple, _Store] = {}
_stores_lock = threading.Lock()


def _attach(s: AquaSettings, consumer: Optional[aqua.Consumer]) -> _Store:
    where = (s.endpoint or os.environ.get("AQUA_ENDPOINT"),
             s.side_path or os.environ.get("AQUA_SIDE_PATH"), s.device)
    with _stores_lock:
        st = _stores.get(where)
        if st is not None and not st.closed:
            if st.settings.tier_settings() != s.tier_settings():
                raise ValueError(
                    f"aqua.sglang: a tier on device {s.device} is open in this process with "
                    f"capacity_bytes, slot_bytes, allow_dram, client_name "
                    f"{st.settings.tier_settings()}; this backend asks for "
                    f"{s.tier_settings()}: backends of one device share one tier")
        else:
            ctx = consumer or open_consumer("aqua.sglang", s.device, endpoint=s.endpoint,
                                            side_path=s.side_path,
                                            client_name=s.client_name, timeout=s.timeout,
                                            where="in \"aqua\" of the extra config")
            st = _Store(s, ctx, own_ctx=consumer is None)
            try:
                st.open()
            except BaseException:
                if st.own_ctx:
                    ctx.close()
                raise
            _stores[where] = st
        st.users += 1
        return st


def _detach(st: _Store) -> None:
    with _stores_lock:
        st.users -= 1
        if st.users:
            return
        for k, v in list(_stores.items()):
            if v is st:
                del _stores[k]
    st.close()


def _dtype(t: Any) -> str:
    return str(t).removeprefix("torch.")


class AquaHiCacheStorage(HiCacheStorage):
    """SGLang's HiCacheStorage over an aqua tensor (module docstring). SGLang makes it as
    cls(storage_config, kwargs) (the `dynamic` backend) or cls(storage_config)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None, *,
                 consumer: Optional[aqua.Consumer] = None) -> None:
        if not isinstance(storage_config, HiCacheStorageConfig):
            raise TypeError(f"aqua.sglang: storage_config must be SGLang's "
                            f"HiCacheStorageConfig, not {type(storage_config).__name__}")
        self.settings = AquaSettings.from_extra_config(storage_config.extra_config)
        c = storage_config
        #: In every key: whose pages these are (HiCacheFile keeps the same in its file names).
        self.scope = (self.settings.namespace, c.model_name or "", c.tp_rank, c.tp_size,
                      c.pp_rank, c.pp_size, c.attn_cp_rank, c.attn_cp_size, c.dcp_rank,
                      c.dcp_size, c.dp_rank)
        self.zero_copy = bool((c.extra_config or {}).get("interface_v1", 0))
        self._pools: dict[str, tuple[Any, tuple]] = {}
        self._closed = False
        self._warned_closed = False
        self._store = _attach(self.settings, consumer)

    # ------------------------------------------------------------------------ host pools

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self._register(PoolName.KV.value, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self._register(str(getattr(host_pool_name, "value", host_pool_name)), host_pool)

    def _register(self, name: str, pool: Any) -> None:
        """A pool's page identity: its flat page's dtype and size, layout and page size."""
        page = pool.get_dummy_flat_data_page()
        nbytes = page.numel() * page.element_size()
        self._pools[name] = (pool, (_dtype(page.dtype), str(getattr(pool, "layout", "")),
                                    int(getattr(pool, "page_size", 1) or 1), nbytes))
        with self._store.lock:
            self._store.slot_hint = max(self._store.slot_hint, nbytes)

    def _ident(self, pool: str, form: str) -> Optional[tuple]:
        p = self._pools.get(pool)
        return (form, *p[1]) if p is not None else None

    def _key(self, key: Any, pool: str = "kv") -> tuple:
        if not isinstance(key, str):
            raise TypeError(f"aqua.sglang: a page key is SGLang's page hash (str), not "
                            f"{type(key).__name__} {key!r}")
        return (self.scope, pool, key)

    def _kv_form(self) -> str:
        return "meta" if self.zero_copy else "flat"

    # ------------------------------------------------------------------------- helpers

    def _usable(self) -> bool:
        if self._closed or self._store.closed:
            if not self._warned_closed:
                self._warned_closed = True
                logger.warning("aqua.sglang: the backend is closed: every page is a miss and "
                               "nothing is stored")
            return False
        return True

    def _write(self, pages: list[tuple[tuple, tuple, list[tuple[int, int]]]]) -> list[bool]:
        """Write pages given as (key, ident, [(host address, bytes), ...]): True for each
        written or already there (a page hash names its bytes, as SGLang's backends assume). A
        page half-written by a failed copy is not findable."""
        st, ok, rows, placed = self._store, [False] * len(pages), [], []
        with st.lock:
            if st.closed:
                return ok
            for i, (key, ident, pieces) in enumerate(pages):
                if st.find(key, ident) is not None:  # a page hash names its bytes: kept
                    st.index.move_to_end(key)
                    ok[i] = True
                    continue
                slot = st.place(key, ident)
                if slot is None:
                    continue
                addr = st.slot_addr(slot)
                for ptr, n in pieces:
                    rows.append((addr, ptr, n))
                    addr += n
                st.index[key] = _Page(slot, ident)
                placed.append((i, key))
            try:
                st.copy(rows, to_tensor=True)
            except aqua.AquaError as e:
                logger.warning("aqua.sglang: writing %d pages failed (%s); none of them is "
                               "kept", len(placed), e)
                st.drop([k for _, k in placed])
                return ok
            for i, _ in placed:
                ok[i] = True
            st.stats.pages_written += len(placed)
            st.stats.bytes_written += sum(r[2] for r in rows)
        return ok

    def _read(self, pages: list[tuple[tuple, tuple, list[tuple[int, int]]]]) -> list[bool]:
        """Read pages given as (key, ident, [(host address, bytes), ...]) if each is there with
        that identity: True for each read."""
        st, ok, rows, hits = self._store, [False] * len(pages), [], []
        with st.lock:
            if st.closed:
                return ok
            for i, (key, ident, pieces) in enumerate(pages):
                p = st.find(key, ident)
                if p is None or sum(n for _, n in pieces) != ident[4]:
                    st.stats.read_misses += 1
                    continue
                st.index.move_to_end(key)
                addr = st.slot_addr(p.slot)
                for ptr, n in pieces:
                    rows.append((ptr, addr, n))
                    addr += n
                hits.append(i)
            try:
                st.copy(rows, to_tensor=False)
            except aqua.AquaError as e:
                logger.warning("aqua.sglang: reading %d pages failed (%s); each is a miss",
                               len(hits), e)
                return ok
            for i in hits:
                ok[i] = True
            st.stats.pages_read += len(hits)
            st.stats.bytes_read += sum(r[2] for r in rows)
        return ok

    def _timed(self, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return fn(*args)
        finally:
            self._store.stats.call_ns += time.perf_counter_ns() - t0

    @staticmethod
    def _tensor_piece(t: Any) -> list[tuple[int, int]]:
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or not t.is_contiguous():
            raise TypeError(f"aqua.sglang: a page's buffer must be a contiguous host tensor, "
                            f"not {type(t).__name__}"
                            f"{' on ' + str(t.device) if isinstance(t, torch.Tensor) else ''}")
        return [(t.data_ptr(), t.numel() * t.element_size())]

    def _tensor_page(self, key: Any, t: Any) -> tuple:
        """(key, identity, pieces) of a flat page of the KV pool in host tensor t."""
        pieces = self._tensor_piece(t)
        kv = self._pools.get("kv")
        layout, ps = (kv[1][1], kv[1][2]) if kv is not None else ("", 0)
        return (self._key(key), ("flat", _dtype(t.dtype), layout, ps, pieces[0][1]), pieces)

    # --------------------------------------------------- SGLang's generic calls (tensors)

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> torch.Tensor | None:
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[torch.Tensor | None]:
        if target_locations is None or len(target_locations) != len(keys):
            raise ValueError(f"aqua.sglang: {len(keys)} keys for "
                             f"{0 if target_locations is None else len(target_locations)} "
                             "target buffers: each read needs the host tensor to fill")
        pages = [self._tensor_page(k, t) for k, t in zip(keys, target_locations)]
        if not self._usable():
            return [None] * len(keys)
        ok = self._timed(self._read, pages)
        return [t if good else None for t, good in zip(target_locations, ok)]

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        if values is None or len(values) != len(keys):
            raise ValueError(f"aqua.sglang: {len(keys)} keys for "
                             f"{0 if values is None else len(values)} values")
        values = [v.contiguous() if isinstance(v, torch.Tensor) else v for v in values]
        pages = [self._tensor_page(k, v) for k, v in zip(keys, values)]
        if not self._usable():
            return False
        return all(self._timed(self._write, pages))

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        k = [self._key(x) for x in keys]
        if not self._usable():
            return 0
        ident = self._ident("kv", self._kv_form())
        st = self._store
        with st.lock:
            for i, key in enumerate(k):
                if st.find(key, ident) is None:
                    return i
        return len(k)

    # ------------------------------------------- zero copy over the registered host pool

    def _pool(self, name: str) -> tuple[Any, tuple]:
        p = self._pools.get(name)
        if p is None:
            raise RuntimeError(f"aqua.sglang: no host pool '{name}' is registered with this "
                               f"backend (registered: {sorted(self._pools)})")
        return p

    def _meta_pages(self, keys: List[str], host_indices: torch.Tensor) -> list:
        pool, pid = self._pool("kv")
        ps = pid[2]
        if host_indices.numel() != len(keys) * ps:
            raise ValueError(f"aqua.sglang: {len(keys)} keys for {host_indices.numel()} host "
                             f"indices (page size {ps})")
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        per = len(ptrs) // max(len(keys), 1)
        ident = ("meta", *pid)
        return [(self._key(k), ident,
                 list(zip(ptrs[i * per:(i + 1) * per], sizes[i * per:(i + 1) * per])))
                for i, k in enumerate(keys)]

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        pages = self._meta_pages(keys, host_indices)
        if not self._usable():
            return [False] * len(keys)
        return self._timed(self._read, pages)

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        pages = self._meta_pages(keys, host_indices)
        if not self._usable():
            return [False] * len(keys)
        return self._timed(self._write, pages)

    # ------------------------------------------------ v2: the KV pool and the extra pools

    def _transfer_pages(self, t: PoolTransfer) -> tuple[str, Any, list, list]:
        name = str(getattr(t.name, "value", t.name))
        pool, pid = self._pool(name)
        keys, ps = t.keys or [], pid[2]
        if t.host_indices is None or t.host_indices.numel() != len(keys) * ps:
            raise ValueError(f"aqua.sglang: pool '{name}': {len(keys)} keys for "
                             f"{0 if t.host_indices is None else t.host_indices.numel()} "
                             f"host indices (page size {ps})")
        offsets = [int(t.host_indices[i * ps]) for i in range(len(keys))]
        return name, pool, offsets, [self._key(k, name) for k in keys]

    def batch_get_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> dict[str, List[bool]]:
        out: dict[str, List[bool]] = {}
        for t in transfers:
            name, pool, offsets, keys = self._transfer_pages(t)
            bufs = [pool.get_dummy_flat_data_page() for _ in keys]
            ident = self._ident(name, "flat")
            ok = (self._timed(self._read, [(k, ident, self._tensor_piece(b))
                                           for k, b in zip(keys, bufs)])
                  if self._usable() else [False] * len(keys))
            for off, b, good in zip(offsets, bufs, ok):
                if good:
                    pool.set_from_flat_data_page(off, b)
            out[name] = ok
        return out

    def batch_set_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> dict[str, List[bool]]:
        out: dict[str, List[bool]] = {}
        for t in transfers:
            name, pool, offsets, keys = self._transfer_pages(t)
            bufs = [pool.get_data_page(off, flat=True).contiguous() for off in offsets]
            ident = self._ident(name, "flat")
            out[name] = (self._timed(self._write, [(k, ident, self._tensor_piece(b))
                                                   for k, b in zip(keys, bufs)])
                         if self._usable() else [False] * len(keys))
        return out

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None
                        ) -> PoolTransferResult:
        """The longest KV prefix present whose extra pools are present as each pool's hit
        policy asks (all its pages, or the trailing ones), as HiCacheFile answers."""
        kv_pages = self.batch_exists(keys, extra_info)
        hits: dict[str, int] = {PoolName.KV: kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        st = self._store
        for t in pool_transfers or []:
            if not restorable:
                break
            name = str(getattr(t.name, "value", t.name))
            ident = self._ident(name, "flat")
            with st.lock:
                have = [st.find(self._key(k, name), ident) is not None and not st.closed
                        for k in keys[:kv_pages]]
            if t.hit_policy == PoolHitPolicy.ALL_PAGES:
                boundary = next((i for i, h in enumerate(have) if not h), kv_pages)
                ok = set(range(1, boundary + 1))
            elif t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                trailing = max(1, len(t.keys) if t.keys else 1)
                ok = {n for n in range(1, kv_pages + 1)
                      if all(have[max(0, n - trailing):n])}
                boundary = max(ok, default=0)
            else:
                raise ValueError(f"aqua.sglang: pool '{name}': hit policy {t.hit_policy} is "
                                 "not supported")
            if boundary:
                hits[t.name] = boundary
            restorable = [n for n in restorable if n in ok]
        return PoolTransferResult(restorable[-1] if restorable else 0, hits, restorable)

    # ------------------------------------------------------------------------- lifetime

    def clear(self) -> bool:
        """Forget every page of this backend's scope."""
        st = self._store
        with st.lock:
            st.drop([k for k in st.index if k[0] == self.scope])
        return True

    def report(self) -> dict:
        """The tier's bytes per place and its counters (operators, tests, bench/run sglang)."""
        st = self._store
        with st.lock:
            i = st.tier.tensor.info() if not st.closed else None
            return {"closed": self._closed or st.closed, "pages": len(st.index),
                    "slots": st.n_slots, "slot_bytes": st.slot_bytes,
                    "peer_bytes": i.peer_bytes if i else 0,
                    "dram_bytes": i.dram_bytes if i else 0,
                    "aquad_connected": (not st.ctx.closed and st.ctx.info().connected),
                    **vars(st.stats), **vars(st.followed)}

    def close(self) -> None:
        """Detach: the last backend of the device gives the tier's memory back."""
        if self._closed:
            return
        self._closed = True
        _detach(self._store)
