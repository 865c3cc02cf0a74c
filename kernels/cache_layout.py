"""The paged KV cache layout the kernels share: ``k_cache`` and ``v_cache`` are each
``[num_blocks, block_size, KVH, D]`` with unit stride in ``D``."""

from __future__ import annotations

import torch


def cache_strides(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, ...]:
    """The block, slot and head strides of ``k_cache`` then of ``v_cache``: the six stride
    arguments every kernel over the paged cache takes, in that order."""
    return (*k_cache.stride()[:3], *v_cache.stride()[:3])
