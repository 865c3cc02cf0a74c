"""Write this step's new K/V rows into their paged-cache slots.

``slot_mapping[i] = block * block_size + offset`` names where token ``i`` goes in
``k_cache`` / ``v_cache`` ``[num_blocks, block_size, KVH, D]``; ``-1`` marks a padding token
whose row is left unwritten. One program per token copies its ``[KVH, D]`` rows; a slot
outside ``0 .. num_blocks * block_size - 1`` is skipped, never written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.cache_layout import cache_strides


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    num_slots,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if (slot < 0) | (slot >= num_slots):
        return
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE

    k = tl.load(k_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    kc = block * stride_kcb + offset * stride_kcs + heads[:, None] * stride_kch + dims[None, :]
    vc = block * stride_vcb + offset * stride_vcs + heads[:, None] * stride_vch + dims[None, :]
    tl.store(k_cache_ptr + kc, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + vc, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _check(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(
            f"k and v must both be [T, KVH, D]; got {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must both be [num_blocks, block_size, KVH, D]; got "
            f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    if k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(f"k rows {tuple(k.shape[1:])} != cache rows {tuple(k_cache.shape[2:])}")
    if slot_mapping.shape != (k.shape[0],) or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"slot_mapping must be int32/int64 [T={k.shape[0]}], got "
            f"{slot_mapping.dtype} {tuple(slot_mapping.shape)}"
        )
    block_size = k_cache.shape[1]
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have unit stride in head_dim, got {t.stride()}")
        if t.device != slot_mapping.device:
            raise ValueError(f"{name} is on {t.device} but slot_mapping on {slot_mapping.device}")


def _check_slots(slot_mapping: torch.Tensor, num_blocks: int, block_size: int) -> None:
    """Every slot below ``num_blocks * block_size`` (host tensors only: free there)."""
    top = int(slot_mapping.max()) if slot_mapping.numel() else -1
    if top >= num_blocks * block_size:
        raise ValueError(
            f"slot {top} is out of range for a cache of {num_blocks} blocks x {block_size} slots"
        )


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """``k_cache[s // bs, s % bs] = k[i]`` (same for v) for every ``s = slot_mapping[i] >= 0``.

    ``k``/``v`` are ``[T, KVH, D]`` and are cast to the cache dtype; ``slot_mapping`` may be
    any int32/int64 view. Slots must be distinct (two tokens writing one slot race): not
    checked. On CPU a slot ``>= num_blocks * block_size`` raises ``ValueError``; on CUDA it is
    not checked (a device sync) but skipped by the kernel, like any slot below 0.
    """
    _check(k, v, k_cache, v_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    num_blocks, block_size = k_cache.shape[:2]
    if slot_mapping.device.type == "cpu":
        _check_slots(slot_mapping, num_blocks, block_size)
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping.contiguous(),  # read as slot_ptr + token
        num_blocks * block_size,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        *cache_strides(k_cache, v_cache),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
