"""The torch reference paged-attention backend against contiguous SDPA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.attention.base import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.attention.registry import available_backends, get_backend
from engine.attention.torch_ref import TorchRefBackend

HEAD_DIM = 8
NUM_HEADS = 4


def _layout(
    prefix_lens: list[int],
    query_lens: list[int],
    block_size: int,
    num_blocks: int,
    gen: torch.Generator,
    num_padding: int = 0,
) -> tuple[AttentionMetadata, list[list[int]]]:
    """Metadata for sequences with ``prefix_lens`` cached tokens and ``query_lens`` new ones,
    their blocks drawn at random (non-contiguous) from the pool; ``num_padding`` trailing
    tokens get slot -1."""
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables, slots = [], []
    for prefix, q_len in zip(prefix_lens, query_lens, strict=True):
        ctx = prefix + q_len
        blocks = [free.pop() for _ in range(-(-ctx // block_size))]
        tables.append(blocks)
        slots += [blocks[p // block_size] * block_size + p % block_size for p in range(prefix, ctx)]
    slots += [-1] * num_padding
    width = max(len(t) for t in tables) + 1
    padded = [t + [0] * (width - len(t)) for t in tables]
    ctx_lens = [p + q for p, q in zip(prefix_lens, query_lens, strict=True)]
    starts = [0]
    for q_len in query_lens:
        starts.append(starts[-1] + q_len)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        context_lens=torch.tensor(ctx_lens, dtype=torch.int32),
        block_tables=torch.tensor(padded, dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        max_query_len=max(query_lens),
        max_context_len=max(ctx_lens),
    )
    return meta, tables


def _write_prefix(cache: torch.Tensor, table: list[int], values: torch.Tensor) -> None:
    block_size = cache.shape[1]
    for p in range(values.shape[0]):
        cache[table[p // block_size], p % block_size] = values[p]


def _sdpa_reference(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention of ``q`` [q_len, H, D] (the last q_len positions) over contiguous
    ``keys``/``values`` [ctx, KVH, D]."""
    q_len, ctx = q.shape[0], keys.shape[0]
    allowed = torch.arange(ctx)[None, :] <= torch.arange(ctx - q_len, ctx)[:, None]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        keys.transpose(0, 1)[None],
        values.transpose(0, 1)[None],
        attn_mask=allowed,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)


CASES = {
    "prefill": ([0, 0, 0], [5, 17, 1]),
    "cached_prefix": ([3, 16, 9], [6, 4, 1]),
    "decode": ([7, 32, 1, 15], [1, 1, 1, 1]),
    "mixed": ([0, 12, 20, 5], [9, 1, 1, 7]),
}


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_contiguous_sdpa(case: str, num_kv_heads: int, block_size: int) -> None:
    prefix_lens, query_lens = CASES[case]
    gen = torch.Generator().manual_seed(
        sorted(CASES).index(case) * 100 + num_kv_heads * 10 + block_size
    )
    num_blocks = 40
    meta, tables = _layout(prefix_lens, query_lens, block_size, num_blocks, gen)
    cache_shape = (num_blocks, block_size, num_kv_heads, HEAD_DIM)
    k_cache = torch.randn(cache_shape, generator=gen)
    v_cache = torch.randn(cache_shape, generator=gen)
    full_k, full_v = [], []
    for prefix, q_len, table in zip(prefix_lens, query_lens, tables, strict=True):
        full_k.append(torch.randn(prefix + q_len, num_kv_heads, HEAD_DIM, generator=gen))
        full_v.append(torch.randn(prefix + q_len, num_kv_heads, HEAD_DIM, generator=gen))
        _write_prefix(k_cache, table, full_k[-1][:prefix])
        _write_prefix(v_cache, table, full_v[-1][:prefix])
    new_k = torch.cat([k[p:] for k, p in zip(full_k, prefix_lens, strict=True)])
    new_v = torch.cat([v[p:] for v, p in zip(full_v, prefix_lens, strict=True)])
    q = torch.randn(sum(query_lens), NUM_HEADS, HEAD_DIM, generator=gen)
    scale = HEAD_DIM**-0.5

    out = TorchRefBackend().forward(q, new_k, new_v, k_cache, v_cache, meta, scale)

    starts = meta.query_start_loc.tolist()
    for i in range(len(prefix_lens)):
        expected = _sdpa_reference(q[starts[i] : starts[i + 1]], full_k[i], full_v[i], scale)
        torch.testing.assert_close(out[starts[i] : starts[i + 1]], expected, atol=1e-5, rtol=1e-5)


def test_padding_slots_skipped_and_unwritten_rows_untouched() -> None:
    gen = torch.Generator().manual_seed(0)
    block_size, num_blocks, kv_heads, padding = 4, 12, 2, 3
    meta, _ = _layout([0, 0], [6, 3], block_size, num_blocks, gen, num_padding=padding)
    cache_shape = (num_blocks, block_size, kv_heads, HEAD_DIM)
    k_cache = torch.randn(cache_shape, generator=gen)
    v_cache = torch.randn(cache_shape, generator=gen)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    t = 9 + padding
    q = torch.randn(t, NUM_HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(t, kv_heads, HEAD_DIM, generator=gen)
    v = torch.randn(t, kv_heads, HEAD_DIM, generator=gen)

    out = TorchRefBackend().forward(q, k, v, k_cache, v_cache, meta, 0.5)

    expected_k, expected_v = k_before.clone(), v_before.clone()
    real = meta.slot_mapping >= 0
    expected_k.view(-1, kv_heads, HEAD_DIM)[meta.slot_mapping[real]] = k[real]
    expected_v.view(-1, kv_heads, HEAD_DIM)[meta.slot_mapping[real]] = v[real]
    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)
    assert int(real.sum()) == 9
    assert torch.equal(out[9:], torch.zeros_like(out[9:]))
    assert torch.isfinite(out).all()


def test_never_reads_past_context() -> None:
    gen = torch.Generator().manual_seed(1)
    block_size, num_blocks, kv_heads = 4, 8, 2
    meta, _ = _layout([0], [5], block_size, num_blocks, gen)
    k_cache = torch.full((num_blocks, block_size, kv_heads, HEAD_DIM), float("nan"))
    v_cache = k_cache.clone()
    q = torch.randn(5, NUM_HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(5, kv_heads, HEAD_DIM, generator=gen)
    out = TorchRefBackend().forward(q, k, k.clone(), k_cache, v_cache, meta, 1.0)
    assert torch.isfinite(out).all()


def test_output_keeps_query_dtype() -> None:
    gen = torch.Generator().manual_seed(2)
    meta, _ = _layout([2], [3], 4, 4, gen)
    k_cache = torch.zeros(4, 4, 2, HEAD_DIM, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    q = torch.randn(3, NUM_HEADS, HEAD_DIM, generator=gen).bfloat16()
    k = torch.randn(3, 2, HEAD_DIM, generator=gen).bfloat16()
    out = TorchRefBackend().forward(q, k, k.clone(), k_cache, v_cache, meta, 1.0)
    assert out.dtype == torch.bfloat16
    assert out.shape == q.shape


def _one_seq_inputs(
    ctx: int, q_len: int, width: int, slot: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    q = torch.randn(q_len, NUM_HEADS, HEAD_DIM)
    k = torch.randn(q_len, 2, HEAD_DIM)
    cache = torch.zeros(4, 4, 2, HEAD_DIM)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, q_len], dtype=torch.int32),
        context_lens=torch.tensor([ctx], dtype=torch.int32),
        block_tables=torch.zeros(1, width, dtype=torch.int32),
        slot_mapping=torch.arange(slot, slot + q_len, dtype=torch.int64),
        max_query_len=q_len,
        max_context_len=ctx,
    )
    return q, k, cache, cache.clone(), meta


@pytest.mark.parametrize(
    ("ctx", "q_len", "width", "slot", "message"),
    [
        (2, 3, 1, 0, "context_len 2 < query_len 3"),
        (9, 3, 2, 0, "needs 3 blocks"),
        (3, 3, 1, 15, "out of range"),
    ],
)
def test_bad_metadata_is_rejected(
    ctx: int, q_len: int, width: int, slot: int, message: str
) -> None:
    q, k, k_cache, v_cache, meta = _one_seq_inputs(ctx, q_len, width, slot)
    with pytest.raises(ValueError, match=message):
        TorchRefBackend().forward(q, k, k.clone(), k_cache, v_cache, meta, 1.0)


def test_bad_head_ratio_is_rejected() -> None:
    q, _, k_cache, v_cache, meta = _one_seq_inputs(3, 3, 1)
    k = torch.randn(3, 3, HEAD_DIM)
    with pytest.raises(ValueError, match="not a multiple of kv heads"):
        TorchRefBackend().forward(q, k, k.clone(), k_cache, v_cache, meta, 1.0)


def test_registry() -> None:
    backend = get_backend("torch")
    assert isinstance(backend, TorchRefBackend)
    assert isinstance(backend, AttentionBackend)
    assert "torch" in available_backends()
    with pytest.raises(ValueError, match=r"available: .*torch"):
        get_backend("flash")
