"""A run's beam-search choices: written by the engine, replayed by the simulator.

The engine keeps the beams its model's log-probabilities rank highest; the simulator has no
model and ranks seeded scores instead (:mod:`sim.beams`), so the two fork, copy and free
different sequences. To replay an engine run step for step, the simulator takes the
engine's choices from the run's ``beams.csv``, one row per new beam:

``step, request_id, beam, parent, token, score``

- ``step``: the 0-based index of the step whose end made the choice (each body counts the
  steps its loop ends, :meth:`core.loop.Executor.at_end`, so the indices agree while the
  replay does);
- ``beam``: the new beam's rank in the choice (0 is the best);
- ``parent``: the index of its parent among the group's live sequences when the choice is
  made (sequence ids are each body's own; the live order is the scheduler's, the same in
  both);
- ``token``: the token it appends; ``score``: its cumulative log-probability.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

from core.plan import BeamChoice, StepPlan

COLUMNS = ("step", "request_id", "beam", "parent", "token", "score")
BeamRow = tuple[int, int, int, int, int, float]


class BeamReplayError(ValueError):
    """A recorded choice names a request or parent the replayed step does not hold: the
    replay has left the recording."""


class BeamLog:
    """The engine side: :meth:`record` at every step's end, in order; :attr:`rows` to write."""

    def __init__(self) -> None:
        self.rows: list[BeamRow] = []
        self.steps = 0

    def record(self, choices: list[BeamChoice]) -> None:
        """The choices made at the end of the next step (empty: none this step)."""
        for choice in choices:
            rid = choice.group.request.request_id
            live = [s.seq_id for s in choice.group.live_seqs()]
            scores = choice.scores or [math.nan] * len(choice.beams)
            for k, ((parent, token), score) in enumerate(zip(choice.beams, scores, strict=True)):
                self.rows.append((self.steps, rid, k, live.index(parent), int(token), score))
        self.steps += 1


class RecordedBeams:
    """The simulator side: the choices of a ``beams.csv``, handed out step by step."""

    def __init__(self, rows: list[BeamRow]) -> None:
        by_step: dict[int, dict[int, list[BeamRow]]] = defaultdict(lambda: defaultdict(list))
        for row in rows:
            by_step[row[0]][row[1]].append(row)
        self._by_step = by_step
        self.steps = 0

    @classmethod
    def read(cls, path: Path) -> RecordedBeams:
        """The rows of ``path``; a malformed file raises ``ValueError`` naming it and the
        line."""
        rows: list[BeamRow] = []
        with Path(path).open(newline="") as f:
            reader = csv.reader(f)
            if tuple(next(reader, ())) != COLUMNS:
                raise ValueError(f"{path}: line 1: not a beams.csv header ({','.join(COLUMNS)})")
            for line, cells in enumerate(reader, start=2):
                try:
                    *ints, score = cells
                    step, rid, beam, parent, token = (int(c) for c in ints)
                    rows.append((step, rid, beam, parent, token, float(score)))
                except ValueError:
                    raise ValueError(
                        f"{path}: line {line}: expected {len(COLUMNS)} numbers "
                        f"({', '.join(COLUMNS)}), got {cells!r}"
                    ) from None
        return cls(rows)

    def choices(self, plan: StepPlan) -> list[BeamChoice]:
        """The recorded choices of the next step for the groups ``plan`` ran; a choice
        whose request or parent the plan does not hold raises :class:`BeamReplayError`."""
        recorded = self._by_step.pop(self.steps, {})
        step, self.steps = self.steps, self.steps + 1
        if not recorded:
            return []
        groups = {s.group.request.request_id: s.group for s in plan.scheduled_seqs()}
        out = []
        for rid, rows in recorded.items():
            group = groups.get(rid)
            if group is None:
                raise BeamReplayError(f"beams.csv: step {step} chooses beams of request {rid}, "
                                 "which the replayed step did not run")  # fmt: skip
            live = group.live_seqs()
            if max(r[3] for r in rows) >= len(live):
                raise BeamReplayError(f"beams.csv: step {step}: request {rid} has {len(live)} "
                                 "live sequences, fewer than the recorded parents")  # fmt: skip
            rows = sorted(rows, key=lambda r: r[2])
            out.append(BeamChoice(group, [(live[r[3]].seq_id, r[4]) for r in rows],
                                  [r[5] for r in rows]))  # fmt: skip
        return out
