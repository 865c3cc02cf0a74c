"""GPU engine runs: ``python -m experiments.bench.engine_gpu --out DIR [--dry] [--max-seconds S]``.

On one CUDA device, fp16, seeded dummy weights, KV budget 12 GiB (the paper's OPT-13B
budget, Kwon et al., SOSP 2023, Table 1), Triton attention: OPT-1.3B (1B class) and OPT-13B
shapes serve a ShareGPT-like trace under ``vllm``, ``orca_max`` and ``orca_oracle``, each
offline (all requests at t = 0) and online (Poisson arrivals replayed on the virtual
clock); one config (OPT-1.3B, vllm, offline) also runs the torch attention backend as a
cross-check (offline decisions do not depend on step times, so both backends must take the
same steps). Every run is ``experiments.serve.run`` on a composed ``serve`` config and
writes its serve files into ``DIR/<model>_<system>_<mode>[_torch]/``; ``DIR/summary.csv``
and ``DIR/summary.json`` (rows, throughput and batch ratios, metadata: device, versions,
date, command) are rewritten after every run, so a killed run keeps what finished. Runs
time their phases (``time_phases=true``: CUDA synchronized at each phase boundary), so each
``steps.csv`` holds the per-step CPU phases ``experiments.calibrate_overhead`` fits.

Work cap (about 2.5 minutes on an H200, the engine's share of ``experiments/gpu_all.sh``'s
8), sized from the first H200 run (``docs/validation/h200/first-run/``, 2026-12-04): there
the eager engine's steps took 9-27 ms for both models (OPT-13B decode 15-27 ms, flat in
the batch and above its operators' profiled 10.5-12 ms), an offline run lasted about as
many steps as its longest output, and the plan then (prompt + output <= 1024, OPT-13B 50
offline requests first) ran only the six offline runs within 150 s. The trace is now drawn
from the fitted ShareGPT model with vLLM's filter at prompt + output <= 512 (longest output
~450 tokens; the schedulers keep OPT's max_model_len 2048, so Orca (Max) still reserves
2048 slots); OPT-13B serves 40 requests offline and 20 online at 4 req/s, OPT-1.3B 100
offline and 32 online at 16 req/s; the cross-check runs OPT-1.3B on 32 requests. On the
H200 (second to fifth calls) the whole plan took 131-158 s: every run 3-19 s, except the
torch backend's cross-check run, 35-47 s. ``--max-seconds`` (default 150) is the time the
runs must end by: a run is skipped (listed under ``skipped`` in the summary, with why) when
the time already spent plus its expected length would pass it. The expected length is the
longest run so far, and at least ``EnginePlan.torch_run_s`` (50 s on a GPU) for a torch
backend run. Runs go in priority order: per model, OPT-13B first (the operator profile and
the calibration are OPT-13B's), vllm offline (the calibration's fit run), vllm online (its
held-out run), then Orca (Max) and Orca (Oracle) offline, then online; the cross-check last.

Hardware: every run is served with the catalog's entry for the GPU it runs on, found from
``torch.cuda.get_device_name`` through the hardware YAMLs' ``device_names``
(:func:`device_hardware`; an H100 SXM and an H200 are known). A device no YAML names (said
on stderr) and a dry run are served as ``NOMINAL_GPU``: the engine's measurements do not
depend on it (its KV budget is given in GiB), only the labels and the simulator's prices.

``--dry`` runs the same code path on CPU (tiny-opt and tiny-llama, fp32, a 1 MiB-class
budget, a few short requests, Triton under its interpreter) so CI can check the script; its
timings are meaningless and labelled so.
"""

from __future__ import annotations

import datetime
import gc
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from experiments.lib.args import OneLineParser
from experiments.lib.cli import check_out_dir, plain_cli

SYSTEMS = ("vllm", "orca_max", "orca_oracle")
NOMINAL_GPU = "h200"  # the hardware of a dry run and of a device no hardware YAML names
SUMMARY_KEYS = (
    "completed",
    "num_requests",
    "output_throughput",
    "request_throughput",
    "mean_ttft_ms",
    "mean_tpot_ms",
    "mean_e2el_ms",
    "normalized_latency",
    "mean_batch_size",
    "num_steps",
    "num_preemptions",
    "kv_token_states_pct",
    "kv_slots",
    "kv_cache_gib",
    "wall_s",
)


@dataclass(frozen=True)
class ModelPlan:
    model: str
    kv_budget_gb: float
    offline_requests: int
    online_requests: int
    online_rate: float  # requests/s of the trace's Poisson arrivals


@dataclass(frozen=True)
class EnginePlan:
    dry: bool
    device: str
    dtype: str
    backend: str
    trace_max_len: int  # workload filter: prompt + output <= this
    length_scale: float  # then lengths times this (dry: short requests on the interpreter)
    models: tuple[ModelPlan, ...]  # in priority order
    cross_check_model: str
    cross_check_requests: int
    swap_space_gb: float  # 0: every system preempts by recompute, no pinned pool to allocate
    torch_run_s: float  # the least expected length of a torch backend run (the cross-check)
    hardware: str  # the catalog GPU the runs are served as (main: device_hardware)


@dataclass(frozen=True)
class RunSpec:
    """One serve run: its directory name and the serve-config overrides."""

    name: str
    model: str
    system: str
    mode: str
    backend: str
    overrides: tuple[str, ...]


def device_hardware(dry: bool) -> str:
    """The catalog name of the GPU this process serves on: ``torch.cuda.get_device_name(0)``
    looked up in the hardware YAMLs' ``device_names`` (:func:`sim.catalog.get_gpu`).
    ``NOMINAL_GPU`` for a dry run, and for a device the catalog does not know (one line on
    stderr says so, and where its name goes)."""
    if dry:
        return NOMINAL_GPU
    import torch

    from sim.catalog import get_gpu

    device = torch.cuda.get_device_name(0)
    try:
        return get_gpu(device).name
    except KeyError:
        print(f"note: no configs/hardware/*.yaml lists {device!r} in its device_names: the runs "
              f"are served as {NOMINAL_GPU} (labels and simulator prices only)",
              file=sys.stderr)  # fmt: skip
        return NOMINAL_GPU


def make_plan(dry: bool) -> EnginePlan:
    if dry:
        tiny = 1 / 1024  # 1 MiB: 1024 fp32 tiny-opt slots, 4 Orca (Max) reservations
        return EnginePlan(
            True, "cpu", "float32", "triton", 256, 1 / 32,
            (ModelPlan("tiny-opt", tiny, 2, 2, 50.0), ModelPlan("tiny-llama", tiny, 2, 2, 50.0)),
            "tiny-opt", 2, 0.0, 0.0, NOMINAL_GPU,
        )  # fmt: skip
    return EnginePlan(
        False, "cuda", "float16", "triton", 512, 1.0,
        (ModelPlan("opt-13b", 12.0, 40, 20, 4.0), ModelPlan("opt-1.3b", 12.0, 100, 32, 16.0)),
        "opt-1.3b", 32, 0.0, 50.0, NOMINAL_GPU,
    )  # fmt: skip


def write_traces(plan: EnginePlan, out: Path) -> dict[str, Path]:
    """One native trace per model (Poisson arrivals at its online rate), in ``out``."""
    from core.workload.synthetic import synthesize
    from core.workload.trace_io import write_trace
    from experiments.bench.engine_cpu import scale_lengths

    paths = {}
    for m in plan.models:
        count = max(m.offline_requests, m.online_requests, plan.cross_check_requests)
        reqs = synthesize(
            "sharegpt", m.online_rate, num_requests=count, max_model_len=plan.trace_max_len
        )
        paths[m.model] = out / f"trace_{m.model}.csv"
        write_trace(paths[m.model], scale_lengths(reqs, plan.length_scale))
    return paths


def serve_overrides(
    plan: EnginePlan, m: ModelPlan, trace: Path, system: str, mode: str, count: int,
    backend: str, time_phases: bool = True,
) -> tuple[str, ...]:  # fmt: skip
    """The serve-config overrides of one run of ``m`` on ``trace`` (also used by the sync
    check and the host-time probe, so they serve what the engine runs serve)."""
    return (
        f"device={plan.device}", f"dtype={plan.dtype}", f"swap_space_gb={plan.swap_space_gb}",
        "kv_budget_fraction=null", "clock=virtual", "progress=false", "seed=0",
        f"hardware={plan.hardware}", "workload=trace", f"time_phases={str(time_phases).lower()}",
        f"model={m.model}", f"system={system}", f"mode={mode}", f"backend={backend}",
        f"kv_cache_gb={m.kv_budget_gb}", f"workload.path='{trace.resolve()}'",
        f"workload.num_requests={count}",
    )  # fmt: skip


def probe_overrides(
    dry: bool, out: Path, system: str, mode: str, count: int | None = None
) -> list[str]:
    """The serve overrides of a probe's run (the sync check, the host-time probe): the plan's
    first model on its own trace (written into ``out``), no phase timing, served as the
    device's GPU (:func:`device_hardware`); ``count`` requests, default the model's count
    for ``mode``."""
    plan = replace(make_plan(dry), hardware=device_hardware(dry))
    model = plan.models[0]
    trace = write_traces(plan, out)[model.model]
    if count is None:
        count = model.online_requests if mode == "online" else model.offline_requests
    return list(serve_overrides(plan, model, trace, system, mode, count, plan.backend,
                                time_phases=False))  # fmt: skip


def run_specs(plan: EnginePlan, traces: dict[str, Path]) -> list[RunSpec]:
    """Every run in priority order: per model (the plan's order), vllm offline, vllm online,
    the baselines offline, the baselines online; then the cross-check."""

    def spec(m: ModelPlan, system: str, mode: str, count: int, backend: str) -> RunSpec:
        suffix = "" if backend == plan.backend else f"_{backend}"
        overrides = serve_overrides(plan, m, traces[m.model], system, mode, count, backend)
        return RunSpec(f"{m.model}_{system}_{mode}{suffix}", m.model, system, mode, backend,
                       overrides)  # fmt: skip

    order = [("vllm", "offline"), ("vllm", "online")]
    order += [(s, mode) for mode in ("offline", "online") for s in SYSTEMS if s != "vllm"]
    specs = []
    for m in plan.models:
        count = {"offline": m.offline_requests, "online": m.online_requests}
        specs += [spec(m, s, mode, count[mode], plan.backend) for s, mode in order]
    checked = next(m for m in plan.models if m.model == plan.cross_check_model)
    for backend in (plan.backend, "torch"):
        s = spec(checked, "vllm", "offline", plan.cross_check_requests, backend)
        specs.append(replace(s, name=f"{s.name}_xcheck"))
    return specs


def serve_one(spec: RunSpec, out: Path) -> dict[str, Any]:
    """Compose the serve config of ``spec``, run it into ``out/spec.name``; its summary row."""
    from experiments.lib.compose import compose_config
    from experiments.serve import run

    metrics = run(compose_config("serve", spec.overrides), out / spec.name)
    row: dict[str, Any] = {
        "run": spec.name,
        "model": spec.model,
        "system": spec.system,
        "mode": spec.mode,
        "backend": spec.backend,
    }
    row.update({k: metrics.get(k) for k in SUMMARY_KEYS})
    return row


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and mode: vllm's output throughput and mean batch over each baseline's;
    and the cross-check's torch-over-triton step count and throughput."""
    done = {r["run"]: r for r in rows if r.get("output_throughput")}
    out = []
    for r in rows:
        if r["system"] != "vllm" or r["run"].endswith("_xcheck"):
            continue
        for base in SYSTEMS[1:]:
            b = done.get(r["run"].replace("_vllm_", f"_{base}_"))
            if b is None or r["run"] not in done:
                continue
            out.append({
                "model": r["model"], "mode": r["mode"], "baseline": base,
                "throughput_ratio": r["output_throughput"] / b["output_throughput"],
                "batch_ratio": r["mean_batch_size"] / b["mean_batch_size"], "same_steps": None,
            })  # fmt: skip
    pair = [r for r in rows if r["run"].endswith("_xcheck")]
    if len(pair) == 2 and all(r["run"] in done for r in pair):
        tri, tor = pair
        out.append({
            "model": tri["model"], "mode": "offline", "baseline": f"{tor['backend']}_backend",
            "throughput_ratio": tri["output_throughput"] / tor["output_throughput"],
            "batch_ratio": tri["mean_batch_size"] / tor["mean_batch_size"],
            "same_steps": tri["num_steps"] == tor["num_steps"],
        })  # fmt: skip
    return out


def metadata(plan: EnginePlan, argv: list[str]) -> dict[str, Any]:
    import torch
    import triton

    device = "cpu (Triton interpreter)" if plan.dry else torch.cuda.get_device_name(0)
    return {
        "device": device,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m experiments.bench.engine_gpu", *argv]),
        "hardware": plan.hardware,
        "dry": plan.dry,
        "timings": "MEANINGLESS: dry run on CPU under the Triton interpreter"
        if plan.dry
        else "engine wall clock per step, CUDA synchronized at each phase boundary "
        "(time_phases=true: steps.csv holds the phase columns of engine.phases)",
        "plan": asdict(plan),
    }


def write_summary(out: Path, doc: dict[str, Any]) -> None:
    from experiments.bench.tables import write_csv
    from experiments.lib.results import write_json

    write_csv(out / "summary.csv", doc["rows"])
    write_json(out / "summary.json", doc)


def expected_seconds(spec: RunSpec, plan: EnginePlan, longest: float) -> float:
    """How long ``spec`` is expected to run: the longest run so far (``longest``), and at
    least ``plan.torch_run_s`` for a torch backend run (the cross-check's, 35-47 s on the
    H200 against 3-19 s for every other run)."""
    return max(longest, plan.torch_run_s if spec.backend == "torch" else 0.0)


def serve_all(
    plan: EnginePlan, specs: list[RunSpec], out: Path, max_seconds: float, doc: dict[str, Any],
    clock: Callable[[], float] = time.perf_counter,
    serve: Callable[[RunSpec, Path], dict[str, Any]] = serve_one, spent: float = 0.0,
) -> None:  # fmt: skip
    """Serve ``specs`` in order into ``out``, the summary rewritten after each. A run that
    would end past ``max_seconds`` (counted from ``spent`` seconds before this call; the
    time spent, read on ``clock``, plus :func:`expected_seconds`) is skipped: its name goes
    in ``doc["skipped"]``, why in ``doc["skip_reasons"]``. A run that raises is recorded in
    ``doc["errors"]``."""
    t0, longest = clock() - spent, 0.0
    for spec in specs:
        elapsed, expected = clock() - t0, expected_seconds(spec, plan, longest)
        if elapsed + expected > max_seconds:
            doc["skipped"].append(spec.name)
            doc["skip_reasons"][spec.name] = (
                f"at {elapsed:.0f} s, expected to take {expected:.0f} s: would end past "
                f"--max-seconds {max_seconds:g}"
            )  # fmt: skip
            continue
        began = clock()
        row = _serve_logged(spec, out, doc, serve)
        longest = max(longest, clock() - began)
        doc["meta"]["elapsed_s"] = clock() - t0
        if row is not None:
            doc["rows"].append(row)
            print(f"{spec.name}: {_shown(row.get('output_throughput'), '.4g')} tok/s, batch "
                  f"{_shown(row.get('mean_batch_size'), '.3g')}, run {row['wall_s']:.1f} s, "
                  f"elapsed {clock() - t0:.0f} s", flush=True)  # fmt: skip
        doc["ratios"] = ratios(doc["rows"])
        write_summary(out, doc)


def _shown(value: Any, spec: str) -> str:
    """``value`` formatted by ``spec``; "n/a" for a metric the run did not report (a progress
    line must not stop the runs after it)."""
    return "n/a" if value is None else format(value, spec)


def _serve_logged(
    spec: RunSpec, out: Path, doc: dict[str, Any],
    serve: Callable[[RunSpec, Path], dict[str, Any]],
) -> dict[str, Any] | None:  # fmt: skip
    """``serve(spec, out)``'s row, or None with the error in ``doc["errors"]`` (one failing
    run must not lose the others' numbers); the GPU's cache emptied after either."""
    try:
        return serve(spec, out)
    except Exception as exc:
        doc["errors"][spec.name] = repr(exc)
        print(f"{spec.name}: FAILED {exc!r}", flush=True)
        return None
    finally:
        gc.collect()
        _empty_cuda_cache()


def _empty_cuda_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@plain_cli
def main(argv: list[str] | None = None) -> int:
    """Run every planned config; 0 when all of them ran without error or skip."""
    parser = OneLineParser(prog="python -m experiments.bench.engine_gpu", description=__doc__)
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--dry", action="store_true", help="tiny CPU run under the interpreter")
    parser.add_argument("--max-seconds", type=float, default=150.0,
                        help="end every run by then: skip one expected to end later")  # fmt: skip
    args_list = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(args_list)
    if not args.max_seconds > 0:  # nan too: it compared false and ignored the budget
        parser.error(f"--max-seconds must be > 0, got {args.max_seconds:g}")
    check_out_dir(args.out)
    if args.dry:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module imports triton
    import torch

    if not args.dry and not torch.cuda.is_available():
        parser.error("no CUDA device; use --dry for a CPU check of the script")
    plan = replace(make_plan(args.dry), hardware=device_hardware(args.dry))
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    specs = run_specs(plan, write_traces(plan, args.out))
    doc: dict[str, Any] = {"meta": metadata(plan, args_list), "rows": [], "errors": {},
                           "skipped": [], "skip_reasons": {}}  # fmt: skip
    serve_all(plan, specs, args.out, args.max_seconds, doc, spent=time.perf_counter() - t0)
    doc["ratios"] = ratios(doc["rows"])
    doc["meta"]["elapsed_s"] = time.perf_counter() - t0
    write_summary(args.out, doc)
    _print_tables(doc, plan.dry)
    return 0 if not doc["errors"] and not doc["skipped"] else 1


def _print_tables(doc: dict[str, Any], dry: bool) -> None:
    from experiments.bench.tables import print_table

    note = " (dry: timings meaningless)" if dry else ""
    cols = ("run", "completed", "output_throughput", "mean_ttft_ms", "mean_tpot_ms",
            "normalized_latency", "mean_batch_size", "num_preemptions", "wall_s")  # fmt: skip
    print_table("engine runs" + note, [{c: r[c] for c in cols} for r in doc["rows"]])
    print_table("vllm over baselines" + note, doc["ratios"])
    for name, err in doc["errors"].items():
        print(f"FAILED {name}: {err}")
    for name, why in doc["skip_reasons"].items():
        print(f"skipped {name}: {why}")


if __name__ == "__main__":
    sys.exit(main())
