"""A machine whose speed drifts along a measured timeline: another cost model's step times,
each scaled by the machine's speed where the step falls in the run.

For checking a step model against runs served on a shared machine whose speed drifts (a
cloud VM, ``docs/validation/cpu-engine.md``): when the runs and the profile that prices them
are measured together, each a unit at a time in turn (``experiments.bench.interleave``),
the i-th of a run's ``expected_steps`` steps falls at progress ``i / expected_steps`` of
the sitting, where the profile's sweeps measured the machine's speed
(``experiments.bench.speed_timeline``). Nothing here is fitted to a run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from core.plan import BatchShape
from sim.cost.base import CostModel


class DriftingCostModel:
    """``inner``'s step time × ``speeds[k]``, where ``k`` is the stretch of the run the step
    falls in: ``speeds`` splits progress 0–1 into equal stretches, the i-th step (from 0)
    is at progress ``(i + 0.5) / expected_steps``, and steps past the expected count take
    the last stretch's speed. A speed is the machine's time over ``inner``'s price (1: as
    priced, above 1: slower). Prices each step once, in order (``priced_in_order``)."""

    priced_in_order = True

    def __init__(self, inner: CostModel, speeds: Sequence[float], expected_steps: int) -> None:
        if not speeds or not all(s > 0 for s in speeds):
            raise ValueError(f"speeds must be a non-empty list of positive numbers, got {speeds}")
        if expected_steps < 1:
            raise ValueError(f"expected_steps must be >= 1, got {expected_steps}")
        self.inner, self.speeds = inner, [float(s) for s in speeds]
        self.expected_steps = expected_steps
        self.steps_priced = 0

    def speed_at(self, step: int) -> float:
        """The speed of the stretch the ``step``-th step (from 0) falls in."""
        progress = (step + 0.5) / self.expected_steps
        return self.speeds[min(int(progress * len(self.speeds)), len(self.speeds) - 1)]

    def speeds_of(self, steps: int) -> np.ndarray:
        """:meth:`speed_at` of steps ``0 .. steps - 1``, as an array."""
        return np.array([self.speed_at(i) for i in range(steps)], dtype=float)

    def step_time(self, shape: BatchShape) -> float:
        speed = self.speed_at(self.steps_priced)
        self.steps_priced += 1
        return self.inner.step_time(shape) * speed

    def describe(self) -> str:
        low, high = min(self.speeds), max(self.speeds)
        return (
            f"{self.inner.describe()}; each step scaled by the machine's measured speed where "
            f"it falls in the run ({len(self.speeds)} stretches over {self.expected_steps} "
            f"expected steps, {low:.2f}-{high:.2f} of the price)"
        )
