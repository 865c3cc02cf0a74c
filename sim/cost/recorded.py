"""Replay of measured step times, so the simulator can re-run the engine's schedule."""

from __future__ import annotations

from collections.abc import Sequence

from core.plan import BatchShape


class RecordedStepsExhausted(IndexError):
    """The simulation asked for a step beyond the recording: the replay diverged."""


class RecordedCostModel:
    """Returns ``step_times[i]`` for the i-th call of :meth:`step_time`, in order.

    The shape is ignored: with the same policy and trace the simulator makes the same
    decisions as the engine, so the i-th step is the same step. Raises
    :class:`RecordedStepsExhausted` (an ``IndexError``) when asked for more steps than were
    recorded, or, given ``then``, prices every step past the recording at ``then`` seconds
    (to see where a replay that outran the recording parted from it).
    """

    priced_in_order = True  # the i-th call answers the i-th step (sim.cost.base)

    def __init__(self, step_times: Sequence[float], then: float | None = None) -> None:
        times = [float(t) for t in step_times]
        bad = [(i, t) for i, t in enumerate(times) if not t >= 0.0]
        if bad:
            i, t = bad[0]
            raise ValueError(f"recorded step time {i} is {t}; step times must be >= 0")
        self._times = times
        self._next = 0
        self._then = then

    @property
    def steps_used(self) -> int:
        return self._next

    @property
    def steps_left(self) -> int:
        return len(self._times) - self._next

    def step_time(self, shape: BatchShape) -> float:
        if self._next >= len(self._times):
            if self._then is not None:
                return self._then
            raise RecordedStepsExhausted(
                f"recorded cost model ran out of step times after "
                f"{len(self._times)} steps; the replay diverged from the recording"
            )
        t = self._times[self._next]
        self._next += 1
        return t

    def describe(self) -> str:
        return f"recorded cost model: replays {len(self._times)} measured step times in order"
