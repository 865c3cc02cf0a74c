"""The attention-backend contract shared by the torch reference and the Triton kernels."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from engine.attention.metadata import AttentionMetadata


@runtime_checkable
class AttentionBackend(Protocol):
    """Paged attention over one layer's KV cache, in the layout of ``AttentionMetadata``."""

    name: str

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Store this step's K/V, then attend.

        ``q`` is ``[T, H, D]``; ``k`` and ``v`` are ``[T, KVH, D]`` with ``H % KVH == 0``;
        the caches are ``[num_blocks, block_size, KVH, D]``. First writes ``k[t]`` / ``v[t]``
        into slot ``meta.slot_mapping[t]`` of the caches (in place, skipping ``-1``), then
        returns ``[T, H, D]`` (dtype of ``q``): each query token's softmax(scale * q·k)
        weighted sum of ``v`` over its sequence's cached tokens up to and including its own
        position. Query head ``h`` reads KV head ``h // (H // KVH)``. Rows of tokens past
        ``meta.query_start_loc[-1]`` (batch padding) are zero.
        """
        ...
