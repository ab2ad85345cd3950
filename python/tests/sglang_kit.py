"""What running SGLang's radix-cache storage kit (sglang.test.kits.unified_radix_cache) with
aqua's backend needs besides the kit, on a machine without a GPU; test_sglang_upstream.py uses it.

The swap: the kit's fixtures name the storage backend "file" (SGLang's HiCacheFile) and give it a
folder through $SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR. KitStorage is aqua's backend made under
that name (SGLang's factory makes a "file" backend as cls(storage_config)): its "aqua" settings
are filled in here, the folder becomes its namespace (the producer and consumer caches of one
kit case share pages, cases do not), and HiCacheFile's "max_size" (from the extra config, or
$SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE) is its capacity, so that both are given the same room.

The CPU: three things of SGLang's fail without a CUDA device, none of them its storage layer or
the kit's checks; python/README.md ("SGLang") names them:
1. the kit's fixtures put the device KV pool on get_device(), which raises "No accelerator"
   without one: it is "cpu" here;
2. the host KV pool pins its memory (cudaHostRegister): made with pin_memory=False, as the kit's
   own prefetch-corruption fixture does;
3. the host pool's device<->host copies are sgl_kernel's CUDA ops, not installed: for the
   layouts the kit uses, the same copies with torch indexing (backup_from_device_all_layer,
   load_to_device_per_layer).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional
from unittest import mock

from sglang.srt.environ import envs
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

from aqua.sglang import AquaHiCacheStorage

#: Backends made for the case running; closed when it ends.
made: list[AquaHiCacheStorage] = []


class KitStorage(AquaHiCacheStorage):
    def __init__(self, storage_config: Any, kwargs: Optional[dict] = None) -> None:
        extra = dict(storage_config.extra_config or {})
        room = extra.get("max_size") or envs.SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE.get()
        extra["aqua"] = {"capacity_bytes": room or "16MiB", "device": 0,
                         "namespace": envs.SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR.get() or ""}
        super().__init__(dataclasses.replace(storage_config, extra_config=extra), kwargs)
        made.append(self)


def _backup(self: Any, device_pool: Any, host_indices: Any, device_indices: Any,
            io_backend: Any) -> None:
    hi, di = host_indices.long(), device_indices.long()
    for layer in range(self.layer_num):
        k, v = self.device_k_buffers[layer][di], self.device_v_buffers[layer][di]
        if self.layout == "page_first":
            self.k_buffer[hi, layer] = k.to(self.k_buffer.dtype)
            self.v_buffer[hi, layer] = v.to(self.v_buffer.dtype)
        else:
            self.k_buffer[layer, hi] = k.to(self.k_buffer.dtype)
            self.v_buffer[layer, hi] = v.to(self.v_buffer.dtype)


def _load(self: Any, device_pool: Any, host_indices: Any, device_indices: Any, layer_id: int,
          io_backend: Any, *, is_draft: bool = False) -> None:
    if not is_draft and not 0 <= layer_id < self.target_layer_num:
        return
    hi, di = host_indices.long(), device_indices.long()
    if self.layout == "page_first":
        k, v = self.k_buffer[hi, layer_id], self.v_buffer[hi, layer_id]
    else:
        k, v = self.k_buffer[layer_id, hi], self.v_buffer[layer_id, hi]
    self.device_k_buffers[layer_id][di] = k
    self.device_v_buffers[layer_id][di] = v


def cpu_patches() -> list[Any]:
    """The three patches above, not started."""
    import sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler as assembler
    import sglang.test.kits.unified_radix_cache.fixtures as fixtures

    def unpinned(buffer_info: Any, _orig: Any = assembler.get_mha_host_pool_cls) -> Any:
        cls = _orig(buffer_info)

        def make(*a: Any, **k: Any) -> Any:
            k["pin_memory"] = False
            return cls(*a, **k)
        return make

    return [mock.patch.object(fixtures, "get_device", return_value="cpu"),
            mock.patch.object(assembler, "get_mha_host_pool_cls", side_effect=unpinned),
            mock.patch.object(MHATokenToKVPoolHost, "backup_from_device_all_layer", _backup),
            mock.patch.object(MHATokenToKVPoolHost, "load_to_device_per_layer", _load)]


def close_made() -> None:
    while made:
        made.pop().close()

