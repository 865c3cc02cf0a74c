"""A cost model whose price is not a finite number of seconds >= 0 stops the simulation
with :class:`sim.driver.StepPriceError` (``simulate`` prints it as one line naming
``cost``), instead of a run whose clock ends at NaN or inf and reports success."""

from __future__ import annotations

import math

import pytest

from core.request import Request
from core.sched.base import BaseScheduler, SchedulerConfig
from core.systems import build_scheduler
from sim.driver import StepPriceError, simulate
from tests.cost_helpers import ConstantCost


def _scheduler() -> BaseScheduler:
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    return build_scheduler("vllm", 256, config=config, block_size=4)


REQUESTS = [Request(i, 0.1 * i, 8, 4) for i in range(3)]


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -0.001])
def test_a_step_priced_out_of_range_stops_the_run(seconds: float) -> None:
    with pytest.raises(StepPriceError, match="priced at"):
        simulate(REQUESTS, _scheduler, ConstantCost(seconds))


def test_a_clock_that_overflows_stops_the_run() -> None:
    with pytest.raises(StepPriceError, match="clock overflowed"):
        simulate(REQUESTS, _scheduler, ConstantCost(1e308))


def test_an_ordinary_price_runs() -> None:
    result = simulate(REQUESTS, _scheduler, ConstantCost(0.01))
    assert result.recorder.num_requests == 3 and math.isfinite(result.end_time_s)


def test_simulate_names_cost_in_one_line(tmp_path) -> None:
    from experiments import simulate as app
    from tests.test_config_errors import SIM_SMALL, run_cli

    code, _, err = run_cli(app, [*SIM_SMALL, "cost.per_step_overhead_s=1e308"], tmp_path)
    assert code == 2
    assert err.startswith("error: cost: the simulated clock overflowed") and err.count("\n") == 1
    assert not (tmp_path / "run" / "metrics.json").exists()
