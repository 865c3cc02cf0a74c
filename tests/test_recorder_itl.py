"""The recorder's tables and inter-token gaps, built once at the end: the gaps equal each finished
request's own ``np.diff`` of its token times, in finishing order."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import core.metrics.recorder as recorder_mod
from core.kv.base import MemoryBreakdown
from core.metrics.recorder import Recorder
from core.plan import BatchShape
from core.request import Request, SequenceGroup

_TIMES = st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=8).map(sorted)


@settings(max_examples=80, deadline=None)
@given(st.lists(_TIMES, max_size=12))
def test_gaps_match_per_request_diff(token_times):
    rec = Recorder()
    expected, peaks = [], {}
    for i, times in enumerate(token_times):
        group = SequenceGroup(Request(100 - i, 0.0, 4, len(times)), i)
        group.first_scheduled_time = group.first_token_time = times[0]
        group.first_token_step, group.finish_step, group.finish_time = 0, 1, times[-1]
        group.token_times = list(times)
        rec.record_request(group)
        if len(times) > 1:
            gaps = np.diff(np.asarray(times))
            expected.append(gaps)
            peaks[100 - i] = float(gaps.max())
    want = np.concatenate(expected) if expected else np.empty(0)
    assert rec.inter_token_latencies().tobytes() == want.tobytes()
    assert rec.max_itl_by_request() == peaks


def test_tables_are_fresh_copies_and_follow_new_rows():
    rec = Recorder()

    def finish(rid: int, times: list[float]) -> None:
        group = SequenceGroup(Request(rid, 0.0, 4, len(times)), rid)
        group.first_scheduled_time = group.first_token_time = times[0]
        group.first_token_step, group.finish_step, group.finish_time = 0, 1, times[-1]
        group.token_times = times
        rec.record_request(group)

    finish(2, [1.0, 1.5, 3.0])
    first = rec.requests_frame()
    first.loc[0, "output_len"] = 99
    rec.inter_token_latencies()[:] = -1.0
    assert rec.requests_frame()["output_len"].tolist() == [3]
    assert rec.inter_token_latencies().tolist() == [0.5, 1.5]
    finish(1, [2.0, 2.25])
    assert rec.requests_frame()["request_id"].tolist() == [1, 2]
    assert rec.inter_token_latencies().tolist() == [0.5, 1.5, 0.25]
    assert rec.max_itl_by_request() == {2: 1.5, 1: 0.25}


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 11),
    st.integers(1, 4),
    st.sampled_from([1, 2]),
    st.floats(0, 1e6, allow_nan=False),
)
def test_packed_step_rows_come_back_exact(num_rows, block, replicas, t0):
    """Step rows packed into float64 blocks come back as recorded (Python ints, and the
    same floats) in every view, and the frame matches a frame of the rows themselves."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recorder_mod, "STEP_BLOCK_ROWS", block)
        rec = Recorder(num_replicas=replicas)
        views = [rec.for_replica(k) for k in range(replicas)] if replicas > 1 else [rec]
        for i in range(num_rows):
            shape = BatchShape(prefill_tokens=3 * i, prefill_seqs=i % 2, decode_seqs=i,
                               decode_ctx_tokens=2**40 + i, copy_blocks=i % 3)  # fmt: skip
            memory = MemoryBreakdown(i, 2 * i, 1, 0, 10**9 - i, 7 * i, 8 * i)
            start = t0 + i / 3
            views[i % replicas].record_row(i, start, start * 1e-7, shape, i, i + 1, 5, 0, 1, 0,
                                           memory)  # fmt: skip
    rows = rec.step_rows()
    assert rec.num_steps == len(rows) == num_rows
    assert all(type(v) is (float if j in (1, 2) else int) for r in rows for j, v in enumerate(r))
    assert [r[1] for r in rows] == [t0 + i / 3 for i in range(num_rows)]
    assert [r[8] for r in rows] == [2**40 + i for i in range(num_rows)]
    columns, table = rec.step_table()
    table = list(table)
    if replicas > 1:
        assert [r[1] for r in table] == [i % replicas for i in range(num_rows)]
        table = [(r[0], *r[2:]) for r in table]
    assert table == rows
    frame = rec.steps_frame()
    assert list(frame.columns) == list(columns)
    if num_rows:
        want = pd.DataFrame.from_records(rows, columns=[c for c in columns if c != "replica"])
        got = frame.drop(columns=["replica"]) if replicas > 1 else frame
        pd.testing.assert_frame_equal(got, want)
