"""Behaviour of the engine's sampler, KV tensors and input preparation that a mutation
audit (one operator changed at a time in engine/sampler.py, kv_cache.py and runner.py)
found no test pinned down: each test here fails under such a mutant."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from core.kv.paged import PagedKVCacheManager
from core.plan import PrefillChunk, StepPlan
from core.request import Request, SamplingParams, Sequence, SequenceGroup
from engine import kv_cache as kv_cache_module
from engine.kv_cache import PagedKVCache, bytes_per_block
from engine.runner import ModelRunner, build_inputs
from engine.sampler import Sampler
from tests.engine_helpers import tiny_config


def seq_of(rid: int, sampling: SamplingParams, prompt: int = 4) -> Sequence:
    group = SequenceGroup(Request(rid, 0.0, prompt, 8, sampling, tuple(range(prompt))), rid)
    return group.seqs[0]


def share_of_token_1(logits: list[float], temperature: float, draws: int = 2000) -> float:
    row = torch.tensor([logits])
    hits = 0
    for s in range(draws):
        seq = seq_of(s, SamplingParams(temperature=temperature, seed=s))
        hits += Sampler().sample([seq], row).token_ids[seq.seq_id]
    return hits / draws


SQRT3 = math.sqrt(3)


@pytest.mark.parametrize(("temperature", "expected"),
                         [(0.5, 0.9), (1.0, 0.75), (2.0, SQRT3 / (1 + SQRT3))])  # fmt: skip
def test_temperature_shapes_the_draws_as_softmax_of_logits_over_it(
    temperature: float, expected: float
) -> None:
    # logits [0, ln 3]: P(token 1) = 3^(1/T) / (1 + 3^(1/T)); seeded, so the shares are fixed
    assert share_of_token_1([0.0, math.log(3.0)], temperature) == pytest.approx(expected, abs=0.03)


def test_top_p_keeps_the_smallest_set_that_reaches_it() -> None:
    # probabilities .5, .25, .25 and p = .5: the first token alone reaches it
    row = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))
    drawn = set()
    for s in range(300):
        seq = seq_of(s, SamplingParams(temperature=1.0, top_p=0.5, seed=s))
        drawn.add(Sampler().sample([seq], row).token_ids[seq.seq_id])
    assert drawn == {0}


def test_each_position_draws_afresh() -> None:
    seq = seq_of(0, SamplingParams(temperature=1.0, seed=7))
    drawn = []
    for _ in range(20):
        token = Sampler().sample([seq], torch.zeros(1, 2)).token_ids[seq.seq_id]
        drawn.append(token)
        seq.output_token_ids.append(token)
        seq.num_generated += 1
    assert set(drawn) == {0, 1}


def test_unseeded_requests_draw_from_streams_of_their_own() -> None:
    a, b = (seq_of(rid, SamplingParams(temperature=1.0)) for rid in (0, 1))
    out = Sampler(seed=3).sample([a, b], torch.zeros(2, 1000))
    assert out.token_ids[a.seq_id] != out.token_ids[b.seq_id]
    again = Sampler(seed=3).sample([a, b], torch.zeros(2, 1000))
    assert again.token_ids == out.token_ids  # and deterministically so


def test_a_seeded_draw_reads_its_own_row_in_a_mixed_batch() -> None:
    greedy = seq_of(0, SamplingParams())
    seeded = seq_of(1, SamplingParams(temperature=1.0, seed=5))
    other = seq_of(2, SamplingParams(temperature=1.0))
    rows = torch.full((3, 4), -30.0)
    rows[0, 3] = rows[1, 0] = rows[2, 1] = 0.0  # each row all but sure of its own token
    out = Sampler().sample([greedy, seeded, other], rows)
    alone = Sampler().sample([seeded], rows[1:2])
    assert out.token_ids[seeded.seq_id] == alone.token_ids[seeded.seq_id] == 0
    assert out.token_ids[other.seq_id] == 1 and out.token_ids[greedy.seq_id] == 3


def test_a_swap_chunk_is_sized_by_one_block_of_every_layer(monkeypatch) -> None:
    config = tiny_config()
    kv = PagedKVCache(config, 8, 4, num_cpu_blocks=4)
    seen: list[float] = []
    monkeypatch.setattr(kv_cache_module, "swap_chunk_blocks", lambda b: seen.append(b) or 2)
    kv.swap_out([(0, 0), (1, 1), (2, 2)])
    assert seen == [bytes_per_block(config, 4, kv.caches.dtype)]


def planned(prompt: int, block_size: int = 4) -> tuple[PagedKVCacheManager, Sequence]:
    manager = PagedKVCacheManager(8, block_size=block_size)
    seq = seq_of(0, SamplingParams(), prompt)
    manager.allocate(seq.group)
    return manager, seq


def test_inputs_refuse_an_empty_chunk_and_a_short_block_table() -> None:
    manager, seq = planned(6)  # two blocks of 4
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match=r"cannot compute tokens \[3, 3\)"):
        build_inputs(StepPlan(prefill=[PrefillChunk(seq, 3, 0)]), manager, cpu)
    table = manager.block_table(seq.seq_id)
    short = SimpleNamespace(block_size=4, block_table=lambda seq_id: table[:1])
    with pytest.raises(ValueError, match="1 blocks cannot hold 6 tokens"):
        build_inputs(StepPlan(prefill=[PrefillChunk(seq, 0, 6)]), short, cpu)  # type: ignore[arg-type]


def test_the_runner_refuses_a_manager_of_another_block_size() -> None:
    manager, seq = planned(6, block_size=16)
    runner = SimpleNamespace(kv_cache=SimpleNamespace(block_size=8), device=torch.device("cpu"))
    with pytest.raises(ValueError, match="manager block_size 16 != KV cache block_size 8"):
        ModelRunner.prepare(runner, StepPlan(prefill=[PrefillChunk(seq, 0, 6)]), manager)  # type: ignore[arg-type]
