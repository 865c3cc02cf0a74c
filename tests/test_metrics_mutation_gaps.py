"""Behaviour of the recorder, the summary and the step loop that a mutation audit (one
operator changed at a time in core/metrics and core/loop) found no test pinned down: each
test here fails under such a mutant."""

from __future__ import annotations

import pytest

from core.kv.base import new_breakdown
from core.loop import StepLoop, VirtualClock, chained_arrivals
from core.metrics.recorder import Recorder
from core.metrics.summary import summarize_recorder
from core.plan import BatchShape
from core.request import Request, SamplingParams, SequenceGroup
from core.sched.base import BaseScheduler, SchedulerConfig
from core.systems import build_scheduler
from sim.driver import CostExecutor, simulate

ZERO = new_breakdown(0, 0, 0, 0, 0, 0, 0)


def finished(rid: int, token_times: list[float], preemptions: int = 0) -> SequenceGroup:
    """A finished group of ``len(token_times)`` output tokens arriving at 0."""
    group = SequenceGroup(Request(rid, 0.0, 4, len(token_times)), rid)
    group.first_scheduled_time, group.first_token_time = 0.0, token_times[0]
    group.finish_time, group.first_token_step, group.finish_step = token_times[-1], 0, 1
    group.token_times, group.num_preemptions = list(token_times), preemptions
    return group


def rejected(rid: int, reason: str, preemptions: int = 0) -> SequenceGroup:
    group = SequenceGroup(Request(rid, 0.0, 4, 4), rid)
    group.reject_reason, group.num_preemptions = reason, preemptions
    group.first_scheduled_time = 0.05
    return group


def test_the_apps_summary_carries_inter_token_gaps_and_their_slo() -> None:
    # summarize_recorder passed no gaps: mean_itl_ms was NaN, and every ITL SLO passed
    rec = Recorder()
    rec.record_request(finished(0, [0.0, 0.125, 0.375]))
    rec.record_request(rejected(1, "needs more KV-cache memory than the cache admits"))
    m = summarize_recorder(rec, {"itl": 200})
    assert m["mean_itl_ms"] == pytest.approx(187.5)  # gaps 125 and 250 ms
    assert m["slo_attainment"] == 0.0  # its longest gap, 250 ms, misses
    assert m["rejected_kv_cache"] == 1
    assert summarize_recorder(rec, {"itl": 250})["slo_attainment"] == pytest.approx(0.5)


def test_an_itl_slo_holds_at_its_limit_and_for_a_single_token() -> None:
    rec = Recorder()
    rec.record_request(finished(0, [0.0, 0.25, 0.5]))
    rec.record_request(finished(1, [0.3]))  # one token: no gap, it meets any ITL limit
    assert summarize_recorder(rec, {"itl": 250})["slo_attainment"] == 1.0
    assert summarize_recorder(rec, {"itl": 249})["slo_attainment"] == 0.5


def test_a_rejected_request_keeps_its_preemptions_and_first_schedule() -> None:
    # preempted, then aborted (it outgrew the cache): its preemptions still happened
    rec = Recorder()
    rec.record_request(finished(0, [0.0, 0.1], preemptions=1))
    rec.record_request(rejected(1, "outgrew the KV cache", preemptions=2))
    row = rec.requests_frame().set_index("request_id").loc[1]
    assert row["num_preemptions"] == 2 and row["first_scheduled_s"] == 0.05
    assert summarize_recorder(rec)["num_preemptions"] == 3


def test_the_steps_frame_is_a_copy() -> None:
    rec = Recorder()
    rec.record_row(0, 0.0, 0.5, BatchShape(decode_seqs=1), 1, 1, 0, 0, 0, 0, ZERO)
    frame = rec.steps_frame()
    frame.loc[0, "duration_s"] = 99.0
    assert rec.steps_frame().loc[0, "duration_s"] == 0.5


class _Flat:
    def step_time(self, shape: BatchShape) -> float:
        return 0.01

    def describe(self) -> str:
        return "10 ms a step"


@pytest.mark.parametrize("every", [1, 3])
@pytest.mark.parametrize("fast", [True, False])
def test_invariants_are_checked_every_n_steps_on_either_path(
    every: int, fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the cadence could stop or skip checks (the fast path's most of all) unnoticed
    calls = {"n": 0}
    check = BaseScheduler.check_integrity

    def counted(self: BaseScheduler) -> None:
        calls["n"] += 1
        check(self)

    monkeypatch.setattr(BaseScheduler, "check_integrity", counted)
    config = SchedulerConfig(max_model_len=64, max_num_batched_tokens=64, max_num_seqs=8)
    reqs = [Request(i, 0.05 * i, 8, 20 + 3 * i) for i in range(5)]
    result = simulate(reqs, lambda: build_scheduler("vllm", 512, config, block_size=4), _Flat(),
                      check_integrity_every=every, fast_forward=fast)  # fmt: skip
    assert result.num_steps > 20
    assert calls["n"] == result.num_steps // every


def test_chained_arrivals_land_where_the_simulators_timeouts_do() -> None:
    # the engine's arrivals match SimPy's, which add each delay to the clock (one ulp off)
    times = chained_arrivals([0.61, 1.82])
    assert times == [0.61, 0.61 + (1.82 - 0.61)] and times[1] != 1.82


def test_same_time_arrivals_are_served_in_id_order_whatever_the_list_order() -> None:
    # the simulator's driver sorts by (arrival, id); the engine goes through serve
    config = SchedulerConfig(max_model_len=64, max_num_batched_tokens=64, max_num_seqs=1)
    loop = StepLoop(build_scheduler("vllm", 256, config, block_size=4),
                    CostExecutor(lambda shape: 0.01, None), Recorder())  # fmt: skip
    loop.run([Request(1, 0.0, 4, 2), Request(0, 0.0, 4, 2)], VirtualClock())
    frame = loop.recorder.requests_frame().set_index("request_id")
    assert frame.loc[0, "first_token_s"] < frame.loc[1, "first_token_s"]


def test_on_done_counts_every_request_once() -> None:
    done: list[int] = []
    config = SchedulerConfig(max_model_len=16, max_num_batched_tokens=16, max_num_seqs=4)
    loop = StepLoop(build_scheduler("vllm", 256, config, block_size=4),
                    CostExecutor(lambda shape: 0.01, None), Recorder(), done.append)  # fmt: skip
    wide = SamplingParams(n=2, temperature=1.0)
    reqs = [Request(0, 0.0, 4, 3), Request(1, 0.0, 4, 3, wide), Request(2, 0.0, 40, 3)]
    loop.run(reqs, VirtualClock())  # request 2 is longer than max_model_len: rejected
    assert sum(done) == 3 and max(done) >= 1


def test_an_itl_slo_without_token_times_is_refused() -> None:
    # no gaps recorded: every request met any ITL limit
    rec = Recorder(keep_token_times=False)
    rec.record_request(finished(0, [0.0, 0.5, 1.0]))
    with pytest.raises(ValueError, match="itl SLO needs token times"):
        summarize_recorder(rec, {"itl": 100})
    assert summarize_recorder(rec, {"ttft": 100})["slo_attainment"] == 1.0
