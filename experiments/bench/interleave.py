"""Several measurements in one sitting, a unit of work each in turn.

On a shared machine whose speed drifts over minutes (a cloud VM: ±30% within a quarter of an
hour, ``docs/validation/cpu-engine.md``), runs measured one after another see different
machines, and a model calibrated on one and validated on another inherits the difference.
:func:`take_turns` runs them together instead: each participant is a generator that does one
unit of work per ``next`` (an engine step: :meth:`engine.engine.LLMEngine.serving`; a
profile point: :func:`experiments.bench.profile_gpu.measuring`), and the next turn always
goes to the participant least far through its expected units (done ÷ expected; ties to the
first listed). Participants whose expectation is right then finish together, each spread
over the whole sitting, so every one meets the same mix of the machine's speeds. A wrong
expectation only skews the spread (a participant past its expectation waits for the others);
:func:`spread` reports what happened, for the record.

Only one participant runs at a time, in the calling thread, so a per-thread CPU clock
(``step_timer=thread_cpu``) times each unit alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Participant:
    """One measurement in the sitting: ``work`` yields once per unit and returns its result,
    which lands in :attr:`result`; ``expected`` units (> 0) is its share of the sitting."""

    name: str
    work: Generator[Any, None, Any]
    expected: int
    done: int = 0
    result: Any = None
    finished: bool = False
    busy_s: float = 0.0  # wall seconds spent in its own units
    turn_times: list[float] = field(default_factory=list)  # sitting seconds at each unit's end

    def __post_init__(self) -> None:
        if self.expected <= 0:
            raise ValueError(f"participant {self.name}: expected units must be > 0")

    @property
    def progress(self) -> float:
        """How far through its expected units (past 1 when the expectation was short)."""
        return self.done / self.expected


def take_turns(
    participants: Sequence[Participant],
    on_finish: Callable[[Participant], None] | None = None,
    log: Callable[[str], None] | None = None,
    log_every_s: float = 60.0,
) -> None:
    """Run every participant to its end, one unit at a time, the least advanced first.
    ``on_finish(p)`` is called as each one ends (write its results before the others go
    on); ``log`` gets a progress line every ``log_every_s`` seconds. An exception in a
    participant propagates at once (the others stop where they are)."""
    names = [p.name for p in participants]
    if len(set(names)) != len(names):
        raise ValueError(f"participant names must be unique, got {names}")
    t0 = time.perf_counter()
    last_log = t0
    live = list(participants)
    while live:
        p = min(live, key=lambda q: q.progress)  # min keeps the first of equals
        began = time.perf_counter()
        try:
            next(p.work)
        except StopIteration as end:
            p.result, p.finished = end.value, True
            live.remove(p)
            if on_finish is not None:
                on_finish(p)
            continue
        now = time.perf_counter()
        p.done += 1
        p.busy_s += now - began
        p.turn_times.append(now - t0)
        if log is not None and now - last_log >= log_every_s:
            last_log = now
            log(f"[{now - t0:.0f} s] " + ", ".join(f"{q.name} {q.done}/{q.expected}" for q in live))


def spread(participants: Sequence[Participant]) -> list[dict[str, Any]]:
    """Where in the sitting each participant's units fell, as fractions of the sitting
    (first, median, last unit's end) and its units against the expectation. Participants
    spread alike have alike quartiles."""
    end = max((p.turn_times[-1] for p in participants if p.turn_times), default=0.0) or 1.0
    rows = []
    for p in participants:
        t = np.asarray(p.turn_times) / end
        q = np.quantile(t, [0.0, 0.25, 0.5, 0.75, 1.0]) if len(t) else [float("nan")] * 5
        rows.append({
            "participant": p.name, "units": p.done, "expected": p.expected,
            "busy_s": round(p.busy_s, 2), "first": round(float(q[0]), 3),
            "q25": round(float(q[1]), 3), "median": round(float(q[2]), 3),
            "q75": round(float(q[3]), 3), "last": round(float(q[4]), 3),
        })  # fmt: skip
    return rows


if __name__ == "__main__":
    from experiments.bench.tables import not_a_command

    not_a_command("experiments.bench.interleave", "experiments.bench.sitting (an interleaved "
                  "sitting of engine runs and a profile)")  # fmt: skip
