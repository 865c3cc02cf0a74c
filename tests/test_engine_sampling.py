"""Parallel sampling with shared blocks, beam search with fork + CoW, seeded sampling."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from core.request import SAMPLED_TEMPERATURE, Request, RequestError, SamplingParams, SequenceGroup
from engine.sampler import Sampler
from tests.engine_helpers import (
    make_engine,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    prompt_ids,
    reference_beam_search,
)

PROMPT = prompt_ids(9, seed=5)


def _request(rid: int, sampling: SamplingParams, output_len: int = 8) -> Request:
    return Request(rid, 0.0, len(PROMPT), output_len, sampling, PROMPT)


def test_parallel_samples_equal_independent_seeded_requests() -> None:
    base = SamplingParams(temperature=0.9, top_p=0.95, seed=11)
    engine = make_engine()
    engine.add_request(_request(0, dataclasses.replace(base, n=3)))
    saved = []
    while engine.has_unfinished():
        engine.step()
        saved.append(engine.scheduler.manager.blocks_saved_by_sharing())
    assert max(saved) > 0
    samples = [s.output_token_ids for s in engine.groups[0].seqs]
    # Sample i of a request with seed s draws what a one-sample request with seed s + i does.
    singles = [_request(i, dataclasses.replace(base, seed=11 + i)) for i in range(3)]
    expected = make_engine().generate(singles).outputs
    assert samples == [expected[i].token_ids[0] for i in range(3)]
    assert len({tuple(s) for s in samples}) > 1  # the samples really differ


@pytest.mark.parametrize("system", ["vllm", "orca_oracle"])
def test_beam_search_equals_recompute_reference(system: str) -> None:
    width, steps = 3, 5
    engine = make_engine(system, num_blocks=64, max_model_len=64)
    engine.add_request(_request(0, SamplingParams(beam_width=width), output_len=steps))
    copies = 0
    while engine.has_unfinished():
        engine.step()
        copies += int(engine.recorder.steps_frame()["copy_blocks"].iloc[-1])
    assert copies > 0  # CoW (paged) or region copies (contiguous) happened
    seqs = sorted(engine.groups[0].seqs, key=lambda s: -s.cum_logprob)
    reference = reference_beam_search(engine.model, PROMPT, width, steps)
    assert [s.output_token_ids for s in seqs] == [tokens for tokens, _ in reference]
    got = [s.cum_logprob for s in seqs]
    assert got == pytest.approx([score for _, score in reference], rel=1e-5, abs=1e-5)


def test_seeded_sampling_is_deterministic_across_batches() -> None:
    sampling = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=3)
    alone = make_engine().generate([_request(0, sampling)]).outputs[0]
    others = [_request(i, SamplingParams(temperature=1.0)) for i in (1, 2)]
    batched = make_engine().generate([*others, _request(0, sampling)]).outputs[0]
    assert alone == batched
    other_seed = dataclasses.replace(sampling, seed=4)
    assert make_engine().generate([_request(0, other_seed)]).outputs[0] != alone


@pytest.mark.parametrize("params", [{"top_k": 1}, {"top_p": 1e-6}])
def test_degenerate_filters_are_greedy(params: dict) -> None:
    greedy = make_engine().generate([_request(0, SamplingParams())]).outputs[0]
    sampled = SamplingParams(temperature=1.5, seed=9, **params)
    assert make_engine().generate([_request(0, sampled)]).outputs[0] == greedy


def test_a_tiny_temperature_is_greedy_and_leaves_the_batch_alone() -> None:
    """Below vLLM's 1e-5 a temperature samples greedily: logits divided by 1e-39 overflow
    to inf, and the NaN probabilities used to stop the whole engine."""
    greedy = make_engine().generate([_request(0, SamplingParams())]).outputs[0]
    tiny = _request(0, SamplingParams(temperature=1e-39, seed=5))
    other = _request(1, SamplingParams(temperature=1.0, seed=5))
    out = make_engine().generate([tiny, other]).outputs
    assert out[0].token_ids == greedy.token_ids and len(out[1].token_ids[0]) == 8


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -1.0])
def test_a_temperature_that_is_not_a_finite_number_is_refused(temperature: float) -> None:
    with pytest.raises(RequestError, match="temperature must be finite and >= 0"):
        SamplingParams(temperature=temperature)


def _draws(params: SamplingParams, logits: torch.Tensor, seeds: range) -> set[int]:
    out = set()
    for s in seeds:
        group = SequenceGroup(Request(0, 0.0, 2, 1, dataclasses.replace(params, seed=s)), 0)
        out.add(Sampler().sample(group.seqs, logits[None]).token_ids[0])
    return out


def test_top_k_and_top_p_restrict_the_support() -> None:
    logits = torch.tensor([3.0, 2.9, 2.8, 0.0, -1.0, -2.0])
    assert _draws(SamplingParams(temperature=1.0, top_k=2), logits, range(200)) == {0, 1}
    probs = torch.softmax(logits, dim=-1)  # top three hold ~0.95 of the mass
    top_p = float(probs[:2].sum()) + 1e-3
    assert _draws(SamplingParams(temperature=1.0, top_p=top_p), logits, range(200)) == {0, 1, 2}
    assert len(_draws(SamplingParams(temperature=1.0), logits, range(200))) > 3  # unfiltered


def test_several_samples_default_to_vllms_temperature_and_refuse_greedy() -> None:
    # greedy n > 1 ran: the n samples were one sequence four times (vLLM refuses it)
    assert SamplingParams().temperature == 0.0 and SamplingParams().greedy
    assert SamplingParams(n=4).temperature == SAMPLED_TEMPERATURE == 1.0
    assert SamplingParams(beam_width=4).temperature == 0.0
    with pytest.raises(RequestError, match=r"n=4 parallel samples with greedy sampling"):
        SamplingParams(n=4, temperature=0.0)
    engine = make_engine()
    out = engine.generate([_request(0, SamplingParams(n=4))]).outputs[0]
    assert len({tuple(t) for t in out.token_ids}) > 1  # the samples differ


def test_a_workloads_samples_sample_and_greedy_ones_are_one_line(tmp_path) -> None:
    from core.workload.spec import build_workload

    cfg = {"kind": "synthetic", "num_requests": 2, "rate": 1.0}
    assert build_workload(cfg)[0].sampling.temperature == 0.0
    assert build_workload({**cfg, "n": 4})[0].sampling.temperature == 1.0
    assert build_workload({**cfg, "n": 4, "temperature": 0.7})[0].sampling.temperature == 0.7
    with pytest.raises(RequestError, match="set a temperature > 0"):
        build_workload({**cfg, "n": 4, "temperature": 0})
