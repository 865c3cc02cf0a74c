"""Per-step phase times of the engine: where a step's seconds go, measured on any device.

One row per recorded step, in step order, with these columns (seconds of the engine's step
timer, :data:`STEP_TIMERS`: ``time.perf_counter`` by default):

- ``schedule_s``: the core scheduler's ``schedule`` calls for the step (a reschedule after
  a preemption that ran nothing included);
- ``transfer_s``: the plan's swap-outs, swap-ins and device block copies (copy-on-write);
- ``prepare_s``: building the batch's input tensors and block tables
  (:func:`engine.runner.build_inputs`);
- ``forward_s``: the model's forward and the LM head on the sampled rows;
- ``sample_s``: the sampler (greedy / random draws / beam candidates, tokens to the host);
- ``output_s``: output processing: ``scheduler.update`` (appending tokens, stop checks,
  freeing finished sequences) and recording the step and the finished requests;
- ``forward_issue_s``: the part of ``forward_s`` until the forward call returned, before
  the device synchronize (on CUDA: the host's time in the forward call, queueing kernels or
  waiting for the device inside it, :mod:`core.metrics.phases`; on CPU equal to
  ``forward_s``).

``transfer_s + prepare_s + forward_s + sample_s`` is the step's ``duration_s`` (what the
executor returns and the virtual clock advances by); ``schedule_s`` and ``output_s`` run
outside it, between steps. The CPU phases of a synchronous (vLLM v0-style) stack, the ones
``experiments.calibrate_overhead`` fits, are :data:`CPU_PHASES`.

On CUDA, kernels run asynchronously, so a phase's clock reading is only meaningful after
``torch.cuda.synchronize``: the engine synchronizes at each phase boundary only when phase
timing is on (``time_phases=True``); otherwise it synchronizes once at the step's end, as
without phase timing, and records no phase rows. On CPU every operation is synchronous and
timing costs a few clock reads per step, so it is on by default.

The timer sees the schedule and output phases through :class:`core.loop.LoopObserver`'s
hooks and the executor's ``at_end`` call (``core`` itself times nothing).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pandas as pd
import torch

from core.loop import LoopObserver
from core.metrics.phases import CPU_PHASES, PHASE_COLUMNS
from core.plan import StepPlan
from core.request import SequenceGroup
from core.sched.base import BaseScheduler

__all__ = [
    "CPU_PHASES", "PHASE_COLUMNS", "STEP_TIMERS", "PhaseTimer", "device_clock",
    "phase_timing_default", "step_timer",
]  # fmt: skip


def phase_timing_default(device: torch.device) -> bool:
    """Whether phases are timed when the caller does not say: where it costs nothing (CPU)."""
    return device.type != "cuda"


STEP_TIMERS: dict[str, Callable[[], float]] = {
    "wall": time.perf_counter,
    "thread_cpu": time.thread_time,
}
"""What a step's seconds are read from. ``wall``: real time (the only meaningful choice on
CUDA). ``thread_cpu``: the CPU time of the engine's thread, for a CPU engine with one torch
thread, where every operation runs on the calling thread: unlike wall time it does not grow
when other processes share the cores (a step the machine's neighbours slowed by 2.4x in wall
time costs the same CPU time), so measured step times are a property of the engine."""


def step_timer(device: torch.device, name: str) -> Callable[[], float]:
    """The clock named ``name`` (:data:`STEP_TIMERS`); ``thread_cpu`` only on CPU."""
    if name not in STEP_TIMERS:
        raise ValueError(f"step_timer must be one of {sorted(STEP_TIMERS)}, got {name!r}")
    if name == "thread_cpu" and device.type != "cpu":
        raise ValueError(f"step_timer 'thread_cpu' times a CPU engine, not {device.type}")
    return STEP_TIMERS[name]


def device_clock(
    device: torch.device, synchronize: bool, now: Callable[[], float] = time.perf_counter
) -> Callable[[], float]:
    """``now``, preceded on CUDA by a device synchronize when ``synchronize``."""
    if device.type == "cuda" and synchronize:

        def clock() -> float:
            torch.cuda.synchronize(device)
            return now()

        return clock
    return now


class PhaseTimer(LoopObserver):
    """Collects :data:`PHASE_COLUMNS` per step: the loop's observer for ``schedule_s`` and
    ``output_s``, the executor's :meth:`executed` and :meth:`output_begins` for the rest."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.now = now
        self.rows: list[tuple[float, ...]] = []
        self._schedule = 0.0
        self._mark = 0.0
        self._executed: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
        self._forward_issue = 0.0

    def before_schedule(self, scheduler: BaseScheduler) -> None:
        self._mark = self.now()

    def after_schedule(self, plan: StepPlan) -> None:
        self._schedule += self.now() - self._mark
        if plan.is_empty and not plan.preempted:
            self._schedule = 0.0  # idle (or a stall): no step follows this call

    def executed(
        self, transfer: float, prepare: float, forward: float, sample: float, forward_issue: float
    ) -> None:
        """The executor's four phases of the step being run, and the forward's issue time."""
        self._executed = (transfer, prepare, forward, sample)
        self._forward_issue = forward_issue

    def output_begins(self) -> None:
        """Called by the executor's ``at_end``, just before the scheduler's update."""
        self._mark = self.now()

    def after_step(self, plan: StepPlan, finished: list[SequenceGroup]) -> None:
        output = self.now() - self._mark
        self.rows.append((self._schedule, *self._executed, output, self._forward_issue))
        self._schedule = 0.0

    def frame(self) -> pd.DataFrame:
        """One row per step so far, columns :data:`PHASE_COLUMNS`."""
        return pd.DataFrame(self.rows, columns=list(PHASE_COLUMNS), dtype="float64")
