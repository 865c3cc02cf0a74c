"""Regression tests for bugs found in review of core/, sim/ and engine/."""

from __future__ import annotations

import numpy as np
import pytest

from core.plan import BatchShape, StepOutcome, StepPlan
from core.request import Request, RequestError, SamplingParams
from core.sched.base import SchedulerConfig
from core.systems import SystemConfigError, build_scheduler
from core.workload.arrivals import make_arrivals
from sim.cost.calibrated import TERMS, CalibratedCostModel
from sim.driver import simulate


def _check_plan(plan: StepPlan, chunked: bool) -> None:
    for chunk in plan.prefill:
        assert chunk.length > 0, f"empty prefill chunk for {chunk.seq}"
        if not chunked:
            assert chunk.end == chunk.seq.num_tokens, f"partial prompt without chunking: {chunk}"
    for seq in plan.decode:
        assert not seq.needs_prefill, f"{seq} decodes with tokens whose K/V was never computed"


@pytest.mark.parametrize("chunked", [False, True])
def test_recomputed_group_over_the_budget_computes_every_token(chunked: bool) -> None:
    # No CPU pool: the n=3 group is preempted by recompute and comes back needing
    # 3 x ~49 tokens, more than the 64-token step budget.
    cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=64, max_model_len=64,
                          chunked_prefill=chunked)  # fmt: skip
    sched = build_scheduler("vllm", 184, config=cfg, block_size=4, num_cpu_slots=0)
    reqs = [Request(i, 0.0, 30, 25, SamplingParams(n=3 if i == 2 else 1)) for i in range(3)]
    groups = [sched.add(r, 0.0) for r in reqs]
    now = 0.0
    for _ in range(5000):
        if not sched.has_unfinished():
            break
        plan = sched.schedule(now)
        _check_plan(plan, chunked)
        now += 0.01
        sched.update(plan, StepOutcome(0.01), now)
        sched.check_integrity()
    assert groups[2].num_preemptions > 0
    assert all(g.finish_time is not None for g in groups)
    # Gang scheduling: every sample of the recomputed group produced the whole output.
    assert [s.num_generated for s in groups[2].seqs] == [25, 25, 25]


def test_prefix_caching_on_a_contiguous_system_is_refused() -> None:
    with pytest.raises(SystemConfigError, match="prefix caching"):
        build_scheduler("orca_oracle", 4096, enable_prefix_caching=True)


class _UnitCost:
    def step_time(self, shape: BatchShape) -> float:
        return 0.01

    def describe(self) -> str:
        return "unit"


def test_simulate_refuses_duplicate_request_ids() -> None:
    reqs = [Request(7, 0.0, 8, 4), Request(7, 0.5, 8, 4)]
    with pytest.raises(ValueError, match="request id 7"):
        simulate(reqs, lambda: build_scheduler("orca_oracle", 4096), _UnitCost())


def test_parallel_samples_that_fit_the_cache_exactly_are_served() -> None:
    # n=2, prompt 4, output 4, blocks of 4: the prompt block is shared and each sample
    # owns one block for its output, 3 blocks in all, the whole cache.
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    sched = build_scheduler("vllm", 12, config=cfg, block_size=4, watermark=0.0)
    group = sched.add(Request(0, 0.0, 4, 4, SamplingParams(n=2)), 0.0)
    assert group.reject_reason is None
    now = 0.0
    while sched.has_unfinished():
        plan = sched.schedule(now)
        assert not plan.is_empty, "stalled"
        now += 0.01
        sched.update(plan, StepOutcome(0.01), now)
        sched.check_integrity()
    assert group.finish_time is not None and len(group.seqs) == 2


def test_unknown_arrival_kind_is_refused_even_without_a_rate() -> None:
    with pytest.raises(RequestError, match="unknown arrival process 'bogus'"):
        make_arrivals("bogus", None, n=3)


@pytest.mark.parametrize("value", [-1e-3, float("nan"), float("inf")])
def test_calibrated_cost_model_refuses_negative_or_non_finite_coefficients(value: float) -> None:
    coefficients = {t: 1.0 for t in TERMS} | {"constant": value}
    with pytest.raises(ValueError, match="finite and >= 0"):
        CalibratedCostModel("opt-13b", "a100-40gb", coefficients)


@pytest.mark.parametrize("seed", range(12))
def test_chunked_prefill_keeps_every_step_within_the_budget(seed: int) -> None:
    rng = np.random.default_rng(seed)
    budget = 10
    cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=budget, max_model_len=64,
                          chunked_prefill=True)  # fmt: skip
    sched = build_scheduler("vllm", 160, config=cfg, block_size=4, watermark=0.0)
    pending = [
        Request(i, 0.02 * i, int(rng.integers(1, 30)), int(rng.integers(1, 30)),
                SamplingParams(n=int(rng.integers(1, 4))))
        for i in range(12)
    ]  # fmt: skip
    groups = []
    now = 0.0
    while pending or sched.has_unfinished():
        while pending and pending[0].arrival_time <= now:
            groups.append(sched.add(pending.pop(0), now))
        plan = sched.schedule(now)
        _check_plan(plan, chunked=True)
        shape = plan.shape()  # decodes are never cut; prompt chunks take what they leave
        assert shape.prefill_tokens <= max(0, budget - shape.decode_seqs)
        now += 0.01
        sched.update(plan, StepOutcome(0.01), now)
    for g in groups:
        assert g.reject_reason is not None or all(
            s.num_generated == g.request.output_len for s in g.seqs
        ), g


@pytest.mark.parametrize("chunked", [False, True])
def test_vllm_never_runs_more_sequences_than_max_num_seqs(chunked: bool) -> None:
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                          chunked_prefill=chunked)  # fmt: skip
    sched = build_scheduler("vllm", 4096, config=cfg, block_size=4)
    for i in range(6):  # each forks into 3 samples after its first token
        sched.add(Request(i, 0.0, 8, 6, SamplingParams(n=3)), 0.0)
    now = 0.0
    while sched.has_unfinished():
        plan = sched.schedule(now)
        assert len(plan.scheduled_seqs()) <= 4
        now += 0.01
        sched.update(plan, StepOutcome(0.01), now)
        assert sum(len(g.live_seqs()) for g in sched.running) <= 4


@pytest.mark.parametrize("system", ["vllm", "orca_oracle", "fastertransformer"])
def test_a_group_wider_than_max_num_seqs_is_rejected_not_stalled(system: str) -> None:
    cfg = SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64)
    sched = build_scheduler(system, 4096, config=cfg, block_size=4)
    group = sched.add(Request(0, 0.0, 8, 6, SamplingParams(n=3)), 0.0)
    assert group.reject_reason is not None and "max_num_seqs=2" in group.reject_reason
    assert not sched.has_unfinished()
