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


@pytest.mark.parametrize(
    ("system", "reserved", "blocks"),
    [
        ("vllm", [24, 8, 0, 0], [10, 10, 10, 11]),  # v0: the prompt's blocks at admission
        ("vllm_v1", [0, 0, 0, 0], [4, 8, 10, 11]),  # V1: each chunk's as it is scheduled
    ],
)
def test_a_chunked_prompts_blocks_and_unwritten_slots(
    system: str, reserved: list[int], blocks: list[int]
) -> None:
    """vLLM v0 allocates a prompt whole at admission: under chunked prefill the slots of
    chunks not yet scheduled hold no K/V, and each step's breakdown counts them as reserved.
    vLLM V1 allocates each chunk's blocks as the step computing it is scheduled."""
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64,
                             chunked_prefill=True)  # fmt: skip
    sched = build_scheduler(system, 64 * BLOCK, config, block_size=BLOCK)
    result = run_loop(sched, [Request(0, 0.0, 40, 2, SamplingParams())])
    steps = result.recorder.steps_frame()
    assert list(steps["prefill_tokens"][:3]) == [16, 16, 8]
    assert list(steps["kv_token_states"][:3]) == [16, 32, 40]
    assert list(steps["kv_reserved"][:4]) == reserved
    assert list(steps["kv_physical_blocks"][:4]) == blocks


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


def test_v1_admits_a_long_prompt_by_its_first_chunk_and_it_gives_way_when_short() -> None:
    """12 blocks of 4; a short request decoding, then a 44-token prompt (11 blocks). vLLM
    v0 allocates a prompt whole: it waits until the first request finished. vLLM V1
    allocates each chunk's blocks: it starts at once, and when a chunk's blocks are short it
    gives way itself (the last admitted), to be admitted again; both finish."""
    out = {}
    for system in ("vllm", "vllm_v1"):
        config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=8, max_model_len=64,
                                 chunked_prefill=True)  # fmt: skip
        sched = build_scheduler(system, 12 * BLOCK, config, block_size=BLOCK, watermark=0.0)
        requests = [Request(0, 0.0, 8, 20, SamplingParams()),
                    Request(1, 1e-4, 44, 2, SamplingParams())]  # fmt: skip
        frame = run_loop(sched, requests).recorder.requests_frame().set_index("request_id")
        assert (frame["status"] == "finished").all()
        out[system] = frame
    v0, v1 = out["vllm"], out["vllm_v1"]
    assert v0.loc[1, "first_scheduled_s"] >= v0.loc[0, "finish_s"]
    assert v0.loc[1, "num_preemptions"] == 0
    assert v1.loc[1, "first_scheduled_s"] == pytest.approx(0.01)  # the second step
    assert v1.loc[1, "num_preemptions"] >= 1
