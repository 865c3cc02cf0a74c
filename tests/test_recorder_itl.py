"""The recorder's tables and inter-token gaps, built once at the end: the gaps equal each finished
request's own ``np.diff`` of its token times, in finishing order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from core.metrics.recorder import Recorder
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
