"""The recorder and the summary metrics against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.metrics.recorder import REQUEST_COLUMNS, STEP_COLUMNS
from core.metrics.summary import free_at_limit_shares, memory_shares, summarize
from core.plan import (
    HELD_BY_BATCH,
    HELD_BY_KEY,
    HELD_BY_MAX_NUM_SEQS,
    HELD_BY_MEMORY,
    HELD_BY_POLICY,
    HELD_BY_TOKEN_BUDGET,
)
from core.request import Request, SamplingParams
from core.sched.base import SchedulerConfig
from core.systems import build_scheduler
from tests.sched_harness import run_loop


def _requests() -> pd.DataFrame:
    """Three finished requests and one rejected; times in seconds."""
    rows = [  # id, arrival, prompt, output, n, ttft, e2el, tpot, finish
        (0, 0.0, 10, 5, 1, 0.1, 0.5, 0.1, 0.5),
        (1, 0.2, 20, 1, 2, 0.3, 0.3, None, 0.5),
        (2, 0.4, 30, 11, 1, 0.2, 1.6, 0.14, 2.0),
    ]
    records = [
        {"request_id": i, "arrival_s": a, "prompt_len": p, "output_len": o, "num_seqs": n,
         "first_scheduled_s": a, "first_token_s": a + t, "finish_s": f, "first_token_step": 0,
         "finish_step": 1, "num_preemptions": 1 if i == 2 else 0, "ttft_s": t, "e2el_s": e,
         "tpot_s": tp, "status": "finished", "reject_reason": ""}
        for i, a, p, o, n, t, e, tp, f in rows
    ]  # fmt: skip
    records.append(
        {"request_id": 3, "arrival_s": 1.0, "prompt_len": 99, "output_len": 9, "num_seqs": 1,
         "num_preemptions": 0, "status": "rejected", "reject_reason": "too long"}
    )  # fmt: skip
    return pd.DataFrame.from_records(records, columns=list(REQUEST_COLUMNS))


def _steps() -> pd.DataFrame:
    """Two steps over a 100-slot cache: 0.1 s with one request waiting, then 0.3 s."""
    base = dict.fromkeys(STEP_COLUMNS, 0)
    rows = [
        base | {"step": 0, "duration_s": 0.1, "running_requests": 2, "batch_requests": 2,
                "num_waiting": 1, "kv_token_states": 10, "kv_reserved": 20,
                "kv_internal_frag": 5, "kv_allocator_padding": 5, "kv_free": 60},
        base | {"step": 1, "start_s": 0.1, "duration_s": 0.3, "running_requests": 4,
                "batch_requests": 1, "num_waiting": 0, "kv_token_states": 40,
                "kv_internal_frag": 10, "kv_free": 50},
    ]  # fmt: skip
    return pd.DataFrame.from_records(rows, columns=list(STEP_COLUMNS))


def test_counts_throughputs_and_latency_statistics() -> None:
    m = summarize(_requests(), _steps(), np.array([0.01, 0.03]))
    assert (m["num_requests"], m["completed"], m["rejected"]) == (4, 3, 1)
    assert m["duration_s"] == pytest.approx(2.0)  # first arrival to last finish
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["total_input_tokens"] == 60
    assert m["total_output_tokens"] == 5 + 2 * 1 + 11  # every sample's tokens
    assert m["output_throughput"] == pytest.approx(9.0)
    # ttft [100, 300, 200] ms; numpy's linear p99 of three: 200 + 0.98 * 100.
    assert (m["mean_ttft_ms"], m["median_ttft_ms"]) == pytest.approx((200.0, 200.0))
    assert m["p99_ttft_ms"] == pytest.approx(298.0)
    # tpot only where there is a second token: [100, 140] ms.
    assert (m["mean_tpot_ms"], m["median_tpot_ms"]) == pytest.approx((120.0, 120.0))
    assert m["p99_tpot_ms"] == pytest.approx(139.6)
    assert (m["mean_e2el_ms"], m["median_e2el_ms"]) == pytest.approx((800.0, 500.0))
    assert m["p99_e2el_ms"] == pytest.approx(500.0 + 0.98 * 1100.0)
    assert (m["mean_itl_ms"], m["median_itl_ms"]) == pytest.approx((20.0, 20.0))
    assert m["p99_itl_ms"] == pytest.approx(29.8)
    assert m["normalized_latency"] == pytest.approx((0.5 / 5 + 0.3 / 1 + 1.6 / 11) / 3)
    assert m["num_preemptions"] == 1
    assert "goodput" not in m and "slo_attainment" not in m


def test_both_batch_metrics_and_busy_time() -> None:
    m = summarize(_requests(), _steps())
    assert m["num_steps"] == 2
    assert m["busy_time_s"] == pytest.approx(0.4)
    # Time-weighted requests holding KV: (0.1 * 2 + 0.3 * 4) / 0.4.
    assert m["mean_batch_size"] == pytest.approx(3.5)
    # Plain per-step mean of requests computed in the step: (2 + 1) / 2.
    assert m["mean_step_batch"] == pytest.approx(1.5)


def test_time_weighted_kv_shares() -> None:
    shares = memory_shares(_steps())
    # Free slots count as external fragmentation while a request waits (step 0 only).
    expected = {
        "kv_token_states_pct": (0.1 * 10 + 0.3 * 40) / 0.4,
        "kv_reserved_pct": 0.1 * 20 / 0.4,
        "kv_internal_frag_pct": (0.1 * 5 + 0.3 * 10) / 0.4,
        "kv_external_frag_pct": 0.1 * (5 + 60) / 0.4,
        "kv_free_at_limit_pct": 0.0,
        "kv_free_pct": 0.3 * 50 / 0.4,
    }
    assert shares == pytest.approx(expected)
    assert sum(shares.values()) == pytest.approx(100.0)
    # the same wait on a scheduler limit (max_num_seqs): free memory, not fragmentation
    steps = _steps()
    steps.loc[0, "queue_held_by"] = HELD_BY_MAX_NUM_SEQS
    held = memory_shares(steps)
    assert held["kv_external_frag_pct"] == pytest.approx(0.1 * 5 / 0.4)
    assert held["kv_free_at_limit_pct"] == pytest.approx(0.1 * 60 / 0.4)
    steps.loc[0, "queue_held_by"] = HELD_BY_POLICY  # a plugin's own limit counts as one
    assert memory_shares(steps) == pytest.approx(held)
    # a table written before the column counts every wait as one on memory
    assert memory_shares(_steps().drop(columns="queue_held_by")) == pytest.approx(expected)


def test_free_at_a_limit_is_split_by_the_limit_that_held_the_queue() -> None:
    steps = pd.concat([_steps()] * 4, ignore_index=True)  # every step waits on its code
    steps["num_waiting"] = 1
    steps["queue_held_by"] = [
        HELD_BY_MEMORY, HELD_BY_MEMORY, HELD_BY_MAX_NUM_SEQS, HELD_BY_TOKEN_BUDGET,
        HELD_BY_BATCH, HELD_BY_POLICY, HELD_BY_MAX_NUM_SEQS, HELD_BY_BATCH,
    ]  # fmt: skip
    split = free_at_limit_shares(steps)
    # free slots: 60 in the 0.1-s steps, 50 in the 0.3-s ones; 1.6 s in all, 100 slots a step
    assert split == pytest.approx({
        "kv_free_at_max_num_seqs_pct": 2 * 0.1 * 60 / 1.6,
        "kv_free_at_token_budget_pct": 0.3 * 50 / 1.6,
        "kv_free_at_batch_in_flight_pct": (0.1 * 60 + 0.3 * 50) / 1.6,
        "kv_free_at_policy_limit_pct": 0.3 * 50 / 1.6,
    })  # fmt: skip
    assert sum(split.values()) == pytest.approx(memory_shares(steps)["kv_free_at_limit_pct"])
    steps["num_waiting"] = 0  # nobody waits: no limit holds memory idle
    assert set(free_at_limit_shares(steps).values()) == {0.0}
    assert set(free_at_limit_shares(_steps().drop(columns="queue_held_by")).values()) == {0.0}
    assert summarize(_requests(), steps).keys() >= split.keys()


_STEP = st.fixed_dictionaries({
    "duration_s": st.sampled_from([0.0, 0.01, 0.3, 2.0]),
    "num_waiting": st.integers(0, 2), "num_swapped": st.integers(0, 1),
    "queue_held_by": st.sampled_from([HELD_BY_MEMORY, *HELD_BY_KEY]),
    "kv_token_states": st.integers(0, 40), "kv_reserved": st.integers(0, 40),
    "kv_internal_frag": st.integers(0, 40), "kv_allocator_padding": st.integers(0, 40),
    "kv_free": st.integers(1, 40),
})  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(_STEP, max_size=8))
def test_the_split_sums_to_free_at_a_limit_on_any_steps(rows: list[dict[str, float]]) -> None:
    steps = pd.DataFrame.from_records(
        [dict.fromkeys(STEP_COLUMNS, 0) | r for r in rows], columns=list(STEP_COLUMNS)
    )
    total = memory_shares(steps)["kv_free_at_limit_pct"]
    split = free_at_limit_shares(steps)
    if math.isnan(total):  # no step, or no time
        assert all(math.isnan(v) for v in split.values())
        return
    assert sum(split.values()) == pytest.approx(total, abs=1e-9)
    w = steps["duration_s"] / steps["duration_s"].sum()
    waiting = (steps["num_waiting"] > 0) | (steps["num_swapped"] > 0)
    size = steps[["kv_token_states", "kv_reserved", "kv_internal_frag",
                  "kv_allocator_padding", "kv_free"]].sum(axis=1)  # fmt: skip
    for code, name in HELD_BY_KEY.items():
        held = waiting & (steps["queue_held_by"] == code)
        share = 100 * (w * steps["kv_free"] / size)[held].sum()
        assert split[f"kv_free_at_{name}_pct"] == pytest.approx(share, abs=1e-9)


@pytest.mark.parametrize(
    ("system", "held_by"),
    [("vllm", HELD_BY_MAX_NUM_SEQS), ("orca_oracle", HELD_BY_MAX_NUM_SEQS),
     ("fastertransformer", HELD_BY_BATCH)],
)  # fmt: skip
def test_a_wait_on_a_scheduler_limit_is_not_fragmentation(system: str, held_by: int) -> None:
    # two requests into a cache that could hold both: max_num_seqs=1 (or a request-level
    # batch in flight) makes the second wait, with memory free that it would fit in
    from core.request import Request
    from core.sched.base import SchedulerConfig
    from core.systems import build_scheduler
    from sim.driver import simulate

    class Second:
        def step_time(self, shape) -> float:
            return 1.0

        def describe(self) -> str:
            return "1 s a step"

    seqs = 1 if system != "fastertransformer" else 256
    budget = max(64, seqs)  # a step's decodes fit the token budget
    config = SchedulerConfig(max_model_len=64, max_num_batched_tokens=budget, max_num_seqs=seqs)
    reqs = [Request(0, 0.0, 10, 4), Request(1, 0.5 if seqs > 1 else 0.0, 10, 4)]
    for fast in (True, False):
        rec = simulate(reqs, lambda: build_scheduler(system, 4096, config), Second(),
                       fast_forward=fast).recorder  # fmt: skip
        steps = rec.steps_frame()
        waiting = steps[(steps["num_waiting"] > 0)]
        assert len(waiting) and (waiting["queue_held_by"] == held_by).all()
        shares = memory_shares(steps)
        assert shares["kv_external_frag_pct"] < 1.0 < shares["kv_free_at_limit_pct"]
        assert sum(shares.values()) == pytest.approx(100.0)
        split = free_at_limit_shares(steps)
        assert split.pop(f"kv_free_at_{HELD_BY_KEY[held_by]}_pct") == pytest.approx(
            shares["kv_free_at_limit_pct"]
        )
        assert set(split.values()) == {0.0}


@pytest.mark.parametrize(
    ("slo", "meeting"),
    [
        ({"ttft": 250, "e2el": 1000}, 1),  # 1 misses ttft, 2 misses e2el
        ({"tpot": 120}, 2),  # 1 has no second token, so no TPOT to miss
        ({"ttft": 1e9}, 3),
    ],
)
def test_goodput_and_slo_attainment(slo: dict[str, float], meeting: int) -> None:
    m = summarize(_requests(), _steps(), slo_ms=slo)
    assert m["goodput"] == pytest.approx(meeting / 2.0)
    # A rejected request missed every SLO: attainment is over all four requests.
    assert m["slo_attainment"] == pytest.approx(meeting / 4)


def test_unknown_slo_key_is_named() -> None:
    with pytest.raises(ValueError, match="unknown SLO 'latency'"):
        summarize(_requests(), _steps(), slo_ms={"latency": 1.0})


def test_nothing_finished_and_no_steps_give_nan_not_errors() -> None:
    requests = _requests().iloc[3:]
    m = summarize(requests, _steps().iloc[:0], slo_ms={"ttft": 1.0})
    assert (m["completed"], m["rejected"], m["duration_s"]) == (0, 1, 0.0)
    for key in ("request_throughput", "mean_ttft_ms", "normalized_latency", "goodput",
                "mean_batch_size", "kv_free_pct"):  # fmt: skip
        assert math.isnan(m[key]), key
    assert m["slo_attainment"] == 0.0


def test_recorder_rows_from_a_run_with_fixed_steps() -> None:
    # Steps of 10 ms. Request 0 (2 samples, 3 tokens): prefill ends at 0.01 with the first
    # token, decodes end at 0.02 and 0.03. Request 1 arrives at 0.015 and joins (Orca's
    # iteration-level batching) at 0.02. Request 2 is too long.
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64)
    sched = build_scheduler("orca_oracle", 512, config=cfg, block_size=4)
    reqs = [
        Request(0, 0.0, 4, 3, SamplingParams(n=2)),
        Request(1, 0.015, 6, 1),
        Request(2, 0.0, 60, 10),
    ]
    rec = run_loop(sched, reqs, step_s=0.01).recorder
    req = rec.requests_frame().set_index("request_id")
    assert list(req["status"]) == ["finished", "finished", "rejected"]
    assert "max_model_len=64" in req.loc[2, "reject_reason"]
    r0, r1 = req.loc[0], req.loc[1]
    assert (r0["first_token_s"], r0["finish_s"]) == pytest.approx((0.01, 0.03))
    assert (r0["ttft_s"], r0["e2el_s"], r0["tpot_s"]) == pytest.approx((0.01, 0.03, 0.01))
    assert (r0["first_token_step"], r0["finish_step"], r0["num_seqs"]) == (0, 2, 2)
    assert r1["first_scheduled_s"] == pytest.approx(0.02)
    assert (r1["ttft_s"], r1["e2el_s"]) == pytest.approx((0.015, 0.015))
    assert pd.isna(r1["tpot_s"])  # one token: no time per output token
    steps = rec.steps_frame()
    assert list(steps["step"]) == [0, 1, 2]
    assert list(steps["start_s"]) == pytest.approx([0.0, 0.01, 0.02])
    # Step 2 decodes request 0's two samples and prefills request 1: two requests.
    assert list(steps["decode_seqs"]) == [0, 2, 2]
    assert list(steps["batch_requests"]) == [1, 1, 2]
    assert list(steps["prefill_tokens"]) == [4, 0, 6]
    # Token-state slots during each step (after its allocations, so with the token the step
    # computes): the prompt; then each sample in its own contiguous region (the fork copied
    # the prompt: one copy) with its first token; then one more token each, and request 1.
    assert list(steps["copy_blocks"]) == [0, 1, 0]
    assert list(steps["kv_token_states"]) == [4, 2 * (4 + 1), 2 * (4 + 2) + 6]
    assert rec.inter_token_latencies() == pytest.approx([0.01, 0.01])


def test_the_simulator_records_times_as_floats_from_its_first_step() -> None:
    """SimPy's clock starts at int 0 unless told otherwise; the engine's at 0.0. A request
    scheduled at the start must read the same type in both bodies' frames."""
    from sim.cost.recorded import RecordedCostModel
    from sim.driver import simulate

    reqs = [Request(0, 0, 4, 3)]  # an arrival given as an int, as a trace may
    result = simulate(
        reqs, lambda: build_scheduler("vllm", 64, SchedulerConfig(max_model_len=16), 4),
        RecordedCostModel([0.01, 0.01, 0.01]),
    )  # fmt: skip
    frame = result.recorder.requests_frame()
    for column in ("first_scheduled_s", "first_token_s", "finish_s"):
        assert frame[column].dtype == np.float64, column
    assert isinstance(result.end_time_s, float)


def test_free_slots_while_a_request_is_swapped_out_are_external_fragmentation() -> None:
    """A request swapped out waits for memory as one waiting for admission does: the same
    free slots must not count as free under swap and as fragmentation under recompute."""
    steps = pd.DataFrame({
        "duration_s": [1.0, 1.0, 1.0], "num_waiting": [1, 0, 0], "num_swapped": [0, 1, 0],
        "kv_token_states": [60, 60, 60], "kv_reserved": [0, 0, 0], "kv_internal_frag": [0, 0, 0],
        "kv_allocator_padding": [0, 0, 0], "kv_free": [40, 40, 40],
    })  # fmt: skip
    shares = memory_shares(steps)
    assert shares["kv_external_frag_pct"] == pytest.approx(100 * 80 / 300)
    assert shares["kv_free_pct"] == pytest.approx(100 * 40 / 300)


def test_several_replicas_tag_their_requests() -> None:
    """A request's first_token_step / finish_step count its own replica's steps, so the
    requests table names the replica (as the steps table does) for the two to be joined."""
    from sim.cost.recorded import RecordedCostModel
    from sim.driver import simulate

    reqs = [Request(i, 0.01 * i, 6, 4) for i in range(6)]

    def run(replicas: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        make = lambda: build_scheduler("vllm", 64, SchedulerConfig(max_model_len=16), 4)  # noqa: E731
        rec = simulate(reqs, make, RecordedCostModel([0.01] * 100), replicas).recorder
        return rec.requests_frame(), rec.steps_frame()

    one, _ = run(1)
    assert list(one.columns) == list(REQUEST_COLUMNS)
    requests, steps = run(3)
    assert list(requests.columns) == ["request_id", "replica", *REQUEST_COLUMNS[1:]]
    assert requests["replica"].tolist() == [i % 3 for i in range(6)]  # dealt round-robin
    ends = steps.set_index(["replica", "step"])
    for row in requests.itertuples():
        step = ends.loc[(row.replica, row.finish_step)]
        assert step["start_s"] + step["duration_s"] == pytest.approx(row.finish_s)


def test_several_replicas_tag_their_steps() -> None:
    from sim.cost.recorded import RecordedCostModel
    from sim.driver import simulate

    reqs = [Request(i, 0.01 * i, 6, 4) for i in range(6)]

    def run(replicas: int) -> pd.DataFrame:
        make = lambda: build_scheduler("vllm", 64, SchedulerConfig(max_model_len=16), 4)  # noqa: E731
        result = simulate(reqs, make, RecordedCostModel([0.01] * 100), replicas)
        return result.recorder.steps_frame()

    one, three = run(1), run(3)
    assert "replica" not in one.columns
    assert list(three.columns[:2]) == ["step", "replica"]
    assert sorted(three["replica"].unique()) == [0, 1, 2]
    for _, rows in three.groupby("replica"):
        assert rows["step"].tolist() == list(range(len(rows)))  # each replica its own count
    assert (
        summarize(pd.DataFrame(columns=list(REQUEST_COLUMNS)), three.iloc[:0])["busy_time_s"] == 0.0
    )


def test_throughput_duration_starts_at_the_first_arrival_even_if_it_was_rejected() -> None:
    """Throughput duration runs from the first arrival of any request (the server was
    loaded from then) to the last finish: here the rejected request arrives first, at 0 s,
    the finished ones at 0.2 s and 0.4 s, the last finishes at 2 s."""
    requests = _requests().iloc[1:].copy()  # requests 1, 2 finished, 3 rejected
    requests.loc[requests["request_id"] == 3, "arrival_s"] = 0.0
    m = summarize(requests, _steps())
    assert (m["completed"], m["rejected"]) == (2, 1)
    assert m["duration_s"] == pytest.approx(2.0)
    assert m["request_throughput"] == pytest.approx(2 / 2.0)
    assert m["output_throughput"] == pytest.approx((2 * 1 + 11) / 2.0)


def test_a_latency_exactly_at_its_slo_limit_meets_it() -> None:
    """An SLO is met at ``latency <= limit``: request 0 has TTFT exactly 100 ms and E2E
    latency exactly 500 ms, so limits of 100 and 500 ms count it (the others miss TTFT)."""
    m = summarize(_requests(), _steps(), slo_ms={"ttft": 100.0, "e2el": 500.0})
    assert m["goodput"] == pytest.approx(1 / 2.0)  # one request over the 2 s duration
    assert m["slo_attainment"] == pytest.approx(1 / 4)
