"""Shared pieces of the engine tests: tiny engines and a no-cache reference decoder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from core.model_spec import ModelSpec
from core.request import Request, SamplingParams
from core.sched.base import SchedulerConfig
from engine.attention.metadata import AttentionMetadata
from engine.engine import LLMEngine
from engine.models import CausalLM
from engine.weights import init_dummy_weights
from sim.catalog import get_model

# Dummy weights at the default std 0.02 make a 64-wide model repeat one token; 0.3 gives
# context-dependent greedy outputs, so a wrong cache read changes the tokens.
TEST_STD = 0.3


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny models run 10x faster on one intra-op thread on a shared 2-core machine (no
    spin-waiting); restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_config(name: str = "tiny-opt") -> ModelSpec:
    return get_model(name)


def make_engine(
    system: str = "vllm",
    num_blocks: int = 64,
    block_size: int = 4,
    model: str = "tiny-opt",
    backend: str = "torch",
    num_cpu_blocks: int = 0,
    preemption_mode: str = "recompute",
    max_model_len: int = 256,
    max_num_seqs: int = 256,
    seed: int = 0,
    enable_prefix_caching: bool = False,
    watermark: float | None = None,
) -> LLMEngine:
    sched = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=2560,
        max_model_len=max_model_len,
        preemption_mode=preemption_mode,
    )
    engine = LLMEngine(
        tiny_config(model),
        system=system,
        num_blocks=num_blocks,
        block_size=block_size,
        backend=backend,
        sched_config=sched,
        num_cpu_blocks=num_cpu_blocks,
        seed=seed,
        enable_prefix_caching=enable_prefix_caching,
        **({} if watermark is None else {"watermark": watermark}),
    )
    init_dummy_weights(engine.model, seed, std=TEST_STD)
    return engine


def prompt_ids(length: int, seed: int, vocab: int = 512) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, vocab, (length,), generator=gen).tolist())


def requests(
    lens: list[tuple[int, int]],
    arrivals: list[float] | None = None,
    sampling: SamplingParams | None = None,
) -> list[Request]:
    """Requests ``i`` with ``(prompt_len, output_len) = lens[i]`` and seeded prompts."""
    arrivals = arrivals or [0.0] * len(lens)
    return [
        Request(i, t, p, o, sampling or SamplingParams(), prompt_ids(p, 100 + i))
        for i, ((p, o), t) in enumerate(zip(lens, arrivals, strict=True))
    ]


@torch.inference_mode()
def prefill_logits(model: CausalLM, tokens: list[int]) -> torch.Tensor:
    """Logits ``[len(tokens), vocab]`` (the model's dtype) of one prefill over ``tokens`` in
    a fresh block-size-1 cache."""
    cfg = model.config
    n = len(tokens)
    shape = (n, 1, cfg.num_kv_heads, cfg.head_dim)
    dtype = next(model.parameters()).dtype
    caches = [
        (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
        for _ in range(cfg.num_layers)
    ]
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        context_lens=torch.tensor([n], dtype=torch.int32),
        block_tables=torch.arange(n, dtype=torch.int32)[None],
        slot_mapping=torch.arange(n, dtype=torch.int64),
        max_query_len=n,
        max_context_len=n,
    )
    return model.compute_logits(model(torch.tensor(tokens), torch.arange(n), caches, meta))


def full_logits(model: CausalLM, tokens: list[int]) -> torch.Tensor:
    """Next-token fp32 logits after ``tokens``, recomputing everything in a fresh cache."""
    return prefill_logits(model, tokens)[-1].float()


def reference_greedy(model: CausalLM, prompt: tuple[int, ...], num_tokens: int) -> list[int]:
    """Greedy decoding by full recompute at every step (no KV cache reuse)."""
    tokens = list(prompt)
    out: list[int] = []
    for _ in range(num_tokens):
        out.append(int(full_logits(model, tokens).argmax()))
        tokens.append(out[-1])
    return out


def reference_beam_search(
    model: CausalLM, prompt: tuple[int, ...], width: int, num_tokens: int
) -> list[tuple[list[int], float]]:
    """Beam search by recompute: keep the top ``width`` (beam, token) candidates by
    cumulative log-probability each step; returns (tokens, score) best first."""
    beams: list[tuple[list[int], float]] = [([], 0.0)]
    for _ in range(num_tokens):
        cands: list[tuple[float, int, int]] = []
        for b, (toks, score) in enumerate(beams):
            logp = torch.log_softmax(full_logits(model, [*prompt, *toks]), dim=-1).double()
            cands += [(score + float(lp), b, t) for t, lp in enumerate(logp.tolist())]
        cands.sort(key=lambda c: -c[0])
        beams = [([*beams[b][0], t], s) for s, b, t in cands[:width]]
    return beams
