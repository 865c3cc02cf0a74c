"""``python -m experiments.calibrate_vllm RUN_DIR --hardware NAME [--model NAME|CONFIG]
[--workload FILE] [--split 0.5] --out DIR``: does kvlab match a real vLLM run?

``RUN_DIR`` holds a vLLM run: ``requests.jsonl`` (per-request engine timestamps),
``meta.json`` (the resolved engine configuration) and optionally ``timeseries.csv``
(running/waiting counts); see ``../shared/measurements/README.md``. The simulator replays
the run's arrivals and lengths (and token ids from ``--workload``, the JSONL that was sent,
so prefix hits replay) on ``system=vllm_v1`` with the engine settings of ``meta.json``
(``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``, dtype, tensor-parallel
size, block size, prefix caching, and the KV blocks vLLM allocated).

1. *Uncalibrated*: the roofline cost model on the GPU's datasheet numbers and the
   documented default efficiencies (:mod:`sim.cost.efficiency`); nothing is fitted.
2. *Calibrated*: three bounded constants with a meaning — a per-step overhead
   ``c0 ∈ [0, 0.1] s``, a compute time scale ``1/compute efficiency ∈ [1, 20]`` and a memory
   time scale ``1/memory efficiency ∈ [1, 20]`` on the basis terms of
   :class:`sim.cost.CalibratedCostModel` — fitted on the first ``split`` of the requests by
   arrival, on signals that do not pass through the queue: each request's TPOT and, for
   requests scheduled at once (``scheduled_ts − queued_ts`` below ``NO_WAIT_S``), the TTFT
   without the wait for the step in flight at arrival (``first_token_ts − scheduled_ts``;
   that wait jumps with step boundaries). A request's simulated TPOT is a sum of step
   times, linear in the constants for a fixed schedule, so each round is a bounded
   least-squares fit of relative errors on the current simulated schedule (damped), then a
   new simulation; the round whose own simulation fits best is kept (``ROUNDS`` rounds).
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

import itertools
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from core.mapping_file import read_mapping, yaml_error_place
from core.metrics.summary import rejection_counts
from core.model_spec import ModelSpec
from core.request import Request
from core.sched.base import SchedulerConfig
from core.workload.trace_io import TraceFormatError
from core.workload.vllm_log import (
    LoggedRequest,
    read_token_ids,
    read_vllm_log,
    requests_from_log,
)
from experiments.lib.args import OneLineParser
from experiments.lib.checks import ConfigError
from experiments.lib.results import REJECT_LABELS, write_json
from experiments.lib.setup import block_size as system_block_size
from experiments.lib.setup import prefix_caching_for, scheduler_config, scheduler_factory
from sim.capacity import kv_capacity
from sim.catalog import CONFIGS, GPUSpec, get_gpu, get_model, gpu_from_config, gpus
from sim.cost import CalibratedCostModel, CostModel, RooflineCostModel
from sim.driver import simulate

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
NO_WAIT_S = 0.05  # "scheduled at once": below one decode step of a 7-8B model (~30 ms)
ROUNDS = 6
DAMPING = 0.5
EPS = 1e-9  # seconds: step ends and request timestamps are the same sums of floats
# (lower, upper) of c0 [s], compute time scale, memory time scale.
BOUNDS = ((0.0, 0.1), (1.0, 20.0), (1.0, 20.0))
# vLLM's max_cudagraph_capture_size default (the shared run's meta.json), for a meta.json
# without a compilation_config.
CUDA_GRAPH_MAX_SIZE = 512
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


class RunError(ValueError):
    """A run directory or option that cannot be used; the message names file and key."""


@dataclass
class VLLMRun:
    """A vLLM run directory read into what the simulator needs."""

    name: str
    meta: dict[str, Any]
    logged: list[LoggedRequest]
    requests: list[Request]
    system: dict[str, Any]
    max_model_len: int
    num_gpu_blocks: int | None
    tp: int
    dtype_bytes: int
    model_name: str
    device_memory_bytes: int | None
    gpu_memory_utilization: float
    cuda_graph_max_size: int
    timeseries: pd.DataFrame | None
    prefix_caching_dropped: bool = False

    @property
    def sched_config(self) -> SchedulerConfig:
        return scheduler_config(self.system, self.max_model_len)

    @property
    def block_size(self) -> int:
        return system_block_size(self.system)


def _meta_value(meta: dict[str, Any], path: Path, *keys: str, default: Any = None) -> Any:
    """The first of ``keys`` (dotted paths into meta.json) present; ``default`` or an
    error naming the key when none is."""
    for key in keys:
        node: Any = meta
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return node
    if default is not None:
        return default
    raise RunError(f"{path}: missing key {keys[0]!r}")


def read_run(run_dir: Path, workload: Path | None = None) -> VLLMRun:
    """Read ``run_dir``'s meta.json, requests.jsonl and timeseries.csv."""
    run_dir = Path(run_dir)
    meta_path = run_dir / "meta.json"
    if not meta_path.is_file():
        raise RunError(f"{meta_path}: not found (a vLLM run directory holds meta.json)")
    try:
        meta = read_mapping(meta_path, json.loads, json.JSONDecodeError, "JSON", "a JSON object")
    except ValueError as e:
        raise RunError(str(e)) from None
    logged = read_vllm_log(run_dir)
    ids = None if workload is None else read_token_ids(workload, logged)
    ek = "engine_kwargs"
    rc = "resolved_config"
    sc = f"{rc}.scheduler_config"
    dtype = _dtype(meta, meta_path)
    _refuse_unmodelled(meta, meta_path, dtype)
    max_len = int(
        _meta_value(meta, meta_path, f"{ek}.max_model_len", f"{rc}.model_config.max_model_len")
    )
    chunked = bool(_meta_value(meta, meta_path, f"{sc}.enable_chunked_prefill", default=True))
    # the run as kvlab's system config group; vLLM v1 keeps no watermark
    system = {
        "name": "vllm_v1",
        "max_num_seqs": int(
            _meta_value(meta, meta_path, f"{ek}.max_num_seqs", f"{sc}.max_num_seqs")
        ),
        "max_num_batched_tokens": int(
            _meta_value(
                meta, meta_path, f"{ek}.max_num_batched_tokens", f"{sc}.max_num_batched_tokens"
            )
        ),
        "preemption_mode": "recompute",
        "chunked_prefill": chunked,
        "block_size": int(_meta_value(meta, meta_path, "kv_cache.block_size", default=16)),
        "watermark": 0.0,
        "enable_prefix_caching": bool(
            _meta_value(meta, meta_path, "kv_cache.enable_prefix_caching", default=True)
        ),
    }
    try:
        scheduler_config(system, max_len)
    except ConfigError as e:
        raise RunError(f"{meta_path}: the run's scheduler settings cannot be simulated: "
                       f"{e.key.removeprefix('system.')}: {e.problem}") from None  # fmt: skip
    requests = requests_from_log(logged, ids)
    wanted = system["enable_prefix_caching"]
    system["enable_prefix_caching"] = prefix_caching_for(system, requests, warn=False)
    blocks = _meta_value(meta, meta_path, "kv_cache.num_gpu_blocks", default=-1)
    if blocks != -1 and not (isinstance(blocks, int) and blocks >= 1):
        raise RunError(f"{meta_path}: kv_cache.num_gpu_blocks must be a whole number >= 1, "
                       f"got {blocks!r}")  # fmt: skip
    memory = _meta_value(meta, meta_path, "hardware.device_total_memory_bytes", default=-1)
    utilization = float(
        _meta_value(meta, meta_path, "kv_cache.gpu_memory_utilization",
                    f"{rc}.cache_config.gpu_memory_utilization", default=0.9)
    )  # fmt: skip
    eager = bool(_meta_value(meta, meta_path, f"{ek}.enforce_eager",
                             f"{rc}.model_config.enforce_eager", default=False))  # fmt: skip
    graphs = int(
        _meta_value(meta, meta_path, f"{rc}.compilation_config.max_cudagraph_capture_size",
                    default=CUDA_GRAPH_MAX_SIZE)
    )  # fmt: skip
    ts_path = run_dir / "timeseries.csv"
    timeseries = None
    if ts_path.is_file():
        try:
            timeseries = pd.read_csv(ts_path)
        except ValueError as e:  # pandas' EmptyDataError and ParserError
            raise RunError(f"{ts_path}: not a CSV table ({e})") from None
    return VLLMRun(
        name=run_dir.name,
        meta=meta,
        logged=logged,
        requests=requests,
        system=system,
        max_model_len=max_len,
        num_gpu_blocks=None if blocks == -1 else int(blocks),
        tp=int(_meta_value(meta, meta_path, f"{ek}.tensor_parallel_size", default=1)),
        dtype_bytes=DTYPE_BYTES[dtype],
        model_name=str(_meta_value(meta, meta_path, "model", f"{ek}.model")),
        device_memory_bytes=None if memory == -1 else int(memory),
        gpu_memory_utilization=utilization,
        cuda_graph_max_size=0 if eager else graphs,
        timeseries=timeseries,
        prefix_caching_dropped=wanted and not system["enable_prefix_caching"],
    )


def _dtype(meta: dict[str, Any], meta_path: Path) -> str:
    """The weights' dtype: ``engine_kwargs.dtype``, or the resolved model config's when that
    is missing or vLLM's default ``auto``; bfloat16 when neither is recorded (older logs),
    an error when ``auto`` is not resolved."""
    key, resolved = "engine_kwargs.dtype", "resolved_config.model_config.dtype"
    dtype = str(_meta_value(meta, meta_path, key, resolved, default="bfloat16"))
    if dtype == "auto":  # vLLM's default: the resolved config says which it chose
        key = resolved
        dtype = str(_meta_value(meta, meta_path, key, default="auto"))
    dtype = dtype.removeprefix("torch.")
    if dtype not in DTYPE_BYTES:
        raise RunError(f"{meta_path}: {key} {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    return dtype


def _refuse_unmodelled(meta: dict[str, Any], meta_path: Path, dtype: str) -> None:
    """Settings the simulator cannot price, refused by name rather than ignored: a KV cache
    dtype other than the weights' ``dtype`` and pipeline or data parallelism."""
    ek, rc = "engine_kwargs", "resolved_config"
    for key in (f"{ek}.kv_cache_dtype", f"{rc}.cache_config.cache_dtype"):
        value = str(_meta_value(meta, meta_path, key, default="auto"))
        if value not in ("auto", dtype, f"torch.{dtype}"):
            raise RunError(f"{meta_path}: {key} is {value!r}: kvlab prices the KV cache in "
                           f"the weights' dtype only ({dtype})")  # fmt: skip
    for key in (f"{rc}.parallel_config.pipeline_parallel_size",
                f"{ek}.pipeline_parallel_size", f"{ek}.data_parallel_size",
                f"{rc}.parallel_config.data_parallel_size"):  # fmt: skip
        value = _meta_value(meta, meta_path, key, default=1)
        if value != 1:
            raise RunError(
                f"{meta_path}: {key} is {value!r}: kvlab models one engine with tensor "
                "parallelism only (pipeline and data parallel size 1)"
            )


def resolve_model(arg: str | None, run: VLLMRun) -> ModelSpec:
    """``--model``: a catalog name or HF id, or a ``config.json`` path; default the run's
    model id from meta.json."""
    if arg is not None and Path(arg).exists():
        return ModelSpec.from_json(arg)
    return get_model(arg or run.model_name)


def resolve_gpu(arg: str) -> GPUSpec:
    """``--hardware``: a catalog name or a hardware YAML path."""
    path = Path(arg)
    if path.suffix in (".yaml", ".yml") and not path.is_file():
        raise RunError(f"--hardware {arg}: no such file (a hardware YAML, or one of the "
                       f"names {', '.join(sorted(gpus()))})")  # fmt: skip
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            where = f", {yaml_error_place(e)}" if yaml_error_place(e) else ""
            raise ValueError(f"{path}{where}: not YAML ({getattr(e, 'problem', e)})") from None
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: not a mapping of the GPU's numbers")
        return gpu_from_config(doc, str(path))
    return get_gpu(arg)


def num_blocks(run: VLLMRun, model: ModelSpec, gpu: GPUSpec) -> tuple[int, str]:
    """vLLM's block count when meta.json records it, else kvlab's estimate (vllm_v1
    accounting on the device memory meta.json records); the capacity description."""
    if run.device_memory_bytes is not None:
        gpu = replace(
            gpu, memory_bytes=int(run.device_memory_bytes),
            source={**gpu.source, "memory_gb": "device_total_memory_bytes of the run's meta.json"},
        )  # fmt: skip
    estimate = kv_capacity(
        model, gpu, run.tp, run.dtype_bytes,
        max_num_batched_tokens=run.sched_config.max_num_batched_tokens,
        max_num_seqs=run.sched_config.max_num_seqs,
        max_model_len=run.sched_config.max_model_len,
        gpu_memory_utilization=run.gpu_memory_utilization,
        block_size=run.block_size, cuda_graph_max_size=run.cuda_graph_max_size,
    )  # fmt: skip
    text = estimate.describe()
    if run.num_gpu_blocks is None:
        return estimate.num_blocks(run.block_size), text
    est = estimate.num_blocks(run.block_size)
    text += (
        f"\n  vLLM allocated {run.num_gpu_blocks} blocks (meta.json, used); kvlab's estimate "
        f"{est} blocks ({est / run.num_gpu_blocks - 1:+.1%})"
    )
    return run.num_gpu_blocks, text


def run_simulation(run: VLLMRun, cost: CostModel, blocks: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Simulate the whole run on ``run.system`` (vllm_v1); the requests and steps frames.
    Prefix caching is off when the log comes without prompt token ids."""
    slots = blocks * run.block_size
    make_scheduler = scheduler_factory(run.system, slots, 0, run.max_model_len, run.requests)
    rec = simulate(run.requests, make_scheduler, cost).recorder
    return rec.requests_frame(), rec.steps_frame()


def measured_frame(logged: list[LoggedRequest]) -> pd.DataFrame:
    """The log as a requests frame (columns of ``core.metrics.recorder``)."""
    return pd.DataFrame(
        {
            "request_id": [r.index for r in logged],
            "arrival_s": [r.arrival for r in logged],
            "output_len": [r.output_len for r in logged],
            "first_scheduled_s": [r.scheduled for r in logged],
            "first_token_s": [r.first_token for r in logged],
            "finish_s": [r.last_token for r in logged],
            "ttft_s": [r.ttft for r in logged],
            "tpot_s": [r.tpot for r in logged],
            "e2el_s": [r.e2e for r in logged],
        }
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
    arrival to last finish)."""
    part = frame[frame["request_id"].isin(ids)]
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
        "output_throughput": float(part["output_len"].sum()) / makespan,
        "makespan_s": makespan,
    }


def relative_errors(sim: dict[str, float], meas: dict[str, float]) -> dict[str, float]:
    return {k: (sim[k] - meas[k]) / meas[k] for k in METRICS}


def bounded_lstsq(a: np.ndarray, b: np.ndarray, bounds: tuple[tuple[float, float], ...]):
    """``min ||a x − b||`` with ``lo ≤ x ≤ hi``, exact for a few variables: every choice of
    each variable at its lower bound, its upper bound or free is solved and the feasible
    one with the least residual kept."""
    n = a.shape[1]
    best, best_res = None, math.inf
    for states in itertools.product(("lo", "hi", "free"), repeat=n):
        x = np.zeros(n)
        free = [i for i, s in enumerate(states) if s == "free"]
        for i, s in enumerate(states):
            if s != "free":
                x[i] = bounds[i][0 if s == "lo" else 1]
        rest = b - a @ x
        if free:
            x[free] = np.linalg.lstsq(a[:, free], rest, rcond=None)[0]
        if all(bounds[i][0] - 1e-12 <= x[i] <= bounds[i][1] + 1e-12 for i in range(n)):
            res = float(np.sum((a @ x - b) ** 2))
            if res < best_res:
                best, best_res = x, res
    assert best is not None  # the all-bounds corners are always feasible
    return best


def _fit_rows(
    probe: CalibratedCostModel, sim_req: pd.DataFrame, steps: pd.DataFrame,
    meas: pd.DataFrame, fit_ids: set[int],
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Rows ``(basis sums, measured)`` of the fit part's TPOTs and no-wait TTFTs on the
    simulated schedule ``steps``; basis columns: constant, compute time, memory time (the
    per-sequence terms are not fitted here: they stay 0)."""
    steps = steps.sort_values("start_s")
    b = probe.basis_matrix(steps)
    basis = np.column_stack([b[:, 0], b[:, 1] + b[:, 2], b[:, 3]])  # const, compute, memory
    cum = np.vstack([np.zeros(3), np.cumsum(basis, axis=0)])
    start = steps["start_s"].to_numpy(dtype=float)
    end = start + steps["duration_s"].to_numpy(dtype=float)
    sim = sim_req.set_index("request_id")
    rows, targets = [], []
    for m in meas[meas["request_id"].isin(fit_ids)].itertuples():
        s = sim.loc[m.request_id]
        if s["status"] != "finished":
            continue
        if m.output_len >= 2 and math.isfinite(m.tpot_s):
            lo = np.searchsorted(end, s["first_token_s"] + EPS, "right")
            hi = np.searchsorted(end, s["finish_s"] + EPS, "right")
            rows.append((cum[hi] - cum[lo]) / (m.output_len - 1))
            targets.append(m.tpot_s)
        if m.first_scheduled_s - m.arrival_s <= NO_WAIT_S:
            lo = np.searchsorted(start, s["first_scheduled_s"] - EPS, "left")
            hi = np.searchsorted(end, s["first_token_s"] + EPS, "right")
            if hi > lo:
                rows.append(cum[hi] - cum[lo])
                targets.append(m.first_token_s - m.first_scheduled_s)
    if len(rows) < 3:
        raise RunError(
            f"only {len(rows)} fit signals (TPOTs of requests with 2+ output tokens, TTFTs of "
            f"requests scheduled at once) from the {len(fit_ids)} requests before the split, "
            "among those the simulator served: too few to fit"
        )
    return np.array(rows), np.array(targets)


def calibrate(
    run: VLLMRun, model: ModelSpec, gpu: GPUSpec, blocks: int, fit_ids: set[int],
    first_trace: tuple[pd.DataFrame, pd.DataFrame],
) -> tuple[CalibratedCostModel, list[dict[str, float]]]:  # fmt: skip
    """Fit the three constants (see the module doc); the model and the per-round values."""
    meas = measured_frame(run.logged)
    probe = CalibratedCostModel(
        model, gpu, dict.fromkeys(("constant", "linear_flop_time", "attn_flop_time",
                                   "byte_time"), 0.0),
        run.tp, run.dtype_bytes, run.block_size,
    )  # fmt: skip
    trace = first_trace
    history: list[dict[str, float]] = []
    best: tuple[float, CalibratedCostModel | None] = (math.inf, None)
    x_prev: np.ndarray | None = None
    for _ in range(ROUNDS):
        a, y = _fit_rows(probe, trace[0], trace[1], meas, fit_ids)
        x_fit = bounded_lstsq(a / y[:, None], np.ones(len(y)), BOUNDS)
        # damped: the fit holds the schedule fixed, and the schedule moves with x
        x = x_fit if x_prev is None else DAMPING * x_fit + (1 - DAMPING) * x_prev
        x_prev = x
        pred = a @ x
        coeffs = {
            "constant": float(x[0]),
            "linear_flop_time": float(x[1]),
            "attn_flop_time": float(x[1]),
            "byte_time": float(x[2]),
        }
        stats = {
            "n_signals": float(len(y)),
            "mape": float(np.mean(np.abs(pred - y) / y)),
        }
        cost = CalibratedCostModel(
            model, gpu, coeffs, run.tp, run.dtype_bytes, run.block_size, stats
        )
        trace = run_simulation(run, cost, blocks)
        # the fit above holds the schedule fixed; score the model on the schedule it makes
        achieved = signal_error(trace[0], meas, fit_ids)
        history.append({**coeffs, **stats, "simulated_signal_mape": achieved})
        if achieved < best[0]:
            best = (achieved, cost)
    assert best[1] is not None
    return best[1], history


def signal_error(sim_req: pd.DataFrame, meas: pd.DataFrame, ids: set[int]) -> float:
    """Mean relative error of the fit signals (TPOT; TTFT of no-wait requests) of ``ids``
    between a simulation and the measurement."""
    sim = sim_req.set_index("request_id")
    errs = []
    for m in meas[meas["request_id"].isin(ids)].itertuples():
        s = sim.loc[m.request_id]
        if s["status"] != "finished":
            continue
        if m.output_len >= 2 and math.isfinite(m.tpot_s) and math.isfinite(s["tpot_s"]):
            errs.append(abs(s["tpot_s"] - m.tpot_s) / m.tpot_s)
        if m.first_scheduled_s - m.arrival_s <= NO_WAIT_S:
            t_sim = s["first_token_s"] - s["first_scheduled_s"]
            t_meas = m.first_token_s - m.first_scheduled_s
            errs.append(abs(t_sim - t_meas) / t_meas)
    return float(np.mean(errs)) if errs else math.inf


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
) -> dict[str, Any]:  # fmt: skip
    """The whole command; returns ``{"uncalibrated", "calibrated", ...}`` and writes the
    files when ``out`` is given. Everything is checked before the first simulation, so a
    bad option costs no time. Logged requests the simulator rejects (longer than
    ``max_model_len``, or more KV than the cache holds: the log and its meta.json disagree)
    are left out of both sides' metrics and named in ``notes``."""
    check_split(split)
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise RunError(f"--out {out}: exists and is not a directory")
    gpu = resolve_gpu(hardware)
    run = read_run(run_dir, workload)
    model = resolve_model(model_arg, run)
    blocks, capacity_text = num_blocks(run, model, gpu)
    fit_ids, held_ids = split_ids(run.logged, split)
    notes = []
    if all(math.isnan(r.scheduled) for r in run.logged):
        notes.append("the log has no scheduled_ts: the queue wait is unknown, so the fit uses "
                     "TPOTs only (no TTFTs of requests scheduled at once)")  # fmt: skip
    if run.prefix_caching_dropped:
        notes.append("prefix caching is on in meta.json but the log comes without prompt token "
                     "ids (--workload): prefix caching is off in the simulation")  # fmt: skip
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
        "rejected_by_simulator": {str(k): v for k, v in sorted(rejected.items())},
        "notes": notes,
    }
    if out is not None:
        out = Path(out)
        result["simulate_command"] = simulate_command(
            run, run_dir, hardware, model_arg, blocks, workload, out / "calibration.json"
        )
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "errors.json", result)
        doc = cal_model.to_dict()
        doc.update(
            source_run=run.name,
            split=split,
            fitted_on="TPOT and no-wait TTFT of the requests before the split",
            hf_config=model.to_hf_config(),
            bounds={"constant": BOUNDS[0], "compute_scale": BOUNDS[1], "memory_scale": BOUNDS[2]},
        )
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
    kinds = ", ".join(f"{n} {REJECT_LABELS[k]}" for k, n in counts.items() if n)
    first = min(rejected)
    return (
        f"{len(rejected)} logged request(s) rejected by the simulator though vLLM served them "
        f"({kinds}; the first, request {first} of the log counting from 0: {rejected[first]}); "
        "left out of the measured and the simulated metrics: do meta.json's max_model_len and "
        "num_gpu_blocks match the run?"
    )


def simulate_command(
    run: VLLMRun, run_dir: Path, hardware: str, model_arg: str | None, blocks: int,
    workload: Path | None, calibration: Path,
) -> str:  # fmt: skip
    """The ``experiments.simulate`` call that replays the run as this tool simulated it:
    the engine settings of meta.json, the KV blocks, the token ids and the calibration."""
    sys_ = run.system
    args = ["python -m experiments.simulate system=vllm_v1"]
    if model_arg is not None and Path(model_arg).exists():
        args.append(f"model.hf_config={model_arg}")
    else:
        args.append(f"model.name={model_arg or run.model_name}")
    tail = ""
    if Path(hardware).suffix in (".yaml", ".yml"):
        yaml_path = Path(hardware)
        args.append(f"hydra.searchpath=[file://{yaml_path.parent.parent}]")
        args.append(f"hardware={yaml_path.stem}")
        tail = "  # with the hardware YAML in a folder named hardware/"
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
    return " ".join(args) + tail


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
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        result = run_calibration(
            args.run_dir, args.hardware, args.model, args.workload, args.split, args.out
        )
    except (RunError, TraceFormatError, ValueError, KeyError, FileNotFoundError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"calibrate_vllm: error: {message}", file=sys.stderr)
        return 2
    for note in result["notes"]:
        print(f"calibrate_vllm: note: {note}", file=sys.stderr)
    print(result["capacity"])
    print(result["calibrated_cost_model"])
    print(f"held-out part: {result['num_heldout_requests']} requests after the first "
          f"{result['num_fit_requests']} (split {args.split})")  # fmt: skip
    print(format_errors(result))
    print(f"wrote {args.out}/errors.json, calibration.json, calibrate_vllm.png")
    print(f"replay it with the calibration:\n  {result['simulate_command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["CONFIGS", "main", "run_calibration"]
