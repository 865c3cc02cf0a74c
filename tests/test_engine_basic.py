"""The engine's greedy outputs against no-cache recompute, rejection, and the KV budget."""

from __future__ import annotations

import pytest
import torch

from core.request import Request
from core.sched.base import SchedulerConfig
from engine.engine import EngineError, LLMEngine
from engine.kv_cache import KVBudgetError, PagedKVCache, bytes_per_block, resolve_kv_budget
from engine.weights import init_dummy_weights
from tests.engine_helpers import (
    TEST_STD,
    make_engine,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    prompt_ids,
    reference_greedy,
    requests,
    tiny_config,
)

LENS = [(5, 6), (9, 4), (3, 7), (12, 5)]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("model", ["tiny-opt", "tiny-llama"])
def test_greedy_batch_equals_recompute(model: str, backend: str) -> None:
    lens = LENS if backend == "torch" else LENS[:2]
    engine = make_engine(model=model, backend=backend)
    reqs = requests(lens)
    result = engine.generate(reqs)
    for r in reqs:
        out = result.outputs[r.request_id]
        assert out.reject_reason is None
        assert out.token_ids == [reference_greedy(engine.model, r.prompt_token_ids, r.output_len)]
    frame = result.recorder.requests_frame()
    assert (frame["status"] == "finished").all()


def test_too_long_request_is_rejected_while_others_complete() -> None:
    engine = make_engine(max_model_len=64)
    reqs = [*requests(LENS), Request(99, 0.0, 60, 10)]
    result = engine.generate(reqs)
    assert "exceeds max_model_len=64" in (result.outputs[99].reject_reason or "")
    frame = result.recorder.requests_frame().set_index("request_id")
    assert frame.loc[99, "status"] == "rejected"
    assert (frame.drop(index=99)["status"] == "finished").all()
    for r in reqs[:-1]:
        assert len(result.outputs[r.request_id].token_ids[0]) == r.output_len


@pytest.mark.parametrize("mode", ["offline", "online"])
def test_a_run_whose_last_requests_are_rejected_finishes_and_records_them(mode: str) -> None:
    # The engine used to wait for an arrival after the last one when the requests that
    # arrived last were all rejected (IndexError). Online, two requests are served and the
    # two too long for max_model_len arrive afterwards; offline, all four are too long.
    engine = make_engine(max_model_len=64)
    served = requests(LENS[:2]) if mode == "online" else []
    reqs = [*served, Request(98, 5.0, 60, 10), Request(99, 5.0, 61, 10)]
    result = engine.generate(reqs, mode=mode)
    frame = result.recorder.requests_frame().set_index("request_id")
    assert list(frame.index) == [r.request_id for r in reqs]
    assert (frame.loc[[98, 99], "status"] == "rejected").all()
    assert (frame.drop(index=[98, 99])["status"] == "finished").all()
    assert result.outputs[99].reject_reason
    assert result.end_time_s == (5.0 if mode == "online" else 0.0)


def test_requests_without_token_ids_get_seeded_prompts() -> None:
    reqs = [Request(i, 0.0, 4 + i, 3) for i in range(3)]
    a = make_engine().generate(reqs).outputs
    b = make_engine().generate(reqs).outputs
    assert a == b
    assert all(len(o.token_ids[0]) == 3 for o in a.values())


def test_an_out_of_vocab_prompt_is_rejected_and_the_others_are_served() -> None:
    reqs = [Request(i, 0.0, 2, 2, prompt_token_ids=(1, 2)) for i in range(3)]
    reqs[1] = Request(1, 0.0, 2, 2, prompt_token_ids=(1, 512))  # tiny model: 512 ids
    result = make_engine().generate(reqs)
    assert "outside the model's vocabulary [0, 512)" in result.outputs[1].reject_reason
    assert [len(result.outputs[i].token_ids[0]) for i in (0, 2)] == [2, 2]
    frame = result.recorder.requests_frame().set_index("request_id")
    assert (
        frame.loc[1, "status"] == "rejected" and (frame.loc[[0, 2], "status"] == "finished").all()
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("budget", [10_000, 100_000, 123_457])
def test_kv_budget_is_never_exceeded(budget: int, dtype: torch.dtype) -> None:
    cfg = tiny_config()
    n = PagedKVCache.num_blocks_for_budget(cfg, budget, 4, dtype)
    cache = PagedKVCache(cfg, n, 4, dtype)
    assert cache.device_bytes <= budget
    assert cache.device_bytes + bytes_per_block(cfg, 4, dtype) > budget  # no whole block wasted


def test_engine_stays_inside_its_blocks() -> None:
    cfg = tiny_config()
    budget = 40 * bytes_per_block(cfg, 4, torch.float32) + 5
    engine = LLMEngine(cfg, kv_budget_bytes=budget, block_size=4)
    assert engine.kv_cache.device_bytes <= budget
    assert engine.kv_cache.num_blocks == 40
    engine.reset()
    for r in requests(LENS):
        engine.add_request(r)
    while engine.has_unfinished():
        engine.step()
        for group in engine.scheduler.running:
            for seq in group.live_seqs():
                table = engine.scheduler.manager.block_table(seq.seq_id)
                assert all(0 <= b < engine.kv_cache.num_blocks for b in table)


def test_budget_errors_name_the_problem() -> None:
    with pytest.raises(KVBudgetError, match="holds no block"):
        PagedKVCache.num_blocks_for_budget(tiny_config(), 100, 16, torch.float32)
    with pytest.raises(KVBudgetError, match="needs a CUDA device"):
        resolve_kv_budget("cpu", fraction=0.5)
    with pytest.raises(KVBudgetError, match="exactly one"):
        resolve_kv_budget("cpu", budget_bytes=10, gib=1.0)
    assert resolve_kv_budget("cpu", gib=0.5) == 512 * 1024**2


@pytest.mark.parametrize("system", ["orca_max", "orca_oracle", "fastertransformer"])
def test_contiguous_systems_give_the_same_greedy_tokens(system: str) -> None:
    reqs = requests(LENS)
    paged = make_engine("vllm").generate(reqs).outputs
    contiguous = make_engine(system, num_blocks=256, max_model_len=64).generate(reqs).outputs
    assert contiguous == paged


def _engine(**kwargs) -> LLMEngine:
    engine = LLMEngine(tiny_config(), num_blocks=64, block_size=4, **kwargs)
    init_dummy_weights(engine.model, 0, std=TEST_STD)
    return engine


def _shared_prefix_requests() -> list[Request]:
    """Three 15-token prompts at t=0 sharing their first 12 tokens, 6 output tokens each."""
    shared = prompt_ids(12, seed=1)
    return [
        Request(i, 0.0, 15, 6, prompt_token_ids=(*shared, *prompt_ids(3, seed=10 + i)))
        for i in range(3)
    ]


def test_chunked_prefill_and_prefix_caching_keep_greedy_tokens() -> None:
    reqs = _shared_prefix_requests()
    plain = _engine().generate(reqs)
    chunked = _engine(
        sched_config=SchedulerConfig(
            max_num_seqs=8, max_num_batched_tokens=8, max_model_len=64, chunked_prefill=True
        )
    ).generate(reqs)
    assert chunked.recorder.steps_frame()["prefill_kv_read_tokens"].sum() > 0
    assert chunked.outputs == plain.outputs
    # Later requests reuse the shared prompt's cached blocks (one at a time, so the first
    # has computed them before the next is admitted).
    cached_engine = _engine(
        enable_prefix_caching=True, sched_config=SchedulerConfig(max_num_seqs=1, max_model_len=64)
    )
    cached = cached_engine.generate(reqs)
    assert cached.recorder.steps_frame()["prefill_kv_read_tokens"].sum() > 0
    assert cached.outputs == plain.outputs


def test_vllm_v1_shares_a_prefix_computed_in_the_same_step() -> None:
    """vLLM V1 indexes a block when the step that fills it is scheduled: requests admitted
    in one step after the first one skip its shared prefix blocks (their attention reads
    the K/V the same forward writes first), and the tokens are those computed without any
    cache. The simulator replaying the engine's step times makes the same steps."""
    from core.systems import build_scheduler
    from sim.cost.recorded import RecordedCostModel
    from sim.driver import simulate

    reqs = _shared_prefix_requests()
    plain = _engine().generate(reqs)
    config = SchedulerConfig(
        max_num_seqs=64, max_num_batched_tokens=64, max_model_len=64, chunked_prefill=True
    )
    v1 = _engine(system="vllm_v1", enable_prefix_caching=True, sched_config=config)
    result = v1.generate(reqs)
    steps = result.recorder.steps_frame()
    first = steps.iloc[0]
    assert first["prefill_seqs"] == 3
    assert first["prefill_tokens"] == 15 + 2 * 3  # the 12 shared tokens computed once
    assert result.outputs == plain.outputs

    def make_scheduler():
        return build_scheduler("vllm_v1", 64 * 4, config, block_size=4, enable_prefix_caching=True)

    cost = RecordedCostModel(steps["duration_s"])
    sim = simulate(reqs, make_scheduler, cost).recorder
    assert cost.steps_left == 0 and sim.steps_frame().equals(steps)


def test_wall_clock_online_run_never_schedules_before_arrival() -> None:
    reqs = requests([(5, 4), (6, 5), (4, 3)], [0.0, 0.02, 0.05])
    wall = make_engine().generate(reqs, mode="online", clock="wall")
    frame = wall.recorder.requests_frame()
    assert (frame["first_scheduled_s"] >= frame["arrival_s"]).all()
    assert (frame["finish_s"] > frame["first_token_s"]).all()
    assert wall.end_time_s >= 0.05
    assert wall.outputs == make_engine().generate(reqs, mode="online").outputs


def test_thread_cpu_step_timer_times_steps_on_the_engine_thread() -> None:
    """The thread-CPU step timer gives the same tokens, positive step and phase times, and
    is refused where it cannot mean anything (CUDA, a wall clock)."""
    from engine.phases import STEP_TIMERS, step_timer

    reqs = requests([(5, 4), (6, 5), (4, 3)], [0.0, 0.01, 0.02])
    plain = make_engine()
    timed = make_engine()
    timed.step_timer_name, timed.step_timer = "thread_cpu", STEP_TIMERS["thread_cpu"]
    timed.reset()
    result = timed.generate(reqs, mode="online")
    assert result.outputs == plain.generate(reqs, mode="online").outputs
    steps = result.recorder.steps_frame()
    assert (steps["duration_s"] > 0).all()
    assert (result.phases[["prepare_s", "forward_s"]] > 0).all().all()
    with pytest.raises(EngineError, match="clock 'virtual'"):
        timed.generate(reqs, mode="online", clock="wall")
    with pytest.raises(ValueError, match="CPU engine"):
        step_timer(torch.device("cuda"), "thread_cpu")
    with pytest.raises(ValueError, match="one of"):
        step_timer(torch.device("cpu"), "cycles")
