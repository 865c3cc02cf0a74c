"""The discrete-event simulator: SimPy processes around ``core``'s scheduler.

Per replica there is an *engine* process around a :class:`core.loop.StepLoop` (the step
sequence both bodies share): the loop schedules a plan and the cost model prices it, the
process advances the clock by one ``timeout``, then the loop feeds the outcome back (every
scheduled sequence that samples produces one token; output lengths come from the trace,
EOS ignored). An *arrival* process adds requests at their arrival
times and wakes idle engines. One event per arrival and at most one per step, never one
per token: a step that ends before any other event is due advances the engine's own clock
without a SimPy timeout (the results are bit-identical to one timeout per step), and a
stretch of plain decode steps that all end before the next event (no admission, no
preemption, no finish but in its last step) runs at once, without scheduling each step
(:meth:`core.loop.StepLoop.fast_forward`; identical tables, checked by the golden and
property tests).

Replicas (data parallelism) each own a scheduler; arrivals go round-robin.
"""

from __future__ import annotations

import gc
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import simpy
from tqdm import tqdm

from core.beam_log import RecordedBeams
from core.loop import PolicyError, StepLoop
from core.metrics.recorder import Recorder
from core.plan import BatchShape, StepOutcome, StepPlan
from core.request import Request
from core.sched.base import BaseScheduler
from sim.beams import sim_beams
from sim.cost.base import CostModel


class SimulationError(RuntimeError):
    """The simulation cannot proceed: a scheduler broke the step loop's contract (stalled
    with work left, or planned a step no body can run; its cause is the
    :class:`~core.loop.PolicyError`), requests were lost, or a step was priced out of range
    (:class:`StepPriceError`)."""


class StepPriceError(SimulationError):
    """A step priced at a time that is not a finite number of seconds >= 0, or a clock
    that overflowed: a cost model's constants out of range (1e308 s a step, say)."""


def checked_price(step_time: Callable[[BatchShape], float]) -> Callable[[BatchShape], float]:
    """``step_time``, raising :class:`StepPriceError` for a price that is NaN, infinite or
    negative, instead of a run whose clock stops at NaN or inf and reports success."""

    def price(shape: BatchShape) -> float:
        t = step_time(shape)
        if not 0.0 <= t < math.inf:
            raise StepPriceError(
                f"a step of {shape.prefill_tokens} prefill tokens and {shape.decode_seqs} "
                f"decodes was priced at {t} s; the cost model's constants are out of range"
            )
        return t

    return price


@dataclass
class SimResult:
    recorder: Recorder
    end_time_s: float
    num_steps: int
    swap_fallbacks: int = 0  # preemptions recomputed for want of CPU swap space, all replicas


class CostExecutor:
    """``core.loop``'s executor in the simulator: prices a plan with ``step_time``; at the
    step's end, takes the beam choices of ``recorded_beams`` (an engine run's, replayed
    step for step) or, with a ``beams_rng``, draws them (:func:`sim.beams.sim_beams`)."""

    def __init__(
        self,
        step_time: Callable[[BatchShape], float],
        beams_rng: np.random.Generator | None,
        recorded_beams: RecordedBeams | None = None,
    ) -> None:
        self.step_time = step_time
        self.beams_rng = beams_rng
        self.recorded_beams = recorded_beams

    def execute(self, plan: StepPlan, shape: BatchShape, start: float) -> StepOutcome:
        return StepOutcome(self.step_time(shape))

    def at_end(self, plan: StepPlan, outcome: StepOutcome) -> None:
        if self.recorded_beams is not None:
            outcome.beams = self.recorded_beams.choices(plan)
        elif self.beams_rng is not None:
            outcome.beams = sim_beams(plan, self.beams_rng)


# A finished group and its sequences hold each other (a cycle), so while the collector is
# paused they outlive the run, token lists and all (about 3 KB a request on the Azure
# conversation trace): a young collection each this many requests done frees those made
# since the last (its cost grows with the garbage, not with the run's long-lived objects).
COLLECT_EVERY_REQUESTS = 1 << 13


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector (restored on exit): for phases that build
    millions of long-lived objects, over which every collection pass would be wasted."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def simulate(
    requests: Sequence[Request],
    make_scheduler: Callable[[], BaseScheduler],
    cost_model: CostModel,
    num_replicas: int = 1,
    seed: int = 0,
    progress: bool = False,
    check_integrity_every: int = 0,
    fast_forward: bool = True,
    vocab_size: int | None = None,
    recorded_beams: RecordedBeams | None = None,
) -> SimResult:
    """Run ``requests`` to completion and return the recorder with every step and request.

    Request ids must be unique. ``make_scheduler`` builds one scheduler per replica.
    ``check_integrity_every > 0`` runs the scheduler's and manager's invariant checks every
    that many steps (tests). ``fast_forward`` runs stretches of plain decode steps at once
    (:meth:`core.loop.StepLoop.fast_forward`; identical results, False for the step-by-step
    reference). ``vocab_size`` (the model's): a request with a prompt id outside it is
    rejected at intake, as the engine rejects it. ``recorded_beams`` (one replica): an
    engine run's beam choices (:mod:`core.beam_log`) instead of the stand-in's draws.
    Python's cyclic garbage collector is paused while the simulation runs (restored
    afterwards), but for one collection each :data:`COLLECT_EVERY_REQUESTS` requests done.
    A step priced at NaN, inf or below zero, or a clock that overflows, raises
    :class:`StepPriceError`.
    """
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    ordered = sorted(requests, key=lambda r: (r.arrival_time, r.request_id))
    if len({r.request_id for r in ordered}) != len(ordered):
        counts = Counter(r.request_id for r in ordered)
        dup = next(rid for rid, c in counts.items() if c > 1)
        raise ValueError(f"request id {dup} appears {counts[dup]} times; ids must be unique")
    env = simpy.Environment(initial_time=0.0)  # float from the start, as the engine's clock
    recorder = Recorder(num_replicas=num_replicas)
    bar = tqdm(total=len(ordered), unit="req", disable=not progress, desc="simulate")
    beams = any(r.sampling.use_beam_search for r in ordered)
    beams_rng = np.random.default_rng(seed) if beams else None
    if recorded_beams is not None and num_replicas != 1:
        raise ValueError("recorded beam choices replay one replica's steps; num_replicas is 1")
    price = checked_price(cost_model.step_time)
    since_collected = 0

    def on_done(k: int) -> None:
        nonlocal since_collected
        bar.update(k)
        since_collected += k
        if since_collected >= COLLECT_EVERY_REQUESTS:
            since_collected = 0
            gc.collect(1)

    executor = CostExecutor(price, beams_rng, recorded_beams)
    loops = [
        StepLoop(
            make_scheduler(),
            executor,
            recorder if num_replicas == 1 else recorder.for_replica(r),
            on_done,
            check_integrity_every,
        )
        for r in range(num_replicas)
    ]
    wakeups: list[simpy.Event | None] = [None] * num_replicas
    state = {"arrivals_done": False}

    def arrivals():
        for i, req in enumerate(ordered):
            delay = req.arrival_time - env.now
            if delay > 0:
                yield env.timeout(delay)
            r = i % num_replicas
            try:
                group = loops[r].add(req, env.now, vocab_size)
            except PolicyError as e:  # the intake's KVCacheError, as a step's
                raise SimulationError(f"replica {r}: {e}") from e
            if group.reject_reason is not None:
                continue
            event = wakeups[r]
            if event is not None and not event.triggered:
                event.succeed()
        state["arrivals_done"] = True
        for event in wakeups:
            if event is not None and not event.triggered:
                event.succeed()

    def engine(r: int):
        """Replica ``r``'s steps; a scheduler's broken contract is a SimulationError."""
        try:
            yield from replica_steps(r)
        except PolicyError as e:  # from a step, a run of steps or an invariant check
            raise SimulationError(f"replica {r}: {e}") from e

    def replica_steps(r: int):
        """Replica ``r``'s steps on the SimPy clock (the step itself is ``core.loop``'s)."""
        loop = loops[r]
        begin, finish = loop.begin, loop.finish
        # Plain decode steps run at once while no other event is due (the rule below);
        # not with beam search, whose stand-in draws random numbers at each step's end,
        # nor with a cost model that must price each step once, in order.
        ahead = loop.fast_forward if fast_forward and beams_rng is None else None
        if getattr(cost_model, "priced_in_order", False):
            ahead = None
        timeout, peek = env.timeout, env.peek
        now = env.now  # this engine's clock; may run ahead of env.now, see below
        next_event = peek()  # the queue changes only while this process is suspended

        def no_event_before(end: float) -> bool:
            lag = env.now
            return next_event > end and lag + (end - lag) == end

        while True:
            pending = None
            if ahead is not None:
                # a run ends with the step that finishes a group: the next may start another
                ran = -1
                while pending is None and ran != loop.num_steps:
                    ran = loop.num_steps
                    now, pending = ahead(now, price, no_event_before)
            if pending is None:
                pending = begin(now)
            if pending is None:
                if state["arrivals_done"]:
                    if env.now != now:
                        yield timeout(now - env.now)  # end the run at this engine's time
                    return
                wakeups[r] = env.event()
                yield wakeups[r]
                wakeups[r] = None
                now = env.now
                next_event = peek()
                continue
            end = pending.end
            lag = env.now
            if no_event_before(end):
                # No event is due before the step ends (nothing could run in between):
                # skip the timeout. A later timeout of ``end - lag`` lands exactly on
                # ``end`` (checked), so the clock stays bit-identical to one per step.
                now = end
            else:
                if lag != now:
                    yield timeout(now - lag)  # catch up first (exact, checked above)
                yield timeout(pending.outcome.duration_s)
                now = env.now
                next_event = peek()
                if next_event == now:
                    # an arrival due at this step's end joins the next step whichever was
                    # scheduled first (the engine adds every arrival <= now before a step)
                    yield timeout(0.0)
                    next_event = peek()
            finish(pending, now)

    # the arrivals are awaited too, so that an intake's error leaves env.run as raised (SimPy
    # re-raises a failed process that nothing waits for as a copy, its cause lost)
    procs = [env.process(arrivals()), *(env.process(engine(r)) for r in range(num_replicas))]
    # The run allocates millions of short-lived objects and keeps every step's row, but
    # makes little cyclic garbage (finished groups): cyclic GC passes over the growing
    # heap would cost more than they free, so they wait until the run is over.
    with no_cyclic_gc():
        try:
            env.run(until=simpy.AllOf(env, procs))
        finally:  # an interrupt's line then starts a line of its own, not the bar's
            bar.close()
    if not math.isfinite(env.now):
        raise StepPriceError(
            f"the simulated clock overflowed ({env.now} s); the cost model's constants are "
            "out of range"
        )
    if recorder.num_requests != len(ordered):
        raise SimulationError(
            f"{len(ordered) - recorder.num_requests} requests neither finished nor were "
            "rejected (a scheduler lost them)"
        )
    num_steps = sum(loop.num_steps for loop in loops)
    fallbacks = sum(loop.scheduler.swap_fallbacks for loop in loops)
    return SimResult(recorder, env.now, num_steps, fallbacks)
