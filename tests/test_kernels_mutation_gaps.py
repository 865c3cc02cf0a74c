"""Gaps a mutation audit of ``kernels/`` found: behaviours no other test pinned.

The attention reference is checked here against an independent inline computation (plain
softmax attention, one query row and head at a time, keys looked up token by token through
the block table), so a mistake shared by the kernel and the reference cannot hide. Every
batch is tiny: the Triton interpreter runs about 4 ms per kernel loop iteration.
"""

from __future__ import annotations

import math

import pytest
import torch

import kernels.paged_attention as pa
from kernels.block_ops import copy_blocks, gather_blocks, scatter_blocks
from kernels.kv_store import store_kv
from kernels.paged_attention import paged_attention
from kernels.reference import ref_gather_blocks, ref_paged_attention, ref_store_kv

SCALE = 0.37
BLOCK_SIZE = 4
NUM_KV_HEADS = 2
GROUP = 3  # q head h reads kv head h // 3
HEAD_DIM = 16
NUM_BLOCKS = 12
PAD_VALUE = 40.0  # slots no sequence owns: a key there leaking in would dominate its softmax

# (query_len, context_len) and block table row per sequence: out-of-order, non-contiguous
# ids; sequence 0 ends in a partial block (11 = 2 * 4 + 3), sequence 1 is a decode at a
# block boundary, sequence 2 a plain prefill, sequence 3 a cached-prefix chunk long enough
# to be split; rows are padded with -1 past the blocks in use.
LENS = [(3, 11), (1, 8), (4, 4), (2, 21)]
TABLES = [
    [9, 2, 7, -1, -1, -1],
    [4, 0, -1, -1, -1, -1],
    [11, -1, -1, -1, -1, -1],
    [1, 10, 3, 6, 8, 5],
]


def _batch(dtype: torch.dtype = torch.float32, seed: int = 0) -> dict:
    """The :data:`LENS` batch; every slot a sequence does not own holds ``PAD_VALUE``."""
    gen = torch.Generator().manual_seed(seed)
    shape = (NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.full(shape, PAD_VALUE)
    v_cache = torch.full(shape, PAD_VALUE)
    for (_, ctx), row in zip(LENS, TABLES, strict=True):
        for t in range(ctx):
            b, off = row[t // BLOCK_SIZE], t % BLOCK_SIZE
            k_cache[b, off] = torch.randn(NUM_KV_HEADS, HEAD_DIM, generator=gen)
            v_cache[b, off] = torch.randn(NUM_KV_HEADS, HEAD_DIM, generator=gen)
    qsl = [0]
    for q_len, _ in LENS:
        qsl.append(qsl[-1] + q_len)
    q = torch.randn(qsl[-1], NUM_KV_HEADS * GROUP, HEAD_DIM, generator=gen)
    return {
        "q": q.to(dtype),
        "k_cache": k_cache.to(dtype),
        "v_cache": v_cache.to(dtype),
        "query_start_loc": torch.tensor(qsl, dtype=torch.int32),
        "context_lens": torch.tensor([ctx for _, ctx in LENS], dtype=torch.int32),
        "block_tables": torch.tensor(TABLES, dtype=torch.int32),
        "max_query_len": max(ql for ql, _ in LENS),
        "max_context_len": max(ctx for _, ctx in LENS),
    }


def _inline_attention(batch: dict, scale: float) -> torch.Tensor:
    """Plain causal softmax attention in float64, one query row and q head at a time."""
    q, k_cache, v_cache = (batch[n].double() for n in ("q", "k_cache", "v_cache"))
    out = torch.full_like(q, float("nan"))
    qsl = batch["query_start_loc"].tolist()
    block_size = k_cache.shape[1]
    group = q.shape[1] // k_cache.shape[2]
    for i, ctx in enumerate(batch["context_lens"].tolist()):
        row = batch["block_tables"][i].tolist()
        q_len = qsl[i + 1] - qsl[i]
        for j in range(q_len):
            pos = ctx - q_len + j  # this query token's absolute position
            for h in range(q.shape[1]):
                kvh = h // group
                keys = [k_cache[row[t // block_size], t % block_size, kvh] for t in range(pos + 1)]
                vals = [v_cache[row[t // block_size], t % block_size, kvh] for t in range(pos + 1)]
                scores = [float(q[qsl[i] + j, h] @ key) * scale for key in keys]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                out[qsl[i] + j, h] = sum(w / total * v for w, v in zip(weights, vals, strict=True))
    return out


def _ref(batch: dict, scale: float = SCALE) -> torch.Tensor:
    keys = ("q", "k_cache", "v_cache", "query_start_loc", "context_lens", "block_tables")
    return ref_paged_attention(*(batch[k] for k in keys), scale)


@pytest.mark.parametrize("scale", [SCALE, 1.0])
def test_reference_matches_inline_softmax_attention(scale: float) -> None:
    """The oracle itself: partial last block, out-of-order ids, GQA h // group, the scale,
    and no key past a query's position (the pad slots would dominate any softmax)."""
    batch = _batch()
    want = _inline_attention(batch, scale)
    assert torch.isfinite(want).all()
    torch.testing.assert_close(_ref(batch, scale).double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_kernel_matches_inline_softmax_attention(num_splits: int) -> None:
    """The kernel against the same inline oracle (not only against the reference), with
    finite pad values in the last partial block and past each context: a leaked key shows."""
    batch = _batch()
    out = torch.full_like(batch["q"], float("nan"))
    paged_attention(**batch, scale=SCALE, out=out, num_splits=num_splits)
    torch.testing.assert_close(out.double(), _inline_attention(batch, SCALE), rtol=1e-4, atol=1e-4)


def test_gqa_heads_read_their_own_kv_head() -> None:
    """q heads ``g * GROUP .. (g + 1) * GROUP - 1`` read kv head ``g`` and no other: zeroing
    kv head 1's values zeroes exactly q heads 3..5 (softmax weights sum to one)."""
    batch = _batch()
    batch["v_cache"][:, :, 1] = 0.0
    for out in (_ref(batch), paged_attention(**batch, scale=SCALE, num_splits=1)):
        assert (out[:, GROUP:] == 0).all()
        assert (out[:, :GROUP].abs().amax(dim=-1) > 0).all()


def test_attention_with_k_and_v_caches_of_different_strides() -> None:
    """``v_cache`` a head-dim slice of a wider tensor: its block / slot / head strides differ
    from ``k_cache``'s, and each cache must be addressed with its own."""
    batch = _batch()
    wide = torch.zeros(*batch["v_cache"].shape[:3], 2 * HEAD_DIM)
    wide[..., :HEAD_DIM] = batch["v_cache"]
    v_view = wide[..., :HEAD_DIM]
    assert v_view.stride() != batch["k_cache"].stride()
    want = _ref(batch)
    for num_splits in (1, 2):
        got = paged_attention(**{**batch, "v_cache": v_view}, scale=SCALE, num_splits=num_splits)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_store_kv_with_k_v_and_caches_of_different_strides() -> None:
    """``k`` and ``v`` (and the two caches) laid out differently: each is read or written
    with its own strides; ``-1`` slots are skipped."""
    gen = torch.Generator().manual_seed(3)
    kvh, dim = 2, 16
    k = torch.randn(5, kvh, dim, generator=gen)
    v = torch.randn(5, 3 * kvh, dim, generator=gen)[:, ::3]  # token and head strides differ
    assert k.stride() != v.stride()
    k_cache = torch.zeros(4, 8, kvh, dim)
    v_cache = torch.zeros(4, 8, kvh, 2 * dim)[..., :dim]
    slots = torch.tensor([17, -1, 3, 30, -1])
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    store_kv(k, v, k_cache, v_cache, slots)
    ref_store_kv(k, v, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    assert torch.equal(v_cache.reshape(32, kvh, dim)[[17, 3, 30]], v[[0, 2, 3]])


def test_block_id_equal_to_num_blocks_is_refused_on_cpu() -> None:
    """Id ``num_blocks`` is one past the cache: refused like any other id outside it."""
    batch = _batch()
    tables = batch["block_tables"].clone()
    tables[1, 1] = NUM_BLOCKS
    with pytest.raises(ValueError, match=rf"sequence 1: block id {NUM_BLOCKS} outside 0\.\.11"):
        paged_attention(**{**batch, "block_tables": tables}, scale=SCALE)


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # numpy's -inf - -inf, 0 / 0
def test_negative_block_id_is_never_dereferenced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unchecked (CUDA) path: a ``-1`` id inside a context masks its keys; it does not read
    the block before the cache (here finite memory of a larger buffer, so a read shows)."""
    monkeypatch.setattr(pa, "_check_lengths", lambda *args: None)
    batch = _batch()
    k_big = torch.ones(NUM_BLOCKS + 1, *batch["k_cache"].shape[1:])
    v_big = torch.ones_like(k_big)
    k_big[1:], v_big[1:] = batch["k_cache"], batch["v_cache"]
    tables = batch["block_tables"].clone()
    tables[2, 0] = -1  # sequence 2's only block
    out = paged_attention(**{**batch, "k_cache": k_big[1:], "v_cache": v_big[1:],
                             "block_tables": tables}, scale=SCALE, num_splits=1)  # fmt: skip
    rows = slice(4, 8)  # sequence 2's query rows
    assert out[rows].isnan().all()
    torch.testing.assert_close(out[:4], _ref(batch)[:4], rtol=1e-4, atol=1e-4)


def _qsl(*starts: int) -> torch.Tensor:
    return torch.tensor(starts, dtype=torch.int32)


# Each broken contract, with the error that names it (the kernel would otherwise compute
# garbage, leave rows unwritten, or read outside a tensor).
BAD_ATTENTION_INPUTS = {
    "query longer than max_query_len": (
        {"max_query_len": 3},
        ValueError,
        r"sequence 2: query_len 4 outside 0\.\.3",
    ),
    "negative query length": (
        {"query_start_loc": _qsl(0, 3, 2, 8, 10)},
        ValueError,
        r"sequence 1: query_len -1 outside",
    ),
    "query spans past q": (
        {"query_start_loc": _qsl(0, 3, 4, 8, 11)},
        ValueError,
        r"end within 10 rows, got 0\.\.11",
    ),
    "q head_dim differs from the cache's": (
        {"q": torch.zeros(10, 6, 8)},
        ValueError,
        r"q head_dim 8 != cache head_dim 16",
    ),
    "column-major block tables": (
        {"block_tables": torch.tensor(TABLES, dtype=torch.int32).t().contiguous().t()},
        ValueError,
        r"row-major",
    ),
    "max_context_len below max_query_len": (
        {"max_context_len": 3},
        ValueError,
        r"need 1 <= max_query_len <= max_context_len, got 4, 3",
    ),
    "v_cache shape differs": (
        {"v_cache": torch.zeros(NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM + 1)},
        ValueError,
        r"v_cache .* != k_cache",
    ),
    "v_cache dtype differs": (
        {"v_cache": torch.zeros(NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM).half()},
        TypeError,
        r"dtypes differ",
    ),
    "float query_start_loc": (
        {"query_start_loc": torch.tensor([0.0, 3.0, 4.0, 8.0, 10.0])},
        TypeError,
        r"query_start_loc must be an int32/int64 tensor",
    ),
}


@pytest.mark.parametrize("case", list(BAD_ATTENTION_INPUTS))
def test_broken_attention_contracts_raise(case: str) -> None:
    change, error, match = BAD_ATTENTION_INPUTS[case]
    with pytest.raises(error, match=match):
        paged_attention(**{**_batch(), **change}, scale=SCALE)


@pytest.mark.parametrize(
    "out",
    [torch.empty(10, 6, HEAD_DIM, dtype=torch.float16), torch.empty(10, 6, 2 * HEAD_DIM)[..., ::2]],
    ids=["dtype", "stride"],
)
def test_out_of_another_dtype_or_stride_is_refused(out: torch.Tensor) -> None:
    with pytest.raises(ValueError, match=r"out must match q"):
        paged_attention(**_batch(), scale=SCALE, out=out)


def test_split_merge_is_stable_for_large_logits() -> None:
    """Logits far above 128 (log2 units) overflow ``exp2`` unless the merge subtracts the
    partitions' common maximum, as the unsplit kernel's online softmax does."""
    batch = _batch()
    batch["q"] = batch["q"] * 200.0
    out = paged_attention(**batch, scale=SCALE, num_splits=3)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), _inline_attention(batch, SCALE), rtol=1e-4, atol=1e-4)


def _store_args() -> dict:
    return {
        "k": torch.zeros(3, 2, 16),
        "v": torch.zeros(3, 2, 16),
        "k_cache": torch.zeros(4, 8, 2, 16),
        "v_cache": torch.zeros(4, 8, 2, 16),
        "slot_mapping": torch.tensor([1, -1, 9]),
    }


BAD_STORE_INPUTS = {
    "k with a strided head_dim": ({"k": torch.zeros(3, 2, 32)[..., ::2]}, r"k must have unit"),
    "v shaped unlike k": ({"v": torch.zeros(3, 2, 8)}, r"k and v must both be \[T, KVH, D\]"),
    "v_cache shaped unlike k_cache": (
        {"v_cache": torch.zeros(4, 8, 2, 8)},
        r"k_cache and v_cache must both be",
    ),
    "float slot_mapping": (
        {"slot_mapping": torch.tensor([1.0, -1.0, 9.0])},
        r"slot_mapping must be int32/int64",
    ),
}


@pytest.mark.parametrize("case", list(BAD_STORE_INPUTS))
def test_broken_store_kv_contracts_raise_and_write_nothing(case: str) -> None:
    change, match = BAD_STORE_INPUTS[case]
    args = {**_store_args(), **change}
    args["k"].fill_(1.0)
    with pytest.raises(ValueError, match=match):
        store_kv(**args)
    assert not args["k_cache"].any() and not args["v_cache"].any()


def test_copy_blocks_refuses_blocks_that_are_not_contiguous() -> None:
    """The kernel copies ``block_numel`` consecutive elements from each block's start: a
    head-dim slice of a wider cache would be copied wrong, so it is refused."""
    wide = torch.zeros(2, 5, 4, 2, 32)
    wide[:, 1] = 1.0
    caches = wide[..., :16]
    with pytest.raises(ValueError, match=r"contiguous blocks"):
        copy_blocks(caches, torch.tensor([[1, 3]]))
    assert not wide[:, 3].any()


def test_swap_ops_refuse_misshaped_ids_and_data() -> None:
    """Bad ids or a wrong block shape get the module's own ``ValueError``, not torch's."""
    caches = torch.zeros(2, 4, 8, 2, 16)
    with pytest.raises(ValueError, match=r"block_ids must be 1-D"):
        gather_blocks(caches, torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match=r"data must be \[2, 1, 8, 2, 16\]"):
        scatter_blocks(caches, torch.tensor([1]), torch.zeros(2, 1, 8, 2, 8))


def test_gathering_no_blocks_gives_an_empty_stack() -> None:
    caches = torch.ones(3, 4, 8, 2, 16)
    none = torch.zeros(0, dtype=torch.int64)
    for got in (gather_blocks(caches, none), ref_gather_blocks(caches, none)):
        assert got.shape == (3, 0, 8, 2, 16)
