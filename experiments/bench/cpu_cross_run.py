"""Cross-run validation on kvlab's CPU engine: ``python -m experiments.bench.cpu_cross_run
--out DIR [--quick]``.

Calibrate on one engine run, validate on a *different* one (another workload and rate):

- run A (calibration): ShareGPT-like requests at ``RATE_A`` req/s;
- run B (validation): Alpaca-like requests at ``RATE_B`` req/s;

both ``experiments.serve`` runs of the ``vllm`` system on OPT-125M shapes (seeded dummy
weights, fp32, one torch thread, online arrivals on the virtual clock: the timeline
advances by each step's measured time, read as the engine thread's CPU time,
``step_timer=thread_cpu``, so other processes on the machine do not inflate it).
``experiments.calibrate`` fits the calibrated step model to A's ``steps.csv``;
``experiments.validate`` simulates B's workload on B's KV cache with that model and
compares with B's measured metrics (and, for reference, A's in-sample fit). It also prices
each run's measured steps with the fitted model, open loop (the engine's own batches, no
queue): the step model's error before queueing amplifies it.
Writes ``DIR/cross_run.json`` and ``DIR/cross_run.csv`` and prints both tables.
``--quick`` uses tiny-opt and a handful of requests (seconds) so a test can run it.
``--reuse-runs`` keeps ``DIR/run_a`` and ``DIR/run_b`` where they already hold a
``steps.csv`` (recalibrate and revalidate after a change to the cost model without serving
again).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from hydra import compose, initialize_config_dir

from experiments import calibrate, validate
from experiments.bench.tables import print_table, write_csv
from experiments.lib.results import write_json
from experiments.serve import run as serve

CONFIGS = str(Path(__file__).resolve().parents[2] / "configs")
RATE_A, RATE_B = 2.0, 6.0
COMMON = [
    "system=vllm", "dtype=float32", "progress=false", "mode=online", "clock=virtual",
    "threads=1", "step_timer=thread_cpu",
]  # fmt: skip
FULL = {
    "model": "opt-125m",
    "a": ["workload=sharegpt", f"workload.rate={RATE_A}", "workload.num_requests=24"],
    "b": ["workload=alpaca", f"workload.rate={RATE_B}", "workload.num_requests=48"],
    "kv": "kv_cache_gb=0.5",
}
QUICK = {
    "model": "tiny-opt",
    "a": ["workload=sharegpt", "workload.rate=30", "workload.num_requests=8"],
    "b": ["workload=alpaca", "workload.rate=60", "workload.num_requests=12"],
    "kv": "kv_cache_gb=0.002",
}
KEYS = ("request_throughput", "output_throughput", "mean_tpot_ms", "mean_e2el_ms", "mean_ttft_ms")


def serve_run(out: Path, overrides: list[str]) -> Path:
    """One engine run into ``out`` (one torch thread, restored after)."""
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        cfg = compose(config_name="serve", overrides=overrides)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        serve(cfg, out)
    finally:
        torch.set_num_threads(before)
    return out


def open_loop_errors(model: Any, steps: pd.DataFrame) -> list[dict[str, Any]]:
    """Per kind of step (decode-only, with a prefill, all): the relative error of the
    summed predicted step time against the summed measured one, and the mean absolute
    per-step error."""
    steps = steps[(steps["prefill_tokens"] + steps["decode_seqs"]) > 0]
    pred = model.predict_steps(steps)
    meas = steps["duration_s"].to_numpy(dtype=float)
    decode = (steps["prefill_tokens"] == 0).to_numpy()
    rows = []
    for kind, mask in (
        ("decode-only", decode),
        ("with prefill", ~decode),
        ("all", decode | ~decode),
    ):
        if not mask.any():
            continue
        p, m = pred[mask], meas[mask]
        rows.append({
            "steps": kind, "n": int(mask.sum()), "measured_s": float(m.sum()),
            "predicted_s": float(p.sum()), "rel_err_sum": float(p.sum() / m.sum() - 1.0),
            "mape": float((abs(p - m) / m).mean()),
        })  # fmt: skip
    return rows


def cross_run(out: Path, quick: bool = False, reuse_runs: bool = False) -> dict[str, Any]:
    """Serve A and B (or, with ``reuse_runs``, keep the runs already in ``out``), calibrate
    on A, validate on A and B; the rows and the documents."""
    plan = QUICK if quick else FULL
    base = [f"model={plan['model']}", plan["kv"], *COMMON]
    runs = {}
    for name, seed in (("a", 1), ("b", 2)):
        run_dir = out / f"run_{name}"
        if reuse_runs and (run_dir / "steps.csv").is_file():
            runs[name] = run_dir
        else:
            runs[name] = serve_run(run_dir, [*base, *plan[name], f"seed={seed}"])
    run_a, run_b = runs["a"], runs["b"]
    fitted = calibrate.calibrate(run_a)
    doc = calibrate.calibration_doc(fitted, run_a)
    write_json(run_a / "calibration.json", doc)
    open_loop = [
        {"run": label, **r}
        for label, run_dir in (("A (in-sample)", run_a), ("B (other run)", run_b))
        for r in open_loop_errors(fitted, pd.read_csv(run_dir / "steps.csv"))
    ]
    rows = []
    results = {}
    for label, run_dir in (("A (in-sample)", run_a), ("B (other run)", run_b)):
        res = validate.validate(run_dir, doc)
        results[label] = res
        by_key = {r["metric"]: r for r in res["comparison"]}
        for key in KEYS:
            r = by_key.get(key) or {
                "engine": res["engine"].get(key),
                "simulator": res["simulator"].get(key),
                "rel_err": validate.rel_err(res["simulator"].get(key), res["engine"].get(key)),
            }
            rows.append({
                "validated_on": label, "metric": key, "engine": r["engine"],
                "simulator": r["simulator"], "rel_err": r["rel_err"],
            })  # fmt: skip
    return {
        "rows": rows, "open_loop": open_loop, "calibration": doc, "plan": plan,
        "validations": results,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench.cpu_cross_run")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="tiny-opt, seconds")
    parser.add_argument(
        "--reuse-runs", action="store_true", help="keep DIR/run_a and DIR/run_b if served"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result = cross_run(args.out, args.quick, args.reuse_runs)
    print(result["calibration"].get("coefficients"))
    print_table("calibrated on run A, validated on A and on B", result["rows"])
    print_table("run A's model on each run's measured steps (open loop)", result["open_loop"])
    write_csv(args.out / "cross_run.csv", result["rows"])
    keep = ("rows", "open_loop", "calibration", "plan")
    write_json(args.out / "cross_run.json", {k: result[k] for k in keep})
    print(f"wrote {args.out}/cross_run.json, cross_run.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
