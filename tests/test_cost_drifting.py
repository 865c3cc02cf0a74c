"""A cost model on a machine whose speed drifts along a measured timeline, and the timeline an
interleaved sitting's profile gives."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from core.plan import BatchShape
from core.request import Request
from core.sched.base import SchedulerConfig
from core.systems import build_scheduler
from experiments.bench.speed_timeline import speed_timeline
from sim.cost import CostModel, RecordedCostModel
from sim.cost.drifting import DriftingCostModel
from sim.driver import simulate
from tests.cost_helpers import ConstantCost

STEP = BatchShape(decode_seqs=1, decode_ctx_tokens=8)


def test_each_step_takes_the_speed_of_the_stretch_it_falls_in() -> None:
    drifting = DriftingCostModel(ConstantCost(0.5), [1.0, 2.0, 4.0], expected_steps=6)
    assert isinstance(drifting, CostModel) and drifting.priced_in_order
    # steps 0-1 in the first third, 2-3 in the second, 4-5 and any past the count in the last
    assert [drifting.step_time(STEP) for _ in range(8)] == [0.5, 0.5, 1, 1, 2, 2, 2, 2]
    assert drifting.steps_priced == 8
    assert "3 stretches over 6 expected steps, 1.00-4.00" in drifting.describe()
    for speeds, expected in (([], 4), ([1.0, 0.0], 4), ([1.0], 0)):
        with pytest.raises(ValueError):
            DriftingCostModel(ConstantCost(0.5), speeds, expected)


def test_the_simulator_prices_every_step_once_in_order() -> None:
    """Against a replay of step times: the drifting model's i-th answer is the i-th recorded
    time times the speed of its stretch, so the simulated end follows from both exactly."""
    reqs = [Request(request_id=i, arrival_time=0.0, prompt_len=6, output_len=5) for i in range(3)]
    config = SchedulerConfig(max_model_len=64)

    def run(cost: CostModel) -> float:
        make = lambda: build_scheduler("vllm", 256, config, block_size=4)  # noqa: E731
        return simulate(reqs, make, cost).end_time_s

    times = [0.01 * (i + 1) for i in range(64)]
    plain = RecordedCostModel(times)
    end = run(plain)
    steps = plain.steps_used
    drifting = DriftingCostModel(RecordedCostModel(times), [1.0, 3.0], expected_steps=steps)
    assert run(drifting) == pytest.approx(
        sum(t * (1.0 if (i + 0.5) / steps < 0.5 else 3.0) for i, t in enumerate(times[:steps]))
    )
    assert drifting.steps_priced == steps and end == pytest.approx(sum(times[:steps]))


def _profile(path: Path, rows: list[tuple[float, str]], units: list[str] | None = None) -> Path:
    path.mkdir()
    with (path / "operator_profile.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        header = ["op", "num_tokens", "context_tokens", "time_ms", "sweeps_ms"]
        writer.writerow(header + ["sweep_units"] * (units is not None))
        for i, (price, sweeps) in enumerate(rows):
            writer.writerow(["linear", i + 1, 0, price, sweeps, *([units[i]] if units else [])])
    return path


def test_the_timeline_is_each_sweeps_time_over_the_price(tmp_path: Path) -> None:
    two = _profile(tmp_path / "two", [(2.0, "1;3;2"), (6.0, "6;9;3")])
    assert speed_timeline(two) == pytest.approx([7 / 8, 12 / 8, 5 / 8])
    assert speed_timeline(_profile(tmp_path / "one", [(2.0, "2"), (6.0, "6")])) is None
    assert speed_timeline(_profile(tmp_path / "ragged", [(2.0, "1;3"), (6.0, "6")])) is None


def test_stretches_within_a_sweep_follow_the_order_its_units_were_timed_in(
    tmp_path: Path,
) -> None:
    """With ``sweep_units`` each sweep is cut, in the order its units were timed, into
    stretches of equal unit count; points of one unit (one forward) count together."""
    rows = [(1.0, "2;1"), (1.0, "1;1"), (2.0, "2;6"), (4.0, "4;2")]
    # sweep 0 timed units 0 (rows 0, 1: one forward), 1 (row 2), 2 (row 3);
    # sweep 1 timed row 3 first, then row 2, then rows 0 and 1
    units = ["0;2", "0;2", "1;1", "2;0"]
    both = _profile(tmp_path / "units", rows, units)
    assert speed_timeline(both) == pytest.approx([9 / 8, 10 / 8])  # per sweep, as before
    assert speed_timeline(both, 3) == pytest.approx([3 / 2, 2 / 2, 4 / 4, 2 / 4, 6 / 2, 2 / 2])
    # two stretches: units {0, 1} and {2} (array_split gives the first part the extra one)
    assert speed_timeline(both, 2) == pytest.approx([5 / 4, 4 / 4, 8 / 6, 2 / 2])
    assert speed_timeline(both, 9) == speed_timeline(both, 3)  # at most a sweep's units
    assert speed_timeline(_profile(tmp_path / "old", rows), 3) == speed_timeline(both)
