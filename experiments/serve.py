"""``python -m experiments.serve``: one engine serving run (or a sweep with ``-m``).

Examples::

    python -m experiments.serve system=orca_oracle workload.num_requests=16
    python -m experiments.serve model=opt-13b device=cuda dtype=float16 backend=triton \
        kv_budget_fraction=0.8 workload.rate=2

The model's shape comes from the simulator's catalog (``model=opt-13b`` means the same in
both bodies); weights are seeded dummies unless ``model.path`` names a local checkpoint.
Writes the simulator's files (``config.yaml``, ``metrics.json``, ``requests.csv``,
``steps.csv`` with measured ``duration_s``) plus ``engine.json``. ``run(cfg, out_dir)`` is
the plain function tests and notebooks call. ``backend=triton`` on ``device=cpu`` needs
``TRITON_INTERPRET=1`` in the environment (Triton's CPU interpreter; slow).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from core.metrics.summary import summarize
from core.workload.spec import build_workload
from engine.config import check_engine_support
from engine.engine import LLMEngine
from engine.kv_cache import GIB, bytes_per_block, resolve_kv_budget
from experiments.lib.results import summary_line, write_run
from experiments.lib.setup import as_dict, scheduler_config, served_max_model_len
from sim.catalog import model_from_config

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def build_engine(c: Mapping[str, Any]) -> tuple[LLMEngine, int]:
    """The configured engine and its max_model_len."""
    spec = model_from_config(c["model"])
    if int(c["model"].get("tp", 1)) != 1:
        raise ValueError(f"the engine runs on one device; model.tp must be 1, not {c['model']}")
    system = c["system"]
    max_model_len = served_max_model_len(system, spec)
    model_config = check_engine_support(spec)
    dtype, device = _dtype(str(c.get("dtype", "float32"))), str(c.get("device", "cpu"))
    block_size = int(system.get("block_size", 16))
    blocks = c.get("num_gpu_blocks")
    budget = (
        resolve_kv_budget(device, gib=c.get("kv_budget_gb"), fraction=c.get("kv_budget_fraction"))
        if blocks is None
        else None
    )
    per_block = bytes_per_block(model_config, block_size, dtype)
    engine = LLMEngine(
        model_config,
        system=system["name"],
        kv_budget_bytes=budget,
        num_blocks=None if blocks is None else int(blocks),
        block_size=block_size,
        backend=str(c.get("backend", "torch")),
        dtype=dtype,
        device=device,
        sched_config=scheduler_config(system, max_model_len),
        num_cpu_blocks=int(float(c.get("swap_space_gb", 0)) * GIB) // per_block,
        seed=int(c.get("seed", 0)),
        weights_path=c["model"].get("path"),
        watermark=float(system.get("watermark", 0.01)),
        enable_prefix_caching=bool(system.get("enable_prefix_caching", False)),
    )
    return engine, max_model_len


def run(cfg: DictConfig | Mapping[str, Any], out_dir: Path | None = None) -> dict[str, Any]:
    """Serve the configured workload; write result files when ``out_dir`` is given.
    Returns the metrics dict (plus the engine's KV size and ``wall_s``)."""
    c = as_dict(cfg)
    engine, max_model_len = build_engine(c)
    workload = {"vocab_size": engine.model_config.vocab_size, **c["workload"]}
    requests = build_workload(workload, max_model_len=max_model_len, seed=int(c.get("seed", 0)))
    t0 = time.perf_counter()
    result = engine.generate(
        requests,
        mode=str(c.get("mode", "online")),
        clock=str(c.get("clock", "virtual")),
        progress=bool(c.get("progress", False)),
    )
    wall = time.perf_counter() - t0
    rec = result.recorder
    req_frame, steps = rec.requests_frame(), rec.steps_frame()
    metrics = summarize(req_frame, steps, rec.inter_token_latencies(), c.get("slo_ms"))
    kv = engine.kv_cache
    metrics.update(
        system=c["system"]["name"],
        model=c["model"]["name"],
        hardware=c.get("hardware", {}).get("name"),
        device=str(engine.device),
        kv_slots=kv.num_blocks * kv.block_size,
        kv_cache_gib=kv.device_bytes / GIB,
        wall_s=wall,
    )
    if out_dir is not None:
        doc = {
            "num_blocks": kv.num_blocks,
            "block_size": kv.block_size,
            "num_cpu_blocks": kv.num_cpu_blocks,
            "kv_bytes": kv.device_bytes,
            "dtype": str(kv.dtype),
            "device": _device_name(engine.device),
            "num_steps": result.num_steps,
        }
        write_run(out_dir, c, metrics, req_frame, steps, extra={"engine": doc})
    return metrics


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return str(device)


@hydra.main(config_path="../configs", config_name="serve", version_base="1.3")
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    metrics = run(cfg, out_dir)
    log.info("%s -> %s", summary_line(metrics, f"on {metrics['device']}"), out_dir)


if __name__ == "__main__":
    main()
