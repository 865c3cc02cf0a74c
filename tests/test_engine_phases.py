"""The engine times each step's phases (engine.phases) and serve writes them to steps.csv."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from core.request import Request, SamplingParams
from engine.phases import PHASE_COLUMNS, PhaseTimer, device_clock, phase_timing_default
from experiments.bench.cpu_cross_run import serve_run
from tests.engine_helpers import make_engine, one_torch_thread  # noqa: F401


def _requests(count: int, output_len: int = 5, **sampling) -> list[Request]:
    return [
        Request(i, 0.01 * i, 6 + i, output_len + i % 3, sampling=SamplingParams(**sampling))
        for i in range(count)
    ]


def test_each_step_has_its_phases_and_they_sum_to_its_duration() -> None:
    engine = make_engine(num_blocks=16, block_size=4)  # tight: preemptions, CoW copies
    result = engine.generate(_requests(6, 20, n=2, temperature=1.0), mode="online")
    steps, phases = result.recorder.steps_frame(), result.phases
    assert phases is not None and list(phases.columns) == list(PHASE_COLUMNS)
    assert len(phases) == len(steps) == result.num_steps > 0
    assert (phases >= 0).all().all() and phases.notna().all().all()
    executed = phases[["transfer_s", "prepare_s", "forward_s", "sample_s"]].sum(axis=1)
    np.testing.assert_allclose(executed, steps["duration_s"], rtol=1e-9, atol=1e-12)
    assert (phases["forward_s"] > 0).all() and (phases["schedule_s"] > 0).all()
    # on CPU the forward is synchronous: issuing it is running it, nothing is left to wait for
    assert (phases["forward_issue_s"] > 0).all()
    assert (phases["forward_issue_s"] <= phases["forward_s"]).all()
    waited = phases["forward_s"] - phases["forward_issue_s"]  # two clock reads apart
    assert waited.median() < 0.01 * phases["forward_s"].median()
    assert (phases["output_s"] > 0).all()
    assert steps["num_preempted"].sum() > 0 and steps["copy_blocks"].sum() > 0


def test_phase_timing_is_off_when_asked_and_defaults_to_cpu_only() -> None:
    engine = make_engine()
    engine.time_phases = False
    engine.reset()
    assert engine.generate(_requests(2)).phases is None
    assert phase_timing_default(torch.device("cpu"))
    assert not phase_timing_default(torch.device("cuda"))
    assert device_clock(torch.device("cpu"), synchronize=True) is device_clock(
        torch.device("cpu"), synchronize=False
    )


def test_an_idle_schedule_call_is_not_charged_to_the_next_step() -> None:
    timer = PhaseTimer()

    class Plan:
        def __init__(self, empty: bool, preempted: list) -> None:
            self.is_empty, self.preempted = empty, preempted

    timer.before_schedule(None)  # type: ignore[arg-type]
    timer.after_schedule(Plan(True, []))  # type: ignore[arg-type]
    assert timer._schedule == 0.0
    timer.before_schedule(None)  # type: ignore[arg-type]
    timer.after_schedule(Plan(True, [1]))  # type: ignore[arg-type]  # preempted: reschedule
    assert timer._schedule > 0.0


def test_serve_writes_the_phase_columns(tmp_path: Path) -> None:
    run = serve_run(
        tmp_path,
        ["model=tiny-opt", "workload.num_requests=4", "kv_cache_gb=0.002", "progress=false"],
    )
    steps = pd.read_csv(run / "steps.csv")
    assert set(PHASE_COLUMNS) <= set(steps.columns)
    assert (steps["forward_s"] > 0).all()


@pytest.mark.parametrize("value", ["3", "'yes'"])
def test_time_phases_must_be_a_boolean(tmp_path: Path, value: str) -> None:
    from experiments.lib.checks import ConfigError

    with pytest.raises(ConfigError, match="time_phases"):
        serve_run(tmp_path, ["model=tiny-opt", "progress=false", f"time_phases={value}"])
