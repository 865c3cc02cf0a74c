"""``python -m experiments.calibrate_vllm RUN_DIR --hardware NAME [--model NAME|CONFIG]
[--workload FILE] [--split 0.5] [--allow-device-mismatch] --out DIR``: does kvlab match a
real vLLM run?

``RUN_DIR`` holds a vLLM run: ``requests.jsonl`` (per-request engine timestamps),
``meta.json`` (the resolved engine configuration) and optionally ``timeseries.csv``
(running/waiting counts); see ``../shared/measurements/README.md``. The simulator replays
the run's arrivals and lengths (and token ids from ``--workload``, the JSONL that was sent,
so prefix hits replay) on ``system=vllm_v1`` with the engine settings of ``meta.json``
(``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``, dtype, tensor-parallel
size, block size, prefix caching, and the KV blocks vLLM allocated). ``--hardware`` must be
the GPU meta.json's ``hardware.device_name`` names where the catalog knows that device (its
``device_names``); ``--allow-device-mismatch`` simulates the run on another GPU deliberately
(with a note). An unknown device, or a hardware YAML that does not list it, gives a note.

1. *Uncalibrated*: the roofline cost model on the GPU's datasheet numbers and the
   documented default efficiencies (:mod:`sim.cost.efficiency`); nothing is fitted.
2. *Calibrated*: three bounded constants with a meaning — a per-step overhead
   ``c0 ∈ [0, 0.1] s``, a compute time scale ``1/compute efficiency ∈ [1, 20]`` and a memory
   time scale ``1/memory efficiency ∈ [1, 20]`` on the basis terms of
   :class:`sim.cost.CalibratedCostModel` — fitted on the first ``split`` of the requests by
   arrival, on signals that do not pass through the queue: each request's TPOT and, for
   requests scheduled at once (``scheduled_ts − queued_ts`` below
   :data:`experiments.lib.vllm_fit.NO_WAIT_S`), the TTFT without the wait for the step in
   flight at arrival (``first_token_ts − scheduled_ts``; that wait jumps with step
   boundaries). A request's simulated TPOT is a sum of step times, linear in the constants
   for a fixed schedule, so each round is a bounded least-squares fit of relative errors on
   the current simulated schedule (damped), then a new simulation; the round whose own
   simulation fits best is kept (``ROUNDS`` rounds; :mod:`experiments.lib.vllm_fit`).
   The whole run is simulated (the held-out arrivals are workload, known in advance), but
   only first-part measurements enter the fit.

Both are scored on the held-out requests (arrival order after the split): ``DIR/errors.json``
maps ``uncalibrated`` and ``calibrated`` to relative errors (simulated − measured) /
measured of ``mean_ttft_ms``, ``median_ttft_ms``, ``p99_ttft_ms``, ``mean_tpot_ms``,
``p99_tpot_ms``, ``mean_e2el_ms``, ``request_throughput``, ``output_throughput`` and
``makespan_s``. ``DIR/calibration.json`` is what ``simulate cost=calibrated
cost.path=DIR/calibration.json`` takes; ``DIR/calibrate_vllm.png`` plots per-request
measured vs predicted TTFT and E2E and the running/waiting counts over time.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from core.metrics.summary import rejection_counts
from core.workload.trace_io import TraceFormatError
from core.workload.vllm_log import LoggedRequest
from experiments.lib.args import OneLineParser, out_dir_problem
from experiments.lib.results import REJECT_LABELS, write_atomic, write_json
from experiments.lib.signals import interrupts_deferred
from experiments.lib.vllm_fit import BOUNDS, bounds_line, calibrate
from experiments.lib.vllm_run import (
    RunError,
    VLLMRun,
    check_device,
    measured_frame,
    model_note,
    num_blocks,
    read_run,
    resolve_gpu,
    resolve_model,
    run_simulation,
)
from sim.catalog import gpus
from sim.cost import RooflineCostModel
from sim.driver import StepPriceError

METRICS = (
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "mean_e2el_ms",
    "request_throughput",
    "output_throughput",
    "makespan_s",
)


def check_split(split: float) -> None:
    if not 0.0 < split < 1.0:
        raise RunError(f"--split must be in (0, 1), got {split}")


def split_ids(logged: list[LoggedRequest], split: float) -> tuple[set[int], set[int]]:
    """Request ids of the first ``split`` by arrival (the fit part) and of the rest."""
    check_split(split)
    if len(logged) < 2:
        raise RunError(f"the log holds {len(logged)} request: a fit part and a held-out part "
                       "need at least 2")  # fmt: skip
    order = sorted(logged, key=lambda r: (r.arrival, r.index))
    k = max(1, min(len(order) - 1, round(split * len(order))))
    return {r.index for r in order[:k]}, {r.index for r in order[k:]}


def part_metrics(frame: pd.DataFrame, ids: set[int]) -> dict[str, float]:
    """The ``METRICS`` of the requests ``ids`` (throughputs over their own makespan: first
    arrival to last finish; output tokens count every sample, as ``summarize`` does, where
    the frame says how many a request has)."""
    part = frame[frame["request_id"].isin(ids)]
    samples = part["num_seqs"] if "num_seqs" in part.columns else 1
    makespan = float(part["finish_s"].max() - part["arrival_s"].min())
    tpot = part["tpot_s"].dropna().to_numpy(dtype=float)
    ttft = part["ttft_s"].to_numpy(dtype=float)
    return {
        "mean_ttft_ms": float(ttft.mean() * 1e3),
        "median_ttft_ms": float(np.median(ttft) * 1e3),
        "p99_ttft_ms": float(np.percentile(ttft, 99) * 1e3),
        "mean_tpot_ms": float(tpot.mean() * 1e3),
        "p99_tpot_ms": float(np.percentile(tpot, 99) * 1e3),
        "mean_e2el_ms": float(part["e2el_s"].mean() * 1e3),
        "request_throughput": len(part) / makespan,
        "output_throughput": float((part["output_len"] * samples).sum()) / makespan,
        "makespan_s": makespan,
    }


def relative_errors(sim: dict[str, float], meas: dict[str, float]) -> dict[str, float]:
    return {k: (sim[k] - meas[k]) / meas[k] for k in METRICS}


def _plot(
    out: Path, meas: pd.DataFrame, sims: dict[str, pd.DataFrame], steps: dict[str, pd.DataFrame],
    heldout: set[int], timeseries: pd.DataFrame | None,
) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    m = meas.set_index("request_id")
    for ax, key, label in ((axes[0], "ttft_s", "TTFT"), (axes[1], "e2el_s", "E2E latency")):
        for name, frame in sims.items():
            s = frame.set_index("request_id").loc[m.index]
            held = m.index.isin(list(heldout))
            ax.scatter(m[key][held], s[key][held], s=8, label=f"{name} (held out)")
            ax.scatter(m[key][~held], s[key][~held], s=8, marker="x", alpha=0.4,
                       label=f"{name} (fit part)")  # fmt: skip
        hi = float(m[key].max()) * 1.05
        ax.plot([0, hi], [0, hi], "k--", lw=0.8)
        ax.set(xlabel=f"measured {label} (s)", ylabel=f"simulated {label} (s)", title=label)
        ax.legend(fontsize=7)
    ax = axes[2]
    if timeseries is not None and {"t", "running", "waiting"} <= set(timeseries.columns):
        ax.plot(timeseries["t"], timeseries["running"], "k-", label="vLLM running")
        ax.plot(timeseries["t"], timeseries["waiting"], "k:", label="vLLM waiting")
    for name, st in steps.items():
        ax.plot(st["start_s"], st["running_requests"], lw=0.8, label=f"{name} running")
        ax.plot(st["start_s"], st["num_waiting"], lw=0.8, ls=":", label=f"{name} waiting")
    ax.set(xlabel="time (s)", ylabel="requests", title="running / waiting")
    ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(out)


def run_calibration(
    run_dir: Path, hardware: str, model_arg: str | None = None, workload: Path | None = None,
    split: float = 0.5, out: Path | None = None, plot: bool = True,
    allow_device_mismatch: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """The whole command; returns ``{"uncalibrated", "calibrated", ...}`` and writes the
    files when ``out`` is given. Everything is checked before the first simulation, so a
    bad option costs no time; ``--hardware`` is checked against meta.json's device as
    :func:`~experiments.lib.vllm_run.check_device` says (its note, if any, goes in
    ``notes``). Logged requests the simulator rejects (longer than ``max_model_len``, more
    KV than the cache holds: the log and its meta.json disagree; or a prompt token id
    outside the model's vocabulary, as ``experiments.simulate`` rejects it) are left out of
    both sides' metrics and named in ``notes``."""
    check_split(split)
    problem = None if out is None else out_dir_problem(Path(out))
    if problem is not None:
        raise RunError(f"--out: {problem}")
    gpu = resolve_gpu(hardware)
    run = read_run(run_dir, workload)
    device_note = check_device(run, gpu, hardware, allow_device_mismatch)
    model = resolve_model(model_arg, run)
    mismatch = model_note(model_arg, run, model)
    run = replace(run, vocab_size=model.vocab_size)  # rejects prompt ids as simulate does
    blocks, capacity_text = num_blocks(run, model, gpu)
    fit_ids, held_ids = split_ids(run.logged, split)
    notes = [*run.notes, *(n for n in (device_note, mismatch) if n is not None)]
    unscheduled = sum(math.isnan(r.scheduled) for r in run.logged)
    if unscheduled == len(run.logged):
        notes.append("the log has no scheduled_ts: the queue wait is unknown, so the fit uses "
                     "TPOTs only (no TTFTs of requests scheduled at once)")  # fmt: skip
    elif unscheduled:
        notes.append(f"{unscheduled} of the log's {len(run.logged)} requests have no "
                     "scheduled_ts: their queue wait is unknown, so the fit leaves out their "
                     "TTFTs")  # fmt: skip
    if run.prefix_caching_without_ids:
        notes.append("prefix caching is on in meta.json but the log comes without prompt token "
                     "ids (--workload): in the simulation a request finds only its own blocks "
                     "again (after a recompute), none of a prefix the run shared")  # fmt: skip
    meas = measured_frame(run.logged)
    roofline = RooflineCostModel(model, gpu, run.tp, run.dtype_bytes, block_size=run.block_size)
    first = run_simulation(run, roofline, blocks)
    rejected = rejected_requests(first[0])
    if rejected:
        notes.append(rejection_note(rejected))
        fit_ids, held_ids = fit_ids - rejected.keys(), held_ids - rejected.keys()
        for name, ids in (("before", fit_ids), ("after", held_ids)):
            if not ids:
                raise RunError(f"every request {name} the split is rejected by the simulator: "
                               f"{notes[-1]}")  # fmt: skip
    measured = part_metrics(meas, held_ids)
    cal_model, history = calibrate(run, model, gpu, blocks, fit_ids, first)
    final = run_simulation(run, cal_model, blocks)
    predicted = {"uncalibrated": part_metrics(first[0], held_ids),
                 "calibrated": part_metrics(final[0], held_ids)}  # fmt: skip
    errors = {k: relative_errors(v, measured) for k, v in predicted.items()}
    result = {
        **errors,
        "measured": measured,
        "predicted": predicted,
        "split": split,
        "num_fit_requests": len(fit_ids),
        "num_heldout_requests": len(held_ids),
        "kv_blocks": blocks,
        "capacity": capacity_text,
        "fit_rounds": history,
        "uncalibrated_cost_model": roofline.describe(),
        "calibrated_cost_model": cal_model.describe(),
        "fitted_bounds": bounds_line(cal_model.coefficients),
        "rejected_by_simulator": {str(k): v for k, v in sorted(rejected.items())},
        "notes": notes,
    }
    if out is not None:
        out = Path(out)
        user_yaml = Path(hardware).suffix in (".yaml", ".yml") and gpu.name not in gpus()
        hardware_copy = out / "hardware" / f"{gpu.name}.yaml" if user_yaml else None
        result["simulate_command"] = simulate_command(
            run, run_dir, gpu.name, model_arg, blocks, workload, out / "calibration.json",
            hardware_copy,
        )  # fmt: skip
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunError(f"--out: cannot make {out} ({e.strerror})") from None
        doc = cal_model.to_dict()
        doc.update(
            source_run=run.name,
            split=split,
            fitted_on="TPOT and no-wait TTFT of the requests before the split",
            hf_config=model.to_hf_config(),
            bounds={"constant": BOUNDS[0], "compute_scale": BOUNDS[1], "memory_scale": BOUNDS[2]},
        )
        with interrupts_deferred():  # one fit's files: an interrupt waits for them all
            if hardware_copy is not None:
                write_atomic(hardware_copy, Path(hardware).read_text(encoding="utf-8"))
            write_json(out / "errors.json", result)
            write_json(out / "calibration.json", doc)
        if plot:
            _plot(
                out / "calibrate_vllm.png", meas,
                {"uncalibrated": first[0], "calibrated": final[0]},
                {"calibrated": final[1]}, held_ids, run.timeseries,
            )  # fmt: skip
    return result


def rejected_requests(sim_req: pd.DataFrame) -> dict[int, str]:
    """Request id → the simulator's reason, for the requests it rejected."""
    rows = sim_req[sim_req["status"] != "finished"]
    return {int(r.request_id): str(r.reject_reason) for r in rows.itertuples()}


def rejection_note(rejected: dict[int, str]) -> str:
    """One line: how many logged requests the simulator rejected, by kind, and the first."""
    frame = pd.DataFrame({"status": "rejected", "reject_reason": list(rejected.values())})
    counts = rejection_counts(frame)
    labels = {**REJECT_LABELS, "rejected_other": "for other reasons"}  # no requests.csv here
    kinds = ", ".join(f"{n} {labels[k]}" for k, n in counts.items() if n)
    first = min(rejected)
    question = "do meta.json's max_model_len and num_gpu_blocks match the run?"
    if counts["rejected_other"] == len(rejected):  # e.g. prompt ids outside the vocabulary
        question = "are --workload's token ids the model's, and the prompts the run sent?"
    return (
        f"{len(rejected)} logged request(s) rejected by the simulator though vLLM served them "
        f"({kinds}; the first, request {first} of the log counting from 0: {rejected[first]}); "
        f"left out of the measured and the simulated metrics: {question}"
    )


def simulate_command(
    run: VLLMRun, run_dir: Path, hardware: str, model_arg: str | None, blocks: int,
    workload: Path | None, calibration: Path, hardware_copy: Path | None = None,
) -> str:  # fmt: skip
    """The ``experiments.simulate`` call that replays the run as this tool simulated it:
    the engine settings of meta.json, the KV blocks, the token ids and the calibration.
    ``hardware_copy``: where a ``--hardware`` YAML is copied as ``<dir>/hardware/<gpu>.yaml``
    (on Hydra's search path in the call), None for a shipped GPU's name."""
    sys_ = run.system
    args = ["python -m experiments.simulate system=vllm_v1"]
    if model_arg is not None and Path(model_arg).exists():
        args.append(f"model.hf_config={model_arg}")
    else:
        args.append(f"model.name={model_arg or run.model_name}")
    if hardware_copy is not None:
        args.append(f"hydra.searchpath=[file://{hardware_copy.parent.parent}]")
        args.append(f"hardware={hardware_copy.stem}")
    else:
        args.append(f"hardware={hardware}")
    args += [
        f"model.tp={run.tp}",
        f"system.max_model_len={run.max_model_len}",
        f"system.max_num_seqs={sys_['max_num_seqs']}",
        f"system.max_num_batched_tokens={sys_['max_num_batched_tokens']}",
        f"system.block_size={run.block_size}",
        f"system.chunked_prefill={str(sys_['chunked_prefill']).lower()}",
        f"system.enable_prefix_caching={str(sys_['enable_prefix_caching']).lower()}",
        f"num_gpu_blocks={blocks}",
        f"workload=vllm_log workload.path={run_dir}",
    ]
    if workload is not None:
        args.append(f"workload.tokens_path={workload}")
    args.append(f"cost=calibrated cost.path={calibration}")
    return " ".join(args)


def format_errors(result: dict[str, Any]) -> str:
    head = f"{'metric':<20} {'measured':>12} {'uncalibrated':>13} {'calibrated':>11}"
    lines = [head]
    for k in METRICS:
        lines.append(
            f"{k:<20} {result['measured'][k]:>12.4g} {result['uncalibrated'][k]:>+13.2%} "
            f"{result['calibrated'][k]:>+11.2%}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m experiments.calibrate_vllm", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("run_dir", type=Path, help="a vLLM run directory (meta.json, requests)")
    parser.add_argument("--hardware", required=True, help="GPU name or hardware YAML path")
    parser.add_argument("--model", default=None, help="name, HF id or config.json path")
    parser.add_argument("--workload", type=Path, default=None, help="the workload JSONL sent")
    parser.add_argument("--split", type=float, default=0.5, help="fit part (by arrival)")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument(
        "--allow-device-mismatch", action="store_true",
        help="simulate on --hardware though meta.json names another catalog GPU",
    )  # fmt: skip
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        result = run_calibration(
            args.run_dir, args.hardware, args.model, args.workload, args.split, args.out,
            allow_device_mismatch=args.allow_device_mismatch,
        )  # fmt: skip
    except (
        RunError, TraceFormatError, StepPriceError, ValueError, KeyError, FileNotFoundError
    ) as e:  # fmt: skip
        message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"calibrate_vllm: error: {message}", file=sys.stderr)
        return 2
    for note in result["notes"]:
        print(f"calibrate_vllm: note: {note}", file=sys.stderr)
    print(result["capacity"])
    print(result["calibrated_cost_model"])
    print(result["fitted_bounds"])
    print(f"held-out part: {result['num_heldout_requests']} requests after the first "
          f"{result['num_fit_requests']} (split {args.split})")  # fmt: skip
    print(format_errors(result))
    print(f"wrote {args.out}/errors.json, calibration.json, calibrate_vllm.png")
    print(f"replay it with the calibration:\n  {result['simulate_command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main", "run_calibration"]
