"""Whole-block copies in the paged KV cache.

- ``copy_blocks``: copy-on-write, ``cache[dst] = cache[src]`` for a list of ``(src, dst)``
  pairs in every layer's K and V cache. A Triton kernel: one launch per cache with one program
  per (pair, chunk of the block), so a step's CoW pairs cost a launch per cache however many
  pairs there are, with no host-side loop over pairs.
- ``gather_blocks`` / ``scatter_blocks``: swap out / in. Plain torch index ops
  (``index_select`` / ``index_copy_``): the work is one gather or scatter per cache around a
  host↔device transfer that dominates, so a custom kernel would not pay.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_CHUNK = 1024


@triton.jit
def _copy_blocks_kernel(
    cache_ptr,
    pairs_ptr,
    stride_block,
    BLOCK_NUMEL: tl.constexpr,
    CHUNK: tl.constexpr,
):
    pair = tl.program_id(0)
    chunk = tl.program_id(1)
    src = tl.load(pairs_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(pairs_ptr + 2 * pair + 1).to(tl.int64)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < BLOCK_NUMEL
    data = tl.load(cache_ptr + src * stride_block + offs, mask=mask)
    tl.store(cache_ptr + dst * stride_block + offs, data, mask=mask)


def _check_ids(ids: torch.Tensor, num_blocks: int, name: str) -> None:
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32/int64, got {ids.dtype}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_blocks):
        raise IndexError(f"{name} out of range [0, {num_blocks}): {ids.tolist()}")


def _block_contiguous(cache: torch.Tensor) -> bool:
    return cache.dim() >= 2 and cache[0].is_contiguous()


def copy_blocks(caches: list[torch.Tensor], pairs: torch.Tensor) -> None:
    """For each cache and each row ``(src, dst)`` of ``pairs [N, 2]``: ``cache[dst] = cache[src]``.

    Every cache is ``[num_blocks, ...]`` with each block contiguous, on ``pairs``' device.
    Destinations must be distinct and never a source (all copies read the pre-copy state),
    which is what copy-on-write produces; violations raise ``ValueError``.
    """
    if pairs.dim() != 2 or pairs.shape[1] != 2:
        raise ValueError(f"pairs must be [N, 2] (src, dst), got {tuple(pairs.shape)}")
    if pairs.shape[0] == 0:
        return
    src, dst = pairs[:, 0], pairs[:, 1]
    if torch.unique(dst).numel() != dst.numel():
        raise ValueError(f"copy_blocks destinations repeat: {dst.tolist()}")
    if torch.isin(dst, src).any():
        raise ValueError(f"a copy_blocks destination is also a source: {pairs.tolist()}")
    pairs = pairs.contiguous()
    for i, cache in enumerate(caches):
        _check_ids(pairs, cache.shape[0], f"pairs (cache {i})")
        if not _block_contiguous(cache) or cache.device != pairs.device:
            raise ValueError(
                f"cache {i} must have contiguous blocks on {pairs.device}; got strides "
                f"{cache.stride()} on {cache.device}"
            )
        block_numel = cache[0].numel()
        grid = (pairs.shape[0], triton.cdiv(block_numel, _CHUNK))
        _copy_blocks_kernel[grid](
            cache, pairs, cache.stride(0), BLOCK_NUMEL=block_numel, CHUNK=_CHUNK
        )


def gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """A new tensor ``[len(block_ids), ...]`` holding ``cache[block_ids]`` (on cache's device).

    Swap-out: the caller moves the result to the host pool.
    """
    if block_ids.dim() != 1:
        raise ValueError(f"block_ids must be 1-D, got {tuple(block_ids.shape)}")
    _check_ids(block_ids, cache.shape[0], "block_ids")
    return cache.index_select(0, block_ids.to(cache.device, torch.int64))


def scatter_blocks(cache: torch.Tensor, block_ids: torch.Tensor, data: torch.Tensor) -> None:
    """``cache[block_ids[i]] = data[i]``; ``data`` may live on another device (swap-in).

    ``block_ids`` must be distinct (a repeated id would leave an arbitrary winner).
    """
    if block_ids.dim() != 1:
        raise ValueError(f"block_ids must be 1-D, got {tuple(block_ids.shape)}")
    if data.shape != (block_ids.shape[0], *cache.shape[1:]):
        raise ValueError(
            f"data must be [{block_ids.shape[0]}, {', '.join(map(str, cache.shape[1:]))}], "
            f"got {tuple(data.shape)}"
        )
    _check_ids(block_ids, cache.shape[0], "block_ids")
    if torch.unique(block_ids).numel() != block_ids.numel():
        raise ValueError(f"scatter_blocks block_ids repeat: {block_ids.tolist()}")
    ids = block_ids.to(cache.device, torch.int64)
    cache.index_copy_(0, ids, data.to(cache.device, cache.dtype))
