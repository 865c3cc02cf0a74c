"""Pieces shared by the model families."""

from __future__ import annotations

import torch
from torch import nn

from core.model_spec import ModelSpec
from engine.attention.base import AttentionBackend
from engine.attention.metadata import AttentionMetadata

KVCache = tuple[torch.Tensor, torch.Tensor]


def check_inputs(
    input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache], config: ModelSpec
) -> None:
    """Raise if the flat token batch or the per-layer cache list has the wrong shape."""
    if input_ids.dim() != 1 or positions.shape != input_ids.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and positions {tuple(positions.shape)} "
            "must both be [T]"
        )
    if len(kv_caches) != config.num_layers:
        raise ValueError(f"got {len(kv_caches)} KV caches for {config.num_layers} layers")


class CausalLM(nn.Module):
    """A decoder with an LM head; parameter names follow HF (``model.…``, ``lm_head``).

    Subclasses name their ``family``, build the body held as ``self.model`` and say where its
    decoder (the module with ``embed_tokens`` that maps tokens to hidden states) lives.
    ``forward`` returns final hidden states; ``compute_logits`` maps them to the vocabulary.
    """

    family: str

    def __init__(self, config: ModelSpec, backend: AttentionBackend) -> None:
        super().__init__()
        if config.family != self.family:
            raise ValueError(
                f"{type(self).__name__} needs a {self.family!r} config, got {config.family!r}"
            )
        self.config = config
        self.model = self.build_body(config, backend)
        self.lm_head = nn.Linear(config.embed_dim, config.vocab_size, bias=False)
        self.tie_weights()

    def build_body(self, config: ModelSpec, backend: AttentionBackend) -> nn.Module:
        raise NotImplementedError

    def decoder(self) -> nn.Module:
        return self.model

    def tie_weights(self) -> None:
        """Share the embedding with the LM head if the config ties them (call after moves)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.decoder().embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """``input_ids``, ``positions``: ``[T]``; one ``(k_cache, v_cache)`` per layer.
        Returns hidden states ``[T, embed_dim]`` and writes this step's K/V to the caches."""
        check_inputs(input_ids, positions, kv_caches, self.config)
        return self.decoder()(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[T, embed_dim]`` -> ``[T, vocab_size]``."""
        return self.lm_head(hidden)
