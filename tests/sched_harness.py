"""A minimal driver loop for scheduler tests: fixed step time, every plan kept."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.plan import StepOutcome, StepPlan
from core.request import Request, SequenceGroup
from core.sched.base import BaseScheduler


@dataclass
class StepLog:
    plan: StepPlan
    running_before: list[SequenceGroup]
    running_after_schedule: list[SequenceGroup]
    waiting_before: list[SequenceGroup]
    swapped_before: list[SequenceGroup]
    finished: list[SequenceGroup]


@dataclass
class LoopResult:
    groups: list[SequenceGroup]
    steps: list[StepLog] = field(default_factory=list)


def run_loop(
    sched: BaseScheduler,
    requests: list[Request],
    step_s: float = 0.01,
    max_steps: int = 100_000,
    check: bool = True,
) -> LoopResult:
    """Add requests at their arrival times and step until all are done."""
    pending = sorted(requests, key=lambda r: (r.arrival_time, r.request_id))
    out = LoopResult(groups=[])
    now = 0.0
    i = 0
    for _ in range(max_steps):
        while i < len(pending) and pending[i].arrival_time <= now:
            out.groups.append(sched.add(pending[i], now))
            i += 1
        if not sched.has_unfinished():
            if i == len(pending):
                return out
            now = pending[i].arrival_time
            continue
        running_before = list(sched.running)
        waiting_before = list(sched.waiting)
        swapped_before = list(sched.swapped)
        plan = sched.schedule(now)
        running_after = list(sched.running)
        if check:
            sched.check_integrity()
            mem = sched.manager.breakdown()
            cap = sched.manager.num_device_blocks * sched.manager.block_size
            assert mem.total == cap, (mem, cap)
            assert min(mem.token_states, mem.reserved, mem.internal_frag, mem.free) >= 0
        if plan.is_empty and not plan.preempted:
            raise AssertionError(f"scheduler stalled: {sched.waiting=} {sched.swapped=}")
        now += step_s
        finished = sched.update(plan, StepOutcome(duration_s=step_s), now)
        if check:
            sched.check_integrity()
        out.steps.append(
            StepLog(plan, running_before, running_after, waiting_before, swapped_before, finished)
        )
    raise AssertionError("did not finish within max_steps")
