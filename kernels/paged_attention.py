"""Paged attention over a varlen batch: prefill, cached-prefix prefill, decode and mixed.

Layout (the engine's ``AttentionMetadata``): ``q [T, H, D]`` holds the new query tokens of
``S`` sequences back to back, sequence ``i`` owning rows ``query_start_loc[i] ..
query_start_loc[i + 1]``. After this step's K/V store, sequence ``i`` has ``context_lens[i]``
tokens in ``k_cache`` / ``v_cache`` ``[num_blocks, block_size, KVH, D]``; logical token ``t``
sits in block ``block_tables[i, t // block_size]`` at offset ``t % block_size``. Query token
``j`` of sequence ``i`` is at position ``context_lens[i] - query_lens[i] + j`` and attends
causally to keys ``0 ..`` that position.

Grid: one program per (query tile, sequence, kv head × kv split). A query tile packs
``BLOCK_Q`` consecutive query tokens times the ``H / KVH`` query heads that share one kv head
(padded to a power of two), so each K/V tile loaded serves the whole GQA group. A tile's rows
are padded to at least 16 so ``tl.dot`` compiles on GPU for decode and MHA too. Keys are
visited ``BLOCK_N`` tokens at a time; each key token finds its physical block through the
block table, so any power-of-two block size (1 … 256) works with one tile shape. Softmax is
online (running max and sum, base-2 exponentials) with fp32 accumulation.

Split-KV (flash-decoding): with ``num_splits > 1`` each (tile, sequence, kv head) is split into
contiguous key partitions; each partition writes its unnormalised output, running max and sum
to fp32 scratch, and a second kernel merges them. See ``choose_num_splits`` for the rule.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.cache_layout import cache_strides

_LOG2E = 1.4426950408889634
_MIN_ROWS = 16  # tl.dot needs M, N, K >= 16 when compiled
_TARGET_ROWS = 64
_MIN_KEYS_PER_SPLIT = 256
_MAX_SPLITS = 16


# Integer arguments that change from step to step are not specialized on: Triton would
# otherwise compile a new variant whenever one of them becomes 1 or a multiple of 16, and
# each compile (~0.3-0.7 s on an H200) stalls the step that meets it
# (docs/validation/h200.md: up to 12 such stalls per engine run before, at most one after).
_PER_STEP_INTS = ["keys_per_split", "num_tokens", "table_width", "stride_bt"]


@triton.jit(do_not_specialize=_PER_STEP_INTS)
def _attn_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    part_out_ptr,
    part_m_ptr,
    part_l_ptr,
    qsl_ptr,
    ctx_ptr,
    bt_ptr,
    sm_scale_log2,
    keys_per_split,
    num_tokens,
    num_blocks,
    table_width,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_bt,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    seq = tl.program_id(1)
    kvh = tl.program_id(2) // NUM_SPLITS
    split = tl.program_id(2) % NUM_SPLITS

    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    if tile * BLOCK_Q >= q_len:
        return
    ctx_len = tl.load(ctx_ptr + seq)
    prefix = ctx_len - q_len

    rows = tl.arange(0, BLOCK_M)
    q_idx = tile * BLOCK_Q + rows // GROUP_P2
    head_in_group = rows % GROUP_P2
    row_ok = (rows < BLOCK_Q * GROUP_P2) & (q_idx < q_len) & (head_in_group < GROUP)
    row_ok = row_ok & (q_start + q_idx < num_tokens)  # unchecked on CUDA: stay inside q, out
    token = (q_start + q_idx).to(tl.int64)
    head = kvh * GROUP + head_in_group
    pos = prefix + q_idx  # absolute position of each row's query token
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM

    q_off = token[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :]
    q_mask = row_ok[:, None] & dim_ok[None, :]
    q = tl.load(q_ptr + q_off, mask=q_mask, other=0.0)

    # Keys this tile may see end after its last query token; the split takes a slice of them.
    kv_hi = prefix + tl.minimum(q_len, (tile + 1) * BLOCK_Q)
    kv_lo = split * keys_per_split
    kv_end = tl.minimum(kv_hi, kv_lo + keys_per_split)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    keys = tl.arange(0, BLOCK_N)
    for start in range(kv_lo, kv_end, BLOCK_N):
        t = start + keys
        column = t // BLOCK_SIZE
        key_ok = (t < kv_end) & (column < table_width)
        block = tl.load(bt_ptr + seq * stride_bt + column, mask=key_ok, other=0).to(tl.int64)
        # An id outside the cache is never dereferenced (on CUDA it is not checked on the
        # host, which would cost a device sync): its keys are masked instead.
        key_ok = key_ok & (block >= 0) & (block < num_blocks)
        slot = t % BLOCK_SIZE
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        k_off = block[:, None] * stride_kb + slot[:, None] * stride_ks + dims[None, :]
        k = tl.load(k_ptr + k_off + kvh * stride_kh, mask=kv_mask, other=0.0)
        v_off = block[:, None] * stride_vb + slot[:, None] * stride_vs + dims[None, :]
        v = tl.load(v_ptr + v_off + kvh * stride_vh, mask=kv_mask, other=0.0)

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale_log2
        visible = key_ok[None, :] & (t[None, :] <= pos[:, None]) & row_ok[:, None]
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    if NUM_SPLITS == 1:
        # A row with no valid key gets NaN, as the merge gives it (padding rows are not stored).
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        o = tl.where(l_i[:, None] == 0.0, float("nan"), acc / l_safe[:, None])
        o_off = token[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :]
        tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        ml_off = (split * num_tokens + token) * NUM_HEADS + head
        tl.store(part_m_ptr + ml_off, m_i, mask=row_ok)
        tl.store(part_l_ptr + ml_off, l_i, mask=row_ok)
        tl.store(part_out_ptr + ml_off[:, None] * HEAD_DIM + dims[None, :], acc, mask=q_mask)


@triton.jit(do_not_specialize=["num_tokens", "num_seqs"])
def _merge_kernel(
    out_ptr,
    part_out_ptr,
    part_m_ptr,
    part_l_ptr,
    qsl_ptr,
    num_seqs,
    num_tokens,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    if token < tl.load(qsl_ptr) or token >= tl.load(qsl_ptr + num_seqs):
        return  # not a sequence's row: its partitions were never written; it stays untouched
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_P2)
    split_ok = splits < NUM_SPLITS
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM

    ml_off = (splits * num_tokens + token) * NUM_HEADS + head
    m = tl.load(part_m_ptr + ml_off, mask=split_ok, other=float("-inf"))
    l = tl.load(part_l_ptr + ml_off, mask=split_ok, other=0.0)
    m_max = tl.max(m, axis=0)  # finite for valid input: split 0 holds key 0, seen by every query
    w = tl.where(split_ok & (m > float("-inf")), tl.exp2(m - m_max), 0.0)
    mask = split_ok[:, None] & dim_ok[None, :]
    acc = tl.load(part_out_ptr + ml_off[:, None] * HEAD_DIM + dims[None, :], mask=mask, other=0.0)
    o = tl.sum(acc * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    o_off = token * stride_ot + head * stride_oh + dims
    tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=dim_ok)


def choose_num_splits(num_programs: int, max_context_len: int, num_sms: int) -> int:
    """Number of KV partitions when the caller does not fix it.

    Split only when the unsplit grid cannot fill the device (``num_programs < num_sms``,
    i.e. few sequences × kv heads, typically long-context decode): then take just enough
    splits to reach one program per SM, but keep each split at least
    ``_MIN_KEYS_PER_SPLIT`` (256) keys so the merge pass stays cheap, and at most
    ``_MAX_SPLITS`` (16). Returns 1 (no split) otherwise.
    """
    if num_programs <= 0 or max_context_len <= 0 or num_programs >= num_sms:
        return 1
    by_device = triton.cdiv(num_sms, num_programs)
    by_length = max_context_len // _MIN_KEYS_PER_SPLIT
    return max(1, min(by_device, by_length, _MAX_SPLITS))


def _check_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
) -> None:
    if q.dim() != 3 or k_cache.dim() != 4:
        raise ValueError(
            f"q must be [T, H, D] and k_cache [num_blocks, block_size, KVH, D]; got "
            f"{tuple(q.shape)} and {tuple(k_cache.shape)}"
        )
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache {tuple(v_cache.shape)} != k_cache {tuple(k_cache.shape)}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(
            f"q, k_cache, v_cache dtypes differ: {q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
        )
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"unsupported dtype {q.dtype}; use float32, float16 or bfloat16")
    if q.dtype == torch.bfloat16 and q.device.type == "cpu":
        raise TypeError(
            f"{q.dtype} on {q.device} is not supported: the Triton interpreter cannot do bf16 "
            "arithmetic; use float32 or float16 on CPU"
        )
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    if q.shape[2] != head_dim:
        raise ValueError(f"q head_dim {q.shape[2]} != cache head_dim {head_dim}")
    if num_kv_heads == 0 or q.shape[1] % num_kv_heads:
        raise ValueError(f"num_heads {q.shape[1]} is not a multiple of num_kv_heads {num_kv_heads}")
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have unit stride in head_dim, got {t.stride()}")
    num_seqs = context_lens.shape[0]
    if query_start_loc.shape != (num_seqs + 1,) or block_tables.dim() != 2:
        raise ValueError(
            f"query_start_loc must be [S + 1] and block_tables [S, max_blocks] for S={num_seqs}; "
            f"got {tuple(query_start_loc.shape)} and {tuple(block_tables.shape)}"
        )
    if block_tables.shape[0] != num_seqs or block_tables.stride(-1) != 1:
        raise ValueError(
            f"block_tables {tuple(block_tables.shape)} must be [S={num_seqs}, *], row-major"
        )
    for name, t in (
        ("query_start_loc", query_start_loc),
        ("context_lens", context_lens),
        ("block_tables", block_tables),
    ):
        if t.dtype not in (torch.int32, torch.int64) or t.device != q.device:
            raise TypeError(
                f"{name} must be an int32/int64 tensor on {q.device}, got {t.dtype} on {t.device}"
            )


def _check_lengths(
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    num_tokens: int,
    max_query_len: int,
    max_context_len: int,
    k_cache: torch.Tensor,
) -> None:
    """The per-sequence contract, read from host tensors: query spans inside ``q``, each
    context at least its query and within the bounds, every block it uses in the cache."""
    num_blocks, block_size = k_cache.shape[:2]
    qsl = query_start_loc.tolist()
    if qsl[0] != 0 or qsl[-1] > num_tokens:
        raise ValueError(
            f"query_start_loc must start at 0 and end within {num_tokens} rows, got "
            f"{qsl[0]}..{qsl[-1]}"
        )
    for i, (start, end, ctx) in enumerate(
        zip(qsl[:-1], qsl[1:], context_lens.tolist(), strict=True)
    ):
        q_len = end - start
        if q_len < 0 or q_len > max_query_len:
            raise ValueError(f"sequence {i}: query_len {q_len} outside 0..{max_query_len}")
        if ctx < q_len or ctx > max_context_len:
            raise ValueError(
                f"sequence {i}: context_len {ctx} must be >= its query_len {q_len} and "
                f"<= max_context_len {max_context_len}"
            )
        needed = -(-ctx // block_size)
        if needed > block_tables.shape[1]:
            raise ValueError(
                f"sequence {i}: context_len {ctx} needs {needed} blocks of {block_size} tokens, "
                f"but block_tables has {block_tables.shape[1]} columns"
            )
        for block in block_tables[i, :needed].tolist():
            if not 0 <= block < num_blocks:
                raise ValueError(f"sequence {i}: block id {block} outside 0..{num_blocks - 1}")


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1  # CPU (interpreter): splitting only adds work


def attention_constexprs(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    max_query_len: int,
    num_splits: int,
    dtype: torch.dtype,
) -> dict[str, int | str]:
    """Compile-time parameters of ``_attn_kernel`` for one launch (also used by AOT checks).

    A query tile holds ``BLOCK_Q`` tokens × the GQA group padded to a power of two, aiming at
    ``_TARGET_ROWS`` rows, never fewer than 16; key tiles are 16…64 tokens.
    """
    group = num_heads // num_kv_heads
    group_p2 = triton.next_power_of_2(group)
    block_q = max(1, min(triton.next_power_of_2(max_query_len), _TARGET_ROWS // group_p2))
    return {
        "NUM_HEADS": num_heads,
        "HEAD_DIM": head_dim,
        "GROUP": group,
        "GROUP_P2": group_p2,
        "BLOCK_Q": block_q,
        "BLOCK_M": max(_MIN_ROWS, block_q * group_p2),
        "BLOCK_N": max(16, min(64, block_size)),
        "BLOCK_D": max(16, triton.next_power_of_2(head_dim)),
        "BLOCK_SIZE": block_size,
        "NUM_SPLITS": num_splits,
        # fp32 inputs: exact fp32 products, not TF32 (the default for fp32 tl.dot on GPU).
        "DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32",
    }


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    max_query_len: int,
    max_context_len: int,
    scale: float,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Causal attention of ``q [T, H, D]`` over the paged cache; returns ``out [T, H, D]``.

    One launch (plus a merge launch when split) serves prefill, cached-prefix prefill, decode
    and mixed batches. ``H`` must be a multiple of the cache's ``KVH`` (GQA/MQA). Inputs may
    be fp32, fp16 or bf16 (one dtype for q and the caches); accumulation is fp32 and ``out``
    gets q's dtype. ``max_query_len`` / ``max_context_len`` must bound the true lengths (they
    size the grid and the split partitions; passing them avoids a device sync);
    ``query_start_loc[0]`` is 0 and sequence ``i``'s row of ``block_tables`` holds
    ``ceil(context_lens[i] / block_size)`` blocks. Every row of the sequences' tokens is
    written; rows outside them (past ``query_start_loc[-1]``) are left untouched, split or
    not. ``num_splits=None`` picks splits with ``choose_num_splits`` (never splits on CPU).

    ``query_start_loc`` and ``context_lens`` may be strided views (copied when they are).

    Raises ``ValueError`` on a contract broken on the host (``TypeError`` for bf16 on CPU,
    which the interpreter cannot compute). On CPU the per-sequence lengths, table widths and
    block ids are checked too; on CUDA they are not (a device sync): the kernel never reads
    past the table or outside the cache, nor reads or writes rows past ``q`` / ``out``. Keys
    behind a block id outside the cache are dropped and the softmax renormalised over the
    rest; a query whose keys are all dropped comes out NaN, split or not, not an error.
    """
    _check_inputs(q, k_cache, v_cache, query_start_loc, context_lens, block_tables)
    # the kernels read them as ptr + seq
    query_start_loc, context_lens = query_start_loc.contiguous(), context_lens.contiguous()
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(
            f"out must match q ({tuple(q.shape)}, {q.dtype}) with unit last stride, got "
            f"{tuple(out.shape)}, {out.dtype}, strides {out.stride()}"
        )
    num_seqs = context_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    if max_query_len < 1 or max_context_len < max_query_len:
        raise ValueError(
            f"need 1 <= max_query_len <= max_context_len, got {max_query_len}, {max_context_len}"
        )

    if q.device.type == "cpu":  # free here; on CUDA it would cost a device sync
        _check_lengths(query_start_loc, context_lens, block_tables, num_tokens,
                       max_query_len, max_context_len, k_cache)  # fmt: skip

    cfg = attention_constexprs(
        num_heads, num_kv_heads, head_dim, block_size, max_query_len, 1, q.dtype
    )
    num_q_tiles = triton.cdiv(max_query_len, int(cfg["BLOCK_Q"]))
    if num_splits is None:
        num_splits = choose_num_splits(
            num_q_tiles * num_seqs * num_kv_heads, max_context_len, _num_sms(q.device)
        )
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    cfg["NUM_SPLITS"] = num_splits
    block_n = int(cfg["BLOCK_N"])
    keys_per_split = triton.cdiv(triton.cdiv(max_context_len, num_splits), block_n) * block_n
    if num_splits == 1:
        keys_per_split = max_context_len

    if num_splits > 1:
        part_ml = (num_splits, num_tokens, num_heads)
        part_m = torch.empty(part_ml, dtype=torch.float32, device=q.device)
        part_l = torch.empty(part_ml, dtype=torch.float32, device=q.device)
        part_out = torch.empty((*part_ml, head_dim), dtype=torch.float32, device=q.device)
    else:
        part_m = part_l = part_out = out  # unused when not split

    grid = (num_q_tiles, num_seqs, num_kv_heads * num_splits)
    _attn_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        part_out,
        part_m,
        part_l,
        query_start_loc,
        context_lens,
        block_tables,
        scale * _LOG2E,
        keys_per_split,
        num_tokens,
        k_cache.shape[0],
        block_tables.shape[1],
        q.stride(0),
        q.stride(1),
        *cache_strides(k_cache, v_cache),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        **cfg,
    )
    if num_splits > 1:
        _merge_kernel[(num_tokens, num_heads)](
            out,
            part_out,
            part_m,
            part_l,
            query_start_loc,
            num_seqs,
            num_tokens,
            out.stride(0),
            out.stride(1),
            NUM_HEADS=num_heads,
            HEAD_DIM=head_dim,
            BLOCK_D=cfg["BLOCK_D"],
            NUM_SPLITS=num_splits,
            SPLITS_P2=triton.next_power_of_2(num_splits),
        )
    return out
