"""The recorder both bodies (simulator and engine) write into.

Per step: start time, duration, the plan's composition and token counts, queue lengths and
the KV memory breakdown *during* the step (after the scheduler's allocations), in slots, and
the physical and logical (per-holder, i.e. without sharing) device block counts. Per request:
arrival, first scheduled, first token, finish (times and step indices), preemptions, or the
reason it was rejected. ``steps_frame()`` / ``requests_frame()`` give the tables written to
``steps.csv`` / ``requests.csv``; :mod:`core.metrics.summary` turns them into metrics.

Rows are kept as tuples (cheap on the hot path), packed every :data:`STEP_BLOCK_ROWS` step
rows into one array a column (:func:`_pack`: the times float64, each count in the narrowest
integer type that holds its block's values, about 50 bytes a row where a row of Python
objects takes over 400: long replays hold millions of steps), and become DataFrames only at
the end. The summary reads them a column at a time (:meth:`Recorder.steps_view`), and
``steps.csv`` is written from them a block at a time (:meth:`Recorder.step_table`).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator
from itertools import chain, islice
from operator import attrgetter, sub
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
_TIME_COLUMNS = frozenset(i for i, n in enumerate(STEP_COLUMNS) if _STEP_DTYPE[n].kind == "f")
# a packed count column's types, narrowest first (_narrowest)
_COUNT_TYPES = tuple(np.iinfo(t) for t in (np.int8, np.int16, np.int32, np.int64))

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
        # earlier step rows, STEP_BLOCK_ROWS a block, as one array a column (_pack)
        self._packed: list[tuple[np.ndarray, ...]] = []
        self._packed_rows = 0
        self._step_replicas: list[int] | None = [] if num_replicas > 1 else None
        self._requests: list[tuple] = []
        self._request_replicas: list[int] | None = [] if num_replicas > 1 else None
        # the inter-token gaps of finished requests' token streams (a request's, or each
        # child's of a ParentRequest) of two tokens or more, stream after stream, as doubles
        # (8 bytes a gap, no object a stream: no list of times, whose floats would keep
        # every step's end time alive), and each stream's request id and number of gaps
        self._gaps_s = array("d")
        self._stream_ids = array("q")
        self._stream_gaps = array("q")
        self.keep_token_times = keep_token_times
        # The requests table, built at the end and kept while no row is added (an app asks
        # for it twice: for its metrics and for its files); keyed by the row count it was
        # built from.
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
            self._packed.append(_pack(self._steps))
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
                if len(times) > 1:  # each later time less the one before, as np.diff
                    self._gaps_s.extend(map(sub, islice(times, 1, None), times))
                    self._stream_ids.append(r.request_id)
                    self._stream_gaps.append(len(times) - 1)

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
        for block in self._packed:  # tolist: Python ints and floats, whatever the array's type
            yield from zip(*(column.tolist() for column in block), strict=True)
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
        view = self.steps_view()
        if not self.num_steps:
            return pd.DataFrame.from_records([], columns=list(view.columns))
        return pd.DataFrame({name: view.column(name) for name in view.columns})

    def steps_view(self) -> StepsView:
        """The steps table as :meth:`steps_frame` has it, read a column at a time (the rows
        recorded so far; later rows are not in it)."""
        blocks = [*self._packed, _pack(self._steps)] if self._steps else list(self._packed)
        replicas = None if self._step_replicas is None else list(self._step_replicas)
        return StepsView(blocks, self.num_steps, replicas)

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
        if not self._stream_ids:
            return {}
        counts = np.array(self._stream_gaps, dtype=np.int64)
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        peaks = np.maximum.reduceat(self.inter_token_latencies(copy=False), starts)
        out: dict[int, float] = {}
        for rid, peak in zip(self._stream_ids, peaks, strict=True):
            out[rid] = max(float(peak), out.get(rid, 0.0))
        return out

    def inter_token_latencies(self, copy: bool = True) -> np.ndarray:
        """Every gap between two consecutive tokens of a request, request by request in
        the order they finished: a new array; ``copy=False``: a read-only view of the
        recorder's own (no second array of every gap), to let go before the next request
        is recorded (the recorder cannot grow it while a view lives: a BufferError)."""
        if not self._stream_ids:
            return np.empty(0)
        if copy:
            return np.array(self._gaps_s, dtype=np.float64)
        view = np.frombuffer(self._gaps_s, dtype=np.float64)
        view.flags.writeable = False
        return view


def _pack(rows: list[tuple]) -> tuple[np.ndarray, ...]:
    """Step rows (at least one) as one array a column of :data:`STEP_COLUMNS`: the times
    float64, each count in the narrowest of int8, int16, int32 and int64 that holds every
    value of its column in these rows (a count past int32's range widens its block's column,
    never wraps). The rows pass through one float64 array (one pass over every value), so a
    count comes back exact below 2**53 in magnitude."""
    width = len(STEP_COLUMNS)
    flat = np.fromiter(chain.from_iterable(rows), dtype=np.float64, count=len(rows) * width)
    flat = flat.reshape(len(rows), width)
    lows, highs = flat.min(axis=0), flat.max(axis=0)
    return tuple(
        flat[:, i].copy() if i in _TIME_COLUMNS else flat[:, i].astype(_narrowest(lo, hi))
        for i, (lo, hi) in enumerate(zip(lows, highs, strict=True))
    )


def _narrowest(lo: float, hi: float) -> np.dtype:
    """The narrowest signed integer type holding every whole number from ``lo`` to ``hi``."""
    return next((t for t in _COUNT_TYPES if t.min <= lo and hi <= t.max), _COUNT_TYPES[-1]).dtype


class StepsView:
    """A recorder's steps table read a column at a time, as :func:`core.metrics.summary`
    reads a frame: ``view[name]`` is the column :meth:`Recorder.steps_frame` would hold (a
    Series in its dtype, made on each read and not kept), ``name in view``, ``len(view)``,
    ``view.empty`` and ``view.columns`` as a frame's. A long run's frame holds every column
    at once, several times the packed rows; this holds the packed blocks, not copies."""

    def __init__(
        self, blocks: list[tuple[np.ndarray, ...]], num_rows: int, replicas: list[int] | None
    ) -> None:
        self._blocks, self._num_rows, self._replicas = blocks, num_rows, replicas
        names = list(STEP_COLUMNS)
        if replicas is not None:
            names.insert(1, "replica")
        self.columns: tuple[str, ...] = tuple(names)

    def column(self, name: str) -> np.ndarray:
        """Column ``name`` as a new array in the frame's dtype (a KeyError for no column)."""
        if name not in self.columns:
            raise KeyError(name)
        if not self._num_rows:  # an empty frame's columns are of no type: object
            return np.empty(0, dtype=object)
        if name == "replica":
            return np.array(self._replicas, dtype=np.int64)
        i = STEP_COLUMNS.index(name)
        return np.concatenate([b[i] for b in self._blocks]).astype(_STEP_DTYPE[name], copy=False)

    def __getitem__(self, name: str) -> pd.Series:
        return pd.Series(self.column(name), name=name)

    def __contains__(self, name: object) -> bool:
        return name in self.columns

    def __len__(self) -> int:
        return self._num_rows

    @property
    def empty(self) -> bool:
        return not self._num_rows


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
