"""Step-time model fitted to measured engine steps on roofline basis terms.

``duration ≈ c0 + c1 · t_linear + c2 · t_attn + c3 · t_bytes + c4 · n_seqs + c5 · n_prefill``
with all ``c ≥ 0``, where the basis times are at datasheet peak (efficiency 1):
``t_linear`` = linear-layer FLOPs / peak, ``t_attn`` = attention FLOPs / peak, ``t_bytes`` =
(weights + activations + K/V read and written) / bandwidth, all from
:func:`sim.cost.work.count_work`; ``n_seqs`` = sequences in the step (prefill + decode) and
``n_prefill`` = prefill sequences in the step. ``c0`` is the per-step overhead, ``1 / c1``
reads as the matmul efficiency, ``c4`` is the host work per sequence per step (block
tables, sampling: what the CPU engine pays in Python for every sequence it runs) and
``c5`` the extra host work of a sequence's prefill (its input preparation). Swaps and block
copies are not fitted; they are priced by the roofline model at default efficiency and
added.

The two per-sequence terms came later than the other four: coefficients (and
``calibration.json`` files) without them still load, with the term at 0.

With an operator ``profile`` of the same model measured on the same device (kvlab's
format, ``experiments.bench.profile_gpu``), the operators' times come from the profile as
measured (:class:`~sim.cost.profiled.ProfiledCostModel`, ``as_measured``) and only
``c0``, ``c4`` and ``c5`` are fitted, to what the profile does not see: the framework's
per-step and per-sequence work and what running all layers in one step costs beyond
timing each operator alone. ``c1``–``c3`` are 0. The profile carries the shape a few
constants cannot: on a CPU, matrix products are not monotone in rows (a one-row product
runs a different kernel), so a roofline basis fitted on one mix of batch sizes misprices
another (``docs/validation/cpu-engine.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from core.defaults import DEFAULT_BLOCK_SIZE
from core.metrics.phases import PHASE_COLUMNS
from core.model_spec import DTYPE_BYTES
from core.plan import BatchShape
from sim.catalog import GPUSpec, ModelSpec, get_gpu, get_model
from sim.cost.profiled import ProfiledCostModel
from sim.cost.roofline import RooflineCostModel
from sim.cost.work import count_work, shape_counts

TERMS = (
    "constant",
    "linear_flop_time",
    "attn_flop_time",
    "byte_time",
    "per_sequence",
    "per_prefill_sequence",
)
# the terms a coefficient set must name; the others default to 0 (files written before them)
CORE_TERMS = TERMS[:4]
REQUIRED_COLUMNS = (
    "prefill_tokens",
    "prefill_attn_pairs",
    "prefill_kv_read_tokens",
    "decode_seqs",
    "decode_ctx_tokens",
    "duration_s",
)
# how fit weighs the steps' errors (see CalibratedCostModel.fit)
WEIGHTINGS = ("absolute", "relative")
# what the terms on top of a profile are fitted to (see CalibratedCostModel.fit)
TARGETS = ("step", "host")
# a steps table's columns of the six counts, in :func:`sim.cost.work.shape_counts`' order
COUNT_COLUMNS = (
    "prefill_tokens",
    "prefill_seqs",
    "prefill_attn_pairs",
    "prefill_kv_read_tokens",
    "decode_seqs",
    "decode_ctx_tokens",
)
# the terms a profile replaces (their coefficients are 0 when fitted on top of a profile)
ROOFLINE_TERMS = ("linear_flop_time", "attn_flop_time", "byte_time")
# the fit statistics that are words (the fit's options); every other one is a number
WORD_STATS = ("weighting", "target")


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """Solve ``min ||a x − b||₂`` subject to ``x ≥ 0`` (Lawson–Hanson active set).

    Variables enter the passive set one at a time by largest gradient; an unconstrained
    least-squares solve on the passive set is accepted if positive, otherwise the step is
    cut back to the boundary and the variables that hit zero leave.
    """
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * np.linalg.norm(a, 1) * max(m, n)
    for _ in range(max_iter or 3 * n):
        w = a.T @ (b - a @ x)
        if passive.all() or w[~passive].max() <= tol:
            break
        j = np.flatnonzero(~passive)[np.argmax(w[~passive])]
        passive[j] = True
        for _ in range(n + 1):
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > tol).all():
                x = z
                break
            shrinking = passive & (z <= tol) & (x > z)
            if not shrinking.any():  # the entering variable cannot grow: numerically optimal
                passive &= z > tol
                break
            alpha = np.min(x[shrinking] / (x[shrinking] - z[shrinking]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        else:
            break
    return x


def _count_arrays(steps: pd.DataFrame, dtype: type) -> list[np.ndarray]:
    """A steps table's :data:`COUNT_COLUMNS` as arrays of ``dtype`` (a missing column,
    such as ``prefill_seqs`` in older tables: zeros)."""
    zeros = np.zeros(len(steps), dtype=dtype)
    return [steps[c].to_numpy(dtype=dtype) if c in steps else zeros for c in COUNT_COLUMNS]


class CalibratedCostModel:
    """Linear model on roofline basis terms, or on top of an operator ``profile`` (module
    doc); build it with :meth:`fit`."""

    def __init__(
        self,
        model: ModelSpec | str,
        gpu: GPUSpec | str,
        coefficients: Mapping[str, float],
        tp: int = 1,
        dtype_bytes: int = 2,
        block_size: int = DEFAULT_BLOCK_SIZE,
        fit_stats: Mapping[str, float | str] | None = None,
        profile: str | None = None,
    ) -> None:
        missing = [t for t in CORE_TERMS if t not in coefficients]
        if missing:
            raise ValueError(f"calibrated coefficients lack {missing}; need {CORE_TERMS}")
        unknown = [t for t in coefficients if t not in TERMS]
        if unknown:
            raise ValueError(f"calibrated coefficients name unknown terms {unknown}; know {TERMS}")
        coefficients = {t: coefficients.get(t, 0.0) for t in TERMS}
        bad = {t: coefficients[t] for t in TERMS if not 0.0 <= float(coefficients[t]) < np.inf}
        if bad:
            raise ValueError(f"calibrated coefficients must be finite and >= 0, got {bad}")
        self.roofline = RooflineCostModel(
            get_model(model), get_gpu(gpu), tp, dtype_bytes, block_size=block_size
        )
        self.coefficients = {t: float(coefficients[t]) for t in TERMS}
        self.fit_stats = dict(fit_stats or {})
        rf = self.roofline
        self._c = tuple(self.coefficients[t] for t in TERMS)
        self._peak, self._bw = rf.gpu.peak_flops, rf.gpu.mem_bandwidth
        self.profile = None if profile is None else str(profile)
        self._profiled = (
            None
            if profile is None
            else ProfiledCostModel(
                profile, rf.model, rf.gpu, tp, dtype_bytes, block_size, as_measured=True
            )
        )

    def basis(self, *counts: Any) -> tuple[Any, ...]:
        """The basis values in ``TERMS`` order (scalars or numpy arrays, elementwise): one,
        the three basis times in seconds, sequences in the step, prefill sequences.
        ``counts``: the six step counts :func:`sim.cost.work.count_work` takes, in its
        order (:data:`COUNT_COLUMNS`)."""
        lf, lb, af, ab = count_work(self.roofline.work_coefficients, *counts)
        lin, attn, byte = lf / self._peak, af / self._peak, (lb + ab) / self._bw
        prefill_seqs, decode_seqs = counts[1], counts[4]
        seqs = prefill_seqs + decode_seqs
        return 1.0 + 0.0 * lin, lin, attn, byte, seqs + 0.0 * lin, prefill_seqs + 0.0 * lin

    @classmethod
    def fit(
        cls,
        steps: pd.DataFrame,
        model: ModelSpec | str,
        gpu: GPUSpec | str,
        tp: int = 1,
        dtype_bytes: int = 2,
        block_size: int = DEFAULT_BLOCK_SIZE,
        weighting: str = "absolute",
        profile: str | None = None,
        target: str = "step",
    ) -> CalibratedCostModel:
        """Non-negative least squares of ``steps.duration_s`` on the basis terms.

        ``steps`` needs the columns in ``REQUIRED_COLUMNS``; ``prefill_seqs`` is optional
        (missing: 0, so prefill LM-head FLOPs and the prefill sequences go uncounted and
        ``per_prefill_sequence`` fits to 0). Rows with no tokens (swap-only
        steps) are dropped. ``weighting`` (one of ``WEIGHTINGS``): ``absolute`` minimizes
        the squared error in seconds, so the longest steps (large prefills) dominate;
        ``relative`` minimizes the squared relative error, so a 50 ms decode step counts as
        much as a 2 s prefill (every kind of step in the run constrains the fit, which is
        what predicting another run's mix needs). ``profile``: an operator profile of this
        model on the measured device; then the fit is of ``duration_s`` minus the
        profile's operator seconds, on the constant and per-sequence terms only (module
        doc). ``target`` (one of ``TARGETS``, with a profile): ``step`` fits those terms to
        what the profile leaves of each step's duration, so they also absorb the profile's
        errors on this run's shapes, which then travel to other runs; ``host`` fits them to
        the step's measured time outside the model's forward and the block transfers
        (``duration_s - forward_s - transfer_s``, the engine's phase timing: input
        preparation and sampling), the framework overhead they stand for (transfers are
        priced apart, as always). With a ``transfer_s`` column (phase timing) the step
        target is ``duration_s - transfer_s`` too: the simulator prices swaps and copies by
        themselves, so they are not fitted twice. ``fit_stats`` records ``r2`` (NaN when the
        steps' times barely differ) and ``mape`` (of the step less its measured transfers),
        ``n_steps``, ``weighting`` and ``target``. A run whose every step took 0 s is a
        ValueError.
        """
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting {weighting!r} is not one of {', '.join(WEIGHTINGS)}")
        if target not in TARGETS:
            raise ValueError(f"target {target!r} is not one of {', '.join(TARGETS)}")
        if target == "host" and profile is None:
            raise ValueError("target 'host' fits on top of an operator profile; give one")
        if target == "host" and "forward_s" not in steps.columns:
            raise ValueError("target 'host' needs the steps' forward_s (phase timing)")
        missing = [c for c in REQUIRED_COLUMNS if c not in steps.columns]
        if missing:
            raise ValueError(f"steps table lacks columns {missing}; need {REQUIRED_COLUMNS}")
        check_step_numbers(steps)
        df = steps[(steps["prefill_tokens"] + steps["decode_seqs"]) > 0]
        if len(df) < len(TERMS):
            raise ValueError(f"need at least {len(TERMS)} non-empty steps to fit, got {len(df)}")
        probe = cls(
            model, gpu, dict.fromkeys(TERMS, 0.0), tp, dtype_bytes, block_size, profile=profile
        )
        a = probe.basis_matrix(df)
        if profile is not None:
            a[:, [TERMS.index(t) for t in ROOFLINE_TERMS]] = 0.0
        base = probe.profile_seconds(df)
        y = df["duration_s"].to_numpy(dtype=float)
        if not (y > 0).any():
            raise ValueError("every step's duration_s is 0: there is no time to calibrate")
        if "transfer_s" in df.columns:  # swaps and copies are priced apart, not fitted
            y = y - df["transfer_s"].to_numpy(dtype=float)
        fit_to = y - base
        if target == "host":
            fit_to = host_seconds(df)
        if weighting == "relative":
            if not (y > 0).all():
                raise ValueError("relative weighting needs every step's duration_s > 0")
            w = 1.0 / y
        else:
            w = np.ones_like(y)
        aw = a * w[:, None]
        scale = np.linalg.norm(aw, axis=0)
        scale[scale == 0] = 1.0
        coef = nnls(aw / scale, fit_to * w) / scale
        pred = a @ coef + base
        ss_res = float(np.sum((y - pred) ** 2))
        ss_tot = float(np.sum((y - y.mean()) ** 2))
        spread = ss_tot > 1e-12 * float(np.sum(y**2))  # steps all alike: R² undefined
        pos = y > 0
        stats: dict[str, float | str] = {
            "n_steps": float(len(df)),
            "r2": 1.0 - ss_res / ss_tot if spread else float("nan"),
            "mape": float(np.mean(np.abs(pred[pos] - y[pos]) / y[pos])) if pos.any() else 0.0,
            "weighting": weighting,
            "target": target,
        }
        return cls(
            model, gpu, dict(zip(TERMS, coef, strict=True)), tp, dtype_bytes, block_size, stats,
            profile,
        )  # fmt: skip

    def basis_matrix(self, steps: pd.DataFrame) -> np.ndarray:
        """The basis values of every row of a steps table, ``[rows, len(TERMS)]``
        (``prefill_seqs`` missing: 0)."""
        return np.column_stack(self.basis(*_count_arrays(steps, float)))

    def _profile_rows(
        self, steps: pd.DataFrame, price: Callable[[ProfiledCostModel, BatchShape], float]
    ) -> np.ndarray:
        """``price(profile, shape)`` of every row of a steps table (0 without a profile;
        ``prefill_seqs`` missing: 0)."""
        out = np.zeros(len(steps))
        if self._profiled is None:
            return out
        for i, counts in enumerate(zip(*_count_arrays(steps, int), strict=True)):
            out[i] = price(self._profiled, BatchShape(*(int(x) for x in counts)))
        return out

    def profile_seconds(self, steps: pd.DataFrame) -> np.ndarray:
        """The profile's operator seconds of every row of a steps table (0 without a
        profile; ``prefill_seqs`` missing: 0)."""
        return self._profile_rows(steps, ProfiledCostModel.gpu_seconds)

    def profile_decode_attention(self, steps: pd.DataFrame) -> np.ndarray:
        """The decode-attention part of :meth:`profile_seconds`, row by row
        (:meth:`ProfiledCostModel.decode_attention_seconds`; 0 without a profile)."""
        return self._profile_rows(steps, ProfiledCostModel.decode_attention_seconds)

    def predict_steps(self, steps: pd.DataFrame) -> np.ndarray:
        """Fitted seconds of every row of a steps table, open loop (the measured batches,
        not the simulator's): the model's error with the queue taken out. Transfers are
        not included (the fit does not price them either)."""
        return self.basis_matrix(steps) @ np.asarray(self._c) + self.profile_seconds(steps)

    def step_time(self, shape: BatchShape) -> float:
        """Fitted seconds for ``shape`` plus roofline swap/copy time; 0 when empty."""
        if shape.is_empty:
            return 0.0
        t = self.roofline.transfer_time(shape)
        if shape.prefill_tokens + shape.decode_seqs:
            b = self.basis(*shape_counts(shape))
            t += sum(c * v for c, v in zip(self._c, b, strict=True))
            if self._profiled is not None:
                t += self._profiled.gpu_seconds(shape)
        return t

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready parameters; ``from_dict`` rebuilds the model."""
        rf = self.roofline
        doc: dict[str, Any] = {
            "kind": "calibrated",
            "model": rf.model.name,
            "gpu": rf.gpu.name,
            "tp": rf.tp,
            "dtype_bytes": rf.dtype_bytes,
            "block_size": rf.block_size,
            "coefficients": dict(self.coefficients),
            "fit_stats": dict(self.fit_stats),
        }
        if self.profile is not None:
            doc["profile"] = self.profile
        return doc

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], gpu: GPUSpec | None = None) -> CalibratedCostModel:
        """The model of a :meth:`to_dict` document; a ValueError names a malformed key.
        ``gpu``: the spec to price on, for a GPU the catalog does not hold (a user's own,
        named as the document names it)."""
        check_calibration_doc(d)
        if gpu is None and "gpu" not in d:
            raise ValueError("gpu: missing (the GPU the model was fitted for)")
        return cls(
            d["model"],
            d["gpu"] if gpu is None else gpu,
            d["coefficients"],
            d.get("tp", 1),
            d.get("dtype_bytes", 2),
            d.get("block_size", DEFAULT_BLOCK_SIZE),
            d.get("fit_stats"),
            d.get("profile"),
        )

    def describe(self) -> str:
        """Coefficients with their reading, what they were fitted on, the constants that
        price swaps and block copies (not fitted) with their sources, and the fit error
        (only the statistics the fit recorded)."""
        rf, c, s = self.roofline, self.coefficients, self.fit_stats
        # experiments.calibrate records n_steps (engine steps); calibrate_vllm, n_signals
        # (per-request TPOT and no-wait TTFT of a vLLM run)
        fitted_on = (
            "fit on per-request signals (TPOT, no-wait TTFT) of a vLLM run"
            if "n_signals" in s
            else f"NNLS fit ({s.get('weighting', 'absolute')} errors) on engine step measurements"
        )
        lines = [f"calibrated cost model: {rf.model.name} on {rf.tp} × {rf.gpu.name}, {fitted_on}"]
        if self._profiled is not None:
            lines.append(
                f"  operator times: {self._profiled.profile.source}, as measured; the terms "
                "below are fitted on top"
            )
        lines.append(f"  constant (per-step overhead) {c['constant'] * 1e3:10.4f} ms")
        for term, reading in (
            ("linear_flop_time", "1/matmul efficiency"),
            ("attn_flop_time", "1/attention compute efficiency"),
            ("byte_time", "1/memory efficiency"),
        ):
            lines.append(f"  {term:<28} {c[term]:10.4f}  ({reading})")
        for term, reading in (
            ("per_sequence", "per sequence in the step"),
            ("per_prefill_sequence", "extra per prefill sequence"),
        ):
            lines.append(f"  {term:<28} {c[term] * 1e3:10.4f} ms ({reading})")
        eff, g = rf.efficiency, rf.gpu
        src = {
            k: g.source.get(k, "no source given") for k in ("host_link_gbs", "mem_bandwidth_gbs")
        }
        link = (
            f"{eff.pcie_bandwidth / 1e9:g} GB/s per direction ({eff.source['pcie_bandwidth']})"
            if eff.pcie_bandwidth
            else f"{g.host_link_bandwidth / 1e9:g} GB/s per direction ({src['host_link_gbs']})"
        )
        lines += [
            "  swaps and device block copies, not fitted, are priced by the roofline:",
            f"    swaps over the host link at {link}",
            f"    copies at {eff.memory:g} of HBM {g.mem_bandwidth / 1e9:g} GB/s "
            f"({eff.source['memory']}; {src['mem_bandwidth_gbs']})",
        ]
        s = {k: v for k, v in s.items() if v is not None}
        stats = [
            text
            for key, text in (
                ("n_steps", f"n_steps={s.get('n_steps', 0):.0f}"),
                ("n_signals", f"n_signals={s.get('n_signals', 0):.0f}"),
                ("r2", f"R²={s.get('r2', 0):.4f}"),
                ("mape", f"MAPE={s.get('mape', 0):.2%}"),
            )
            if key in s
        ]
        if stats:
            lines.append("  fit: " + " ".join(stats))
        return "\n".join(lines)


def check_step_numbers(steps: pd.DataFrame) -> None:
    """Every count and time column a fit reads (the engine's phase times included) is a
    finite number >= 0; else a ValueError naming the column and the first bad row
    (counting data rows from 1)."""
    for col in (*REQUIRED_COLUMNS, *COUNT_COLUMNS, *PHASE_COLUMNS):
        if col not in steps.columns:
            continue
        values = pd.to_numeric(steps[col], errors="coerce").to_numpy(dtype=float)
        bad = ~(np.isfinite(values) & (values >= 0))
        if bad.any():
            row = int(np.argmax(bad))
            value = steps[col].iloc[row]
            shown = repr(value) if isinstance(value, str) else str(value)
            raise ValueError(f"column {col}, row {row + 1}: {shown} is not a finite number >= 0")


def check_calibration_doc(d: Mapping[str, Any]) -> None:
    """A calibration document's fields have the types :meth:`CalibratedCostModel.from_dict`
    reads (``dtype_bytes`` one of the widths of :data:`core.model_spec.DTYPE_BYTES`,
    ``profile`` a path or null, ``fit_stats`` numbers but for :data:`WORD_STATS`); else a
    ValueError naming the key."""
    if not isinstance(d.get("coefficients"), Mapping):
        raise ValueError(f"coefficients: expected a mapping of term to value, got "
                         f"{d.get('coefficients')!r}")  # fmt: skip
    if not isinstance(d.get("model"), str):
        raise ValueError(f"model: expected the model's name, got {d.get('model')!r}")
    if "gpu" in d and not isinstance(d["gpu"], str):
        raise ValueError(f"gpu: expected a name, got {d['gpu']!r}")
    for key, default in (("tp", 1), ("dtype_bytes", 2), ("block_size", DEFAULT_BLOCK_SIZE)):
        value = d.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}: expected a whole number >= 1, got {value!r}")
    widths = sorted(set(DTYPE_BYTES.values()))
    if d.get("dtype_bytes", 2) not in widths:
        raise ValueError(f"dtype_bytes: expected one of {widths} (bytes per element of "
                         f"{', '.join(DTYPE_BYTES)}), got {d['dtype_bytes']!r}")  # fmt: skip
    if d.get("profile") is not None and not isinstance(d["profile"], str):
        raise ValueError(f"profile: expected a path or null, got {d['profile']!r}")
    stats = d.get("fit_stats")
    if stats is not None and not isinstance(stats, Mapping):
        raise ValueError(f"fit_stats: expected a mapping, got {stats!r}")
    for key, value in (stats or {}).items():
        kind = str if key in WORD_STATS else int | float
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            wanted = "a word" if key in WORD_STATS else "a number"
            raise ValueError(f"fit_stats.{key}: expected {wanted} or null, got {value!r}")
    for term, value in d["coefficients"].items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"coefficients.{term}: expected a number, got {value!r}")


def host_seconds(steps: pd.DataFrame) -> np.ndarray:
    """Each step's measured time outside the forward: ``duration_s - forward_s -
    transfer_s`` (``transfer_s`` missing: 0), what the host target fits (the engine's phase
    timing: input preparation and sampling)."""
    host = steps["duration_s"].to_numpy(dtype=float) - steps["forward_s"].to_numpy(dtype=float)
    if "transfer_s" in steps.columns:
        host = host - steps["transfer_s"].to_numpy(dtype=float)
    return host
