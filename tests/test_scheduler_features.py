"""Chunked prefill, beam search, recompute of parallel samples and the simulator driver on
the shared policies."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.plan import StepPlan
from core.request import Request, SamplingParams, SequenceGroup
from core.sched.base import SchedulerConfig, SchedulerConfigError
from core.systems import build_scheduler
from sim.driver import simulate
from tests.sched_harness import run_loop


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


def _check_plan(plan: StepPlan, chunked: bool) -> None:
    """Prompt chunks are non-empty and start where the sequence's computed tokens end;
    without chunking a prompt runs whole; a decode never reads uncomputed K/V."""
    for chunk in plan.prefill:
        assert chunk.length > 0, f"empty prefill chunk for {chunk.seq}"
        assert chunk.start == chunk.seq.num_computed, f"a chunk skips or repeats tokens: {chunk}"
        if not chunked:
            assert chunk.end == chunk.seq.num_tokens, f"partial prompt without chunking: {chunk}"
    for seq in plan.decode:
        assert not seq.needs_prefill, f"{seq} decodes with tokens whose K/V was never computed"


def _all_finished(groups: list[SequenceGroup]) -> None:
    for g in groups:
        assert g.reject_reason is not None or all(
            s.num_generated == g.request.output_len for s in g.seqs
        ), g


@given(reqs=requests(), budget=st.sampled_from([8, 16, 33]), slots=st.sampled_from([64, 128]))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_chunked_prefill_respects_budget_and_finishes_everything(reqs, budget, slots):
    def check(plan: StepPlan) -> None:
        _check_plan(plan, chunked=True)
        shape = plan.shape()  # decodes are never cut; prompt chunks take what they leave
        assert shape.prefill_tokens <= max(0, budget - shape.decode_seqs)

    res = run_loop(_vllm(slots, budget, chunked=True), reqs, max_steps=20_000, on_plan=check)
    _all_finished(res.groups)


@pytest.mark.parametrize("seed", range(12))
def test_chunked_prefill_with_parallel_samples_keeps_every_step_within_the_budget(seed: int):
    rng = np.random.default_rng(seed)
    budget = 10
    cfg = SchedulerConfig(max_num_seqs=budget, max_num_batched_tokens=budget, max_model_len=64,
                          chunked_prefill=True)  # fmt: skip
    sched = build_scheduler("vllm", 160, config=cfg, block_size=4, watermark=0.0)
    reqs = [
        Request(i, 0.02 * i, int(rng.integers(1, 30)), int(rng.integers(1, 30)),
                SamplingParams(n=int(rng.integers(1, 4))))
        for i in range(12)
    ]  # fmt: skip

    def check(plan: StepPlan) -> None:
        _check_plan(plan, chunked=True)
        shape = plan.shape()
        assert shape.prefill_tokens + shape.decode_seqs <= budget

    _all_finished(run_loop(sched, reqs, on_plan=check).groups)


def test_a_token_budget_below_max_num_seqs_is_refused_with_chunked_prefill() -> None:
    """Each running sequence's decode counts against the budget, so 16 sequences could
    not fit a budget of 10 (vLLM refuses the pair too)."""
    with pytest.raises(SchedulerConfigError, match="max_num_batched_tokens=10 is below"):
        SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=10, chunked_prefill=True)


def test_chunked_prefill_mixes_prompt_chunks_with_decodes():
    res = run_loop(_vllm(512, 16, chunked=True), [Request(0, 0.0, 8, 30), Request(1, 0.0, 40, 5)])
    assert any(log.plan.prefill and log.plan.decode for log in res.steps)


@pytest.mark.parametrize("system", ["vllm", "orca_oracle"])
def test_beam_search_groups_keep_their_width_and_memory_stays_consistent(system):
    cfg = SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=64, max_model_len=64)
    sched = build_scheduler(system, 1024, config=cfg, block_size=4, num_cpu_slots=512)
    reqs = [Request(i, 0.0, 9 + i, 12, SamplingParams(beam_width=3)) for i in range(4)]

    def check(plan: StepPlan, finished: list[SequenceGroup]) -> None:
        for g in sched.running:
            if g.num_generated > 0:
                assert len(g.live_seqs()) == 3

    res = run_loop(sched, reqs, on_step=check, beams_rng=np.random.default_rng(0))
    assert all(g.finish_time is not None for g in res.groups)
    assert sched.manager.breakdown().free == sched.manager.num_device_blocks * 4
    assert any(log.plan.copies for log in res.steps)  # beams forked (copy-on-write)


def test_simulate_with_beams_and_parallel_samples_records_every_request():
    reqs = [Request(i, 0.02 * i, 10, 8, SamplingParams(beam_width=2 if i % 2 else 1, n=1))
            for i in range(10)]  # fmt: skip
    reqs += [Request(10 + i, 0.01 * i, 6, 5, SamplingParams(n=3)) for i in range(5)]
    res = simulate(reqs, lambda: _vllm(512, 64, chunked=False), ConstantCost(),
                   check_integrity_every=1)  # fmt: skip
    df = res.recorder.requests_frame()
    assert len(df) == 15 and (df["status"] == "finished").all()


def test_simulate_refuses_duplicate_request_ids() -> None:
    reqs = [Request(7, 0.0, 8, 4), Request(7, 0.5, 8, 4)]
    with pytest.raises(ValueError, match="request id 7"):
        simulate(reqs, lambda: build_scheduler("orca_oracle", 4096), ConstantCost())


@pytest.mark.parametrize("chunked", [False, True])
def test_recomputed_group_over_the_budget_computes_every_token(chunked: bool) -> None:
    # No CPU pool: the n=3 group is preempted by recompute and comes back needing
    # 3 x ~49 tokens, more than the 64-token step budget.
    cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=64, max_model_len=64,
                          chunked_prefill=chunked)  # fmt: skip
    sched = build_scheduler("vllm", 184, config=cfg, block_size=4, num_cpu_slots=0)
    reqs = [Request(i, 0.0, 30, 25, SamplingParams(n=3 if i == 2 else 1)) for i in range(3)]
    groups = run_loop(sched, reqs, max_steps=5000, on_plan=lambda p: _check_plan(p, chunked)).groups
    assert groups[2].num_preemptions > 0
    assert all(g.finish_time is not None for g in groups)
    # Gang scheduling: every sample of the recomputed group produced the whole output.
    assert [s.num_generated for s in groups[2].seqs] == [25, 25, 25]


def test_stand_in_token_ids_of_different_sequences_hash_apart() -> None:
    """What a prefix cache keys on is the hash: CPython hashes -1 as -2."""
    from core.sched.base import stand_in_token_id

    ids = [stand_in_token_id(i) for i in range(10_000)]
    assert max(ids) < 0
    assert len({hash((0, (i, i))) for i in ids}) == len(ids)


class FlatCost:
    def step_time(self, shape) -> float:
        return 0.01

    def describe(self) -> str:
        return "10 ms a step"


def _flat_run(system: str, reqs: list[Request], fast: bool):
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    return simulate(
        reqs, lambda: build_scheduler(system, 4096, config=cfg, block_size=4), FlatCost(),
        fast_forward=fast,
    )  # fmt: skip


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("system", ["vllm", "orca_oracle"])
def test_an_arrival_exactly_at_a_step_end_joins_the_next_step(system: str, fast: bool) -> None:
    """Steps of exactly 0.01 s from 0: the second step ends at 0.02, when the second request
    arrives. The arrival is due no later than that step's end, so the engine must let it in
    before scheduling the step that starts at 0.02 (step 2), as one timeout per step
    would; with or without fast-forward."""
    reqs = [Request(0, 0.0, 8, 10), Request(1, 0.02, 8, 3)]
    res = _flat_run(system, reqs, fast)
    steps = res.recorder.steps_frame()
    assert steps["start_s"].iloc[2] == 0.02
    late = res.recorder.requests_frame().set_index("request_id").loc[1]
    assert late["first_scheduled_s"] == 0.02
    assert late["first_token_step"] == 2


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("system", ["vllm", "orca_oracle", "fastertransformer"])
def test_end_time_is_the_last_steps_end(system: str, fast: bool) -> None:
    """``SimResult.end_time_s`` is when the last step ends (its start plus its duration),
    also when the engine ran ahead of the event clock with no event left to wait for."""
    reqs = [Request(0, 0.0, 8, 5), Request(1, 0.0, 6, 3)]
    res = _flat_run(system, reqs, fast)
    steps = res.recorder.steps_frame()
    assert res.num_steps == len(steps) == 5
    assert res.end_time_s == steps["start_s"].iloc[-1] + steps["duration_s"].iloc[-1]
    assert res.end_time_s == pytest.approx(0.05)


@pytest.mark.parametrize("sampling", [SamplingParams(n=2), SamplingParams(beam_width=2)])
def test_a_group_of_several_sequences_is_swapped_even_in_recompute_mode(sampling) -> None:
    """vLLM v0.1 swaps a group of several sequences (parallel samples or beams) when it
    preempts it, whatever the preemption mode: recomputing would lose what the sequences
    share. Three blocks of 4, recompute mode; A (one sequence) and B (two, prompts of 4)
    take one block each in the prompt step. At the first decode A takes the last free
    block and B's two sequences, each opening a block, find none: B is preempted, and
    swapped out, not recomputed (none of the run's preemptions is a recomputation)."""
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64)
    sched = build_scheduler("vllm", 12, config=cfg, block_size=4, num_cpu_slots=64,
                            watermark=0.0)  # fmt: skip
    reqs = [Request(0, 0.0, 4, 4), Request(1, 0.0, 4, 4, sampling)]
    res = run_loop(sched, reqs, beams_rng=np.random.default_rng(0))
    _all_finished(res.groups)
    assert all(g.reject_reason is None for g in res.groups)
    swapped = [[g.request_id for g in log.plan.preempted_by_swap] for log in res.steps]
    assert [ids for ids in swapped if ids] == [[1]]
    assert not any(log.plan.preempted for log in res.steps), "a several-sequence group recomputed"
    assert sched.swap_fallbacks == 0
