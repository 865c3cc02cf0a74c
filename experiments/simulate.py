"""``python -m experiments.simulate``: one simulated serving run (or a sweep with ``-m``).

Examples::

    python -m experiments.simulate system=orca_max workload.rate=1.5
    python -m experiments.simulate -m system=vllm,orca_oracle workload.rate=0.5,1,1.5,2

Each run writes ``config.yaml``, ``metrics.json``, ``requests.csv``, ``steps.csv`` and
``cost_model.json`` into its Hydra output directory; a sweep also writes ``summary.csv``.
A job whose directory already holds a complete run of the same config is not run again
(rerun a sweep with the same ``hydra.sweep.dir`` to resume it). ``hydra/launcher=<name>``
runs a sweep's jobs on joblib, Ray or Slurm (``experiments.lib.jobs``).
``run(cfg)`` is the plain function tests and notebooks call.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from core.metrics.summary import summarize
from experiments.lib.jobs import exit_if_launcher_missing
from experiments.lib.results import finished_metrics, summary_line, write_run
from experiments.lib.setup import RunSetup, as_dict, build_setup
from sim.cost import CostModel, Efficiency, build_cost_model
from sim.driver import simulate

log = logging.getLogger(__name__)


def run(cfg: DictConfig | Mapping[str, Any], out_dir: Path | None = None) -> dict[str, Any]:
    """Simulate the configured run; write result files when ``out_dir`` is given.
    Returns the metrics dict (plus ``wall_s`` and the KV capacity used)."""
    c = as_dict(cfg)
    setup = build_setup(c)
    cost_model = make_cost_model(c, setup)
    log.info("%s", setup.capacity.describe())
    t0 = time.perf_counter()
    result = simulate(
        setup.requests,
        setup.make_scheduler,
        cost_model,
        num_replicas=int(c.get("num_replicas", 1)),
        seed=int(c.get("seed", 0)),
        progress=bool(c.get("progress", False)),
    )
    wall = time.perf_counter() - t0
    rec = result.recorder
    requests, steps = rec.requests_frame(), rec.steps_frame()
    metrics = summarize(requests, steps, rec.inter_token_latencies(), c.get("slo_ms"))
    metrics.update(
        system=c["system"]["name"],
        model=setup.model.name,
        hardware=setup.gpu.name,
        tp=setup.tp,
        kv_slots=setup.capacity.num_slots,
        kv_cache_gib=setup.capacity.kv_bytes_total / 1024**3,
        wall_s=wall,
        sim_steps_per_s=result.num_steps / wall if wall > 0 else float("nan"),
    )
    if out_dir is not None:
        write_run(out_dir, c, metrics, requests, steps, extra={"cost_model": _cost_doc(cost_model)})
    return metrics


_EFFICIENCY_KEYS = {
    "compute_efficiency": "compute",
    "memory_efficiency": "memory",
    "per_step_overhead_s": "per_step_overhead_s",
}


def make_cost_model(c: Mapping[str, Any], setup: RunSetup) -> CostModel:
    """The configured cost model; efficiency overrides are labelled as such."""
    cost_cfg = dict(c.get("cost") or {"kind": "roofline"})
    kind = cost_cfg.pop("kind", "roofline")
    overrides = {
        _EFFICIENCY_KEYS[k]: float(v)
        for k, v in cost_cfg.items()
        if k in _EFFICIENCY_KEYS and v is not None
    }
    extra = {k: v for k, v in cost_cfg.items() if k not in _EFFICIENCY_KEYS}
    if overrides:
        extra["efficiency"] = Efficiency().with_values(
            {k: "set in the run's config (cost group)" for k in overrides}, **overrides
        )
    if kind == "roofline":
        extra.setdefault("block_size", int(c["system"].get("block_size", 16)))
    if kind == "calibrated" and extra.get("path"):
        return calibrated_from_file(Path(extra["path"]), setup)
    return build_cost_model(kind, setup.model, setup.gpu, setup.tp, **extra)


def calibrated_from_file(path: Path, setup: RunSetup) -> CostModel:
    """The calibrated model in ``path`` (``experiments.calibrate`` or ``calibrate_vllm``)
    applied to this run's model and GPU; a file fitted for another model or GPU raises."""
    if not path.is_file():
        raise FileNotFoundError(f"cost.path: no calibration file {path}")
    doc = json.loads(path.read_text())
    if doc.get("kind") != "calibrated" or "coefficients" not in doc:
        raise ValueError(f"{path}: not a calibration file (kind 'calibrated', coefficients)")
    for key, ours in (("model", setup.model.name), ("gpu", setup.gpu.name)):
        if doc.get(key) not in (None, ours):
            raise ValueError(f"{path}: fitted for {key} {doc[key]!r}, this run uses {ours!r}")
    return build_cost_model(
        "calibrated", setup.model, setup.gpu, setup.tp,
        coefficients=doc["coefficients"], fit_stats=doc.get("fit_stats"),
        dtype_bytes=int(doc.get("dtype_bytes", 2)), block_size=int(doc.get("block_size", 16)),
    )  # fmt: skip


def _cost_doc(cost_model: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"describe": cost_model.describe()}
    config = getattr(cost_model, "config", None)
    if callable(config):
        doc.update(config())
    return doc


def simulate_job(cfg: DictConfig) -> dict[str, Any]:
    """One Hydra job: simulate into the job's output directory, unless that directory
    already holds a complete run of this config (resume); returns the metrics."""
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    metrics = finished_metrics(out_dir, cfg)
    if metrics is not None:
        log.info("%s: finished before, not run again", out_dir)
        return metrics
    metrics = run(cfg, out_dir)
    log.info("%s -> %s", summary_line(metrics, f"rate={cfg.workload.get('rate')}"), out_dir)
    return metrics


@hydra.main(config_path="../configs", config_name="simulate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    simulate_job(cfg)


if __name__ == "__main__":
    exit_if_launcher_missing(sys.argv[1:])
    main()
