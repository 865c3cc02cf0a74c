"""A scheduler that drops an accepted request (takes it out of every queue without finishing
or aborting it) is caught by the step loop (``core.loop.LostRequestError``): at the
integrity check after the step that dropped it, or at the latest when the loop goes idle;
before, the simulator ran to the end and raised a bare ``SimulationError``."""

from __future__ import annotations

import pytest

from core.loop import LostRequestError
from core.plan import StepPlan
from core.request import Request
from core.sched.vllm import VLLMScheduler
from core.systems import build_scheduler
from sim.cost.roofline import RooflineCostModel
from sim.driver import SimulationError, simulate


class DropsOne(VLLMScheduler):
    """vLLM's policy, but the first time more than two requests wait it loses the last."""

    dropped = False

    def schedule(self, now: float) -> StepPlan:
        if not self.dropped and len(self.waiting) > 2:
            self.waiting.pop()
            self.dropped = True
        return super().schedule(now)


def _make() -> VLLMScheduler:
    scheduler = build_scheduler("vllm", 4096)
    scheduler.__class__ = DropsOne
    return scheduler


REQUESTS = [Request(i, 0.0, 40, 8) for i in range(5)]


@pytest.mark.parametrize("check_every", [0, 1])
def test_a_dropped_request_is_a_policy_error_naming_the_scheduler(check_every: int) -> None:
    cost = RooflineCostModel("opt-125m", "a100-40gb")
    with pytest.raises(SimulationError, match=r"scheduler vllm lost 1 request\(s\) by step") as e:
        simulate(REQUESTS, _make, cost, check_integrity_every=check_every)
    assert isinstance(e.value.__cause__, LostRequestError)
    if check_every:  # the check after the first step finds it
        assert "by step 1:" in str(e.value)


def test_an_honest_scheduler_loses_nothing() -> None:
    cost = RooflineCostModel("opt-125m", "a100-40gb")
    result = simulate(
        REQUESTS, lambda: build_scheduler("vllm", 4096), cost, check_integrity_every=1
    )
    assert result.recorder.num_requests == 5
