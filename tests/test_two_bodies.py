"""One policy, two bodies: the simulator replaying the engine's measured step times makes
the engine's decisions, step for step (the rule "one policy, two bodies": README)."""

from __future__ import annotations

import pytest

from core.plan import StepOutcome, StepPlan
from core.sched.base import BaseScheduler, SchedulerConfig
from core.systems import build_scheduler
from sim.cost.recorded import RecordedCostModel
from sim.driver import simulate
from tests.engine_helpers import (
    make_engine,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    requests,
)

LENS = [(9, 8), (5, 12), (14, 6), (7, 10), (6, 9), (11, 7), (4, 11), (8, 9), (13, 7)]
# Four requests at t=0 outgrow 14 blocks of 4 slots by themselves (vllm must preempt
# whatever the step times); mid-run arrivals a few ms apart (how many land mid-run depends
# on the machine's speed); a late pair after everything finished (an idle jump).
ARRIVALS = [0.0, 0.0, 0.0, 0.0, 0.004, 0.011, 0.02, 30.0, 30.0]
STEP_COLUMNS = ["prefill_tokens", "prefill_seqs", "decode_seqs", "num_preempted"]
REQUEST_COLUMNS = ["request_id", "status", "first_token_step", "finish_step", "num_preemptions"]

CASES = [("vllm", "recompute", 14), ("vllm", "swap", 14), ("orca_oracle", "recompute", 24)]


@pytest.mark.parametrize(("system", "mode", "num_blocks"), CASES)
def test_simulator_replays_the_engine(
    system: str, mode: str, num_blocks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[list[int]] = []
    original = BaseScheduler.update

    def spy(self: BaseScheduler, plan: StepPlan, outcome: StepOutcome, now: float):
        batches.append([seq.group.request_id for seq in plan.scheduled_seqs()])
        return original(self, plan, outcome, now)

    monkeypatch.setattr(BaseScheduler, "update", spy)
    engine = make_engine(
        system, num_blocks=num_blocks, num_cpu_blocks=64, preemption_mode=mode, max_model_len=64
    )
    reqs = requests(LENS, ARRIVALS)
    eng = engine.generate(reqs, mode="online", clock="virtual").recorder
    engine_batches, batches[:] = list(batches), []

    config = SchedulerConfig(max_model_len=64, preemption_mode=mode)

    def make_scheduler() -> BaseScheduler:
        return build_scheduler(system, num_blocks * 4, config, block_size=4, num_cpu_slots=256)

    cost = RecordedCostModel(eng.steps_frame()["duration_s"])
    sim = simulate(reqs, make_scheduler, cost).recorder
    assert cost.steps_left == 0
    assert batches == engine_batches

    e_steps, s_steps = eng.steps_frame(), sim.steps_frame()
    # Same batches, token counts, queue lengths, memory breakdowns and start times ...
    assert e_steps[STEP_COLUMNS].equals(s_steps[STEP_COLUMNS])
    assert e_steps.equals(s_steps)
    # ... and the same per-request steps and timestamps.
    e_req = eng.requests_frame()
    assert e_req[REQUEST_COLUMNS].equals(sim.requests_frame()[REQUEST_COLUMNS])
    assert e_req.equals(sim.requests_frame())
    assert (e_req["status"] == "finished").all()
    assert 30.0 in e_steps["start_s"].tolist()  # idle, then jumped to the late arrivals
    if system == "vllm":
        assert e_steps["num_preempted"].sum() > 0
        swapped = e_steps["swap_out_blocks"].sum() > 0
        assert swapped == (mode == "swap")
