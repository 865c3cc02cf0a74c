"""``python -m experiments.validate RUN_DIR [--calibration FILE] [--recorded] [--out FILE]``:
the simulator's prediction of an engine run beside the engine's measurement.

The simulator runs the run's workload (rebuilt from its ``config.yaml`` exactly as
``experiments.serve`` built it: same model vocabulary, ``max_model_len`` and seed; offline
runs put every arrival at 0) on the same policy with the engine's KV cache (slots and CPU
swap slots from ``engine.json``), priced by a cost model:

- default: the calibrated model in ``calibration.json`` (``experiments.calibrate``);
- ``--recorded``: the engine's own step times replayed in order. For a ``clock: virtual``
  run this reproduces the engine exactly (DESIGN.md, "one policy, two bodies"), so every
  relative error is 0; a wall-clock run has no such identity.

Prints throughput, mean TTFT / TPOT / e2e latency, normalized latency and mean batch size
of both with relative errors ``(simulator − engine) / engine``, and writes
``validation.json`` (default: in ``RUN_DIR``). A plain argparse CLI.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from core.metrics.summary import summarize
from core.request import Request
from core.sched.base import BaseScheduler
from core.systems import build_scheduler
from core.workload.spec import build_workload
from experiments.calibrate import read_run_config
from experiments.lib.results import write_json
from experiments.lib.setup import scheduler_config, served_max_model_len
from sim.catalog import model_from_config
from sim.cost import CalibratedCostModel, CostModel, RecordedCostModel
from sim.driver import simulate

METRICS = (
    "output_throughput",
    "request_throughput",
    "mean_ttft_ms",
    "mean_tpot_ms",
    "mean_e2el_ms",
    "normalized_latency",
    "mean_batch_size",
)


def run_requests(cfg: Mapping[str, Any], run_dir: Path) -> tuple[list[Request], int]:
    """The run's requests as the engine received them, and the scheduler's max_model_len.
    A trace file that is no longer at its recorded path is looked for, by name, beside the
    run directory (results copied from another machine)."""
    spec = model_from_config(cfg["model"])
    max_model_len = served_max_model_len(cfg["system"], spec)
    workload = {"vocab_size": spec.vocab_size, **cfg["workload"]}
    path = workload.get("path")
    if path is not None and not Path(path).exists():
        moved = Path(run_dir).parent / Path(path).name
        if not moved.is_file():
            raise FileNotFoundError(f"{run_dir}: workload trace {path} not found, nor {moved}")
        workload["path"] = str(moved)
    requests = build_workload(workload, max_model_len=max_model_len, seed=int(cfg.get("seed", 0)))
    if cfg.get("mode", "online") == "offline":
        requests = [dataclasses.replace(r, arrival_time=0.0) for r in requests]
    return requests, max_model_len


def simulate_run(run_dir: Path, cost_model: CostModel) -> dict[str, Any]:
    """Simulate ``run_dir``'s workload on its policy and KV cache; the summary metrics."""
    cfg = read_run_config(run_dir)
    engine_path = Path(run_dir) / "engine.json"
    if not engine_path.is_file():
        raise FileNotFoundError(f"{run_dir} has no engine.json (KV cache size of the run)")
    kv = json.loads(engine_path.read_text())
    requests, max_model_len = run_requests(cfg, run_dir)
    system = cfg["system"]
    block_size = int(kv["block_size"])

    def make_scheduler() -> BaseScheduler:
        return build_scheduler(
            system["name"],
            int(kv["num_blocks"]) * block_size,
            config=scheduler_config(system, max_model_len),
            block_size=block_size,
            num_cpu_slots=int(kv["num_cpu_blocks"]) * block_size,
            watermark=float(system.get("watermark", 0.01)),
            enable_prefix_caching=bool(system.get("enable_prefix_caching", False)),
        )

    rec = simulate(requests, make_scheduler, cost_model, seed=int(cfg.get("seed", 0))).recorder
    return summarize(
        rec.requests_frame(), rec.steps_frame(), rec.inter_token_latencies(), cfg.get("slo_ms")
    )


def rel_err(sim: Any, eng: Any) -> float | None:
    """``(sim − eng) / |eng|``; 0 when both are equal, None when undefined."""
    if sim is None or eng is None or not (math.isfinite(sim) and math.isfinite(eng)):
        return None
    if sim == eng:
        return 0.0
    return (sim - eng) / abs(eng) if eng != 0 else None


def compare(engine: Mapping[str, Any], simulator: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per metric in ``METRICS``: engine, simulator, relative error."""
    rows = []
    for key in METRICS:
        e, s = engine.get(key), simulator.get(key)
        rows.append({"metric": key, "engine": e, "simulator": s, "rel_err": rel_err(s, e)})
    return rows


def validate(
    run_dir: Path, calibration: Mapping[str, Any] | None = None, recorded: bool = False
) -> dict[str, Any]:
    """Simulate ``run_dir`` with the calibrated model ``calibration`` (a ``to_dict``
    document) or, with ``recorded``, with the engine's step times; both sets of metrics and
    the comparison rows."""
    run_dir = Path(run_dir)
    if recorded == (calibration is not None):
        raise ValueError("give exactly one of a calibration document and recorded=True")
    cfg = read_run_config(run_dir)
    if recorded:
        steps = pd.read_csv(run_dir / "steps.csv")
        cost: CostModel = RecordedCostModel(steps["duration_s"].tolist())
    else:
        assert calibration is not None
        if calibration.get("kind") != "calibrated":
            raise ValueError(f"calibration kind is {calibration.get('kind')!r}, not 'calibrated'")
        cost = CalibratedCostModel.from_dict(calibration)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    simulated = simulate_run(run_dir, cost)
    return {
        "run": run_dir.name,
        "cost_model": cost.describe(),
        "clock": cfg.get("clock", "virtual"),
        "exact_replay_expected": recorded and cfg.get("clock", "virtual") == "virtual",
        "engine": metrics,
        "simulator": simulated,
        "comparison": compare(metrics, simulated),
    }


def print_comparison(rows: list[dict[str, Any]]) -> None:
    print(f"{'metric':<20} {'engine':>14} {'simulator':>14} {'rel. error':>11}")
    for r in rows:
        err = "n/a" if r["rel_err"] is None else f"{r['rel_err']:+.2%}"
        print(f"{r['metric']:<20} {_num(r['engine']):>14} {_num(r['simulator']):>14} {err:>11}")


def _num(x: Any) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.validate", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="an engine run directory")
    parser.add_argument("--calibration", type=Path, default=None, help="RUN_DIR/calibration.json")
    parser.add_argument("--recorded", action="store_true", help="replay measured step times")
    parser.add_argument("--out", type=Path, default=None, help="default RUN_DIR/validation.json")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    calibration = None
    if not args.recorded:
        path = args.calibration or args.run_dir / "calibration.json"
        if not path.is_file():
            parser.error(f"no calibration file {path}; run experiments.calibrate or --recorded")
        calibration = json.loads(path.read_text())
    result = validate(args.run_dir, calibration, args.recorded)
    print(result["cost_model"])
    print_comparison(result["comparison"])
    out = args.out or args.run_dir / "validation.json"
    write_json(out, result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
