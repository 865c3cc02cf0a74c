"""Seeds derived from other seeds, and the prompt ids the engine draws for a request that
comes without any: one function, so the simulator can replay exactly what the engine
hashed into its prefix cache."""

from __future__ import annotations

import dataclasses

import numpy as np

from core.request import Request

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def mix_seed(*parts: int) -> int:
    """A 63-bit seed hashing ``parts`` (splitmix64 chain; order matters)."""
    h = 0
    for p in parts:
        h = _splitmix64(h ^ (p & _MASK64))
    return h >> 1


def with_drawn_prompt_ids(request: Request, vocab_size: int, seed: int) -> Request:
    """``request`` with prompt ids: its own when it has them, else ``prompt_len`` ids drawn
    uniformly from ``[0, vocab_size)`` by a generator seeded from ``(seed, request_id)``
    (what :meth:`engine.engine.LLMEngine.add_request` gives it)."""
    if request.prompt_token_ids is not None:
        return request
    rng = np.random.default_rng(mix_seed(seed, request.request_id))
    drawn = rng.integers(0, vocab_size, size=request.prompt_len)
    return dataclasses.replace(request, prompt_token_ids=tuple(int(t) for t in drawn))
