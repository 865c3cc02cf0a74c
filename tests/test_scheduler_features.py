"""Chunked prefill, beam search and the simulator driver on the shared policies."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.plan import StepOutcome
from core.request import Request, SamplingParams
from core.sched.base import SchedulerConfig
from core.systems import build_scheduler
from sim.driver import _sim_beams, simulate


class ConstantCost:
    def step_time(self, shape) -> float:
        return 0.01 + 1e-5 * shape.num_tokens

    def describe(self) -> str:
        return "constant"


def _vllm(slots: int, budget: int, chunked: bool, cpu: int = 512, mode: str = "recompute"):
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=64,
                          chunked_prefill=chunked, preemption_mode=mode)  # fmt: skip
    return build_scheduler("vllm", slots, config=cfg, block_size=4, num_cpu_slots=cpu)


@st.composite
def requests(draw):
    n = draw(st.integers(1, 15))
    t, out = 0.0, []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.01, 0.05]))
        out.append(Request(i, t, draw(st.integers(1, 40)), draw(st.integers(1, 20))))
    return out


@given(reqs=requests(), budget=st.sampled_from([8, 16, 33]), slots=st.sampled_from([64, 128]))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_chunked_prefill_respects_budget_and_finishes_everything(reqs, budget, slots):
    sched = _vllm(slots, budget, chunked=True)
    groups = [sched.add(r, 0.0) for r in reqs]
    now, steps = 0.0, 0
    while sched.has_unfinished():
        plan = sched.schedule(now)
        sched.check_integrity()
        assert sum(c.length for c in plan.prefill) + len(plan.decode) <= max(
            budget, len(plan.decode)
        )
        for c in plan.prefill:  # a chunk never skips or repeats tokens
            assert c.start == c.seq.num_computed and c.length >= 1
        now += 0.01
        sched.update(plan, StepOutcome(0.01), now)
        steps += 1
        assert steps < 20_000
    for g in groups:
        assert g.finish_time is not None or g.reject_reason, g
        if g.finish_time is not None:
            assert g.num_generated == g.request.output_len


def test_chunked_prefill_mixes_prompt_chunks_with_decodes():
    sched = _vllm(512, 16, chunked=True)
    reqs = [Request(0, 0.0, 8, 30), Request(1, 0.0, 40, 5)]
    for r in reqs:
        sched.add(r, 0.0)
    mixed = False
    now = 0.0
    while sched.has_unfinished():
        plan = sched.schedule(now)
        mixed |= bool(plan.prefill and plan.decode)
        now += 0.01
        sched.update(plan, StepOutcome(0.01), now)
    assert mixed


@pytest.mark.parametrize("system", ["vllm", "orca_oracle"])
def test_beam_search_groups_keep_their_width_and_memory_stays_consistent(system):
    cfg = SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=64, max_model_len=64)
    sched = build_scheduler(system, 1024, config=cfg, block_size=4, num_cpu_slots=512)
    groups = [
        sched.add(Request(i, 0.0, 9 + i, 12, SamplingParams(beam_width=3)), 0.0) for i in range(4)
    ]
    rng = np.random.default_rng(0)
    now = 0.0
    while sched.has_unfinished():
        plan = sched.schedule(now)
        outcome = StepOutcome(0.01, beams=_sim_beams(plan, rng))
        now += 0.01
        sched.update(plan, outcome, now)
        sched.check_integrity()
        for g in groups:
            if g.finish_time is None and g.num_generated > 0:
                assert len(g.live_seqs()) == 3
    assert all(g.finish_time is not None for g in groups)
    assert sched.manager.breakdown().free == sched.manager.num_device_blocks * 4


def test_simulate_with_beams_and_parallel_samples_records_every_request():
    reqs = [Request(i, 0.02 * i, 10, 8, SamplingParams(beam_width=2 if i % 2 else 1, n=1))
            for i in range(10)]  # fmt: skip
    reqs += [Request(10 + i, 0.01 * i, 6, 5, SamplingParams(n=3)) for i in range(5)]
    res = simulate(reqs, lambda: _vllm(512, 64, chunked=False), ConstantCost(),
                   check_integrity_every=1)  # fmt: skip
    df = res.recorder.requests_frame()
    assert len(df) == 15 and (df["status"] == "finished").all()


def test_recomputed_multi_sequence_group_larger_than_the_budget_still_runs():
    # No CPU pool: a preempted n=3 group falls back to recompute and then needs 3 x ~40
    # tokens at once, more than the 64-token step budget.
    cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=64, max_model_len=64)
    sched = build_scheduler("vllm", 184, config=cfg, block_size=4, num_cpu_slots=0)
    reqs = [Request(i, 0.0, 30, 25, SamplingParams(n=3 if i == 2 else 1)) for i in range(3)]
    groups = [sched.add(r, 0.0) for r in reqs]
    now = 0.0
    for _ in range(5000):
        if not sched.has_unfinished():
            break
        plan = sched.schedule(now)
        assert not plan.is_empty or plan.preempted, "stalled"
        now += 0.01
        sched.update(plan, StepOutcome(0.01), now)
    assert groups[2].num_preemptions > 0
    assert all(g.finish_time is not None for g in groups)
