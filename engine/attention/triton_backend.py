"""The ``triton`` attention backend: ``kernels.store_kv`` then ``kernels.paged_attention``.

Contract: ``engine.attention.base.AttentionBackend``. On CPU the kernels only run under the
Triton interpreter (``TRITON_INTERPRET=1`` set before Triton is imported).
"""

from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata
from kernels.kv_store import store_kv
from kernels.paged_attention import paged_attention


class TritonAttentionBackend:
    """Paged attention with Triton kernels; ``num_splits=None`` lets the kernel choose."""

    name = "triton"

    def __init__(self, num_splits: int | None = None) -> None:
        self.num_splits = num_splits

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
        """Store ``k``/``v`` at ``meta.slot_mapping``, then attend; ``[T, H, D]`` in q's dtype.

        Rows past ``meta.query_start_loc[-1]`` (batch padding) are zero.
        """
        if k.shape != v.shape or k.shape[0] != q.shape[0]:
            raise ValueError(
                f"inconsistent shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
            )
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.zeros_like(q)  # padding rows are never written by the kernel
        if meta.num_seqs == 0:
            return out
        return paged_attention(
            q,
            k_cache,
            v_cache,
            meta.query_start_loc,
            meta.context_lens,
            meta.block_tables,
            meta.max_query_len,
            meta.max_context_len,
            scale,
            out=out,
            num_splits=self.num_splits,
        )
