"""Plain-torch references for every kernel in this package: slow, obvious, and the oracle
the tests and the GPU benchmark compare against. Same contracts as the kernels (see
``kernels.paged_attention``): paged KV ``[num_blocks, block_size, KVH, D]``, block tables,
varlen query layout, ``slot_mapping`` with ``-1`` for padding.
"""

from __future__ import annotations

import torch


def gather_sequence_kv(
    cache: torch.Tensor, block_table: torch.Tensor, context_len: int
) -> torch.Tensor:
    """The first ``context_len`` tokens of one sequence, ``[context_len, KVH, D]``."""
    block_size = cache.shape[1]
    num_blocks = -(-context_len // block_size)
    blocks = cache[block_table[:num_blocks].long()]  # [nb, bs, KVH, D]
    return blocks.reshape(-1, *cache.shape[2:])[:context_len]


def ref_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal paged attention, one sequence at a time, softmax in fp32; out has q's dtype."""
    out = torch.empty_like(q)
    num_heads = q.shape[1]
    starts = query_start_loc.tolist()
    for i, ctx in enumerate(context_lens.tolist()):
        lo, hi = starts[i], starts[i + 1]
        if hi == lo:
            continue
        k = gather_sequence_kv(k_cache, block_tables[i], ctx).float()
        v = gather_sequence_kv(v_cache, block_tables[i], ctx).float()
        group = num_heads // k.shape[1]
        k = k.repeat_interleave(group, dim=1)  # [ctx, H, D]
        v = v.repeat_interleave(group, dim=1)
        qi = q[lo:hi].float()
        scores = torch.einsum("qhd,khd->hqk", qi, k) * scale
        pos = torch.arange(ctx - (hi - lo), ctx, device=q.device)
        visible = torch.arange(ctx, device=q.device)[None, :] <= pos[:, None]
        scores = scores.masked_fill(~visible[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[lo:hi] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out


def ref_store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write row ``i`` of ``k``/``v`` into flat slot ``slot_mapping[i]``; skip ``-1``."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = k_cache.shape[1]
    k_cache[slots // block_size, slots % block_size] = k[keep].to(k_cache.dtype)
    v_cache[slots // block_size, slots % block_size] = v[keep].to(v_cache.dtype)


def ref_copy_blocks(caches: torch.Tensor, pairs: torch.Tensor) -> None:
    """For every cache ``c`` of the stacked ``caches [num_caches, num_blocks, ...]`` and every
    ``(src, dst)`` row of ``pairs``: ``caches[c, dst] = caches[c, src]``."""
    for cache in caches:
        for src, dst in pairs.tolist():
            cache[dst] = cache[src]


def ref_gather_blocks(caches: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """A copy of ``caches[:, block_ids]`` (stacked caches, blocks along dim 1)."""
    if len(block_ids) == 0:
        return caches[:, :0].clone()
    return torch.stack([caches[:, b].clone() for b in block_ids.tolist()], dim=1)


def ref_scatter_blocks(caches: torch.Tensor, block_ids: torch.Tensor, data: torch.Tensor) -> None:
    """``caches[:, block_ids[i]] = data[:, i]`` for every ``i``."""
    for i, b in enumerate(block_ids.tolist()):
        caches[:, b] = data[:, i].to(caches.device, caches.dtype)
