"""Whole-block copies in the paged KV cache, over all caches at once.

Every function takes the caches stacked, ``[num_caches, num_blocks, ...]`` (the engine's
K caches of all layers then its V caches, in one tensor), so a step's block moves cost a
fixed number of calls however many layers and pairs there are:

- ``copy_blocks``: copy-on-write, ``caches[c, dst] = caches[c, src]`` for a list of
  ``(src, dst)`` pairs in every cache ``c``. A Triton kernel, ONE launch per call with one
  program per (pair, chunk of a block, cache): no host-side loop over pairs or caches.
- ``gather_blocks`` / ``scatter_blocks``: swap out / in. Plain torch index ops
  (``index_select`` / ``index_copy_`` along the blocks dim): one gather and one scatter per
  swap around a host↔device transfer that dominates, so a custom kernel would not pay.
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
    stride_cache,
    stride_block,
    BLOCK_NUMEL: tl.constexpr,
    CHUNK: tl.constexpr,
):
    pair = tl.program_id(0)
    chunk = tl.program_id(1)
    cache = tl.program_id(2).to(tl.int64)
    src = tl.load(pairs_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(pairs_ptr + 2 * pair + 1).to(tl.int64)
    base = cache_ptr + cache * stride_cache
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < BLOCK_NUMEL
    data = tl.load(base + src * stride_block + offs, mask=mask)
    tl.store(base + dst * stride_block + offs, data, mask=mask)


def _check_ids(ids: torch.Tensor, num_blocks: int, name: str) -> None:
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32/int64, got {ids.dtype}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_blocks):
        raise IndexError(f"{name} out of range [0, {num_blocks}): {ids.tolist()}")


def _check_stacked(caches: torch.Tensor) -> None:
    if caches.dim() < 3:
        raise ValueError(
            f"caches must be stacked [num_caches, num_blocks, ...], got {tuple(caches.shape)}"
        )


def check_copy_pairs(pairs: torch.Tensor, num_blocks: int) -> None:
    """Raise one error naming the problem unless ``pairs`` is ``[N, 2]`` int ``(src, dst)``
    rows in ``[0, num_blocks)`` with distinct destinations, none of which is a source (so
    every copy reads the pre-copy state, as copy-on-write produces)."""
    if pairs.dim() != 2 or pairs.shape[1] != 2:
        raise ValueError(f"pairs must be [N, 2] (src, dst), got {tuple(pairs.shape)}")
    _check_ids(pairs, num_blocks, "copy pairs")
    src, dst = pairs[:, 0], pairs[:, 1]
    if torch.unique(dst).numel() != dst.numel():
        raise ValueError(f"copy_blocks destinations repeat: {dst.tolist()}")
    if torch.isin(dst, src).any():
        raise ValueError(f"a copy_blocks destination is also a source: {pairs.tolist()}")


def copy_blocks(caches: torch.Tensor, pairs: torch.Tensor) -> None:
    """For every cache ``c`` and row ``(src, dst)`` of ``pairs [N, 2]``:
    ``caches[c, dst] = caches[c, src]``, in one kernel launch.

    ``caches`` is ``[num_caches, num_blocks, ...]`` with each block contiguous (any stride
    between caches and between blocks), on ``pairs``' device; ``pairs`` is checked by
    :func:`check_copy_pairs`.
    """
    _check_stacked(caches)
    check_copy_pairs(pairs, caches.shape[1])
    if pairs.shape[0] == 0:
        return
    if not caches[0, 0].is_contiguous() or caches.device != pairs.device:
        raise ValueError(
            f"caches must have contiguous blocks on {pairs.device}; got strides "
            f"{caches.stride()} on {caches.device}"
        )
    block_numel = caches[0, 0].numel()
    grid = (pairs.shape[0], triton.cdiv(block_numel, _CHUNK), caches.shape[0])
    _copy_blocks_kernel[grid](
        caches,
        pairs.contiguous(),
        caches.stride(0),
        caches.stride(1),
        BLOCK_NUMEL=block_numel,
        CHUNK=_CHUNK,
    )


def gather_blocks(caches: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """A new tensor ``[num_caches, len(block_ids), ...]`` holding ``caches[:, block_ids]``
    (on ``caches``' device), from one ``index_select``.

    Swap-out: the caller moves the result to the host pool.
    """
    _check_stacked(caches)
    if block_ids.dim() != 1:
        raise ValueError(f"block_ids must be 1-D, got {tuple(block_ids.shape)}")
    _check_ids(block_ids, caches.shape[1], "block_ids")
    return caches.index_select(1, block_ids.to(caches.device, torch.int64))


def scatter_blocks(caches: torch.Tensor, block_ids: torch.Tensor, data: torch.Tensor) -> None:
    """``caches[:, block_ids[i]] = data[:, i]`` with one ``index_copy_``; ``data`` may live
    on another device (swap-in: one transfer).

    ``block_ids`` must be distinct (a repeated id would leave an arbitrary winner).
    """
    _check_stacked(caches)
    if block_ids.dim() != 1:
        raise ValueError(f"block_ids must be 1-D, got {tuple(block_ids.shape)}")
    want = (caches.shape[0], block_ids.shape[0], *caches.shape[2:])
    if data.shape != want:
        raise ValueError(f"data must be [{', '.join(map(str, want))}], got {tuple(data.shape)}")
    _check_ids(block_ids, caches.shape[1], "block_ids")
    if torch.unique(block_ids).numel() != block_ids.numel():
        raise ValueError(f"scatter_blocks block_ids repeat: {block_ids.tolist()}")
    ids = block_ids.to(caches.device, torch.int64)
    caches.index_copy_(1, ids, data.to(caches.device, caches.dtype))
