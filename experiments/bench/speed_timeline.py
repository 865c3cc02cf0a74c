"""The machine's speed through an interleaved sitting, as its operator profile measured it.

An interleaved sitting (:mod:`experiments.bench.sitting`) spreads the profile's sweeps over
the whole sitting, so sweep ``j`` of ``K`` is the sitting's progress ``j/K`` to ``(j+1)/K``.
Each sweep, cut into stretches in the order its units were timed, says how fast the machine
ran there: the stretch's summed time over the summed price (``time_ms``, each point's mean
over the sweeps), so 1 is the price and 1.1 a stretch that ran 10% slow
(:func:`speed_timeline`; :class:`sim.cost.drifting.DriftingCostModel` prices steps at it).

A stretch holds a few dozen units, so its speed also carries their scatter. On a machine
that holds its speed that scatter is all there is, and a timeline taken as measured only
adds it to every price. :func:`shrink_to_price` weighs each stretch's departure from the
price against its own standard error (:func:`stretches`: the ratio estimator's, from its
units' residuals) and keeps only what the stretches differ by beyond it: a random-effects
estimate (DerSimonian and Laird, Controlled Clinical Trials 7:177, 1986), with the mean held
at the price. A steady machine's timeline comes out near 1; a drifting one's nearly as
measured. Nothing here is fitted to a run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.bench import profile_gpu
from experiments.bench.cold_sweep import cold_sweeps


@dataclass(frozen=True)
class Stretch:
    """One stretch of a sitting: its speed (time over price), the variance of that estimate
    (``inf`` with fewer than two units, which say nothing of their scatter) and its units.
    ``copies``: where its units were cold calls (:mod:`experiments.bench.cold_sweep`), the
    index of the stretch whose speed it takes: the same place in the first measured sweep
    (one sweep later, and in a sorted sweep the same points); its variance is infinite."""

    speed: float
    variance: float
    units: int
    copies: int | None = None


class UnknownScatter(ValueError):
    """No stretch's scatter is known: :func:`shrink_to_price` has nothing to weigh by."""


@dataclass(frozen=True)
class ShrunkTimeline:
    """:func:`shrink_to_price`'s answer. ``speeds``: each stretch's speed, shrunk toward 1 by
    its weight ``tau² / (tau² + variance)``; ``tau``: the spread of the machine's speed between
    stretches beyond their own scatter (0: none shows); ``q``: the
    heterogeneity statistic, ``Σ (speed − 1)² / variance``, and ``counted``, the stretches
    it sums over (its expectation when the machine held its speed)."""

    speeds: list[float]
    tau: float
    q: float
    counted: int

    def as_dict(self) -> dict[str, object]:
        return {
            "speeds": self.speeds, "tau": self.tau, "q": self.q, "counted": self.counted,
        }  # fmt: skip


def stretches(
    profile_dir: str | Path,
    stretches_per_sweep: int = 1,
    rows: Callable[[pd.DataFrame], pd.Series] | None = None,
) -> list[Stretch] | None:
    """Each stretch of the sitting, in order: with ``stretches_per_sweep`` = m each sweep's
    units, in the order its ``sweep_units`` column records, are cut into m runs of equal
    count, m·K stretches in all (m at most the units of a sweep). A profile without that
    column (taken before it was written) gives one stretch per sweep. The stretches of the
    first ``cold_sweeps`` sweeps (the sidecar's; :mod:`experiments.bench.cold_sweep`) say
    nothing of the machine: each takes the speed of the same place in the first measured
    sweep (``copies``). None with fewer than two sweeps, none after the cold ones, or a
    ragged ``sweeps_ms``.

    ``rows`` (the profile's table → a boolean mask) times only those points: the stretches
    are cut as for the whole profile, so the same stretch covers the same time whatever the
    mask, and a stretch none of whose units holds a chosen point is at the price (1) with
    infinite variance."""
    profile = pd.read_csv(Path(profile_dir) / "operator_profile.csv")
    sidecar = Path(profile_dir) / "operator_profile.json"
    cold = cold_sweeps(json.loads(sidecar.read_text())) if sidecar.is_file() else 0
    if "sweeps_ms" not in profile:
        return None
    sweeps = [profile_gpu.parse_sweeps(cell) for cell in profile["sweeps_ms"]]
    count = len(sweeps[0]) if sweeps else 0
    if count < 2 or any(len(row) != count for row in sweeps):
        return None
    price = profile["time_ms"].to_numpy(dtype=float)
    if "sweep_units" in profile:
        units = [profile_gpu.parse_units(cell) for cell in profile["sweep_units"]]
    else:  # where in a sweep each point fell is unknown: the sweep is one unit
        units = [[0] * count for _ in sweeps]
    per_sweep = min(len({row[j] for row in units}) for j in range(count))
    stretches_per_sweep = min(stretches_per_sweep, per_sweep)
    if cold >= count:
        return None
    chosen = np.ones(len(profile), bool) if rows is None else np.asarray(rows(profile), bool)
    out = []
    for j in range(count):
        by_unit: dict[int, list[float]] = {}  # unit → [time, price] of its chosen points
        for row, unit_row, p, keep in zip(sweeps, units, price, chosen, strict=True):
            cell = by_unit.setdefault(unit_row[j], [0.0, 0.0])
            if keep:
                cell[0], cell[1] = cell[0] + row[j], cell[1] + p
        ordered = np.array([by_unit[u] for u in sorted(by_unit)])
        for part in np.array_split(ordered, stretches_per_sweep):
            part = part[part[:, 1] > 0]
            if j < cold:  # the same stretch of the first measured sweep
                source = cold * stretches_per_sweep + len(out) % stretches_per_sweep
                out.append(Stretch(float("nan"), float("inf"), len(part), copies=source))
            elif not len(part):
                out.append(Stretch(1.0, float("inf"), 0))
            else:
                out.append(_ratio(part[:, 0], part[:, 1]))
    speeds = _copied(out, [s.speed for s in out])
    return [replace(s, speed=v) for s, v in zip(out, speeds, strict=True)]


def _copied(found: list[Stretch], speeds: list[float]) -> list[float]:
    """``speeds`` (one per stretch of ``found``) with each cold stretch's entry that of the
    stretch it copies."""
    return [v if s.copies is None else speeds[s.copies] for s, v in zip(found, speeds, strict=True)]


def _ratio(time: np.ndarray, price: np.ndarray) -> Stretch:
    """The ratio estimator ``Σ time / Σ price`` and its variance over the units (the
    linearised form: the units' residuals from the ratio, squared, over the squared total)."""
    speed = float(time.sum() / price.sum())
    n = len(time)
    if n < 2:
        return Stretch(speed, float("inf"), n)
    residual = time - speed * price
    variance = float(n / (n - 1) * (residual**2).sum() / price.sum() ** 2)
    return Stretch(speed, variance, n)


def speed_timeline(profile_dir: str | Path, stretches_per_sweep: int = 1) -> list[float] | None:
    """Each stretch's speed as measured (:func:`stretches`), or None."""
    found = stretches(profile_dir, stretches_per_sweep)
    return None if found is None else [s.speed for s in found]


def shrink_to_price(found: list[Stretch]) -> ShrunkTimeline:
    """Each stretch's speed shrunk toward the price (1) by how much the stretches differ
    beyond their own scatter. With ``w = 1 / variance`` (0 for an infinite one) and
    ``Q = Σ w (speed − 1)²`` over the k stretches of finite, positive variance, the moments'
    spread is ``tau² = max(0, (Q − k) / Σ w)`` (``E[Q] = k + tau² Σ w``, the mean known);
    a stretch keeps ``tau² / (tau² + variance)`` of its departure. A stretch of zero variance
    keeps all of it, one of infinite variance none, and a cold one the shrunk speed of the
    stretch it copies. :class:`UnknownScatter` when no stretch has a finite variance (each
    holds fewer than two units, as in a profile that did not record where its points fell
    in each sweep): how much the stretches differ beyond their scatter cannot be told then,
    which is not the same as their not differing."""
    if not found:
        raise ValueError("no stretches to shrink")
    if not any(np.isfinite(s.variance) for s in found if s.copies is None):
        raise UnknownScatter(
            "no stretch of the sitting's profile holds two units or more, so their scatter is "
            "unknown and the speed cannot be shrunk by it (a profile without sweep_units: "
            "python -m experiments.bench.fill_sweep_units fills them in from the plan's order)"
        )
    positive = [s for s in found if np.isfinite(s.variance) and s.variance > 0]
    weights = np.array([1.0 / s.variance for s in positive])
    q = float(sum(w * (s.speed - 1.0) ** 2 for w, s in zip(weights, positive, strict=True)))
    tau2 = max(0.0, (q - len(positive)) / weights.sum()) if len(positive) else 0.0
    speeds = []
    for s in found:
        if s.variance == 0:
            keep = 1.0
        elif not np.isfinite(s.variance) or tau2 == 0:
            keep = 0.0
        else:
            keep = tau2 / (tau2 + s.variance)
        speeds.append(1.0 + keep * (s.speed - 1.0))
    speeds = _copied(found, speeds)
    return ShrunkTimeline(speeds, float(np.sqrt(tau2)), q, len(positive))


if __name__ == "__main__":
    from experiments.bench.tables import not_a_command

    not_a_command("experiments.bench.speed_timeline", "experiments.bench.cpu_cross_run, "
                  "cpu_error_parts and speed_by_op")  # fmt: skip
