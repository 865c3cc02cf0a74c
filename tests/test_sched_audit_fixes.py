"""A defect a scheduler fuzz audit reproduced (2026-12-05): on the contiguous managers
(Orca, FasterTransformer) a request forked on its last token (``n > 1`` with one output
token) queued block copies into regions its own finish freed, and the loop ran a step made
of those copies alone: one step too many, the run ending a step late."""

from __future__ import annotations

import pytest

from core.request import Request, SamplingParams
from core.sched.base import BaseScheduler, SchedulerConfig
from core.systems import build_scheduler
from sim.driver import simulate
from tests.sched_harness import run_loop

SYSTEMS = ("orca_max", "orca_pow2", "orca_oracle", "fastertransformer", "vllm")


class FlatCost:
    def step_time(self, shape: object) -> float:
        return 0.01

    def describe(self) -> str:
        return "10 ms a step"


def _scheduler(system: str) -> BaseScheduler:
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    return build_scheduler(system, 256, config=config, block_size=4)


@pytest.mark.parametrize("system", SYSTEMS)
def test_no_step_copies_into_a_finished_request(system: str) -> None:
    requests = [Request(0, 0.0, 8, 1, SamplingParams(n=2))]
    result = run_loop(_scheduler(system), requests)
    for step in result.steps:
        plan = step.plan
        assert plan.prefill or plan.decode or not plan.copies, plan.copies
    assert result.recorder.num_steps == 1


@pytest.mark.parametrize("system", SYSTEMS)
def test_a_one_token_parallel_sample_takes_one_step(system: str) -> None:
    requests = [Request(0, 0.0, 8, 1, SamplingParams(n=2))]
    metrics = simulate(requests, lambda: _scheduler(system), FlatCost())
    assert metrics.num_steps == 1
    assert metrics.end_time_s == pytest.approx(0.01)


@pytest.mark.parametrize("system", SYSTEMS[:4])
def test_a_longer_parallel_sample_still_copies_its_region(system: str) -> None:
    """The fork of a request that goes on still copies the prompt into each sample's
    region, in the step after the fork."""
    requests = [Request(0, 0.0, 8, 3, SamplingParams(n=2))]
    result = run_loop(_scheduler(system), requests)
    copies = [step.plan.copies for step in result.steps if step.plan.copies]
    assert copies and all(step.plan.decode for step in result.steps if step.plan.copies)
