"""Turning a config (Hydra DictConfig or a plain dict of the same shape) into the pieces
both bodies run: the model and GPU specs, the KV budget, the request list and the
scheduler factory. ``experiments.simulate`` and ``experiments.serve`` share this."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from core.request import Request
from core.sched.base import BaseScheduler, SchedulerConfig
from core.systems import build_scheduler, get_system
from core.workload.spec import build_workload
from sim.capacity import KVCapacity, kv_capacity
from sim.catalog import GPUSpec, ModelSpec, model_from_config, resolve_gpu

GIB = 1024**3
log = logging.getLogger(__name__)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def as_dict(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    return dict(cfg)


@dataclass
class RunSetup:
    model: ModelSpec
    gpu: GPUSpec
    tp: int
    capacity: KVCapacity
    sched_config: SchedulerConfig
    requests: list[Request]
    make_scheduler: Callable[[], BaseScheduler]
    max_model_len: int


def scheduler_config(system: Mapping[str, Any], max_model_len: int) -> SchedulerConfig:
    return SchedulerConfig(
        max_num_seqs=int(system.get("max_num_seqs", 256)),
        max_num_batched_tokens=int(system.get("max_num_batched_tokens", 2560)),
        max_model_len=max_model_len,
        preemption_mode=str(system.get("preemption_mode", "recompute")),
        chunked_prefill=bool(system.get("chunked_prefill", False)),
    )


def served_max_model_len(system: Mapping[str, Any], model: ModelSpec) -> int:
    """``system.max_model_len`` (vLLM's engine argument), else the model's maximum
    context; a value above the model's maximum raises naming the key."""
    value = system.get("max_model_len")
    if value is None:
        return model.max_model_len
    if int(value) > model.max_model_len:
        raise ValueError(
            f"system.max_model_len={value} exceeds {model.name}'s maximum context "
            f"({model.max_model_len})"
        )
    return int(value)


def prefix_caching_for(system: Mapping[str, Any], requests: list[Request]) -> bool:
    """``system.enable_prefix_caching``, turned off (with a warning) for a workload without
    prompt token ids: block hashes need the tokens (e.g. ``system=vllm_v1`` on a synthetic
    workload without ``with_token_ids``, or a vLLM log without ``tokens_path``)."""
    wanted = bool(system.get("enable_prefix_caching", False))
    if wanted and any(r.prompt_token_ids is None for r in requests):
        log.warning(
            "system.enable_prefix_caching is on but the workload has no prompt token ids: "
            "prefix caching is off for this run"
        )
        return False
    return wanted


def build_setup(cfg: DictConfig | Mapping[str, Any]) -> RunSetup:
    """Resolve every config group into concrete objects; errors name the bad field."""
    c = as_dict(cfg)
    model = model_from_config(c["model"])
    gpu = resolve_gpu(c["hardware"])
    tp = int(c["model"].get("tp", 1))
    system = c["system"]
    get_system(system["name"])
    max_model_len = served_max_model_len(system, model)
    sched_config = scheduler_config(system, max_model_len)
    kv_gb = c.get("kv_cache_gb")
    blocks = c.get("num_gpu_blocks")
    capacity = kv_capacity(
        model,
        gpu,
        tp=tp,
        dtype_bytes=DTYPE_BYTES.get(str(c.get("dtype") or "bfloat16"), 2),
        gpu_memory_utilization=float(c.get("gpu_memory_utilization", 0.9)),
        max_num_batched_tokens=sched_config.max_num_batched_tokens,
        max_num_seqs=sched_config.max_num_seqs,
        kv_cache_bytes=None if kv_gb is None else int(float(kv_gb) * GIB),
        max_model_len=max_model_len,
        num_gpu_blocks=None if blocks is None else int(blocks),
        block_size=int(system.get("block_size", 16)),
        cuda_graph_max_size=int(system.get("cuda_graph_max_size") or 0),
        non_torch_bytes=int(float(system.get("non_torch_gb") or 0) * GIB),
    )
    swap_bytes = float(c.get("swap_space_gb", 4)) * GIB
    num_cpu_slots = int(swap_bytes // capacity.bytes_per_token_per_gpu)
    seed = int(c.get("seed", 0))
    requests = build_workload(c["workload"], max_model_len=max_model_len, seed=seed)
    prefix_caching = prefix_caching_for(system, requests)

    def make_scheduler() -> BaseScheduler:
        return build_scheduler(
            system["name"],
            capacity.num_slots,
            config=sched_config,
            block_size=int(system.get("block_size", 16)),
            num_cpu_slots=num_cpu_slots,
            watermark=float(system.get("watermark", 0.01)),
            enable_prefix_caching=prefix_caching,
        )

    return RunSetup(model, gpu, tp, capacity, sched_config, requests, make_scheduler, max_model_len)
