"""Torch reference paged attention: gather K/V through block tables, softmax in fp32.

Slow (a Python loop over sequences) but simple enough to trust; it is the oracle the
Triton kernels and the HF-parity tests are checked against. It always reads keys from the
cache, never from the step's ``k``/``v`` directly, so a wrong slot mapping or block table
shows up as wrong output.
"""

from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata
from kernels.reference import gather_sequence_kv, ref_store_kv


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``k[t]``, ``v[t]`` to flat slot ``slot_mapping[t]`` of the caches; skip ``-1``."""
    num_blocks, block_size = k_cache.shape[:2]
    if v_cache.shape != k_cache.shape:
        raise ValueError(
            f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ"
        )
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(
            f"slot_mapping has shape {tuple(slot_mapping.shape)}, expected ({k.shape[0]},)"
        )
    top = int(slot_mapping.max()) if slot_mapping.numel() else -1
    if top >= num_blocks * block_size:
        raise ValueError(
            f"slot {top} is out of range for a cache of {num_blocks} blocks x {block_size} slots"
        )
    ref_store_kv(k, v, k_cache, v_cache, slot_mapping)


def _check_shapes(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError("q, k, v must be [T, heads, head_dim]")
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(
            f"inconsistent shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"query heads ({q.shape[1]}) not a multiple of kv heads ({k.shape[1]})")
    if k_cache.dim() != 4 or k_cache.shape[2:] != k.shape[1:]:
        raise ValueError(
            f"cache shape {tuple(k_cache.shape)} does not match [blocks, block_size, "
            f"{k.shape[1]}, {k.shape[2]}]"
        )
    num_tokens = int(meta.query_start_loc[-1])
    if num_tokens > q.shape[0]:
        raise ValueError(f"metadata covers {num_tokens} tokens but q has {q.shape[0]}")


class TorchRefBackend:
    """Reference ``AttentionBackend`` (see ``engine.attention.base`` for the contract)."""

    name = "torch"

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
        _check_shapes(q, k, v, k_cache, meta)
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        block_size = k_cache.shape[1]
        group = q.shape[1] // k.shape[1]
        out = torch.zeros_like(q)
        starts = meta.query_start_loc.tolist()
        ctx_lens = meta.context_lens.tolist()
        for i, ctx in enumerate(ctx_lens):
            start, end = starts[i], starts[i + 1]
            q_len = end - start
            if q_len == 0:
                continue
            if ctx < q_len:
                raise ValueError(f"sequence {i}: context_len {ctx} < query_len {q_len}")
            n_blocks = -(-ctx // block_size)
            if n_blocks > meta.block_tables.shape[1]:
                raise ValueError(
                    f"sequence {i}: context_len {ctx} needs {n_blocks} blocks but block_tables "
                    f"has {meta.block_tables.shape[1]} columns"
                )
            keys = gather_sequence_kv(k_cache, meta.block_tables[i], ctx).float()  # [ctx, KVH, D]
            values = gather_sequence_kv(v_cache, meta.block_tables[i], ctx).float()
            keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # [H, ctx, D]
            values = values.repeat_interleave(group, dim=1).transpose(0, 1)
            queries = q[start:end].float().transpose(0, 1)  # [H, q_len, D]
            scores = scale * queries @ keys.transpose(1, 2)  # [H, q_len, ctx]
            q_pos = torch.arange(ctx - q_len, ctx, device=q.device)
            k_pos = torch.arange(ctx, device=q.device)
            scores.masked_fill_(k_pos[None, :] > q_pos[:, None], float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            out[start:end] = (probs @ values).transpose(0, 1).to(q.dtype)
        return out
