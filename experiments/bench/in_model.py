"""Operator times measured inside a whole model's forward on CPU, as kvlab's CPU engine runs
it: the profile's ``--cpu`` points of few tokens (``profile_gpu``).

Timed one at a time, a decoder layer's operators meet a cache that either holds their data
(warm: called again at once) or holds none of it (cold: after a large write). In the engine
neither is true: between two reads of a layer's weights and K/V the other layers stream
theirs, in the same order every step. Measured on this VM (``docs/validation/cpu-engine.md``),
a one-sequence decode forward of OPT-125M's twelve layers costs about what the warm
operators sum to and some 18% less than the cold ones. So the small points, where the
difference matters, are measured where it arises: in the forward of a model with all the
layers, each operator's time summed over the layers by the calling thread's CPU clock and
divided by the layer count.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch import nn

from core.model_spec import ModelSpec


class _TimedBackend:
    """Delegates to an attention backend, adding each call's thread CPU time to ``spent``."""

    def __init__(self, inner: Any, spent: dict[str, float]) -> None:
        self.inner, self.spent, self.name = inner, spent, inner.name

    def forward(self, *args: Any) -> torch.Tensor:
        start = time.thread_time()
        out = self.inner.forward(*args)
        self.spent["attn"] += time.thread_time() - start
        return out


class InModelTimer:
    """A model of ``config.num_layers`` layers (seeded dummy weights), one K/V cache per layer
    (views of one stacked tensor, as ``engine.kv_cache`` holds them) of ``num_blocks``
    blocks, with its linear layers and attention timed inside the forward.

    Per call of :meth:`time`, the ops' thread CPU times: ``linear`` (every ``nn.Linear`` of
    the layers), ``attn`` (the attention backend: K/V store and attention), ``other`` (the
    rest of the forward: norms, activations, residuals, embeddings, the timing hooks' own
    few microseconds per operator), each per layer, and ``lm_head`` (logits of every row,
    right after the forward). CPU only: the thread clock does not see a GPU's work.
    """

    def __init__(
        self, config: ModelSpec, backend: str, dtype: torch.dtype, num_blocks: int,
        block_size: int,
    ) -> None:  # fmt: skip
        from engine.models import build_model
        from engine.weights import init_dummy_weights

        self.config, self.layers = config, config.num_layers
        cpu = torch.device("cpu")
        self.model = build_model(config, backend, dtype, cpu)
        init_dummy_weights(self.model, seed=0)
        self.spent = {"linear": 0.0, "attn": 0.0}
        for module in self.model.decoder().layers.modules():
            if hasattr(module, "backend"):
                module.backend = _TimedBackend(module.backend, self.spent)
            if isinstance(module, nn.Linear):
                module.register_forward_pre_hook(self._start_linear)
                module.register_forward_hook(self._end_linear)
        self._linear_start = 0.0
        block = (block_size, config.num_kv_heads, config.head_dim)
        gen = torch.Generator().manual_seed(1)
        caches = torch.randn((2 * self.layers, num_blocks, *block), generator=gen).to(dtype)
        self.kv_caches = [(caches[i], caches[self.layers + i]) for i in range(self.layers)]

    def _start_linear(self, *_: Any) -> None:
        self._linear_start = time.thread_time()

    def _end_linear(self, *_: Any) -> None:
        self.spent["linear"] += time.thread_time() - self._linear_start

    def time(
        self, meta: Any, positions: torch.Tensor, repeats: int, warmup: int
    ) -> dict[str, float]:
        """Median milliseconds of each op over ``repeats`` forwards (after ``warmup``) of the
        tokens at ``positions`` with attention metadata ``meta``; see the class doc."""
        ids = torch.arange(positions.numel()) % self.config.vocab_size
        samples: dict[str, list[float]] = {"linear": [], "other": [], "attn": [], "lm_head": []}
        for i in range(warmup + repeats):
            self.spent["linear"] = self.spent["attn"] = 0.0
            start = time.thread_time()
            hidden = self.model(ids, positions, self.kv_caches, meta)
            mid = time.thread_time()
            self.model.compute_logits(hidden)
            end = time.thread_time()
            if i < warmup:
                continue
            linear, attn = self.spent["linear"], self.spent["attn"]
            per_layer = 1e3 / self.layers
            samples["linear"].append(linear * per_layer)
            samples["attn"].append(attn * per_layer)
            samples["other"].append((mid - start - linear - attn) * per_layer)
            samples["lm_head"].append((end - mid) * 1e3)
        return {op: statistics.median(ms) for op, ms in samples.items()}
