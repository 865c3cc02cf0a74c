"""The step loop: what happens in one serving step, in order, written once for both bodies.

A step at time ``now``:

1. ``plan = scheduler.schedule(now)``; groups the scheduler aborted are recorded; a plan
   that runs nothing but preempted something is rescheduled at once (everything running
   was preempted; the freed memory re-admits work); an empty plan with work left is a
   stall (:class:`StallError`); an empty plan with nothing left means *idle*; a policy
   plugin's plan is checked (:class:`PlanError`);
2. the memory breakdown and running count are taken (they describe the step);
3. the body's :class:`Executor` runs or prices the plan and returns its outcome (the step's
   duration and, in the engine, the sampled tokens);
4. at the step's end, ``scheduler.update(plan, outcome, end)``, then the step and every
   finished group are recorded.

Requests enter through :meth:`StepLoop.add` (a rejected one is recorded at once; under a
scheduler whose ``sampling_fanout`` is ``"requests"`` a request of ``n > 1`` samples enters as
``n`` requests of one sample, a :class:`~core.request.ParentRequest`, recorded as one request
when its last child is done). A body
whose clock advances by a plain call runs a step with :meth:`StepLoop.step`, or a whole
trace with :meth:`StepLoop.run` (or :meth:`StepLoop.serve`, which yields after each step;
arrivals chained as the simulator's arrival process reaches them, idle jumps to the next
arrival). The simulator's clock advances by yielding to SimPy, so it calls
:meth:`StepLoop.begin` (steps 1-3) and :meth:`StepLoop.finish` (step 4) around its timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from core.kv.base import KVCacheError, MemoryBreakdown
from core.metrics.recorder import Recorder, ReplicaRecorder
from core.plan import BatchShape, StepOutcome, StepPlan, new_shape
from core.request import ParentRequest, Request, SequenceGroup, child_request
from core.sched.base import BaseScheduler
from core.systems import SHIPPED_MANAGERS, SHIPPED_SCHEDULERS


class PolicyError(RuntimeError):
    """The scheduler broke the step loop's contract: a policy plugin's bug, or kvlab's."""


class StallError(PolicyError):
    """The scheduler has unfinished work but scheduled nothing."""


class IntegrityError(PolicyError):
    """The scheduler's or its KV-cache manager's invariants failed
    (:meth:`~core.sched.base.BaseScheduler.check_integrity`, run every ``check_every``
    steps)."""


class KVMisuseError(PolicyError, KVCacheError):
    """The scheduler misused its KV-cache manager (a :class:`~core.kv.base.KVCacheError`
    escaped ``schedule`` or ``update``: a block freed twice, a sequence unknown to it)."""


class LostRequestError(PolicyError):
    """The scheduler dropped requests: groups it accepted that neither finished nor were
    aborted are in none of its queues (``waiting``, ``running``, ``swapped``)."""


class PlanError(PolicyError):
    """The scheduler returned a plan no body can run right
    (:meth:`~core.sched.base.BaseScheduler.plan_problem`)."""


class Executor(Protocol):
    """A body's way of running a plan."""

    def execute(self, plan: StepPlan, shape: BatchShape, start: float) -> StepOutcome:
        """Run (engine) or price (simulator) ``plan``, which starts at ``start``; the
        outcome's ``duration_s`` is the step's length."""
        ...

    def at_end(self, plan: StepPlan, outcome: StepOutcome) -> None:
        """Called when the step's end is reached, just before the scheduler sees
        ``outcome``: for results a body decides only then (the simulator's stand-in beam
        choices are drawn in order of step ends across replicas). Usually nothing."""
        ...


class Clock(Protocol):
    """Where :meth:`StepLoop.run` gets the time from."""

    def now(self) -> float:
        """The current time."""
        ...

    def step_end(self, start: float, duration_s: float) -> float:
        """The time a step that started at ``start`` and took ``duration_s`` ended."""
        ...

    def wait_until(self, t: float) -> None:
        """Idle until ``t`` (the next arrival)."""
        ...


class VirtualClock:
    """Advances by step durations and jumps to the next arrival when idle."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def step_end(self, start: float, duration_s: float) -> float:
        self.t = start + duration_s
        return self.t

    def wait_until(self, t: float) -> None:
        self.t = t


class LoopObserver:
    """Hooks for tests that look inside steps; every method does nothing by default."""

    def before_schedule(self, scheduler: BaseScheduler) -> None:
        """Before each ``schedule`` call (reschedules after a preemption included)."""

    def after_schedule(self, plan: StepPlan) -> None:
        """After each ``schedule`` call, before the plan runs."""

    def after_step(self, plan: StepPlan, finished: list[SequenceGroup]) -> None:
        """After a step's update and records."""


@dataclass(slots=True)
class PendingStep:
    """A step between :meth:`StepLoop.begin` and :meth:`StepLoop.finish`."""

    plan: StepPlan
    shape: BatchShape
    memory: MemoryBreakdown
    running: int
    start: float
    outcome: StepOutcome

    @property
    def end(self) -> float:
        """``start + duration``: where a clock that advances by durations lands."""
        return self.start + self.outcome.duration_s


@dataclass(eq=False)
class StepLoop:
    """One scheduler, one executor, one recorder. ``on_done(k)`` is told whenever ``k``
    requests are done (rejected, aborted or finished; progress bars). ``check_every > 0``
    runs the scheduler's and manager's invariant checks every that many steps.
    ``check_plans`` holds every plan to :meth:`BaseScheduler.plan_problem` (a
    :class:`PlanError` names the first problem); None: for a scheduler or KV-cache manager
    that is not one of the shipped ones (a plugin's), whose plans nothing else checks. Its
    errors name the scheduler, and a plugin's manager beside it."""

    scheduler: BaseScheduler
    executor: Executor
    recorder: Recorder | ReplicaRecorder
    on_done: Callable[[int], object] | None = None
    check_every: int = 0
    observer: LoopObserver | None = None
    check_plans: bool | None = None
    num_steps: int = field(default=0, init=False)
    ended: list[SequenceGroup] = field(default_factory=list, init=False)  # since begin()
    # groups accepted by add that have not finished or been aborted (a queue must hold them)
    num_open: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.check_plans is None:
            self.check_plans = (
                type(self.scheduler) not in SHIPPED_SCHEDULERS
                or type(self.scheduler.manager) not in SHIPPED_MANAGERS
            )

    @property
    def who(self) -> str:
        """What the loop's errors call the policy: its scheduler, and a plugin's manager."""
        manager = getattr(self.scheduler, "manager", None)
        own = ""
        if manager is not None and type(manager) not in SHIPPED_MANAGERS:
            own = f" (KV manager {type(manager).__qualname__})"
        return f"scheduler {self.scheduler.name}{own}"

    def _done(self, groups: list[SequenceGroup], opened: bool = True) -> None:
        """Record ``groups``, done; ``opened``: they were accepted (not rejected at intake). A
        child of a :class:`ParentRequest` is recorded as its parent once the last is done;
        ``on_done`` counts requests so recorded."""
        record = self.recorder.record_request
        recorded = 0
        for group in groups:
            parent = group.parent
            if parent is None:
                record(group)
                recorded += 1
            elif parent.child_ended():
                record(parent)
                recorded += 1
        if opened:
            self.num_open -= len(groups)
        self.ended.extend(groups)
        if self.on_done is not None and recorded:
            self.on_done(recorded)

    def add(
        self, request: Request, now: float, vocab_size: int | None = None
    ) -> SequenceGroup | ParentRequest:
        """Queue ``request`` at ``now``; a rejected one (one the scheduler can never serve, or
        with a prompt id outside a vocabulary of ``vocab_size``) is recorded at once. A
        KVCacheError from the intake (its manager asked whether the request can ever fit) is
        a :class:`KVMisuseError`, as from a step. A request of ``n > 1`` samples under a
        scheduler whose ``sampling_fanout`` is ``"requests"`` is queued as ``n`` requests of
        one sample (:func:`~core.request.child_request`) and comes back as their
        :class:`ParentRequest`; when the first is rejected, so is the request, whole."""
        if request.sampling.n > 1 and self.scheduler.sampling_fanout == "requests":
            return self._add_fanout(request, now, vocab_size)
        group = self._intake(request, now, vocab_size)
        if group.reject_reason is not None:
            self._done([group], opened=False)
        else:
            self.num_open += 1
        return group

    def _intake(self, request: Request, now: float, vocab_size: int | None) -> SequenceGroup:
        problem = request.vocabulary_problem(vocab_size)
        if problem is not None:
            return self.scheduler.reject(request, problem)
        try:
            return self.scheduler.add(request, now)
        except KVCacheError as e:
            raise self._misuse("add", e) from e

    def _add_fanout(self, request: Request, now: float, vocab_size: int | None) -> ParentRequest:
        parent = ParentRequest(request)
        for index in range(request.sampling.n):
            child = self._intake(child_request(request, index), now, vocab_size)
            parent.adopt(child)
            if index == 0 and child.reject_reason is not None:
                break  # every child is the same request: none would be served
        rejected = [c for c in parent.children if c.reject_reason is not None]
        self.num_open += len(parent.children) - len(rejected)
        if rejected:
            self._done(rejected, opened=False)
        return parent

    def begin(self, now: float) -> PendingStep | None:
        """Steps 1-3 at ``now``; ``None`` when idle (nothing left to run). Clears
        :attr:`ended`, which then collects the groups aborted or finished in this step."""
        self.ended = []
        sched = self.scheduler
        observer = self.observer
        while True:
            if observer is not None:
                observer.before_schedule(sched)
            try:
                plan = sched.schedule(now)
            except KVCacheError as e:
                raise self._misuse("schedule", e) from e
            if self.check_plans and not isinstance(plan, StepPlan):
                raise PlanError(
                    f"{self.who}'s schedule returned {type(plan).__name__}, not a "
                    f"StepPlan (step {self.num_steps}): a policy returns its plan, e.g. the "
                    "parent's schedule(now)"
                )
            if observer is not None:
                observer.after_schedule(plan)
            aborted = sched.pop_aborted()
            if aborted:
                self._done(aborted)
            if not plan.is_empty:
                if self.check_plans:
                    self._check_plan(plan)
                break
            if plan.preempted or aborted:  # memory was freed: what waits may fit now
                continue
            if sched.has_unfinished():
                manager = sched.manager
                raise StallError(
                    f"{self.who} has {len(sched.waiting)} waiting, "
                    f"{len(sched.running)} running and {len(sched.swapped)} swapped "
                    f"requests but scheduled nothing ({manager.num_free_blocks()} of "
                    f"{manager.num_device_blocks} KV blocks free)"
                )
            if self.num_open:
                raise self._lost(self.num_open)
            return None
        shape = plan.shape()
        memory = sched.manager.breakdown()
        running = len(sched.running)
        outcome = self.executor.execute(plan, shape, now)
        return PendingStep(plan, shape, memory, running, now, outcome)

    def _check_integrity(self) -> None:
        sched = self.scheduler
        try:
            sched.check_integrity()
        except (AssertionError, KVCacheError) as e:  # the managers' checks raise KVCacheError
            raise IntegrityError(f"{self.who} after step {self.num_steps}: {e}") from e
        queued = len(sched.waiting) + len(sched.running) + len(sched.swapped)
        queued += len(getattr(sched, "_aborted", ()))  # aborted, not yet popped
        if queued < self.num_open:
            raise self._lost(self.num_open - queued)

    def _lost(self, count: int) -> LostRequestError:
        return LostRequestError(
            f"{self.who} lost {count} request(s) by step {self.num_steps}: "
            "accepted, neither finished nor aborted, and in none of its queues"
        )

    def _misuse(self, verb: str, e: KVCacheError) -> KVMisuseError:
        return KVMisuseError(
            f"{self.who} in {verb} at step {self.num_steps}: its KV-cache "
            f"manager refused a call: {e}"
        )

    def _check_plan(self, plan: StepPlan) -> None:
        problem = self.scheduler.plan_problem(plan)
        if problem is not None:
            raise PlanError(
                f"{self.who} planned a step no body can run: {problem} (step {self.num_steps})"
            )

    def finish(self, pending: PendingStep, end: float) -> list[SequenceGroup]:
        """Step 4 at the step's ``end``; returns the groups that finished."""
        sched = self.scheduler
        plan, outcome = pending.plan, pending.outcome
        self.executor.at_end(plan, outcome)
        step = sched.step_index
        try:
            finished = sched.update(plan, outcome, end)
        except KVCacheError as e:
            raise self._misuse("update", e) from e
        self.recorder.record_step(
            step, pending.start, outcome.duration_s, plan, pending.shape, pending.memory,
            pending.running,
        )  # fmt: skip
        if finished:
            self._done(finished)
        self.num_steps += 1
        if self.check_every and self.num_steps % self.check_every == 0:
            self._check_integrity()
        if self.observer is not None:
            self.observer.after_step(plan, finished)
        return finished

    def fast_forward(
        self,
        now: float,
        price: Callable[[BatchShape], float],
        accept: Callable[[float], bool],
    ) -> tuple[float, PendingStep | None]:
        """Run the plain decode steps the scheduler promises (:meth:`BaseScheduler.
        decode_run`) at once, each priced by ``price`` and ended at ``now + duration``, for
        as long as ``accept(end)`` holds for the step's end (a body whose clock sees other
        events stops before one is due). Leaves the scheduler, recorder and counters as one
        :meth:`begin` / :meth:`finish` per step with the executor returning ``price(shape)``
        would, invariant checks included. Returns the clock after the last step run
        (``now`` when none ran) and, when a promised step's end was not accepted, that
        step begun, as :meth:`begin` returns it (the caller finishes it with
        :meth:`finish`), else None. Not with an observer (it would miss the steps), nor for
        a scheduler whose ``decode_run`` does not speak for its ``schedule`` and ``update``
        (:meth:`BaseScheduler.decode_run_applies`)."""
        sched = self.scheduler
        if self.observer is not None or not sched.decode_run_applies():
            return now, None
        check = self.check_every
        run = sched.decode_run(check - self.num_steps % check if check else 1 << 62)
        if run is None:
            return now, None
        n, ctx, first = len(run.seqs), run.ctx_tokens, now
        shapes: list[BatchShape] = []
        durations: list[float] = []
        ends: list[float] = []
        held = None  # the step whose end was not accepted: begun, not finished
        for _ in run.new_blocks:
            shape = new_shape(0, 0, 0, 0, n, ctx, 0, 0, 0)
            duration = price(shape)
            end = now + duration
            if not accept(end):
                held = shape, duration
                break
            shapes.append(shape)
            durations.append(duration)
            ends.append(end)
            now = end
            ctx += n
        self.ended = []
        step = sched.step_index
        memories, finished = sched.advance_decode_run(run, ends, held is not None)
        groups, waiting, held_by = len(run.groups), run.num_waiting, run.queue_held_by
        record, start = self.recorder.record_row, first
        for j, (shape, duration) in enumerate(zip(shapes, durations, strict=True)):
            record(step + j, start, duration, shape, groups, groups, waiting, 0, held_by, 0,
                   memories[j])  # fmt: skip
            start = ends[j]
        if finished:
            self._done(finished)
        self.num_steps += len(ends)
        if ends and check and self.num_steps % check == 0:
            self._check_integrity()
        if held is None:
            return now, None
        plan = StepPlan([], list(run.seqs), [], [], [], [], [], waiting, 0, held_by)
        shape, duration = held
        return now, PendingStep(plan, shape, memories[-1], groups, now, StepOutcome(duration))

    def step(self, clock: Clock) -> PendingStep | None:
        """One whole step at ``clock.now()``; ``None`` when idle."""
        pending = self.begin(clock.now())
        if pending is not None:
            self.finish(pending, clock.step_end(pending.start, pending.outcome.duration_s))
        return pending

    def run(
        self,
        requests: Sequence[Request],
        clock: Clock,
        add: Callable[[Request, float], object] | None = None,
    ) -> None:
        """Serve ``requests`` (sorted by arrival, then id) to completion: before each step
        every request that has arrived by then is added (by ``add``, default
        :meth:`add`); when idle, the clock waits for the next arrival."""
        for _ in self.serve(requests, clock, add):
            pass

    def serve(
        self,
        requests: Sequence[Request],
        clock: Clock,
        add: Callable[[Request, float], object] | None = None,
    ) -> Iterator[PendingStep]:
        """:meth:`run` one step at a time: yields each step once it has finished, so a
        caller can do other work between steps (serve several runs in turn); exhausted
        when every request is done."""
        add = self.add if add is None else add
        ordered = sorted(requests, key=lambda r: (r.arrival_time, r.request_id))
        arrivals = chained_arrivals([r.arrival_time for r in ordered])
        i, n = 0, len(ordered)
        while True:
            now = clock.now()
            while i < n and arrivals[i] <= now:
                add(ordered[i], arrivals[i])
                i += 1
            pending = self.step(clock)
            if pending is not None:
                yield pending
            elif i == n:
                return
            else:
                clock.wait_until(arrivals[i])


def chained_arrivals(times: list[float]) -> list[float]:
    """Arrival instants as the simulator's arrival process reaches them: from ``t``, a
    timeout of ``a - t`` lands at ``t + (a - t)``, which can differ from ``a`` by an ulp."""
    out: list[float] = []
    t = 0.0
    for a in times:
        delay = a - t
        if delay > 0:
            t = t + delay
        out.append(t)
    return out
