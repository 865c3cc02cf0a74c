"""Triton paged attention (under the interpreter on CPU) against the torch reference.

Every run starts from a NaN-poisoned output and a NaN-poisoned cache (only the slots a
sequence owns hold numbers), so a row left unwritten or a key read past ``context_lens``
shows up as NaN. Error bound: max |out - ref| / max |ref| below ``TOL[dtype]``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton.backends

import kernels.paged_attention as pa
from kernels.paged_attention import choose_num_splits, paged_attention
from kernels.reference import ref_paged_attention

TOL = {torch.float32: 1e-4, torch.float16: 2e-2}
SCALE = 0.3


def make_batch(
    lens: list[tuple[int, int]],
    block_size: int,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    dtype: torch.dtype,
    seed: int,
    pad_id: int = 0,
) -> dict:
    """Random varlen batch: ``lens`` is (query_len, context_len) per sequence.

    Block tables are a random permutation of a pool with spare blocks, padded with
    ``pad_id``, and sequence 1 (when present) shares sequence 0's first block, as a shared
    prompt prefix would.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-ctx // block_size) for _, ctx in lens]
    num_blocks = sum(blocks_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(blocks_per_seq) + 1
    tables = torch.full((len(lens), width), pad_id, dtype=torch.int32)
    used = 0
    for i, nb in enumerate(blocks_per_seq):
        tables[i, :nb] = torch.tensor(perm[used : used + nb], dtype=torch.int32)
        used += nb
    if len(lens) > 1 and lens[0][1] >= block_size and lens[1][1] >= block_size:
        tables[1, 0] = tables[0, 0]

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    for i, (_, ctx) in enumerate(lens):
        for t in range(ctx):
            b, off = int(tables[i, t // block_size]), t % block_size
            k_cache[b, off] = torch.randn(num_kv_heads, head_dim, generator=gen).to(dtype)
            v_cache[b, off] = torch.randn(num_kv_heads, head_dim, generator=gen).to(dtype)

    qlens = torch.tensor([ql for ql, _ in lens], dtype=torch.int32)
    qsl = torch.zeros(len(lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(qlens, 0)
    num_tokens = int(qsl[-1])
    q = torch.randn(num_tokens, num_kv_heads * group, head_dim, generator=gen).to(dtype)
    return {
        "q": q,
        "k_cache": k_cache,
        "v_cache": v_cache,
        "query_start_loc": qsl,
        "context_lens": torch.tensor([ctx for _, ctx in lens], dtype=torch.int32),
        "block_tables": tables,
        "max_query_len": max(ql for ql, _ in lens),
        "max_context_len": max(ctx for _, ctx in lens),
    }


def reference(batch: dict) -> torch.Tensor:
    """:func:`ref_paged_attention` on a :func:`make_batch` batch at ``SCALE``."""
    keys = ("q", "k_cache", "v_cache", "query_start_loc", "context_lens", "block_tables")
    return ref_paged_attention(*(batch[k] for k in keys), SCALE)


def run_and_check(batch: dict, num_splits: int | None) -> torch.Tensor:
    q = batch["q"]
    out = torch.full_like(q, float("nan"))
    got = paged_attention(**batch, scale=SCALE, out=out, num_splits=num_splits)
    assert got is out
    ref = reference(batch).float()
    assert torch.isfinite(ref).all()
    assert torch.isfinite(out).all(), "unwritten rows or keys read past context_lens"
    err = (out.float() - ref).abs().max() / ref.abs().max()
    assert err < TOL[q.dtype], f"relative error {err:.2e} >= {TOL[q.dtype]:.0e}"
    return out


def mixed_lens(bs: int) -> list[tuple[int, int]]:
    """Prefill at a block boundary, context 1, cached-prefix chunk, decode at a boundary,
    ragged decode: every case in one batch (one launch)."""
    return [(2 * bs, 2 * bs), (1, 1), (5, bs + 8), (1, 2 * bs), (1, 3 * bs + 5)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize(("num_kv_heads", "group"), [(2, 1), (2, 4), (1, 8)])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_mixed_batch_matches_reference(
    dtype: torch.dtype, block_size: int, num_kv_heads: int, group: int, num_splits: int
) -> None:
    batch = make_batch(mixed_lens(block_size), block_size, num_kv_heads, group, 32, dtype, seed=1)
    run_and_check(batch, num_splits)


@pytest.mark.parametrize("block_size", [64, 256])
def test_large_blocks(block_size: int) -> None:
    lens = [(3, 70), (1, block_size), (1, block_size + 1)]
    batch = make_batch(lens, block_size, 2, 2, 16, torch.float16, seed=2)
    run_and_check(batch, 1)
    run_and_check(batch, 2)


def test_head_dim_not_power_of_two() -> None:
    batch = make_batch([(4, 9), (1, 17)], 8, 2, 2, 24, torch.float32, seed=3)
    run_and_check(batch, 1)


def test_more_splits_than_keys_leaves_empty_partitions_harmless() -> None:
    batch = make_batch([(1, 3), (1, 40)], 8, 1, 4, 16, torch.float32, seed=4)
    split = run_and_check(batch, 7)
    whole = run_and_check(batch, 1)
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-5)


def test_long_prefill_spans_several_query_tiles() -> None:
    # group 8 packs 8 query tokens per tile: 70 tokens need 9 tiles, the last one partial.
    batch = make_batch([(70, 75)], 16, 1, 8, 16, torch.float32, seed=5)
    run_and_check(batch, 2)


def test_auto_splits_and_default_out() -> None:
    batch = make_batch([(1, 33), (1, 5)], 8, 2, 2, 16, torch.float32, seed=6)
    out = paged_attention(**batch, scale=SCALE)
    ref = reference(batch)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_sequence_with_no_query_tokens_is_skipped() -> None:
    batch = make_batch([(3, 10), (0, 12), (1, 9)], 8, 1, 2, 16, torch.float32, seed=7)
    run_and_check(batch, 1)


def test_choose_num_splits_rule() -> None:
    # a grid that already fills the device is never split
    assert choose_num_splits(num_programs=132, max_context_len=32768, num_sms=132) == 1
    # short contexts are never split below 256 keys per split
    assert choose_num_splits(num_programs=1, max_context_len=300, num_sms=132) == 1
    assert choose_num_splits(num_programs=1, max_context_len=512, num_sms=132) == 2
    # few programs, long context: enough splits to fill the SMs, capped at 16
    assert choose_num_splits(num_programs=40, max_context_len=32768, num_sms=132) == 4
    assert choose_num_splits(num_programs=1, max_context_len=32768, num_sms=132) == 16
    for programs in range(1, 200, 7):
        for ctx in (1, 100, 1000, 10_000):
            n = choose_num_splits(programs, ctx, 132)
            assert 1 <= n <= 16
            assert n == 1 or ctx // n >= 256


def test_bad_inputs_raise_clear_errors() -> None:
    batch = make_batch([(2, 5)], 8, 2, 2, 16, torch.float32, seed=8)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        paged_attention(**{**batch, "q": torch.zeros(2, 3, 16)}, scale=SCALE)
    with pytest.raises(TypeError, match="dtypes differ"):
        paged_attention(**{**batch, "q": batch["q"].half()}, scale=SCALE)
    odd = batch["k_cache"][:, :6]
    with pytest.raises(ValueError, match="power of two"):
        paged_attention(**{**batch, "k_cache": odd, "v_cache": odd}, scale=SCALE)
    with pytest.raises(ValueError, match="out must match"):
        paged_attention(**batch, scale=SCALE, out=torch.empty(2, 4, 8))
    with pytest.raises(ValueError, match="max_query_len"):
        paged_attention(**{**batch, "max_query_len": 0}, scale=SCALE)
    with pytest.raises(ValueError, match="num_splits"):
        paged_attention(**batch, scale=SCALE, num_splits=0)


def test_split_kv_leaves_padding_rows_untouched() -> None:
    """The merge pass runs over every row of ``q``; rows past the last sequence's tokens
    have no partitions written and must keep what ``out`` held."""
    batch = make_batch([(1, 21), (1, 9)], 8, 1, 2, 16, torch.float32, seed=12)
    pad = torch.zeros(2, *batch["q"].shape[1:])
    batch["q"] = torch.cat([batch["q"], pad])
    out = torch.full_like(batch["q"], 7.0)
    paged_attention(**batch, scale=SCALE, out=out, num_splits=2)
    assert (out[2:] == 7.0).all()
    torch.testing.assert_close(out[:2], reference(batch)[:2], rtol=1e-4, atol=1e-4)


def test_broken_length_contracts_raise_instead_of_reading_out_of_bounds() -> None:
    """Each of these reads memory it must not (a segfault under the interpreter, an illegal
    access or garbage on a GPU) unless refused on the host."""
    batch = make_batch([(2, 7)], 4, 1, 2, 16, torch.float32, seed=13)
    with pytest.raises(ValueError, match="context_len 7 needs 2 blocks of 4 tokens, but block_"):
        paged_attention(**{**batch, "block_tables": batch["block_tables"][:, :1]}, scale=SCALE)
    far = batch["block_tables"].clone()
    far[0, 1] = 4_000_000
    with pytest.raises(ValueError, match="block id 4000000 outside"):
        paged_attention(**{**batch, "block_tables": far}, scale=SCALE)
    short = torch.tensor([1], dtype=torch.int32)
    with pytest.raises(ValueError, match="context_len 1 must be >= its query_len 2"):
        paged_attention(**{**batch, "context_lens": short}, scale=SCALE)
    loose = paged_attention(**{**batch, "max_context_len": 40}, scale=SCALE)  # a bound only
    torch.testing.assert_close(loose, reference(batch), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="must start at 0"):
        paged_attention(**{**batch, "query_start_loc": torch.tensor([1, 3], dtype=torch.int32)},
                        scale=SCALE)  # fmt: skip
    with pytest.raises(ValueError, match="<= max_context_len 7"):
        paged_attention(**{**batch, "context_lens": torch.tensor([8], dtype=torch.int32)},
                        scale=SCALE)  # fmt: skip


def test_gqa_group_not_a_power_of_two() -> None:
    # 6 query heads over 2 kv heads: each tile pads the group of 3 to 4 rows per token
    batch = make_batch(mixed_lens(8), 8, 2, 3, 16, torch.float32, seed=14)
    run_and_check(batch, 1)
    run_and_check(batch, 2)


@pytest.mark.parametrize("block_size", [1, 32])
def test_smallest_and_mid_block_sizes(block_size: int) -> None:
    batch = make_batch([(3, 40), (1, 33)], block_size, 1, 2, 16, torch.float32, seed=15)
    run_and_check(batch, 2)


def test_block_table_padded_with_minus_one() -> None:
    """The engine pads each row of ``block_tables`` past the blocks in use with -1."""
    batch = make_batch([(2, 9), (1, 25), (1, 3)], 8, 1, 2, 16, torch.float32, 16, pad_id=-1)
    assert (batch["block_tables"] == -1).sum() >= 4
    run_and_check(batch, 1)
    run_and_check(batch, 2)


@pytest.mark.parametrize("name", ["context_lens", "query_start_loc"])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_strided_length_tensors_are_read_by_value(name: str, num_splits: int) -> None:
    """A column of a wider int tensor holds the right values but not back to back."""
    batch = make_batch([(1, 5), (2, 20), (1, 9)], 8, 1, 2, 16, torch.float32, seed=17)
    lens = batch[name]
    strided = torch.stack([lens, torch.zeros_like(lens)], 1)[:, 0]
    assert strided.stride() == (2,)
    run_and_check({**batch, name: strided}, num_splits)


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # numpy's -inf - -inf, 0 / 0
@pytest.mark.parametrize("num_splits", [1, 2])
def test_invalid_block_ids_on_the_unchecked_path(
    monkeypatch: pytest.MonkeyPatch, num_splits: int
) -> None:
    """As on CUDA (no host checks): a query whose keys are all behind invalid block ids comes
    out NaN, split or not; a query with some invalid blocks attends to the remaining keys."""
    monkeypatch.setattr(pa, "_check_lengths", lambda *args: None)
    batch = make_batch([(1, 5), (1, 20)], 8, 1, 2, 16, torch.float32, seed=18)
    tables = batch["block_tables"].clone()
    tables[0, 0] = -1  # sequence 0's only block
    tables[1, 2] = batch["k_cache"].shape[0]  # keys 16..19 of sequence 1
    out = paged_attention(**{**batch, "block_tables": tables}, scale=SCALE,
                          num_splits=num_splits)  # fmt: skip
    assert out[0].isnan().all()
    # the decode query at position 19 then sees keys 0..15: context 16's decode query does
    seen = reference({**batch, "context_lens": torch.tensor([5, 16], dtype=torch.int32)})
    torch.testing.assert_close(out[1], seen[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_rows_past_q_are_never_written(monkeypatch: pytest.MonkeyPatch, num_splits: int) -> None:
    """Unchecked (CUDA) path: ``query_start_loc`` claims one row more than ``q`` holds; the
    row after ``out`` (here the next row of a larger buffer) must stay untouched."""
    monkeypatch.setattr(pa, "_check_lengths", lambda *args: None)
    batch = make_batch([(3, 10)], 8, 1, 2, 16, torch.float32, seed=19)
    q = torch.cat([batch["q"], torch.zeros(1, *batch["q"].shape[1:])])
    buffer = torch.full_like(q, 7.0)
    batch["query_start_loc"] = torch.tensor([0, 4], dtype=torch.int32)
    batch["context_lens"] = torch.tensor([11], dtype=torch.int32)
    batch["max_query_len"], batch["max_context_len"] = 4, 11
    paged_attention(**{**batch, "q": q[:3]}, scale=SCALE, out=buffer[:3], num_splits=num_splits)
    assert (buffer[3] == 7.0).all()


def test_bf16_on_cpu_is_refused() -> None:
    """The interpreter cannot do bf16 arithmetic: it would return garbage, not an error."""
    batch = make_batch([(2, 5)], 8, 1, 2, 16, torch.bfloat16, seed=20)
    with pytest.raises(TypeError, match="bfloat16 on cpu"):
        paged_attention(**batch, scale=SCALE)


def test_triton_backend_matches_torch_backend_with_padding() -> None:
    from engine.attention.metadata import AttentionMetadata
    from engine.attention.torch_ref import TorchRefBackend
    from engine.attention.triton_backend import TritonAttentionBackend

    gen = torch.Generator().manual_seed(9)
    block_size, kvh, heads, dim = 8, 2, 4, 16
    # seq 0: prefill 6 over a cached prefix of 4; seq 1: decode at context 9; then 1 pad token
    tables = torch.tensor([[3, 5], [6, 1]], dtype=torch.int32)
    slots = [3 * 8 + 4, 3 * 8 + 5, 3 * 8 + 6, 3 * 8 + 7, 5 * 8 + 0, 5 * 8 + 1, 1 * 8 + 0, -1]
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, 6, 7], dtype=torch.int32),
        context_lens=torch.tensor([10, 9], dtype=torch.int32),
        block_tables=tables,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        max_query_len=6,
        max_context_len=10,
    )
    cache = torch.randn(8, block_size, kvh, dim, generator=gen)
    q = torch.randn(8, heads, dim, generator=gen)
    k = torch.randn(8, kvh, dim, generator=gen)
    v = torch.randn(8, kvh, dim, generator=gen)
    caches = {name: (cache.clone(), cache.clone() * 2) for name in ("torch", "triton")}
    ref = TorchRefBackend().forward(q, k, v, *caches["torch"], meta, SCALE)
    got = TritonAttentionBackend().forward(q, k, v, *caches["triton"], meta, SCALE)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    assert (got[7] == 0).all()
    torch.testing.assert_close(caches["triton"][0], caches["torch"][0], rtol=0, atol=0)
    torch.testing.assert_close(caches["triton"][1], caches["torch"][1], rtol=0, atol=0)


@pytest.mark.slow
def test_kernels_compile_for_hopper(tmp_path: Path) -> None:
    """The interpreter is lenient; lower every kernel to an sm_90 cubin in a fresh process."""
    if "nvidia" not in triton.backends.backends:
        pytest.skip("Triton's NVIDIA backend is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compile for real, not from a warm cache
    proc = _aot_check(env, "--arch", "90")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(" ok (") == 6


def test_aot_check_under_the_interpreter_is_one_line() -> None:
    # a shell that exported TRITON_INTERPRET=1 (the CPU tests ask for it) got a traceback
    proc = _aot_check({**os.environ, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "TRITON_INTERPRET" in lines[0], proc.stderr


def _aot_check(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m kernels.aot_check args`` in a fresh process with ``env``."""
    return subprocess.run(
        [sys.executable, "-m", "kernels.aot_check", *args],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_step_varying_integers_are_not_specialized_on() -> None:
    """Compiled (not interpreted), the attention kernels name their per-step integers in
    ``do_not_specialize``, and each name is one of the kernel's arguments (a rename must not
    silently bring back a compile whenever one becomes 1 or a multiple of 16)."""
    code = (
        "from kernels.paged_attention import _attn_kernel as a, _merge_kernel as m\n"
        "wants = ({'keys_per_split', 'num_tokens', 'table_width', 'stride_bt'},\n"
        "         {'num_tokens', 'num_seqs'})\n"
        "for k, want in zip((a, m), wants):\n"
        "    names = {k.arg_names[i] if isinstance(i, int) else i for i in k.do_not_specialize}\n"
        "    assert names == want and names <= set(k.arg_names), (names, k.arg_names)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
