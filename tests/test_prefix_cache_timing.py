"""When a computed prompt becomes a prefix-cache hit (a researcher-scenario audit,
2026-12-05): under ``system=vllm`` a prompt's full blocks were offered to the cache only at
its sequence's next decode ``append``, so a request that finished on its first token left
no cached prefix, and a request admitted in the prompt-only step right after another's
found nothing. Now they are offered when the step that computes them ends, on every paged
system; ``vllm_v1`` offers them already when that step is scheduled."""

from __future__ import annotations

import pytest

from core.request import Request, SamplingParams
from core.sched.base import SchedulerConfig
from core.systems import build_scheduler
from tests.sched_harness import run_loop

BLOCK = 4
SHARED = list(range(1, 17))  # a 16-token prefix: four full blocks


def _request(i: int, arrival: float, output_len: int) -> Request:
    prompt = [*SHARED, 100 + i, 200 + i]
    return Request(i, arrival, len(prompt), output_len, SamplingParams(), prompt)


def _cached_per_request(system: str, requests: list[Request]) -> dict[int, int]:
    """Per request, the prompt tokens its first prefill chunk found in the cache."""
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=64)
    sched = build_scheduler(system, 64 * BLOCK, config, block_size=BLOCK,
                            enable_prefix_caching=True)  # fmt: skip
    found: dict[int, int] = {}
    for step in run_loop(sched, requests).steps:
        for chunk in step.plan.prefill:
            found.setdefault(chunk.seq.group.request.request_id, chunk.start)
    return found


@pytest.mark.parametrize("system", ["vllm", "vllm_v1"])
def test_a_request_finished_on_its_first_token_leaves_its_prefix_cached(system: str) -> None:
    found = _cached_per_request(system, [_request(0, 0.0, 1), _request(1, 1.0, 3)])
    assert found == {0: 0, 1: len(SHARED)}


@pytest.mark.parametrize("system", ["vllm", "vllm_v1"])
def test_a_prompt_admitted_in_the_next_step_finds_the_previous_prompt(system: str) -> None:
    """Request 1 arrives while request 0's prompt step runs; under the v0.1 rules the next
    step is its prompt step (prompts first), under V1 a mixed one: both find the prefix."""
    found = _cached_per_request(system, [_request(0, 0.0, 5), _request(1, 1e-6, 5)])
    assert found == {0: 0, 1: len(SHARED)}


def test_a_chunked_prompts_unwritten_slots_are_reserved_not_token_states() -> None:
    """A prompt is allocated whole at admission; under chunked prefill the slots of chunks
    not yet scheduled hold no K/V: each step's breakdown counts them as reserved."""
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64,
                             chunked_prefill=True)  # fmt: skip
    sched = build_scheduler("vllm_v1", 64 * BLOCK, config, block_size=BLOCK)
    result = run_loop(sched, [Request(0, 0.0, 40, 2, SamplingParams())])
    steps = result.recorder.steps_frame()
    assert list(steps["prefill_tokens"][:3]) == [16, 16, 8]
    assert list(steps["kv_token_states"][:3]) == [16, 32, 40]
    assert list(steps["kv_reserved"][:4]) == [24, 8, 0, 0]


def test_a_recomputed_sequence_past_its_prefill_reserves_nothing() -> None:
    """A sequence preempted by recompute after generating tokens is prefilled again in
    chunks; a chunk that stops one token short of it leaves the sequence decoding, and
    its slots from then on are token states, not reserved (a review found them counted
    as reserved, one more each decode step, until the request finished)."""
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=4, max_model_len=64,
                             chunked_prefill=True)  # fmt: skip
    sched = build_scheduler("vllm", 9 * BLOCK, config, block_size=BLOCK)
    requests = [Request(i, 0.0, 10, 20, SamplingParams()) for i in range(2)]
    result = run_loop(sched, requests)
    steps = result.recorder.steps_frame()
    assert result.recorder.requests_frame()["num_preemptions"].sum() > 0
    # a budget of 4 always leaves a mid-prefill sequence a chunk: no prefill, none reserved
    idle = steps["prefill_tokens"] == 0
    assert (steps.loc[idle, "kv_reserved"] == 0).all()
    assert (steps["kv_reserved"] > 0).any()
