"""The fit of ``calibrate_vllm``: three bounded constants of
:class:`sim.cost.CalibratedCostModel` (a per-step overhead, a compute and a memory time
scale) fitted to a vLLM run's TPOTs and no-wait TTFTs of the requests before the split,
re-simulating the run after each round (see :mod:`experiments.calibrate_vllm`)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

from core.model_spec import ModelSpec
from experiments.lib.vllm_run import RunError, VLLMRun, measured_frame, run_simulation
from sim.catalog import GPUSpec
from sim.cost import CalibratedCostModel

NO_WAIT_S = 0.05  # "scheduled at once": below one decode step of a 7-8B model (~30 ms)
ROUNDS = 6
DAMPING = 0.5
EPS = 1e-9  # seconds: step ends and request timestamps are the same sums of floats
# (lower, upper) of c0 [s], compute time scale, memory time scale.
BOUNDS = ((0.0, 0.1), (1.0, 20.0), (1.0, 20.0))


def bounds_line(coefficients: dict[str, float]) -> str:
    """The three fitted constants against their :data:`BOUNDS`, naming each one the fit left
    at a bound (it did not move it: the signals asked for less, or more, than the bound
    allows), and how to read the scales beside the uncalibrated roofline."""
    values = (
        ("per-step constant", coefficients["constant"], BOUNDS[0], 1e3, " ms"),
        ("compute time scale", coefficients["linear_flop_time"], BOUNDS[1], 1.0, ""),
        ("memory time scale", coefficients["byte_time"], BOUNDS[2], 1.0, ""),
    )
    parts = []
    for name, value, (lo, hi), unit, suffix in values:
        at = ""
        if math.isclose(value, lo, rel_tol=1e-9, abs_tol=1e-12):
            at = ", at its lower bound"
        elif math.isclose(value, hi, rel_tol=1e-9, abs_tol=1e-12):
            at = ", at its upper bound"
        parts.append(f"{name} {value * unit:.4g}{suffix} (in [{lo * unit:g}, {hi * unit:g}]{at})")
    return (
        "fitted: " + "; ".join(parts) + ". A scale multiplies its term's time at the "
        "datasheet peak, and the calibrated terms add, where the uncalibrated roofline takes "
        "the larger of compute and memory time at its default efficiencies: a scale of 1 is "
        "not a faster model than the roofline"
    )


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
