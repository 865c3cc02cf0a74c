"""The recorder both bodies (simulator and engine) write into.

Per step: start time, duration, the plan's composition and token counts, queue lengths and
the KV memory breakdown *during* the step (after the scheduler's allocations), in slots, and
the physical and logical (per-holder, i.e. without sharing) device block counts. Per request:
arrival, first scheduled, first token, finish (times and step indices), preemptions, or the
reason it was rejected. ``steps_frame()`` / ``requests_frame()`` give the tables written to
``steps.csv`` / ``requests.csv``; :mod:`core.metrics.summary` turns them into metrics.

Rows are kept as tuples (cheap on the hot path), packed every :data:`STEP_BLOCK_ROWS` step
rows into a float64 array (200 bytes a row, under half a row of Python objects: long
replays hold hundreds of thousands of steps), and become DataFrames only at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np
import pandas as pd

from core.kv.base import MemoryBreakdown
from core.plan import BatchShape, StepPlan
from core.request import ParentRequest, SequenceGroup

_GROUP = attrgetter("group")

STEP_COLUMNS = (
    "step",
    "start_s",
    "duration_s",
    "prefill_seqs",
    "prefill_tokens",
    "prefill_attn_pairs",
    "prefill_kv_read_tokens",
    "decode_seqs",
    "decode_ctx_tokens",
    "batch_requests",
    "running_requests",
    "num_waiting",
    "num_swapped",
    "queue_held_by",
    "num_preempted",
    "swap_in_blocks",
    "swap_out_blocks",
    "copy_blocks",
    "kv_token_states",
    "kv_reserved",
    "kv_internal_frag",
    "kv_allocator_padding",
    "kv_free",
    "kv_physical_blocks",
    "kv_logical_blocks",
)

_STEP_DTYPE = np.dtype(
    [(name, "f8" if name in ("start_s", "duration_s") else "i8") for name in STEP_COLUMNS]
)

STEP_BLOCK_ROWS = 1 << 15  # step rows kept as tuples before they are packed into an array

REQUEST_COLUMNS = (
    "request_id",
    "arrival_s",
    "prompt_len",
    "output_len",
    "num_seqs",
    "first_scheduled_s",
    "first_token_s",
    "finish_s",
    "first_token_step",
    "finish_step",
    "num_preemptions",
    "cached_prompt_tokens",
    "readmit_cached_tokens",
    "ttft_s",
    "e2el_s",
    "tpot_s",
    "status",
    "reject_reason",
)


class Recorder:
    """Collects step and request rows. ``keep_token_times`` keeps every request's token
    timestamps for inter-token latency (ITL) statistics. With ``num_replicas > 1`` each
    replica records through :meth:`for_replica`, and the steps table gains a ``replica``
    column after ``step`` (each replica numbers its own steps), the requests table one after
    ``request_id`` (the replica that served the request, whose steps its
    ``first_token_step`` and ``finish_step`` count)."""

    def __init__(self, keep_token_times: bool = True, num_replicas: int = 1) -> None:
        self._steps: list[tuple] = []  # the newest step rows, not yet packed
        # earlier step rows, STEP_BLOCK_ROWS a block, as float64 (rows, columns) arrays: the
        # counts are far below 2**53 and the times are floats, so every value comes back exact
        self._packed: list[np.ndarray] = []
        self._packed_rows = 0
        self._step_replicas: list[int] | None = [] if num_replicas > 1 else None
        self._requests: list[tuple] = []
        self._request_replicas: list[int] | None = [] if num_replicas > 1 else None
        # (request id, token times) of finished requests with two tokens or more; the gaps
        # are taken in one vectorized pass at the end, not one NumPy call per request
        self._token_times: list[tuple[int, list[float]]] = []
        self.keep_token_times = keep_token_times
        # The requests table and the token gaps, built at the end and kept while no row is
        # added (an app asks for them twice: for its metrics and for its files); keyed by the
        # row count they were built from.
        self._built: dict[str, tuple[int, Any]] = {}

    def record_step(
        self,
        step: int,
        start_s: float,
        duration_s: float,
        plan: StepPlan,
        shape: BatchShape,
        memory: MemoryBreakdown,
        running_requests: int,
    ) -> None:
        groups = set(map(_GROUP, plan.decode))  # groups hash by identity
        if plan.prefill:
            groups.update(c.seq.group for c in plan.prefill)
        self.record_row(
            step, start_s, duration_s, shape, len(groups), running_requests, plan.num_waiting,
            plan.num_swapped, plan.queue_held_by,
            len(plan.preempted) + len(plan.preempted_by_swap), memory,
        )  # fmt: skip

    def record_row(
        self,
        step: int,
        start_s: float,
        duration_s: float,
        shape: BatchShape,
        batch_requests: int,
        running_requests: int,
        num_waiting: int,
        num_swapped: int,
        queue_held_by: int,
        num_preempted: int,
        memory: MemoryBreakdown,
    ) -> None:
        """One step's row from its counts (:meth:`record_step` counts them from the plan;
        a body that runs plain decode steps at once knows them without one)."""
        self._steps.append(
            (
                step,
                start_s,
                duration_s,
                shape.prefill_seqs,
                shape.prefill_tokens,
                shape.prefill_attn_pairs,
                shape.prefill_kv_read_tokens,
                shape.decode_seqs,
                shape.decode_ctx_tokens,
                batch_requests,
                running_requests,
                num_waiting,
                num_swapped,
                queue_held_by,
                num_preempted,
                shape.swap_in_blocks,
                shape.swap_out_blocks,
                shape.copy_blocks,
                memory.token_states,
                memory.reserved,
                memory.internal_frag,
                memory.allocator_padding,
                memory.free,
                memory.physical_blocks,
                memory.logical_blocks,
            )
        )
        if len(self._steps) >= STEP_BLOCK_ROWS:
            self._packed.append(_as_array(self._steps))
            self._packed_rows += len(self._steps)
            self._steps = []

    def record_request(self, group: SequenceGroup | ParentRequest) -> None:
        """One request's row: a group's, or a :class:`ParentRequest`'s (its children's
        times and counts combined as it defines them; ``num_seqs`` its ``n``)."""
        r = group.request
        if group.reject_reason is not None:
            self._requests.append(
                (r.request_id, r.arrival_time, r.prompt_len, r.output_len, r.sampling.num_seqs,
                 group.first_scheduled_time, None, None, None, None, group.num_preemptions,
                 group.cached_prompt_tokens, group.readmit_cached_tokens, None, None, None,
                 "rejected", group.reject_reason)
            )  # fmt: skip
            return
        ttft = group.first_token_time - r.arrival_time
        e2el = group.finish_time - r.arrival_time
        if isinstance(group, ParentRequest):  # its children's mean, each from its own first
            tpot = group.tpot_s()
        else:
            tpot = (e2el - ttft) / (r.output_len - 1) if r.output_len > 1 else None
        self._requests.append(
            (r.request_id, r.arrival_time, r.prompt_len, r.output_len, r.sampling.num_seqs,
             group.first_scheduled_time, group.first_token_time, group.finish_time,
             group.first_token_step, group.finish_step, group.num_preemptions,
             group.cached_prompt_tokens, group.readmit_cached_tokens, ttft, e2el, tpot,
             "finished", "")
        )  # fmt: skip
        if self.keep_token_times:
            for times in group.token_streams():  # a ParentRequest's: each child's
                if len(times) > 1:
                    self._token_times.append((r.request_id, times))  # final once finished

    def for_replica(self, replica: int) -> ReplicaRecorder:
        """What replica ``replica``'s step loop records through."""
        return ReplicaRecorder(self, replica)

    @property
    def num_steps(self) -> int:
        return self._packed_rows + len(self._steps)

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    def _cached(self, name: str, rows: int, build: Callable[[], Any]) -> Any:
        hit = self._built.get(name)
        if hit is None or hit[0] != rows:
            hit = self._built[name] = (rows, build())
        return hit[1]

    def step_rows(self) -> list[tuple]:
        """The step rows as recorded, in :data:`STEP_COLUMNS` order (Python ints, and floats
        for ``start_s`` and ``duration_s``): :meth:`steps_frame` without the frame."""
        return list(self.iter_step_rows())

    def iter_step_rows(self) -> Iterator[tuple]:
        """:meth:`step_rows` one at a time, without a list of them all (a packed block's rows
        are made again as tuples one block at a time)."""
        for block in self._packed:
            columns = [block[:, i].astype(_STEP_DTYPE[n]) for i, n in enumerate(STEP_COLUMNS)]
            yield from zip(*(column.tolist() for column in columns), strict=True)
        yield from self._steps

    def step_table(self) -> tuple[tuple[str, ...], Iterator[tuple]]:
        """The columns and rows of ``steps.csv``: :meth:`iter_step_rows` under
        :data:`STEP_COLUMNS`, with each row's replica after ``step`` in a run of several
        replicas (as :meth:`steps_frame`). The rows can be iterated once."""
        if self._step_replicas is None:
            return STEP_COLUMNS, self.iter_step_rows()
        columns = (STEP_COLUMNS[0], "replica", *STEP_COLUMNS[1:])
        rows = zip(self.iter_step_rows(), self._step_replicas, strict=True)
        return columns, ((r[0], k, *r[1:]) for r, k in rows)

    def steps_frame(self) -> pd.DataFrame:
        """One row per step; ``start_s`` and ``duration_s`` are floats, every other column
        an integer count. A new frame on each call, built from the packed rows (not kept:
        a long run's frame is the size of its packed rows again)."""
        if not self.num_steps:
            columns = list(STEP_COLUMNS)
            if self._step_replicas is not None:
                columns.insert(1, "replica")
            return pd.DataFrame.from_records([], columns=columns)
        # float64 blocks, then each column in its dtype, a column at a time (faster than a
        # record array; no copy of the whole table beside the frame)
        blocks = [*self._packed, _as_array(self._steps)] if self._steps else self._packed
        frame = pd.DataFrame(
            {
                name: np.concatenate([b[:, i] for b in blocks]).astype(_STEP_DTYPE[name])
                for i, name in enumerate(STEP_COLUMNS)
            }
        )
        if self._step_replicas is not None:
            frame.insert(1, "replica", np.array(self._step_replicas, dtype=np.int64))
        return frame

    def requests_frame(self) -> pd.DataFrame:
        """One row per request, by request id; a new frame on each call."""
        return self._cached("requests", len(self._requests), self._build_requests).copy()

    def _build_requests(self) -> pd.DataFrame:
        df = pd.DataFrame.from_records(self._requests, columns=list(REQUEST_COLUMNS))
        if self._request_replicas is not None:
            df.insert(1, "replica", np.array(self._request_replicas, dtype=np.int64))
        return df.sort_values("request_id", kind="stable").reset_index(drop=True)

    def max_itl_by_request(self) -> dict[int, float]:
        """Each finished request's longest inter-token gap (s), by request id (requests
        with one output token have none; a :class:`ParentRequest`'s is its children's
        longest); what an ITL SLO is checked against."""
        if not self._token_times:
            return {}
        gaps, counts = self._gaps()
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        peaks = np.maximum.reduceat(gaps, starts)
        out: dict[int, float] = {}
        for (rid, _), peak in zip(self._token_times, peaks, strict=True):
            out[rid] = max(float(peak), out.get(rid, 0.0))
        return out

    def inter_token_latencies(self) -> np.ndarray:
        """Every gap between two consecutive tokens of a request, request by request in
        the order they finished."""
        if not self._token_times:
            return np.empty(0)
        return self._gaps()[0].copy()

    def _gaps(self) -> tuple[np.ndarray, np.ndarray]:
        """All requests' token gaps, concatenated, and how many each request has."""
        return self._cached("gaps", len(self._token_times), self._build_gaps)

    def _build_gaps(self) -> tuple[np.ndarray, np.ndarray]:
        lists = [times for _, times in self._token_times]
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        ends = np.cumsum(lengths)
        times = np.fromiter(chain.from_iterable(lists), dtype=np.float64, count=int(ends[-1]))
        return np.delete(np.diff(times), ends[:-1] - 1), lengths - 1  # no gaps across requests


def _as_array(rows: list[tuple]) -> np.ndarray:
    """Step rows as one float64 (rows, columns) array, in one pass over every value."""
    width = len(STEP_COLUMNS)
    flat = np.fromiter(chain.from_iterable(rows), dtype=np.float64, count=len(rows) * width)
    return flat.reshape(len(rows), width)


class ReplicaRecorder:
    """A replica's view of a shared :class:`Recorder`: the rows it records are the shared
    recorder's, each step and request row tagged with ``replica``."""

    def __init__(self, shared: Recorder, replica: int) -> None:
        if shared._step_replicas is None:
            raise ValueError("a recorder of one replica has no replica views")
        self.shared, self.replica = shared, replica

    def record_request(self, group: SequenceGroup | ParentRequest) -> None:
        self.shared.record_request(group)
        replicas = self.shared._request_replicas
        assert replicas is not None
        replicas.append(self.replica)

    def record_step(self, *args: Any, **kwargs: Any) -> None:
        self.shared.record_step(*args, **kwargs)
        self._tag()

    def record_row(self, *args: Any, **kwargs: Any) -> None:
        self.shared.record_row(*args, **kwargs)
        self._tag()

    def _tag(self) -> None:
        replicas = self.shared._step_replicas
        assert replicas is not None
        replicas.append(self.replica)
