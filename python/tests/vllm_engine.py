"""vLLM's scheduler and KV connector driven without a model, the way vLLM's own tests of its
offloading connector drive them: vLLM's Scheduler (with the OffloadingConnector in the scheduler
role) schedules real Requests; an OffloadingConnector in the worker role runs each step's
transfers over KV caches that are host tensors (on simcuda device memory is host memory, so the
copies between them and the aqua tensor are real); model outputs are made up, one token a step.
Used by test_vllm.py and bench/vllm.py. Nothing here imitates a vLLM interface: every call is
to vLLM's classes.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.forward_context import ForwardContext
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

import kv_model

EOS = 2
#: A model config vLLM can read without a hub: a tiny OPT (no weights are ever loaded).
MODEL_CONFIG = {
    "architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 64,
    "num_attention_heads": 4, "num_hidden_layers": 2, "ffn_dim": 128, "vocab_size": 1000,
    "max_position_embeddings": 4096, "word_embed_proj_dim": 64, "do_layer_norm_before": True,
    "torch_dtype": "float16", "bos_token_id": EOS, "eos_token_id": EOS, "pad_token_id": 1,
}


def model_dir() -> str:
    d = os.path.join(tempfile.gettempdir(), f"aqua-vllm-model-{os.getuid()}")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "config.json")
    text = json.dumps(MODEL_CONFIG)
    if not os.path.exists(path) or open(path).read() != text:
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    return d


@dataclass
class StepLog:
    """What the scheduler decided, step by step: per request, the tokens it took from the
    offloaded cache (vLLM's external hits) and the jobs it asked the worker for."""

    external_hits: dict[str, int] = field(default_factory=dict)
    stores: int = 0
    loads: int = 0


class Engine:
    """One engine: scheduler and worker of vLLM with the OffloadingConnector."""

    def __init__(self, extra_config: Optional[dict[str, Any]], *, num_gpu_blocks: int = 128,
                 block_size: int = 16, layers: int = 2, kv_heads: int = 4, head_size: int = 64,
                 max_num_batched_tokens: int = 1024, worker_extra: Optional[dict[str, Any]] = None,
                 tensor_parallel: int = 1, rank_extra: Optional[list[dict[str, Any]]] = None,
                 processes: bool = False):
        """tensor_parallel workers (ranks), each with its own KV caches and worker connector;
        rank_extra: keys added to the extra config of each rank's worker (e.g. its device).
        processes: each rank's worker connector runs in a process of its own (RankProcess), as
        vLLM's multiprocess executor runs one worker process per GPU."""
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.tensor_parallel = tensor_parallel
        self.vllm_config = self._config(extra_config, block_size, max_num_batched_tokens,
                                        tensor_parallel)
        self.layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
        self.shape = (layers, block_size, kv_heads, head_size)
        self.kv_cache_config = _kv_cache_config(self.shape, num_gpu_blocks)
        self.page_bytes = self.kv_cache_config.kv_cache_groups[0].kv_cache_spec.page_size_bytes
        self.vllm_config.cache_config.num_gpu_blocks = num_gpu_blocks
        with set_current_vllm_config(self.vllm_config):
            self.scheduler = Scheduler(
                vllm_config=self.vllm_config, kv_cache_config=self.kv_cache_config,
                log_stats=True, structured_output_manager=StructuredOutputManager(
                    self.vllm_config), block_size=block_size)
        self.connector: Optional[OffloadingConnector] = None
        #: Each rank's worker connector and KV caches: one host tensor per layer, (blocks, K/V,
        #: tokens, heads, head size). worker and kv_caches are rank 0's. With processes, each
        #: rank's are in its RankProcess instead.
        self.workers: list[OffloadingConnector] = []
        self.ranks: list[RankProcess] = []
        self.kv_caches_of: list[dict[str, torch.Tensor]] = []
        self.aggregator: Optional[KVOutputAggregator] = None
        if extra_config is not None:
            assert isinstance(self.scheduler.connector, OffloadingConnector)
            self.connector = self.scheduler.connector
            for rank in range(tensor_parallel):
                worker_config = self.vllm_config
                extra = worker_extra if worker_extra is not None else extra_config
                if worker_extra is not None or tensor_parallel > 1:
                    # Another spec on the worker side (see test_vllm.py), or another rank.
                    extra = {**extra, **(rank_extra[rank] if rank_extra else {})}
                    worker_config = self._config(extra, block_size, max_num_batched_tokens,
                                                 tensor_parallel, rank)
                    worker_config.kv_transfer_config.engine_id = (  # type: ignore[union-attr]
                        self.vllm_config.kv_transfer_config.engine_id)  # type: ignore
                    worker_config.cache_config.num_gpu_blocks = num_gpu_blocks
                if processes:
                    self.ranks.append(RankProcess(worker_config, self.shape, num_gpu_blocks,
                                                  self.layer_names, rank))
                else:
                    w, caches = _worker(worker_config, self.shape, num_gpu_blocks,
                                        self.layer_names)
                    self.workers.append(w)
                    self.kv_caches_of.append(caches)
            # What vLLM's executors do with the outputs of several workers.
            self.aggregator = KVOutputAggregator.from_connector(self.connector, tensor_parallel)
        if not self.kv_caches_of and not self.ranks:  # no connector: the KV caches alone
            self.kv_caches_of = [_kv_caches(self.shape, num_gpu_blocks, self.layer_names)]
        self.kv_caches = self.kv_caches_of[0] if self.kv_caches_of else {}
        self.worker: Optional[OffloadingConnector] = self.workers[0] if self.workers else None
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(block_size, sha256)
        self.ctx = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})
        self.next_id = 0
        self.log = StepLog()
        #: vLLM's offloading counters (vllm:kv_offload_store_bytes, ...) summed over the steps.
        self.counters: dict[str, float] = {}
        self.finished: list[str] = []
        self.prompts: dict[str, list[int]] = {}

    @staticmethod
    def _config(extra: Optional[dict[str, Any]], block_size: int, max_num_batched_tokens: int,
                tensor_parallel: int = 1, rank: int = 0) -> VllmConfig:
        scheduler = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=max_num_batched_tokens,
                                    max_model_len=4096, enable_chunked_prefill=True,
                                    is_encoder_decoder=False)
        model = ModelConfig(model=model_dir(), skip_tokenizer_init=True, dtype="float16",
                            seed=42, max_model_len=4096)
        cache = CacheConfig(block_size=block_size, gpu_memory_utilization=0.9,
                            cache_dtype="auto", enable_prefix_caching=True)
        transfer = None
        if extra is not None:
            transfer = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                        kv_connector_extra_config=dict(extra))
        parallel = ParallelConfig(tensor_parallel_size=tensor_parallel)
        parallel.rank = rank
        return VllmConfig(scheduler_config=scheduler, model_config=model, cache_config=cache,
                          kv_transfer_config=transfer, device_config=DeviceConfig("cpu"),
                          parallel_config=parallel)

    # --------------------------------------------------------------------------- requests

    def add(self, tokens: list[int], max_tokens: int = 1) -> str:
        rid = str(self.next_id)
        self.next_id += 1
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        params.update_from_generation_config({}, EOS)
        req = Request(request_id=rid, prompt_token_ids=tokens, sampling_params=params,
                      pooling_params=None, block_hasher=self.hasher)
        self.prompts[rid] = tokens
        self.scheduler.add_request(req)
        return rid

    def block_ids(self, rid: str) -> list[int]:
        """The GPU blocks of a running request (group 0)."""
        blocks = self.scheduler.kv_cache_manager.get_block_ids(rid)
        return list(blocks[0])

    # ------------------------------------------------------------------------------ steps

    def step(self, compute: Any = None) -> Any:
        """One engine step: schedule, the worker's transfers around a forward pass
        (compute(scheduler_output) stands for the model writing KV), then the outputs."""
        out = self.scheduler.schedule()
        for req in out.scheduled_new_reqs:
            self.log.external_hits[req.req_id] = req.num_computed_tokens
        meta = out.kv_connector_metadata
        if self.workers or self.ranks:
            assert isinstance(meta, OffloadingConnectorMetadata)
            self.log.stores += len(meta.store_jobs)
            self.log.loads += len(meta.load_jobs)
        kv_outputs: list[KVConnectorOutput] = []
        if self.ranks:
            # Each rank's process runs its part of the step (as a worker of vLLM's
            # multiprocess executor does); what they return is joined as below.
            work = compute.plan(out) if compute is not None else []
            for r in self.ranks:
                r.send("step", meta, work, out.finished_req_ids,
                       out.total_num_scheduled_tokens > 0)
            results = [r.result() for r in self.ranks]
            if compute is not None:
                compute.add_checked([checked for *_, checked in results])
            kv_outputs = [KVConnectorOutput(finished_sending=sending or None,
                                            finished_recving=recving or None,
                                            kv_connector_worker_meta=worker_meta)
                          for sending, recving, worker_meta, _ in results]
        for w in self.workers:
            w.handle_preemptions(meta)
            w.bind_connector_metadata(meta)
            w.start_load_kv(self.ctx)
        if compute is not None and not self.ranks:
            compute(out)
        for w in self.workers:
            if out.total_num_scheduled_tokens > 0:
                w.wait_for_save()
            sending, recving = w.get_finished(out.finished_req_ids)
            kv_outputs.append(KVConnectorOutput(
                finished_sending=sending or None, finished_recving=recving or None,
                kv_connector_worker_meta=w.build_connector_worker_meta()))
            w.clear_connector_metadata()
        running = [r for r in self.scheduler.running if r.request_id in out.num_scheduled_tokens]
        req_ids = [r.request_id for r in running]
        # A token for each request whose prompt is computed; none for a partial prefill.
        sampled = [[7] if r.num_computed_tokens >= r.num_tokens else [] for r in running]

        def model_output(kv: Optional[KVConnectorOutput]) -> ModelRunnerOutput:
            return ModelRunnerOutput(
                req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                pooler_output=None, kv_connector_output=kv)

        if self.aggregator is not None:
            output = self.aggregator.aggregate([model_output(kv) for kv in kv_outputs])
            assert output is not None
        else:
            output = model_output(KVConnectorOutput())
        for outputs in self.scheduler.update_from_output(out, output).values():
            stats = outputs.scheduler_stats
            if stats is not None and stats.kv_connector_stats:  # vLLM's connector metrics
                kinds = stats.kv_connector_stats.get("types", {})
                for name, series in stats.kv_connector_stats.get("data", {}).items():
                    if kinds.get(name) == "counter":
                        self.counters[name] = self.counters.get(name, 0) + sum(series.values())
            for o in outputs.outputs:
                if o.finished:
                    self.finished.append(o.request_id)
        return out

    def run(self, compute: Any = None, max_steps: int = 1000) -> None:
        """Steps until every request has finished and the connector has nothing in flight."""
        for _ in range(max_steps):
            if not self.scheduler.has_requests() and not self._busy():
                return
            self.step(compute)
            time.sleep(0)
        raise AssertionError("the engine did not finish its requests")

    def zero_kv(self) -> None:
        """Zero every rank's KV caches (as if their blocks were reused for other work)."""
        for caches in self.kv_caches_of:
            for layer in caches.values():
                layer.zero_()
        for r in self.ranks:
            r.call("zero_kv")

    def _busy(self) -> bool:
        return any(_busy(c) for c in self.workers) or any(r.call("busy") for r in self.ranks)

    def shutdown(self) -> None:
        for w in self.workers:
            w.shutdown()
        for r in self.ranks:
            r.close()
        if self.connector is not None:
            self.connector.shutdown()


def _busy(c: OffloadingConnector) -> bool:
    return c.connector_worker is not None and bool(getattr(c.connector_worker.worker, "_jobs",
                                                           None))


def _kv_cache_config(shape: tuple[int, int, int, int], num_gpu_blocks: int) -> KVCacheConfig:
    layers, block_size, kv_heads, head_size = shape
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=kv_heads, head_size=head_size,
                             dtype=torch.float16)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    return KVCacheConfig(num_blocks=num_gpu_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(names, spec)])


def _kv_caches(shape: tuple[int, int, int, int], num_gpu_blocks: int,
               names: list[str]) -> dict[str, torch.Tensor]:
    _, block_size, kv_heads, head_size = shape
    return {name: torch.zeros((num_gpu_blocks, 2, block_size, kv_heads, head_size),
                              dtype=torch.float16) for name in names}


def _worker(config: VllmConfig, shape: tuple[int, int, int, int], num_gpu_blocks: int,
            names: list[str]) -> tuple[OffloadingConnector, dict[str, torch.Tensor]]:
    """A rank's worker connector over KV caches of its own."""
    caches = _kv_caches(shape, num_gpu_blocks, names)
    with set_current_vllm_config(config):
        w = OffloadingConnector(config, KVConnectorRole.WORKER,
                                _kv_cache_config(shape, num_gpu_blocks))
        w.register_kv_caches(caches)
    return w, caches


class RankProcess:
    """One rank's worker connector, its KV caches and (through aqua.vllm) its aqua consumer in
    a process of its own, started with spawn as vLLM's multiprocess executor starts workers.
    The engine sends each step's connector metadata and model work; the rank answers what
    vLLM's worker would put in its KVConnectorOutput. An error in the rank is raised here."""

    TIMEOUT = 120

    def __init__(self, config: VllmConfig, shape: tuple[int, int, int, int],
                 num_gpu_blocks: int, names: list[str], rank: int) -> None:
        mp = multiprocessing.get_context("spawn")
        self.conn, child = mp.Pipe()
        self.rank = rank
        self.proc = mp.Process(target=_rank_main,
                               args=(child, config, shape, num_gpu_blocks, names, rank),
                               name=f"rank-{rank}", daemon=True)
        self.proc.start()
        child.close()
        self.result()  # started, or the error that stopped it

    def send(self, op: str, *args: Any) -> None:
        try:
            self.conn.send((op, args))
        except OSError as e:  # its end of the pipe is gone
            raise self._died() from e

    def _died(self) -> RuntimeError:
        self.proc.join(5)
        return RuntimeError(f"rank {self.rank} died (exit status {self.proc.exitcode})")

    def result(self) -> Any:
        if not self.conn.poll(self.TIMEOUT):
            raise TimeoutError(f"rank {self.rank} did not answer in {self.TIMEOUT} s")
        try:
            ok, value = self.conn.recv()
        except (EOFError, OSError) as e:
            raise self._died() from e
        if not ok:
            raise RuntimeError(f"rank {self.rank}: {value}")
        return value

    def call(self, op: str, *args: Any) -> Any:
        self.send(op, *args)
        return self.result()

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.call("shutdown")
            except (RuntimeError, TimeoutError):
                pass
            self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


def _rank_main(conn: Any, config: VllmConfig, shape: tuple[int, int, int, int],
               num_gpu_blocks: int, names: list[str], rank: int) -> None:
    """A rank's process: builds its worker connector, then runs what the engine sends."""
    try:
        w, caches = _worker(config, shape, num_gpu_blocks, names)
    except BaseException:
        conn.send((False, traceback.format_exc()))
        return
    conn.send((True, None))
    ctx = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})
    while True:
        try:
            op, args = conn.recv()
        except EOFError:
            op, args = "shutdown", ()
        try:
            if op == "step":
                meta, work, finished, scheduled = args
                w.handle_preemptions(meta)
                w.bind_connector_metadata(meta)
                w.start_load_kv(ctx)
                checked = kv_model.apply(work, caches, rank, shape[1])
                if scheduled:
                    w.wait_for_save()
                sending, recving = w.get_finished(finished)
                worker_meta = w.build_connector_worker_meta()
                w.clear_connector_metadata()
                value: Any = (sending, recving, worker_meta, checked)
            elif op == "zero_kv":
                for layer in caches.values():
                    layer.zero_()
                value = None
            elif op == "busy":
                value = _busy(w)
            elif op == "stats":  # aqua.vllm's worker: its AquaStats, its slots
                aw = w.connector_worker.worker  # type: ignore[union-attr]
                value = (aw.stats(), aw.num_slots, aw.ctx.device, aw.tensor.info().max_bytes)
            elif op == "shutdown":
                w.shutdown()
                conn.send((True, None))
                return
            else:
                raise ValueError(f"unknown op {op!r}")
            conn.send((True, value))
        except BaseException:
            conn.send((False, traceback.format_exc()))
