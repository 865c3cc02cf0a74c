"""Rarely taken step-loop and recorder paths, reached through the public entry points.

- a scheduler with unfinished requests that schedules nothing and frees nothing stops the
  run on a :class:`core.loop.StallError` naming its queue counts and free KV blocks, in
  the simulator and in the engine alike (the loop is shared);
- a multi-replica run that records no step (every request rejected at intake) still has
  the ``replica`` column in its (empty) steps frame, as every multi-replica run does.

Scheduler guards that no workload on the shipped KV managers reaches (an earlier check
always catches the case) are not tested here: the admission bound of
``BaseScheduler.add`` already covers a recomputed group's re-admission and a swapped
group's swap-in on an empty device.
"""

from __future__ import annotations

import pytest

from core.loop import StallError
from core.metrics.recorder import STEP_COLUMNS, Recorder, ReplicaRecorder
from core.plan import BatchShape, StepPlan
from core.sched.base import BaseScheduler, SchedulerConfig
from core.sched.vllm import VLLMScheduler
from core.systems import build_scheduler
from engine.engine import EngineError
from sim.driver import SimulationError, simulate
from tests.engine_helpers import (
    make_engine,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    requests,
)

CONFIG = SchedulerConfig(max_model_len=64)


class _Flat:
    """Every step takes 10 ms."""

    def step_time(self, shape: BatchShape) -> float:
        return 0.01


def _vllm(num_blocks: int = 16) -> BaseScheduler:
    return build_scheduler("vllm", num_blocks * 4, CONFIG, block_size=4)


def test_a_scheduler_that_schedules_nothing_stalls_in_both_bodies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two requests prefilled, then an empty plan, nothing preempted or aborted: both bodies
    stop on the loop's StallError, which names the queues and the free blocks (each body
    wraps it in its own error: the simulator's names the replica)."""

    admit_then_idle = VLLMScheduler.schedule

    def schedule_nothing_after_the_first_step(self: VLLMScheduler, now: float) -> StepPlan:
        if self.step_index == 0:
            return admit_then_idle(self, now)
        return self._finish_plan(self._new_plan())

    monkeypatch.setattr(VLLMScheduler, "schedule", schedule_nothing_after_the_first_step)
    reqs = requests([(5, 3), (7, 2)])  # two blocks of 4 slots each once prefilled
    expected = (
        "scheduler vllm has 0 waiting, 2 running and 0 swapped requests but scheduled "
        "nothing (12 of 16 KV blocks free)"
    )
    with pytest.raises(SimulationError) as sim_error:
        # step by step: a fast-forward runs the decodes the (unpatched) decode_run promises
        simulate(reqs, _vllm, _Flat(), fast_forward=False)
    assert str(sim_error.value) == f"replica 0: {expected}"
    assert isinstance(sim_error.value.__cause__, StallError)
    with pytest.raises(EngineError) as engine_error:
        make_engine("vllm", num_blocks=16, max_model_len=64).generate(reqs)
    assert str(engine_error.value) == expected
    assert isinstance(engine_error.value.__cause__, StallError)


def test_a_multi_replica_run_with_no_step_keeps_the_replica_column() -> None:
    """Every request is longer than max_model_len: each is rejected with its reason, no
    step runs, and the empty steps frame has the columns of a two-replica run that ran."""
    too_long = requests([(60, 10), (50, 20)])
    empty = simulate(too_long, _vllm, _Flat(), num_replicas=2).recorder
    ran = simulate(requests([(5, 3), (7, 2)]), _vllm, _Flat(), num_replicas=2).recorder
    steps = empty.steps_frame()
    assert steps.empty
    assert list(steps.columns) == list(ran.steps_frame().columns)
    assert list(steps.columns) == ["step", "replica", *STEP_COLUMNS[1:]]
    frame = empty.requests_frame()
    assert frame["status"].tolist() == ["rejected", "rejected"]
    assert frame["reject_reason"].str.contains("exceeds max_model_len=64").all()


def test_a_one_replica_recorder_has_no_replica_views() -> None:
    with pytest.raises(ValueError, match="a recorder of one replica has no replica views"):
        ReplicaRecorder(Recorder(), 0)
