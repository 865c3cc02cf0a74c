"""The sitting's speed from its profile's sweeps, and that speed shrunk by its own scatter."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from experiments.bench.speed_timeline import Stretch, UnknownScatter, shrink_to_price, stretches


def _profile(
    path: Path, prices: list[float], sweeps: list[list[float]], ops: list[str] | None = None
) -> Path:
    """A profile of one point per unit, every sweep timing the units in row order (each
    point's op from ``ops``, default ``linear``)."""
    path.mkdir()
    with (path / "operator_profile.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["op", "num_tokens", "context_tokens", "time_ms", "sweeps_ms",
                         "sweep_units"])  # fmt: skip
        for i, (price, times) in enumerate(zip(prices, sweeps, strict=True)):
            units = ";".join([str(i)] * len(times))
            op = ops[i] if ops else "linear"
            writer.writerow([op, i + 1, 0, price, ";".join(map(str, times)), units])
    return path


def test_a_stretch_carries_the_ratio_estimators_variance(tmp_path: Path) -> None:
    # sweep 0 times 1, 3, 4 against prices 1, 2, 4; sweep 1 times them at the price
    found = stretches(_profile(tmp_path / "p", [1.0, 2.0, 4.0], [[1, 1], [3, 2], [4, 4]]))
    assert found is not None and len(found) == 2
    first = found[0]
    assert first.speed == pytest.approx(8 / 7) and first.units == 3
    residuals = np.array([1, 3, 4]) - 8 / 7 * np.array([1, 2, 4])
    assert first.variance == pytest.approx(3 / 2 * (residuals**2).sum() / 49)
    assert found[1] == Stretch(1.0, 0.0, 3)
    # one unit per stretch: its scatter is unknown
    alone = stretches(_profile(tmp_path / "q", [1.0, 2.0, 4.0], [[1, 1], [3, 2], [4, 4]]), 3)
    assert alone is not None and all(math.isinf(s.variance) for s in alone)


def test_shrinkage_by_hand() -> None:
    found = [Stretch(1.2, 0.01, 9), Stretch(0.8, 0.01, 9), Stretch(1.0, 0.04, 9)]
    shrunk = shrink_to_price(found)
    # weights 100, 100, 25; Q = 4 + 4 + 0; tau² = (8 - 3) / 225
    tau2 = 5 / 225
    assert shrunk.q == pytest.approx(8.0) and shrunk.counted == 3
    assert shrunk.tau == pytest.approx(math.sqrt(tau2))
    keep = tau2 / (tau2 + 0.01)
    assert shrunk.speeds == pytest.approx([1 + 0.2 * keep, 1 - 0.2 * keep, 1.0])
    # below the scatter's own expectation nothing is kept
    calm = shrink_to_price([Stretch(1.05, 0.01, 9), Stretch(0.95, 0.01, 9)])
    assert calm.tau == 0 and calm.speeds == [1.0, 1.0]
    # an exact stretch keeps its speed, one of unknown scatter takes the price
    edge = shrink_to_price([Stretch(1.3, 0.0, 9), Stretch(1.4, math.inf, 1), *found])
    assert edge.speeds[:2] == [1.3, 1.0] and edge.counted == 3
    with pytest.raises(ValueError):
        shrink_to_price([])


def _sitting(tmp_path: Path, drift: np.ndarray, noise: float, seed: int) -> list[Stretch]:
    """A profile of 40 units over ``len(drift)`` one-stretch sweeps: sweep j runs at
    ``drift[j]`` and every call scatters by ``noise`` (relative, log-normal)."""
    rng = np.random.default_rng(seed)
    prices = rng.uniform(0.5, 5.0, 40)
    times = prices[:, None] * drift[None, :] * np.exp(rng.normal(0, noise, (40, len(drift))))
    means = times.mean(axis=1)
    found = stretches(_profile(tmp_path, list(means), times.tolist()))
    assert found is not None
    return found


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_steady_machine_stays_near_the_price_a_drifting_one_near_its_measure(
    tmp_path: Path, seed: int
) -> None:
    steady = _sitting(tmp_path / "steady", np.ones(30), noise=0.15, seed=seed)
    shrunk = shrink_to_price(steady)
    raw_dev = np.abs(np.array([s.speed for s in steady]) - 1)
    shrunk_dev = np.abs(np.array(shrunk.speeds) - 1)
    # the profile's scatter alone: the shrunk timeline keeps a fraction of it
    assert shrunk.tau < 0.035 and shrunk_dev.max() < 0.8 * raw_dev.max()
    speeds = np.random.default_rng(seed + 10).uniform(0.7, 1.4, 30)
    drifting = _sitting(tmp_path / "drifting", speeds, noise=0.15, seed=seed)
    shrunk = shrink_to_price(drifting)
    raw = np.array([s.speed for s in drifting])
    # the machine's drift dwarfs the scatter: the timeline is kept nearly as measured
    assert shrunk.tau > 0.1
    assert np.abs(np.array(shrunk.speeds) - raw).max() < 0.2 * np.abs(raw - 1).max()


def test_cold_sweeps_copy_the_same_place_one_sweep_later(tmp_path: Path) -> None:
    """A sidecar's ``cold_sweeps``: those sweeps' stretches take the speed of the same place
    in the first measured sweep, carry no weight in the shrinkage, and take the shrunk speed
    of the stretch they copy."""
    import json

    from experiments.bench.cold_sweep import set_aside

    rng = np.random.default_rng(3)
    prices = rng.uniform(1.0, 3.0, 8)
    drift = [5.0, 1.3, 0.7, 1.2, 0.8]  # sweep 0 is cold: five times the price
    times = prices[:, None] * np.array(drift)[None, :] * rng.uniform(0.97, 1.03, (8, 5))
    raw = _profile(tmp_path / "raw", list(times.mean(axis=1)), times.tolist())
    (raw / "operator_profile.json").write_text(json.dumps({"method": "mean of 5 sweeps"}))
    warm = set_aside(raw, tmp_path / "warm", 1)
    found = stretches(warm, 2)
    assert found is not None and len(found) == 10
    assert [s.copies for s in found[:2]] == [2, 3] and found[2].copies is None
    assert [s.speed for s in found[:2]] == [found[2].speed, found[3].speed]
    assert all(math.isinf(s.variance) for s in found[:2])
    assert found[2].speed == pytest.approx(1.3 / np.mean(drift[1:]), rel=0.05)
    shrunk = shrink_to_price(found)
    assert shrunk.counted == 8
    assert shrunk.speeds[:2] == shrunk.speeds[2:4]
    # without the sidecar's word, sweep 0 reads as the machine running 2.8 times its price
    plain = stretches(raw, 2)
    assert plain is not None and plain[0].speed > 2.5 and plain[0].copies is None


def test_a_class_of_points_is_timed_over_the_whole_profiles_stretches(tmp_path: Path) -> None:
    """``rows`` times only the chosen points, in stretches cut as for the whole profile: a
    stretch none of whose units holds one is at the price with infinite variance."""
    # units 0-3 in row order; two stretches a sweep: units 0-1, then 2-3
    ops = ["attn_decode", "linear", "attn_decode", "linear"]
    prices = [1.0, 2.0, 3.0, 4.0]
    times = [[1.5, 1.0], [2.0, 2.0], [3.0, 6.0], [4.0, 4.0]]  # attention slows, not linear
    path = _profile(tmp_path / "p", prices, times, ops)
    attention = stretches(path, 2, lambda t: t["op"] == "attn_decode")
    linear = stretches(path, 2, lambda t: t["op"] == "linear")
    whole = stretches(path, 2)
    assert attention is not None and linear is not None and whole is not None
    assert [s.speed for s in attention] == pytest.approx([1.5, 1.0, 1.0, 2.0])
    assert [s.speed for s in linear] == [1.0] * 4 and all(s.units == 1 for s in linear)
    assert [s.speed for s in whole] == pytest.approx([3.5 / 3, 1.0, 1.0, 10 / 7])
    # only the first unit is chosen: the second stretch of each sweep holds none of it
    first = stretches(path, 2, lambda t: t["num_tokens"] == 1)
    assert first is not None
    assert first[1] == Stretch(1.0, math.inf, 0) and first[3] == Stretch(1.0, math.inf, 0)


def test_unknown_scatter_is_not_shrunk_to_the_price(tmp_path: Path) -> None:
    """One unit per stretch (a profile that did not record where its points fell): the
    stretches' scatter is unknown, so no shrunk timeline is made (it used to be all 1, the
    'shrunk' validation silently the 'as is' one)."""
    alone = stretches(_profile(tmp_path / "q", [1.0, 2.0, 4.0], [[1, 1], [3, 2], [4, 4]]), 3)
    assert alone is not None
    with pytest.raises(UnknownScatter, match="fill_sweep_units"):
        shrink_to_price(alone)


def test_two_cold_sweeps_copy_the_first_measured_sweep(tmp_path: Path) -> None:
    """With two cold sweeps, each cold stretch takes the speed of the same stretch of the
    first measured sweep (the third), not of the sweep two on (which ran past the end)."""
    sweeps = [[9, 9, 2, 3, 1], [9, 9, 4, 5, 1]]  # units 0 and 1, five sweeps of one call
    path = _profile(tmp_path / "p", [1.0, 1.0], sweeps)
    (path / "operator_profile.json").write_text('{"cold_sweeps": 2}')
    found = stretches(path, 2)
    assert found is not None and len(found) == 10
    speeds = [s.speed for s in found]
    assert speeds[:4] == [2.0, 4.0, 2.0, 4.0]  # sweeps 0 and 1 copy sweep 2
    assert speeds[4:] == [2.0, 4.0, 3.0, 5.0, 1.0, 1.0]
