"""Triton KV store and block copy (interpreter on CPU) against the torch references."""

from __future__ import annotations

import pytest
import torch

from kernels import block_ops, kv_store
from kernels.block_ops import copy_blocks, gather_blocks, scatter_blocks
from kernels.kv_store import store_kv
from kernels.reference import (
    ref_copy_blocks,
    ref_gather_blocks,
    ref_scatter_blocks,
    ref_store_kv,
)
from tests.kernel_helpers import CountingLauncher


def rand(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("block_size", "kvh", "dim"), [(8, 2, 16), (16, 3, 24), (128, 1, 32)])
def test_store_kv_matches_reference(
    dtype: torch.dtype, block_size: int, kvh: int, dim: int
) -> None:
    num_blocks, num_tokens = 5, 11
    gen = torch.Generator().manual_seed(block_size)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 7]] = -1
    # k and v as strided views of one fused projection, as a model produces them
    kv = rand((num_tokens, 2, kvh, dim), dtype, seed=1)
    k, v = kv[:, 0], kv[:, 1]
    k_cache = rand((num_blocks, block_size, kvh, dim), dtype, seed=2)
    v_cache = rand((num_blocks, block_size, kvh, dim), dtype, seed=3)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    store_kv(k, v, k_cache, v_cache, slots)
    ref_store_kv(k, v, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref)
    assert torch.equal(v_cache, v_ref)
    written = k_cache.reshape(-1, kvh, dim)[slots[slots >= 0]]
    assert torch.equal(written, k[slots >= 0])


def test_store_kv_casts_to_cache_dtype_and_all_padding_is_noop() -> None:
    k, v = rand((4, 2, 16), torch.float32, 1), rand((4, 2, 16), torch.float32, 2)
    k_cache = torch.zeros(2, 8, 2, 16, dtype=torch.float16)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([9, 0, -1, 15], dtype=torch.int32)
    store_kv(k, v, k_cache, v_cache, slots)
    k_ref, v_ref = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    ref_store_kv(k, v, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    before = k_cache.clone()
    store_kv(k, v, k_cache, v_cache, torch.full((4,), -1, dtype=torch.int64))
    assert torch.equal(k_cache, before)


def test_store_kv_rejects_bad_shapes() -> None:
    cache = torch.zeros(2, 8, 2, 16)
    k = torch.zeros(3, 2, 16)
    with pytest.raises(ValueError, match="slot_mapping"):
        store_kv(k, k, cache, cache, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="cache rows"):
        store_kv(torch.zeros(3, 1, 16), torch.zeros(3, 1, 16), cache, cache, torch.zeros(3).long())
    with pytest.raises(ValueError, match="power of two"):
        store_kv(k, k, cache[:, :6], cache[:, :6], torch.zeros(3, dtype=torch.int64))


def test_store_kv_refuses_a_slot_past_the_cache() -> None:
    """With every layer's caches in one tensor, slot ``num_blocks * block_size`` would land
    in the next layer's cache."""
    caches = torch.zeros(4, 4, 8, 2, 16)  # K0, K1, V0, V1
    k, slots = torch.ones(1, 2, 16), torch.tensor([32])
    with pytest.raises(ValueError, match="slot 32 is out of range for a cache of 4 blocks x 8"):
        store_kv(k, k, caches[0], caches[2], slots)
    assert not caches.any()


def test_store_kv_kernel_skips_slots_outside_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on CUDA (no host check): slots past the cache or below -1 are skipped, not written
    into the next layer's cache."""
    monkeypatch.setattr(kv_store, "_check_slots", lambda *args: None)
    caches = torch.zeros(4, 4, 8, 2, 16)
    k = rand((4, 2, 16), torch.float32, seed=7)
    slots = torch.tensor([32, 5, -7, 40])
    store_kv(k, k, caches[0], caches[2], slots)
    ref = torch.zeros_like(caches)
    ref[0].reshape(32, 2, 16)[5] = ref[2].reshape(32, 2, 16)[5] = k[1]
    assert torch.equal(caches, ref)


def test_store_kv_reads_strided_slot_mapping() -> None:
    k, v = rand((3, 2, 16), torch.float32, 1), rand((3, 2, 16), torch.float32, 2)
    slots = torch.tensor([[3, 0], [17, 0], [-1, 0]])[:, 0]
    assert slots.stride() == (2,)
    k_cache, v_cache = torch.zeros(4, 8, 2, 16), torch.zeros(4, 8, 2, 16)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    store_kv(k, v, k_cache, v_cache, slots)
    ref_store_kv(k, v, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("num_caches", "block", "pairs"),
    [
        (1, (8, 2, 16), [[3, 0]]),
        (4, (8, 2, 16), [[0, 4], [2, 7], [0, 5], [8, 1]]),
        (6, (64, 3, 24), [[6, 2], [1, 8]]),  # a block larger than one copy chunk
        (2, (4, 1, 8), [[5, 3], [7, 0], [8, 6], [2, 1]]),
    ],
)
def test_copy_blocks_matches_reference_across_caches(
    dtype: torch.dtype, num_caches: int, block: tuple[int, ...], pairs: list
) -> None:
    caches = rand((num_caches, 9, *block), dtype, seed=num_caches)
    ref = caches.clone()
    ids = torch.tensor(pairs, dtype=torch.int64)
    copy_blocks(caches, ids)
    ref_copy_blocks(ref, ids)
    assert torch.equal(caches, ref)
    for src, dst in pairs:
        assert torch.equal(caches[:, dst], caches[:, src])
    copy_blocks(caches, torch.zeros(0, 2, dtype=torch.int64))
    assert torch.equal(caches, ref)


def test_copy_blocks_takes_strided_caches_with_contiguous_blocks() -> None:
    # the K caches alone, a view of a [K and V, layers, blocks, ...] tensor
    whole = rand((2, 3, 6, 8, 2, 16), torch.float32, seed=5)
    k_only = whole[0, :, :]
    ref = whole.clone()
    pairs = torch.tensor([[1, 4], [0, 2]])
    copy_blocks(k_only, pairs)
    ref_copy_blocks(ref[0], pairs)
    assert torch.equal(whole, ref)  # the V half is untouched


def test_copy_blocks_is_one_launch_for_all_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = CountingLauncher(block_ops._copy_blocks_kernel)
    monkeypatch.setattr(block_ops, "_copy_blocks_kernel", launcher)
    caches = rand((6, 5, 8, 2, 16), torch.float32, seed=6)
    ref = caches.clone()
    pairs = torch.tensor([[0, 3], [1, 4]])
    copy_blocks(caches, pairs)
    ref_copy_blocks(ref, pairs)
    assert torch.equal(caches, ref)
    assert launcher.grids == [(2, 1, 6)]  # pairs x chunks x caches


@pytest.mark.parametrize(
    ("pairs", "error", "match"),
    [
        ([[0, 1], [2, 1]], ValueError, "repeat"),
        ([[0, 1], [1, 2]], ValueError, "also a source"),
        ([[0, 9]], IndexError, "out of range"),
        ([[-1, 2]], IndexError, "out of range"),
        ([[0, 1, 2]], ValueError, r"\[N, 2\]"),
        ([[0.0, 1.0]], TypeError, "int32/int64"),
    ],
)
def test_copy_blocks_rejects_bad_pairs(pairs: list, error: type, match: str) -> None:
    caches = torch.zeros(2, 9, 8, 2, 16)
    with pytest.raises(error, match=match):
        copy_blocks(caches, torch.tensor(pairs))
    with pytest.raises(ValueError, match="stacked"):
        copy_blocks(caches[0, 0, 0], torch.tensor([[0, 1]]))


@pytest.mark.parametrize(("num_caches", "block"), [(1, (16, 2, 16)), (4, (8, 1, 8))])
def test_gather_then_scatter_round_trips_blocks(num_caches: int, block: tuple[int, ...]) -> None:
    caches = rand((num_caches, 10, *block), torch.float16, 4)
    ids = torch.tensor([7, 2, 9], dtype=torch.int64)
    swapped = gather_blocks(caches, ids)
    assert swapped.shape == (num_caches, 3, *block)
    assert torch.equal(swapped, ref_gather_blocks(caches, ids))
    swapped_copy = swapped.clone()
    caches[:, ids] = 0  # the blocks are reused while swapped out; the copy must not alias
    assert torch.equal(swapped, swapped_copy)
    dest = torch.tensor([0, 5, 3], dtype=torch.int32)
    ref = caches.clone()
    scatter_blocks(caches, dest, swapped)
    ref_scatter_blocks(ref, dest, swapped)
    assert torch.equal(caches, ref)
    assert torch.equal(caches[:, dest.long()], swapped)


def test_swap_ops_reject_bad_inputs() -> None:
    caches = torch.zeros(2, 4, 8, 2, 16)
    with pytest.raises(IndexError, match="out of range"):
        gather_blocks(caches, torch.tensor([4]))
    with pytest.raises(ValueError, match="data must be"):
        scatter_blocks(caches, torch.tensor([1]), torch.zeros(2, 2, 8, 2, 16))
    with pytest.raises(ValueError, match="data must be"):
        scatter_blocks(caches, torch.tensor([1]), torch.zeros(1, 8, 2, 16))
    with pytest.raises(ValueError, match="repeat"):
        scatter_blocks(caches, torch.tensor([1, 1]), torch.zeros(2, 2, 8, 2, 16))
    with pytest.raises(ValueError, match="stacked"):
        gather_blocks(caches[0, 0, 0], torch.tensor([1]))
