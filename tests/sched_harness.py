"""``core.loop`` for scheduler tests: a fixed step time, every plan kept, invariants checked
after every schedule and update, and hooks to look at plans and steps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from core.loop import LoopObserver, StepLoop, VirtualClock
from core.metrics.recorder import Recorder
from core.plan import StepPlan
from core.request import ParentRequest, Request, SequenceGroup
from core.sched.base import BaseScheduler
from sim.driver import CostExecutor


@dataclass
class StepLog:
    """One ``schedule`` call: the queues before it, the plan, the running list after it,
    and the groups that finished when the plan ran (an empty plan runs nothing)."""

    plan: StepPlan
    running_before: list[SequenceGroup]
    running_after_schedule: list[SequenceGroup]
    waiting_before: list[SequenceGroup]
    swapped_before: list[SequenceGroup]
    finished: list[SequenceGroup] = field(default_factory=list)


@dataclass
class LoopResult:
    groups: list[SequenceGroup]  # a ParentRequest's children each (vllm_v1, n > 1)
    steps: list[StepLog] = field(default_factory=list)
    recorder: Recorder = field(default_factory=Recorder)


class _Watch(LoopObserver):
    def __init__(
        self,
        out: LoopResult,
        check: bool,
        on_plan: Callable[[StepPlan], None] | None,
        on_step: Callable[[StepPlan, list[SequenceGroup]], None] | None,
        max_steps: int,
    ) -> None:
        self.out, self.check = out, check
        self.on_plan, self.on_step = on_plan, on_step
        self.max_steps = max_steps
        self.before: tuple[list[SequenceGroup], ...] = ()
        self.sched: BaseScheduler | None = None

    def before_schedule(self, scheduler: BaseScheduler) -> None:
        self.sched = scheduler
        self.before = (list(scheduler.running), list(scheduler.waiting), list(scheduler.swapped))
        if len(self.out.steps) >= self.max_steps:
            raise AssertionError("did not finish within max_steps")

    def after_schedule(self, plan: StepPlan) -> None:
        sched = self.sched
        assert sched is not None
        running, waiting, swapped = self.before
        self.out.steps.append(StepLog(plan, running, list(sched.running), waiting, swapped))
        if self.check:
            if not plan.is_empty:
                problem = sched.plan_problem(plan)
                assert problem is None, problem
            sched.check_integrity()
            mem = sched.manager.breakdown()
            cap = sched.manager.num_device_blocks * sched.manager.block_size
            assert mem.total == cap, (mem, cap)
            assert min(mem.token_states, mem.reserved, mem.internal_frag, mem.free) >= 0
        if self.on_plan is not None:
            self.on_plan(plan)

    def after_step(self, plan: StepPlan, finished: list[SequenceGroup]) -> None:
        self.out.steps[-1].finished = finished
        if self.check:
            assert self.sched is not None
            self.sched.check_integrity()
        if self.on_step is not None:
            self.on_step(plan, finished)


def run_loop(
    sched: BaseScheduler,
    requests: list[Request],
    step_s: float = 0.01,
    max_steps: int = 100_000,
    check: bool = True,
    on_plan: Callable[[StepPlan], None] | None = None,
    on_step: Callable[[StepPlan, list[SequenceGroup]], None] | None = None,
    beams_rng: np.random.Generator | None = None,
) -> LoopResult:
    """Serve ``requests`` at their arrival times with ``core.loop`` until all are done
    (a stall raises ``core.loop.StallError``). ``on_plan(plan)`` sees every plan before it
    runs, ``on_step(plan, finished)`` every step after its update; ``beams_rng`` draws
    beam choices as the simulator does."""
    out = LoopResult(groups=[])
    watch = _Watch(out, check, on_plan, on_step, max_steps)
    executor = CostExecutor(lambda shape: step_s, beams_rng)
    loop = StepLoop(sched, executor, out.recorder, observer=watch)

    def add(request: Request, now: float) -> None:
        added = loop.add(request, now)
        if isinstance(added, ParentRequest):  # vllm_v1's n samples: a group each
            out.groups.extend(added.children)
        else:
            out.groups.append(added)

    loop.run(requests, VirtualClock(), add=add)
    return out
