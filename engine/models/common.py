"""Pieces shared by the model families."""

from __future__ import annotations

import torch

from engine.config import ModelConfig

KVCache = tuple[torch.Tensor, torch.Tensor]


def check_inputs(
    input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache], config: ModelConfig
) -> None:
    """Raise if the flat token batch or the per-layer cache list has the wrong shape."""
    if input_ids.dim() != 1 or positions.shape != input_ids.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and positions {tuple(positions.shape)} "
            "must both be [T]"
        )
    if len(kv_caches) != config.num_layers:
        raise ValueError(f"got {len(kv_caches)} KV caches for {config.num_layers} layers")
