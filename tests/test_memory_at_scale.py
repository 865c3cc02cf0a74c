"""What a long run keeps: step rows packed narrow (yet exact past int32), and finished
requests' objects let go during the run, not held until its files are written."""

from __future__ import annotations

import gc
import json
import math

import pytest

import core.metrics.recorder as recorder_mod
import sim.driver as driver
from core.kv.base import MemoryBreakdown
from core.metrics.recorder import Recorder
from core.metrics.summary import block_moves, memory_shares, summarize
from core.plan import BatchShape
from core.request import Request, SequenceGroup
from core.sched.base import BaseScheduler, SchedulerConfig
from core.systems import build_scheduler
from core.workload.spec import build_workload
from sim.cost.roofline import RooflineCostModel


def _record(rec: Recorder, i: int, free: int, ctx: int) -> None:
    shape = BatchShape(prefill_seqs=i % 2, decode_seqs=3, decode_ctx_tokens=ctx)
    memory = MemoryBreakdown(16 * i, 0, 3, 0, free, i, i)
    rec.record_row(i, 0.5 * i, 0.01, shape, 3, 3, 2, 0, 0, 0, memory)


def test_packed_step_rows_are_narrow_and_widen_past_int32(monkeypatch: pytest.MonkeyPatch):
    """A block of small counts keeps them in a few bytes each (float64 took 200 bytes a
    row); a count past int32's range widens its block's column and comes back exact."""
    monkeypatch.setattr(recorder_mod, "STEP_BLOCK_ROWS", 100)
    rec = Recorder()
    for i in range(100):
        _record(rec, i, 40_000, 100 + i)
    big = [2**31, -(2**31) - 1, 2**40]
    for i, ctx in enumerate(big):
        _record(rec, 100 + i, 40_000 + i, ctx)
    for i in range(97):  # fills the second block
        _record(rec, 103 + i, 7, 5)
    small, wide = rec._packed
    assert sum(column.nbytes for column in small) <= 64 * 100
    ctx = recorder_mod.STEP_COLUMNS.index("decode_ctx_tokens")
    assert wide[ctx].dtype.itemsize == 8
    rows = rec.step_rows()
    assert [r[ctx] for r in rows[100:103]] == big
    assert rec.steps_frame()["decode_ctx_tokens"].tolist()[100:103] == big


def _live_groups() -> int:
    return sum(type(o) is SequenceGroup for o in gc.get_objects())


def test_finished_groups_are_let_go_during_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished group and its sequences form a cycle, which the paused collector would
    keep (token lists and all) until the run's files are written: the run collects them
    every COLLECT_EVERY_REQUESTS requests done."""
    monkeypatch.setattr(driver, "COLLECT_EVERY_REQUESTS", 10, raising=False)
    # one request at a time: at most one is in flight when a collection comes
    requests = [Request(i, 2.0 * i, 32, 8) for i in range(60)]
    cost = RooflineCostModel("opt-13b", "a100-40gb")
    with driver.no_cyclic_gc():  # and kept paused after the run, to count what it left
        gc.collect()
        before = _live_groups()
        result = driver.simulate(requests, lambda: build_scheduler("vllm", 4096), cost)
        left = _live_groups() - before
    assert result.recorder.num_requests == 60
    assert left <= 20  # the last ten, and one in flight at each collection


def test_the_summary_reads_the_steps_view_as_the_frame() -> None:
    """summarize_recorder reads the steps a column at a time (Recorder.steps_view): the
    same metrics, to the bit, as from the frame of them all, under memory pressure (waits,
    preemptions, swaps) and for no steps at all."""
    wl = {"kind": "synthetic", "dataset": "sharegpt", "rate": 8.0, "duration_s": 10.0}
    requests = build_workload(wl, max_model_len=2048, seed=1)
    config = SchedulerConfig(preemption_mode="swap")

    def make() -> BaseScheduler:
        return build_scheduler("vllm", 3000, config=config, num_cpu_slots=2048)

    rec = driver.simulate(requests, make, RooflineCostModel("opt-13b", "a100-40gb")).recorder
    assert rec.steps_frame()["num_preempted"].sum() > 0
    frame, view = rec.steps_frame(), rec.steps_view()
    assert list(view.columns) == list(frame.columns) and len(view) == len(frame)
    args = (rec.inter_token_latencies(), {"itl": 40, "ttft": 900}, rec.max_itl_by_request())
    want = summarize(rec.requests_frame(), frame, *args)
    assert json.dumps(summarize(rec.requests_frame(), view, *args)) == json.dumps(want)
    empty = Recorder()
    for table in (empty.steps_frame(), empty.steps_view()):
        assert math.isnan(memory_shares(table)["kv_free_pct"])
        assert block_moves(table) == {f"total_{c}": 0 for c in ("copy_blocks",
                                      "swap_out_blocks", "swap_in_blocks")}  # fmt: skip
