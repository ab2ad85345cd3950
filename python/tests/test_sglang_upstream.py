"""SGLang's own storage test kit for its radix cache, unchanged, with aqua's backend in place.

sglang 0.5.23 ships the kit its radix-cache storage tests are written with
(sglang/test/kits/unified_radix_cache/storage.py: fixtures that build SGLang's UnifiedRadixCache
with its HiCache controller over a storage backend, produce pages to storage from one cache and
prefetch them into another, and the kit's own checks of what comes back); its tests themselves
are not in the wheel. Each case here is a body over the kit's fixtures and checks, run twice:
with SGLang's HiCacheFile (the backend the kit is written for, on a temporary folder), and with
aqua's backend swapped in under the name the kit uses (sglang_kit.py says how, and what the
machine without a GPU needs). A case that fails with HiCacheFile is a wrong use of the kit, not a
pass for aqua. Every aqua case runs against a real aquad, with a lender on the simulated
machine's GPU 1.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from array import array
from unittest import mock

import pytest
import torch
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.test.kits.unified_radix_cache.config import CacheConfig
from sglang.test.kits.unified_radix_cache.fixtures import build_fixture, match_prefix
from sglang.test.kits.unified_radix_cache.storage import (
    UnifiedRadixCacheStorageAttachBackfillFixtures, UnifiedRadixCacheStorageFixtures)
from sglang.test.test_utils import CustomTestCase

import sglang_kit

#: The lender of the running case (an agent), for cases that take its memory back.
LENDER = None


@pytest.fixture(autouse=True)
def _lender(aquad, producer):
    global LENDER
    LENDER = producer
    yield
    sglang_kit.close_made()
    LENDER = None


class Kit(UnifiedRadixCacheStorageFixtures):
    backend = "aqua"

    def setUp(self) -> None:
        super().setUp()
        LENDER.eval("ctx.offer(256 << 20)")
        for p in sglang_kit.cpu_patches():
            p.start()
            self.addCleanup(p.stop)
        if self.backend == "aqua":
            p = mock.patch.dict(StorageBackendFactory._registry)
            p.start()
            self.addCleanup(p.stop)
            StorageBackendFactory.register_backend("file", "sglang_kit", "KitStorage")

    def _storage(self, cache):
        b = cache.cache_controller.storage_backend
        self.assertEqual(type(b).__name__, "KitStorage" if self.backend == "aqua"
                         else "HiCacheFile")
        return b

    def test_l3_round_trip(self) -> None:
        """Producer: insert, fill, back up device -> host -> storage. Consumer: prefetch from
        storage to host, load back to device: the KV is the producer's."""
        seq = self._make_seq(1, 4)
        storage_dir = self._make_storage_dir()
        expected_k, expected_v = self._l3_produce(storage_dir, seq, marker=5)
        cons, cons_alloc, _ = self._l3_consumer(storage_dir)
        self._storage(cons)
        self._consume_prefetch(cons, seq, CacheRequestHandle("rt", 0))
        m = match_prefix(cons, seq)
        self.assertEqual(m.device_prefix_len, 0)
        self.assertEqual(m.host_hit_length, len(seq), "prefetched span not host-resident")
        hashes = self._all_page_hashes(cons, m.last_host_node)
        self.assertEqual(self._storage_exists_count(cons, hashes), len(hashes))
        self._load_back_node(cons, m.last_host_node)
        m2 = match_prefix(cons, seq)
        self.assertEqual(m2.device_prefix_len, len(seq))
        k, v = self._snapshot_full_kv(cons_alloc, cons.path_device_indices(m2.last_device_node))
        self.assertTrue(torch.equal(k, expected_k))
        self.assertTrue(torch.equal(v, expected_v))
        cons.sanity_check()

    def test_buffer_mode_round_trip(self) -> None:
        """host_memory_mode=buffer_only: storage is the only place pages wait; a staged
        prefetch consumed as the PrefillAdder consumes it."""
        seq = self._buffer_swa_seq()
        storage_dir = self._make_storage_dir()
        _, (ek, ev) = self._produce_buffer_l3(storage_dir, seq, marker=11)
        cons, cons_alloc, _ = self._build_buffer_hicache_fixture(storage_dir)
        self._storage(cons)
        req_id = CacheRequestHandle("buf", 0)
        cons.prefetch_from_storage(req_id, cons.root_node_handle(), array("q", seq), None, None)
        self._run_prefetch_to_completion(cons, req_id)
        m = match_prefix(cons, seq)
        self.assertEqual(m.device_prefix_len, len(seq))
        k, v = self._snapshot_full_kv(cons_alloc, cons.path_device_indices(m.last_device_node))
        self.assertTrue(torch.equal(k, ek))
        self.assertTrue(torch.equal(v, ev))
        cons.sanity_check()

    def test_injected_storage_failures_never_give_a_wrong_page(self) -> None:
        """SGLang's failure injector (SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE) around the
        backend fails a third of its calls: what the consumer gets is a prefix of the pages,
        each the producer's."""
        from sglang.srt.environ import envs
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorageFailureInjector
        seq = self._make_seq(1, 8)
        storage_dir = self._make_storage_dir()
        with envs.SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE.override(0.3):
            expected_k, expected_v = self._l3_produce(storage_dir, seq, marker=7)
            cons, cons_alloc, _ = self._l3_consumer(storage_dir)
        self.assertIsInstance(cons.cache_controller.storage_backend,
                              HiCacheStorageFailureInjector)
        self._consume_prefetch(cons, seq, CacheRequestHandle("inj", 0))
        m = match_prefix(cons, seq)
        got = m.host_hit_length
        self.assertEqual(got % self.cfg.page_size, 0)
        if got:
            self._load_back_node(cons, m.last_host_node)
            m2 = match_prefix(cons, seq[:got])
            k, v = self._snapshot_full_kv(cons_alloc,
                                          cons.path_device_indices(m2.last_device_node))
            self.assertTrue(torch.equal(k, expected_k[:got]))
            self.assertTrue(torch.equal(v, expected_v[:got]))
        cons.sanity_check()

    def _produce_paged(self, storage_dir, seq):
        """_l3_produce with a marker of its own per page, so that a page delivered in place of
        another does not compare equal."""
        ps = self.cfg.page_size
        prod, alloc, rtp = build_fixture(self.cfg)
        self._init_hicache(prod, storage_backend="file", storage_dir=storage_dir,
                           prefetch_threshold=1)
        self._insert(prod, alloc, rtp, seq)
        leaf = match_prefix(prod, seq).last_device_node
        indices = prod.path_device_indices(leaf)
        for p in range(len(seq) // ps):
            self._fill_full_kv(alloc, indices[p * ps:(p + 1) * ps], marker=20 + 2 * p)
        expected = self._snapshot_full_kv(alloc, indices)
        self._backup_node(prod, leaf)
        self._write_path_to_l3(prod, leaf)
        self._flush_l3_backups(prod)
        return expected

    def _anchor(self, cache, alloc, rtp, head):
        """A prefix the consumer computed itself, on device and backed up to host: what the
        scheduler requires of the node a prefetch hangs under."""
        ps = self.cfg.page_size
        self._insert(cache, alloc, rtp, head)
        node = match_prefix(cache, head).last_device_node
        indices = cache.path_device_indices(node)
        for p in range(len(head) // ps):
            self._fill_full_kv(alloc, indices[p * ps:(p + 1) * ps], marker=20 + 2 * p)
        self._backup_node(cache, node)
        return node

    def _prefetch_under(self, cache, anchor, tokens, name):
        req = CacheRequestHandle(name, 0)
        cache.prefetch_from_storage(req, anchor, array("q", tokens),
                                    cache.get_last_hash_value(anchor), None)
        self._run_prefetch_to_completion(cache, req)

    def test_a_prefetch_committed_under_a_prefix_is_the_producers_kv_page_for_page(self) -> None:
        """The kit's prefetch-corruption concern, with the commit made for real through the
        backend (the kit's own corruption fixtures fake it with made-up hashes and no storage):
        the consumer holds the first two pages itself and prefetches the rest under them. What
        loads back is the producer's KV page for page (each page has its own marker); the same
        tail under another prefix finds nothing, a page's key being its whole prefix. Over
        aqua the lender has taken everything back first: the pages come from host memory."""
        ps = self.cfg.page_size
        seq = self._make_seq(1, 4)
        storage_dir = self._make_storage_dir()
        want_k, want_v = self._produce_paged(storage_dir, seq)
        if self.backend == "aqua":
            self.assertTrue(LENDER.eval("ctx.reclaim(aqua.ALL, timeout=20).complete"))

        cons, alloc, rtp = self._l3_consumer(storage_dir)
        anchor = self._anchor(cons, alloc, rtp, seq[:2 * ps])
        self._prefetch_under(cons, anchor, seq[2 * ps:], "tail")
        m = match_prefix(cons, seq)
        self.assertEqual(m.device_prefix_len, 2 * ps)
        self.assertEqual(m.host_hit_length, 2 * ps, "the prefetched tail is host-resident")
        self._load_back_node(cons, m.last_host_node)
        got_k, got_v = self._snapshot_full_kv(
            alloc, cons.path_device_indices(match_prefix(cons, seq).last_device_node))
        self.assertTrue(torch.equal(got_k, want_k))
        self.assertTrue(torch.equal(got_v, want_v))
        cons.sanity_check()
        if self.backend == "aqua":
            r = self._storage(cons).report()
            self.assertEqual(r["peer_bytes"], 0, r)
            self.assertGreater(r["dram_bytes"], 0, r)

        other, oalloc, ortp = self._l3_consumer(storage_dir)
        head = self._make_seq(5001, 2)
        anchor = self._anchor(other, oalloc, ortp, head)
        self._prefetch_under(other, anchor, seq[2 * ps:], "foreign")
        m = match_prefix(other, head + seq[2 * ps:])
        self.assertEqual((m.device_prefix_len, m.host_hit_length), (2 * ps, 0))
        other.sanity_check()

    def test_a_sibling_publishing_the_head_trims_the_staged_prefetch(self) -> None:
        """The kit's check: a staged prefetch whose first page a sibling request published
        meanwhile loads only the rest, and both parts are the right KV."""
        seq = self._buffer_swa_seq()
        self._assert_sibling_head_is_trimmed(self._make_storage_dir(), seq,
                                             window_sized=False)


CONFIGS = {"page1": CacheConfig(page_size=1), "page4": CacheConfig(page_size=4),
           "page16": CacheConfig(page_size=16),
           "page4_swa": CacheConfig(page_size=4, components=(ComponentType.FULL,
                                                             ComponentType.SWA),
                                    sliding_window_size=4)}
for _backend in ("file", "aqua"):
    for _label, _cfg in CONFIGS.items():
        _name = f"Test{_backend.capitalize()}_{_label}"
        globals()[_name] = type(_name, (Kit, CustomTestCase),
                                {"cfg": _cfg, "backend": _backend})
del Kit


PAGE = 16 * 12288  # a page of the scenario's fixture: 16 tokens of 24 layers, 2 heads of 64, bf16


class Scenario(UnifiedRadixCacheStorageFixtures, CustomTestCase):
    """End to end through SGLang's radix cache and HiCache controller, once over HiCacheFile on
    /dev/shm (SGLang's own tier in host memory) and once over aqua, both given room for 24 pages:
    one producer cache writes 8 sequences of 4 pages in two rounds and reads two of the first
    four back in between, the lender takes back a third of what it lent after the first
    round and the rest after the second; a second consumer then prefetches every sequence.
    Every page it gets is the producer's, and which sequences hit is the same over both."""
    cfg = CacheConfig(page_size=16, kv_size=2048)

    def _run(self, backend: str) -> list[int]:
        with mock.patch.dict(StorageBackendFactory._registry):
            if backend == "aqua":
                StorageBackendFactory.register_backend("file", "sglang_kit", "KitStorage")
            return self._scenario(backend)

    def _scenario(self, backend: str) -> list[int]:
        from sglang.srt.environ import envs
        storage_dir = tempfile.mkdtemp(dir="/dev/shm")
        self.addCleanup(shutil.rmtree, storage_dir, ignore_errors=True)
        room = {"max_size": 24 * PAGE, "eviction_ratio": 1.0}
        seqs = [self._make_seq(1 + 1000 * i, 4) for i in range(8)]
        expected = {}
        with envs.SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE.override(str(24 * PAGE)), \
                envs.SGLANG_HICACHE_FILE_BACKEND_EVICTION_RATIO.override("1.0"):
            prod, prod_alloc, prod_rtp = build_fixture(self.cfg)
            self._init_hicache(prod, storage_backend="file", storage_dir=storage_dir,
                               prefetch_threshold=1, storage_extra=room)
            store = prod.cache_controller.storage_backend
            self.assertEqual(type(store).__name__,
                             "KitStorage" if backend == "aqua" else "HiCacheFile")

            def write(i: int) -> None:
                self._insert(prod, prod_alloc, prod_rtp, seqs[i])
                leaf = match_prefix(prod, seqs[i]).last_device_node
                indices = prod.path_device_indices(leaf)
                self._fill_full_kv(prod_alloc, indices, marker=10 + i)
                expected[i] = self._snapshot_full_kv(prod_alloc, indices)
                self._backup_node(prod, leaf)
                self._write_path_to_l3(prod, leaf)
                self._flush_l3_backups(prod)

            def reclaim(nbytes: str) -> None:
                if backend == "aqua":
                    r = LENDER.eval(f"ctx.reclaim({nbytes}, timeout=20).complete")
                    self.assertTrue(r, "the lender's reclaim did not complete")

            for i in range(4):
                write(i)
            if backend == "aqua":
                r = store.report()
                self.assertEqual(r["dram_bytes"], 0)
                self.assertGreater(r["peer_bytes"], 0)
            reclaim("2 << 20")
            # The engine reads two of the first four back through its backend (a read makes
            # a page recent in both tiers, so the next round evicts the other two).
            host = prod.cache_controller.storage_host_pool
            for i in (0, 2):
                hashes = self._all_page_hashes(prod, match_prefix(prod, seqs[i]).last_device_node)
                self.assertEqual(store.batch_exists(hashes), len(hashes))
                got = store.batch_get(hashes, [host.get_dummy_flat_data_page() for _ in hashes])
                self.assertTrue(all(x is not None for x in got), (backend, i))
            for i in range(4, 8):
                write(i)
            reclaim("aqua.ALL")
            if backend == "aqua":
                r = store.report()
                self.assertEqual(r["peer_bytes"], 0, r)
                self.assertGreater(r["migrations"], 1, r)
                self.assertEqual(r["evictions"], 8, r)
            cons, cons_alloc, _ = self._l3_consumer(storage_dir)
            hits = []
            for i, seq in enumerate(seqs):
                self._consume_prefetch(cons, seq, CacheRequestHandle(f"late{i}", 0))
                m = match_prefix(cons, seq)
                hits.append(m.host_hit_length)
                if m.host_hit_length:
                    self._load_back_node(cons, m.last_host_node)
                    got = self._snapshot_full_kv(
                        cons_alloc,
                        cons.path_device_indices(match_prefix(cons, seq).last_device_node))
                    n = m.host_hit_length
                    self.assertTrue(torch.equal(got[0], expected[i][0][:n]), (backend, i))
                    self.assertTrue(torch.equal(got[1], expected[i][1][:n]), (backend, i))
            cons.sanity_check()
        return hits

    def test_two_reclaims_no_wrong_page_and_the_same_hits_as_sglangs_host_tier(self) -> None:
        for p in sglang_kit.cpu_patches():
            p.start()
            self.addCleanup(p.stop)
        # A lender of 2 MiB chunks, three of them: the tier's 24 pages span all three.
        LENDER.eval("ctx.close()")
        LENDER.exec("ctx = aqua.Producer(1, client_name='pytest-producer', "
                    "chunk_bytes=2 << 20)")
        LENDER.eval("ctx.offer(6 << 20)")
        file_hits = self._run("file")
        aqua_hits = self._run("aqua")
        self.assertEqual(aqua_hits, file_hits)
        self.assertEqual(file_hits, [64, 0, 64, 0, 64, 64, 64, 64])


class AttachBackfill(UnifiedRadixCacheStorageAttachBackfillFixtures,
                     UnifiedRadixCacheStorageFixtures, CustomTestCase):
    """aqua attached at run time as an operator attaches a backend to a running server
    (attach_storage_backend, the `dynamic` backend with the zero-copy interface): the pages of a
    tree built with storage off get their hashes as if storage had been on from the start, are
    written through aqua and read back into another cache, and detach gives the tier back."""
    cfg = CacheConfig(page_size=4)
    prefix_tokens = array("q", range(1, 9))
    suffix_tokens = array("q", range(9, 17))

    def test_attach_backfills_hashes_and_pages_round_trip_through_aqua(self) -> None:
        for p in sglang_kit.cpu_patches():
            p.start()
            self.addCleanup(p.stop)
        LENDER.eval("ctx.offer(256 << 20)")
        extra = json.dumps({"backend_name": "aqua", "module_path": "aqua.sglang",
                            "class_name": "AquaHiCacheStorage", "interface_v1": 1,
                            "prefetch_threshold": 1,
                            "aqua": {"capacity_bytes": "16MiB", "device": 0}})
        from sglang.srt.runtime_context import get_parallel
        single = get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)
        single.__enter__()
        self.addCleanup(single.__exit__, None, None, None)
        on = self._build_two_level_tree(storage_on_from_the_start=True)
        off = self._build_two_level_tree(storage_on_from_the_start=False)
        self._init_hicache(off)
        ok, msg = off.attach_storage_backend("dynamic", extra)
        self.assertTrue(ok, msg)
        self.assertEqual(self._hashes_by_token_ids(off), self._hashes_by_token_ids(on))
        store = off.cache_controller.storage_backend
        self.assertEqual(off.cache_controller.page_set_func.__name__, "_page_set_zero_copy")
        seq = list(self.prefix_tokens + self.suffix_tokens)
        leaf = match_prefix(off, seq).last_device_node
        alloc = off.token_to_kv_pool_allocator
        indices = off.path_device_indices(leaf)
        self._fill_full_kv(alloc, indices, marker=3)
        want_k, want_v = self._snapshot_full_kv(alloc, indices)
        self._backup_node(off, leaf)
        self._write_path_to_l3(off, leaf)
        self._flush_l3_backups(off)
        self.assertEqual(store.report()["pages_written"], len(seq) // self.cfg.page_size)

        cons, cons_alloc, _ = build_fixture(self.cfg)
        self._init_hicache(cons)
        ok, msg = cons.attach_storage_backend("dynamic", extra)
        self.assertTrue(ok, msg)
        self._consume_prefetch(cons, seq, CacheRequestHandle("attached", 0))
        m = match_prefix(cons, seq)
        self.assertEqual(m.host_hit_length, len(seq))
        self._load_back_node(cons, m.last_host_node)
        got_k, got_v = self._snapshot_full_kv(
            cons_alloc, cons.path_device_indices(match_prefix(cons, seq).last_device_node))
        self.assertTrue(torch.equal(got_k, want_k) and torch.equal(got_v, want_v))
        self.assertEqual(store.report()["pages_read"], len(seq) // self.cfg.page_size)
        for cache in (off, cons):
            ok, msg = cache.detach_storage_backend()
            self.assertTrue(ok, msg)
        self.assertTrue(store.report()["closed"], "detaching both gives the tier back")
