"""Cross-run validation on kvlab's CPU engine: ``python -m experiments.bench.cpu_cross_run
--out DIR [--quick] [--reuse-runs] [--profile PROFILE] [--sitting interleaved|sequential]``.

Calibrate on one engine run, validate on *different* ones (other workloads and rates).
Five ``experiments.serve`` runs (S, A, B, then A and B again) of the ``vllm`` system on
OPT-125M shapes (seeded dummy weights, fp32, one torch thread, online arrivals on the
virtual clock: the timeline advances by each step's measured time, read as the engine
thread's CPU time, ``step_timer=thread_cpu``, so other processes on the machine do not
inflate it):

- run S (span, calibration): ShareGPT-mean lengths with wide spreads
  (``SPAN_SIGMAS``: prompts from a few tokens to a thousand, outputs likewise) at
  ``RATE_S`` req/s, past what the engine serves, so its batches grow from one sequence to
  dozens and drain again. It is built to cover the operating range, as a profiler's grid
  does, not to resemble either validation run;
- run A: ShareGPT-like requests at ``RATE_A`` req/s;
- run B: Alpaca-like requests at ``RATE_B`` req/s.

Three calibrations, each ``experiments.calibrate`` with ``WEIGHTING`` (relative step errors)
and, on a profile, ``--target host`` (the per-step terms fitted to the engine's measured time
outside the forward):
on S, validated on A and B (neither was seen by the fit), on A, validated on B, and on B,
validated on A (a production-like run extrapolated to another workload and rate).
``experiments.validate`` simulates each validation run's workload on
its KV cache with the fitted model and compares with its measured metrics; the in-sample
rows are printed for reference. Each model also prices every run's measured steps open loop
(the engine's own batches, no queue): the step model's error before queueing amplifies it.
Writes ``DIR/cross_run.json`` and ``DIR/cross_run.csv`` and prints the tables; with a
profile, also each run's speed against it (``drift``: :func:`speed_drift`).
``--quick`` uses tiny-opt and a handful of requests (a smoke test; minutes on a busy CPU).
Runs A2 and B2 serve A and B again with the same config and seed: the engine's own
run-to-run difference (the ``repeatability`` table), the floor under any model's error on
another run; S's model is validated on them too.
``--reuse-runs`` keeps ``DIR/run_*`` where they already hold a ``steps.csv``
(recalibrate and revalidate after a change to the cost model without serving again).
Every model is calibrated on top of an operator profile of the model on this machine
(``python -m experiments.bench.profile_gpu --cpu``): operator times from the profile, only
the per-step and per-sequence terms fitted (``experiments.calibrate --profile``). By default
(``--profile measure``) the script first takes that profile into ``DIR/operator_profile``
(about 2 minutes; kept by ``--reuse-runs`` when present), in the same sitting as the runs,
since a shared VM's speed drifts between sittings; ``--profile each`` profiles before every
run instead and prices each run on its own profile (the fitted terms travel, the operator
times are the machine's at that run); ``--profile PATH`` uses another one and
``--profile none`` fits the roofline basis alone (the model before profiles).

``--sitting interleaved`` (default) serves the five runs, and takes the ``measure`` profile,
together in one sitting, a step of one run after a step of another and a profile point
between (:mod:`experiments.bench.sitting`), each spread over the whole sitting, so that the
machine's drifting speed falls on every run and on the profile alike; a pilot profile taken
first (``DIR/pilot_profile``, or the ``--profile`` path) only paces the turns, and
``DIR/sitting.json`` records where each run's steps fell. ``--sitting sequential`` serves
them one after another, as before (and is the only sitting ``--profile each`` has).

The interleaved profile takes ``PROFILE_PASSES`` sweeps of one call per point, each sweep a
stretch of the sitting, so it also measures how the machine's speed drifted through the
sitting (:mod:`experiments.bench.speed_timeline`, ``STRETCHES_PER_SWEEP`` stretches per
sweep). Every pair is then validated a second time with each simulated step priced at the
speed of the stretch where it falls
(:class:`sim.cost.drifting.DriftingCostModel`; a run's i-th step falls at ``i / expected``
of the sitting, the expectation that paced its turns): ``timed_rows`` and
``timed_open_loop`` in ``cross_run.json``. It separates the step model's error from the
machine's drift, which a run whose step sizes change through the sitting (a long request
decoding alone at its end) meets unevenly. Only the profile's sweeps and the pilot's
expectation enter it, nothing measured on the run validated. A third time, at each
stretch's speed shrunk toward the price by its own scatter
(:func:`experiments.bench.speed_timeline.shrink_to_price`: ``shrunk_rows``,
``shrunk_open_loop``, ``speed_shrinkage``): on a machine that held its speed the measured
timeline is the profile's scatter, and the shrunk one stays near the price; on one that
drifted it stays near the measured one.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from experiments import calibrate, validate
from experiments.bench import profile_gpu
from experiments.bench.sitting import expected_units, serve_together
from experiments.bench.speed_timeline import UnknownScatter, shrink_to_price, stretches
from experiments.bench.tables import print_table, write_csv
from experiments.lib.args import OneLineParser
from experiments.lib.checks import ConfigError
from experiments.lib.cli import check_out_dir, plain_cli
from experiments.lib.compose import compose_config
from experiments.lib.results import read_metrics, write_json
from experiments.serve import run as serve
from sim.cost import CalibratedCostModel
from sim.cost.drifting import DriftingCostModel
from sim.cost.profile import read_profile

RATE_S, RATE_A, RATE_B = 4.0, 2.0, 6.0
SPAN_SIGMAS = ["workload.sigma_input=2.0", "workload.sigma_output=1.0"]
WEIGHTING = "relative"
# on top of a profile, the per-step terms are fitted to the time outside the forward (the
# engine's phase timing): fitted to what the profile leaves of the whole step, they absorb
# the profile's errors on the calibration run's shapes and carry them to the other runs
# (docs/validation/cpu-engine.md, eighth sitting)
TARGET_ON_PROFILE = "host"
EACH = "each"  # --profile each: profile before every run, price each run on its own
INTERLEAVED, SEQUENTIAL = "interleaved", "sequential"  # --sitting
# the interleaved sitting's profile sweeps every point this often, one call per point and
# sweep, and keeps each point's mean over the sweeps: each point then samples the sitting at
# 18 moments, as the runs' steps sample it at every moment. Before (through the eleventh
# sitting) it took 3 sweeps of a burst of 6 calls and kept the median: the sweeps of one point
# differed by up to 1.9x on a VM whose speed swung, and the median of three kept one moment
# (docs/validation/cpu-engine.md, eleventh sitting). 18 single calls cost what 3 bursts of 6 did.
PROFILE_PASSES = 18
PROFILE_SINGLE_CALLS = True
# the timed validation's speed per quarter of a sweep (72 stretches), not per sweep: chosen on
# the 14th-16th sittings (the units' order replayed), where it took the scatter of S's model
# over 50-step windows of every run from 2.7-8.6% to 1.8-6.6%; 288 gained at most 0.8 point
# (docs/validation/cpu-engine.md, seventeenth to nineteenth sittings)
STRETCHES_PER_SWEEP = 4
# --system: the paper's v0.1 rules (a prefill step pauses every decode) or today's vLLM
# (chunked prefill, decodes first in the token budget, mixed steps)
SYSTEMS = ("vllm", "vllm_v1")
COMMON = [
    "dtype=float32", "progress=false", "mode=online", "clock=virtual",
    "threads=1", "step_timer=thread_cpu",
]  # fmt: skip
FULL = {
    "model": "opt-125m",
    "s": ["workload=sharegpt", *SPAN_SIGMAS, f"workload.rate={RATE_S}",
          "workload.num_requests=40"],
    "a": ["workload=sharegpt", f"workload.rate={RATE_A}", "workload.num_requests=24"],
    "b": ["workload=alpaca", f"workload.rate={RATE_B}", "workload.num_requests=48"],
    "kv": "kv_cache_gb=0.5",
}  # fmt: skip
QUICK = {
    "model": "tiny-opt",
    "s": ["workload=sharegpt", *SPAN_SIGMAS, "workload.rate=40", "workload.num_requests=10"],
    "a": ["workload=sharegpt", "workload.rate=30", "workload.num_requests=8"],
    "b": ["workload=alpaca", "workload.rate=60", "workload.num_requests=12"],
    "kv": "kv_cache_gb=0.002",
}
SEEDS = {"s": 3, "a": 1, "b": 2}
# A2 and B2 serve A and B again, same config and seed: the engine's own repeatability
REPEATS = {"a2": "a", "b2": "b"}
LABELS = {
    "s": "S (span)",
    "a": "A (ShareGPT)",
    "a2": "A again",
    "b": "B (Alpaca)",
    "b2": "B again",
}
# (calibrated on, validated on): the span run predicts both others; A and B predict each other
PAIRS = (("s", ("s", "a", "a2", "b", "b2")), ("a", ("a", "b")), ("b", ("b", "a")))
KEYS = ("request_throughput", "output_throughput", "mean_tpot_ms", "mean_e2el_ms", "mean_ttft_ms")


def take_profile(out: Path, model: str) -> str:
    """``profile_gpu --cpu`` of ``model`` into ``out`` (one torch thread); its path."""
    profile_gpu.main(["--cpu", "--model", model, "--out", str(out)])
    return str(out)


def serve_run(out: Path, overrides: list[str]) -> Path:
    """One engine run into ``out`` (one torch thread, restored after)."""
    cfg = compose_config("serve", overrides)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        serve(cfg, out)
    finally:
        torch.set_num_threads(before)
    return out


DRIFT_WINDOW = 100  # decode steps per window of the speed-drift table


def speed_drift(model: Any, steps: pd.DataFrame, window: int = DRIFT_WINDOW) -> dict[str, Any]:
    """How fast the machine ran a run, against the operator profile: each decode-only step's
    measured time over the profile's price of it (``model.profile_seconds``), its median
    overall and per ``window`` steps in run order. One machine at one speed gives the same
    ratio all along; a drifting one does not, and a model fitted at one speed misprices a
    run served at another."""
    decode = steps[(steps["prefill_tokens"] == 0) & (steps["decode_seqs"] > 0)]
    ratio = decode["duration_s"].to_numpy(dtype=float) / model.profile_seconds(decode)
    medians = [
        float(pd.Series(ratio[i : i + window]).median()) for i in range(0, len(ratio), window)
    ]
    return {
        "decode_steps": len(ratio),
        "median": float(pd.Series(ratio).median()) if len(ratio) else float("nan"),
        "window_min": min(medians, default=float("nan")),
        "window_max": max(medians, default=float("nan")),
        "windows": medians,
    }


def open_loop_errors(
    model: Any, steps: pd.DataFrame, drift: DriftingCostModel | None = None
) -> list[dict[str, Any]]:
    """Per kind of step (decode-only, with a prefill, all): the relative error of the
    summed predicted step time against the summed measured one, and the mean absolute
    per-step error. With ``drift``, the i-th step's price is scaled by its speed there."""
    if drift is not None:
        scale = drift.speeds_of(len(steps))
    keep = ((steps["prefill_tokens"] + steps["decode_seqs"]) > 0).to_numpy()
    steps = steps[keep]
    pred = model.predict_steps(steps)
    if drift is not None:
        pred = pred * scale[keep]
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


def metric_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """``KEYS``' engine value, simulated value and relative error from a validation."""
    by_key = {r["metric"]: r for r in res["comparison"]}
    rows = []
    for key in KEYS:
        r = by_key.get(key) or {
            "engine": res["engine"].get(key),
            "simulator": res["simulator"].get(key),
            "rel_err": validate.rel_err(res["simulator"].get(key), res["engine"].get(key)),
        }
        rows.append({
            "metric": key, "engine": r["engine"], "simulator": r["simulator"],
            "rel_err": r["rel_err"],
        })  # fmt: skip
    return rows


def cross_run(
    out: Path,
    quick: bool = False,
    reuse_runs: bool = False,
    profile: str | None = None,
    sitting: str = INTERLEAVED,
    pilot: Callable[[], str] | None = None,
    system: str = SYSTEMS[0],
) -> dict[str, Any]:
    """Serve the runs of ``LABELS`` (or, with ``reuse_runs``, keep those already in ``out``),
    calibrate on S, A and B (on top of ``profile`` when given), validate each on the runs
    of ``PAIRS``; rows and documents. ``profile`` :data:`EACH` (sequential sittings only):
    each run is profiled just before it is served (``run_*/operator_profile``); a model
    keeps the terms fitted on its calibration run and prices another run on that run's own
    profile. ``sitting`` :data:`INTERLEAVED`: the runs are served together a step each in
    turn (:func:`experiments.bench.sitting.serve_together`, paced by the profile ``pilot()``
    returns, called only when something is served), and when ``profile`` is
    ``out/operator_profile`` it is taken within the same sitting, unless ``reuse_runs``
    keeps it. With nothing to serve, ``sitting`` is recorded as ``reused``. Every run is
    served under ``system`` (one of :data:`SYSTEMS`); a kept run served under another is a
    :class:`ConfigError`, raised before anything is served."""
    if profile == EACH and sitting == INTERLEAVED:
        raise ValueError("--profile each profiles between runs: it needs a sequential sitting")
    plan = QUICK if quick else FULL
    base = [f"model={plan['model']}", plan["kv"], f"system={system}", *COMMON]
    each = profile == EACH
    runs = {name: out / f"run_{name}" for name in LABELS}
    to_serve = {}
    for name, run_dir in runs.items():
        if reuse_runs and (run_dir / "steps.csv").is_file():
            served = served_system(run_dir)
            if served != system:
                raise ConfigError("--system", f"{run_dir.name} was served under {served}", system)
        else:
            spec = REPEATS.get(name, name)
            to_serve[name] = (run_dir, [*base, *plan[spec], f"seed={SEEDS[spec]}"])
    record, inner = None, out / "operator_profile"
    kept = reuse_runs and (inner / "operator_profile.csv").is_file()
    take_inner = sitting == INTERLEAVED and profile == str(inner) and not kept
    if not (to_serve or take_inner):
        sitting = "reused"
        if (out / "sitting.json").is_file():
            record = json.loads((out / "sitting.json").read_text())
    elif sitting == INTERLEAVED:
        if pilot is None:
            raise ValueError("an interleaved sitting needs a pilot profile to pace its turns")
        record = serve_together(
            to_serve, pilot(), out / "sitting.json", inner if take_inner else None,
            plan["model"], PROFILE_PASSES, PROFILE_SINGLE_CALLS,
        )  # fmt: skip
    else:
        for run_dir, overrides in to_serve.values():
            if each:
                take_profile(run_dir / "operator_profile", plan["model"])
            serve_run(run_dir, overrides)

    def profile_of(name: str) -> str | None:
        return str(runs[name] / "operator_profile") if each else profile

    found, expected = None, {}
    if record is not None and profile == str(inner):
        found = stretches(inner, STRETCHES_PER_SWEEP)
        expected = expected_units(record)
        if not set(runs) <= set(expected):
            found = None  # a profile retaken alone: the runs' places are not recorded
    # each pair again at the sitting's speed: as measured ("timed") and shrunk by its scatter
    shrunk = None
    timelines: dict[str, list[float]] = {}
    if found is not None:
        timelines = {"timed": [s.speed for s in found]}
        try:
            shrunk = shrink_to_price(found)
            timelines["shrunk"] = shrunk.speeds
        except UnknownScatter:  # said with the results: speed_shrinkage null, no shrunk rows
            shrunk = None
    rows, open_loop, calibrations, drift = [], [], {}, []
    at_speed: dict[str, list[dict[str, Any]]] = {
        f"{kind}_{part}": [] for kind in timelines for part in ("rows", "open_loop")
    }
    for fit_on, targets in PAIRS:
        on = profile_of(fit_on)
        target = TARGET_ON_PROFILE if on is not None else "step"
        fitted = calibrate.calibrate(runs[fit_on], WEIGHTING, on, target)
        doc = calibrate.calibration_doc(fitted, runs[fit_on])
        write_json(runs[fit_on] / "calibration.json", doc)
        calibrations[LABELS[fit_on]] = doc

        def priced_on(
            name: str, doc: dict[str, Any] = doc, fitted: Any = fitted
        ) -> tuple[Any, dict[str, Any]]:
            """The model fitted on ``fit_on`` and its document, on ``name``'s profile."""
            if not each:
                return fitted, doc
            moved = {**doc, "profile": profile_of(name)}
            return CalibratedCostModel.from_dict(moved), moved

        if profile is not None and not drift:  # any fit prices the operators alike
            for name, run_dir in runs.items():
                d = speed_drift(priced_on(name)[0], pd.read_csv(run_dir / "steps.csv"))
                drift.append({"run": LABELS[name], **d})
        for target in targets:
            role = "in-sample" if target == fit_on else "other run"
            where = {"calibrated_on": LABELS[fit_on], "validated_on": LABELS[target]}
            steps = pd.read_csv(runs[target] / "steps.csv")
            model, target_doc = priced_on(target)
            open_loop += [{**where, **r} for r in open_loop_errors(model, steps)]
            res = validate.validate(runs[target], target_doc)
            rows += [{**where, "role": role, **r} for r in metric_rows(res)]
            for kind, speeds in timelines.items():
                n = expected[target]
                timed = DriftingCostModel(model, speeds, n)
                at_speed[f"{kind}_open_loop"] += [
                    {**where, **r} for r in open_loop_errors(model, steps, timed)
                ]
                res = validate.validate(
                    runs[target], target_doc,
                    wrap=lambda m, n=n, speeds=speeds: DriftingCostModel(m, speeds, n),
                )  # fmt: skip
                at_speed[f"{kind}_rows"] += [{**where, "role": role, **r} for r in metric_rows(res)]
    return {
        "rows": rows, "open_loop": open_loop, "calibrations": calibrations, "plan": plan,
        "speed_timeline": timelines.get("timed"),
        "speed_shrinkage": None if shrunk is None else shrunk.as_dict(),
        "timed_rows": at_speed.get("timed_rows", []),
        "timed_open_loop": at_speed.get("timed_open_loop", []),
        "shrunk_rows": at_speed.get("shrunk_rows", []),
        "shrunk_open_loop": at_speed.get("shrunk_open_loop", []),
        "sitting": sitting, "sitting_record": record, "system": system,
        "repeatability": repeatability(runs), "profile": profile, "drift": drift,
        "step_timers": {LABELS[n]: read_metrics(d).get("step_timer") for n, d in runs.items()},
    }  # fmt: skip


def served_system(run_dir: Path) -> str | None:
    """The system a run was served under, by its ``config.yaml``."""
    return calibrate.read_run_config(run_dir)["system"].get("name")


def repeatability(runs: dict[str, Path]) -> list[dict[str, Any]]:
    """The engine against itself: each repeated run's ``KEYS`` against the first serving of
    the same config and seed, as (again − first) / first. A model's error on another run
    cannot be told apart from this."""
    rows = []
    for again, first in REPEATS.items():
        m_first, m_again = (read_metrics(runs[n]) for n in (first, again))
        for key in KEYS:
            rows.append({
                "run": LABELS[first], "metric": key, "first": m_first.get(key),
                "again": m_again.get(key),
                "rel_diff": validate.rel_err(m_again.get(key), m_first.get(key)),
            })  # fmt: skip
    return rows


@plain_cli
def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m experiments.bench.cpu_cross_run")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="tiny-opt, a smoke test")
    parser.add_argument("--reuse-runs", action="store_true",
                        help="keep DIR/run_*, DIR/operator_profile and DIR/pilot_profile "
                        "where present")  # fmt: skip
    parser.add_argument("--profile", default="measure",
                        help="the operator profile to calibrate on top of: 'measure' (default: "
                        "take one in the same sitting, into DIR/operator_profile), 'each' (one "
                        "before every run; each run priced on its own), a path (profile_gpu "
                        "--cpu), or 'none' (roofline basis alone)")  # fmt: skip
    parser.add_argument("--sitting", choices=(INTERLEAVED, SEQUENTIAL), default=INTERLEAVED,
                        help="serve the runs (and take the profile) together, a step each in "
                        "turn (default), or one after another")  # fmt: skip
    parser.add_argument("--system", choices=SYSTEMS, default=SYSTEMS[0],
                        help="the serving rules of every run: the paper's vLLM v0.1 (default) "
                        "or today's (chunked prefill, mixed steps)")  # fmt: skip
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    check_out_dir(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    model = (QUICK if args.quick else FULL)["model"]
    profile: str | None = None if args.profile == "none" else args.profile
    interleaved = args.sitting == INTERLEAVED
    if profile == EACH and interleaved:
        raise ConfigError(
            "--profile", "'each' profiles between runs served one after another; "
            "use it with --sitting sequential", EACH,
        )  # fmt: skip
    if profile not in (None, "measure", EACH):
        try:  # before serving for a quarter of an hour
            read_profile(profile)
        except ValueError as err:
            raise ConfigError("--profile", str(err)) from None
    pilot_dir = args.out / "pilot_profile"

    def pilot() -> str:
        """The profile pacing an interleaved sitting's turns: a given one, else one taken
        now (kept by --reuse-runs)."""
        if profile not in (None, "measure", str(args.out / "operator_profile")):
            return str(profile)
        if not (args.reuse_runs and (pilot_dir / "operator_profile.csv").is_file()):
            take_profile(pilot_dir, model)
        return str(pilot_dir)

    if profile == "measure":
        profile = str(args.out / "operator_profile")
        kept = (args.out / "operator_profile" / "operator_profile.csv").is_file()
        if not interleaved and not (args.reuse_runs and kept):
            take_profile(args.out / "operator_profile", model)
    result = cross_run(
        args.out, args.quick, args.reuse_runs, profile, args.sitting, pilot, args.system
    )
    for label, doc in result["calibrations"].items():
        print(f"calibrated on {label}: {doc.get('coefficients')}")
    print_table("calibrated on one run, validated on others", result["rows"])
    print_table("each model on each run's measured steps (open loop)", result["open_loop"])
    print_table("the engine against itself (same config and seed, served again)",
                result["repeatability"])  # fmt: skip
    if result["timed_rows"]:
        steps = ", ".join(f"{x:.2f}" for x in result["speed_timeline"])
        print(f"the sitting's speed by stretch (time over price): {steps}")
        print_table("the same, each step at the machine's speed where it fell (the profile's "
                    "sweeps)", result["timed_rows"])  # fmt: skip
        print_table("the same, open loop", result["timed_open_loop"])
        shrink = result["speed_shrinkage"]
        if shrink is None:
            print("no shrunk validation: no stretch holds two units or more, so their scatter "
                  "is unknown (fill_sweep_units fills in where each point fell)")  # fmt: skip
        else:
            steps = ", ".join(f"{x:.2f}" for x in shrink["speeds"])
            print(
                f"the same speeds shrunk toward the price by their own scatter (tau "
                f"{shrink['tau']:.3f}, Q {shrink['q']:.0f} over {shrink['counted']}): {steps}"
            )
            print_table("the same, each step at the shrunk speed", result["shrunk_rows"])
            print_table("the same, open loop", result["shrunk_open_loop"])
    if result["drift"]:
        title = f"each run's decode steps over the profile's price (per {DRIFT_WINDOW} steps)"
        rows = [{k: v for k, v in d.items() if k != "windows"} for d in result["drift"]]
        print_table(title, rows)
    write_csv(args.out / "cross_run.csv", result["rows"])
    write_json(args.out / "cross_run.json", result)
    print(f"wrote {args.out}/cross_run.json, cross_run.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
