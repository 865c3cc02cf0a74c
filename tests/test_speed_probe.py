"""The CPU speed probe and the engine's probed step timer."""

from __future__ import annotations

from collections import deque
from itertools import count

import pytest

from engine.speed_probe import NOMINAL_S, SpeedProbe
from tests.engine_helpers import make_engine, requests


def test_probe_samples_every_nth_call_and_scales_by_the_recent_median() -> None:
    probe = SpeedProbe(every=3, window=2)
    scales = [probe.scale() for _ in range(7)]  # calls 0, 3 and 6 sample
    assert len(probe.samples) == 3 and all(s > 0 for s in probe.samples)
    assert all(k > 0 for k in scales)
    probe.recent = deque([0.002, 0.004], maxlen=2)
    assert probe.scale() == pytest.approx(NOMINAL_S / 0.003)  # call 7: no new sample
    assert len(probe.samples) == 3
    summary = probe.summary()
    assert summary["samples"] == 3 and summary["min_s"] <= summary["median_s"] <= summary["max_s"]
    with pytest.raises(ValueError, match=">= 1"):
        SpeedProbe(every=0)


class _FixedScale:
    def __init__(self, k: float) -> None:
        self.k = k

    def scale(self) -> float:
        return self.k


def test_probed_engine_scales_every_step_and_phase_and_keeps_the_tokens() -> None:
    """With a clock that ticks one second per read, a probe scale of 2 doubles every step's
    duration and phase, and nothing else changes (same tokens, same steps)."""
    reqs = requests([(5, 4), (6, 5), (4, 3)], [0.0, 0.01, 0.02])
    results = {}
    for k in (1.0, 2.0):
        engine = make_engine()
        ticks = count()
        engine.step_timer = lambda ticks=ticks: float(next(ticks))
        engine.speed_probe = _FixedScale(k)  # type: ignore[assignment]
        engine.reset()
        results[k] = engine.generate(reqs, mode="offline")
    one, two = results[1.0], results[2.0]
    assert two.outputs == one.outputs
    d1 = one.recorder.steps_frame()["duration_s"].to_numpy()
    d2 = two.recorder.steps_frame()["duration_s"].to_numpy()
    assert len(d1) == len(d2) and (d1 > 0).all()
    assert d2 == pytest.approx(2 * d1)
    assert two.phases.to_numpy() == pytest.approx(2 * one.phases.to_numpy())


def test_thread_cpu_probed_engine_records_its_probes() -> None:
    engine = make_engine()
    engine.step_timer_name = "thread_cpu_probed"
    engine.speed_probe = SpeedProbe(every=2)
    engine.reset()
    result = engine.generate(requests([(5, 4), (6, 5)], [0.0, 0.0]), mode="offline")
    assert (result.recorder.steps_frame()["duration_s"] > 0).all()
    assert engine.speed_probe.summary()["samples"] == -(-result.num_steps // 2)
