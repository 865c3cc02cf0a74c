"""One count of the work: the roofline's step time, its work() and the calibrated basis
agree over random batch shapes, in the compute-bound and the memory-bound regime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.model_spec import ModelSpec
from core.plan import BatchShape
from sim.catalog import get_model
from sim.cost import CalibratedCostModel, Efficiency, RooflineCostModel
from sim.cost.calibrated import TERMS
from sim.cost.work import WorkCoefficients, count_work, shape_counts

EMBEDDED_PROFILE = (
    Path(__file__).resolve().parents[1]
    / "sim/cost/profiles/vidur-a100-llama-2-7b/operator_profile.csv"
)

FULL = Efficiency(compute=1.0, memory=1.0)
MODELS = ("opt-13b", "llama-3-8b", "tiny-llama")


@st.composite
def prefill_shapes(draw: st.DrawFn) -> BatchShape:
    """Long prompts: every part compute-bound on the roofline."""
    lengths = draw(st.lists(st.integers(1024, 2048), min_size=1, max_size=4))
    starts = draw(st.lists(st.integers(0, 64), min_size=len(lengths), max_size=len(lengths)))
    pairs = sum(n * s + n * (n + 1) // 2 for n, s in zip(lengths, starts, strict=True))
    return BatchShape(
        prefill_tokens=sum(lengths),
        prefill_seqs=len(lengths),
        prefill_attn_pairs=pairs,
        prefill_kv_read_tokens=sum(starts),
    )


@st.composite
def decode_shapes(draw: st.DrawFn) -> BatchShape:
    """Small decode batches: every part memory-bound on the roofline."""
    seqs = draw(st.integers(1, 16))
    ctx = draw(st.integers(seqs, seqs * 2048))
    return BatchShape(decode_seqs=seqs, decode_ctx_tokens=ctx)


def _models(name: str, tp: int = 1) -> tuple[RooflineCostModel, CalibratedCostModel]:
    roof = RooflineCostModel(name, "a100-40gb", tp, efficiency=FULL)
    cal = CalibratedCostModel(name, "a100-40gb", dict.fromkeys(TERMS, 0.0), tp)
    return roof, cal


@settings(max_examples=60, deadline=None)
@given(shape=st.one_of(prefill_shapes(), decode_shapes()), name=st.sampled_from(MODELS))
def test_work_and_basis_are_one_count(shape: BatchShape, name: str) -> None:
    roof, cal = _models(name)
    w = roof.work(shape)
    lf, lb, af, ab = count_work(roof.work_coefficients, *shape_counts(shape))
    assert (w["linear_flops"], w["linear_bytes"], w["attn_flops"], w["attn_bytes"]) == (
        lf,
        lb,
        af,
        ab,
    )
    _, lin, attn, byte, *_ = cal.basis(*shape_counts(shape))
    g = roof.gpu
    assert lin == pytest.approx(w["linear_flops"] / g.peak_flops, rel=1e-12)
    assert attn == pytest.approx(w["attn_flops"] / g.peak_flops, rel=1e-12)
    # the calibrated basis counts activation bytes too (it used to drop them)
    assert byte == pytest.approx((w["linear_bytes"] + w["attn_bytes"]) / g.mem_bandwidth, rel=1e-12)
    assert w["linear_bytes"] > roof.weight_bytes


@settings(max_examples=40, deadline=None)
@given(shape=prefill_shapes(), name=st.sampled_from(("opt-13b", "llama-3-8b")))
def test_compute_bound_step_is_the_flop_basis(shape: BatchShape, name: str) -> None:
    roof, cal = _models(name)
    w = roof.work(shape)
    g = roof.gpu
    assert w["linear_flops"] / g.peak_flops > w["linear_bytes"] / g.mem_bandwidth
    assert w["attn_flops"] / g.peak_flops > w["attn_bytes"] / g.mem_bandwidth
    _, lin, attn, *_ = cal.basis(*shape_counts(shape))
    assert roof.step_time(shape) == pytest.approx(lin + attn, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(shape=decode_shapes(), name=st.sampled_from(MODELS))
def test_memory_bound_step_is_the_byte_basis(shape: BatchShape, name: str) -> None:
    roof, cal = _models(name)
    w = roof.work(shape)
    g = roof.gpu
    assert w["linear_flops"] / g.peak_flops < w["linear_bytes"] / g.mem_bandwidth
    assert w["attn_flops"] / g.peak_flops < w["attn_bytes"] / g.mem_bandwidth
    _, _, _, byte, *_ = cal.basis(*shape_counts(shape))
    assert roof.step_time(shape) == pytest.approx(byte, rel=1e-12)


def test_count_work_is_elementwise_over_arrays() -> None:
    k = WorkCoefficients.of(get_model("opt-13b"))
    shapes = [BatchShape(decode_seqs=4, decode_ctx_tokens=900), BatchShape(), BatchShape(
        prefill_tokens=300, prefill_seqs=2, prefill_attn_pairs=30000)]  # fmt: skip
    cols = [np.array(c, dtype=float) for c in zip(*map(shape_counts, shapes), strict=True)]
    arrays = count_work(k, *cols)
    for i, s in enumerate(shapes):
        assert tuple(float(a[i]) for a in arrays) == tuple(
            map(float, count_work(k, *shape_counts(s)))
        )
    assert all(float(a[1]) == 0.0 for a in arrays)  # an empty step has no work


def test_the_profiled_lm_head_is_priced_from_the_same_count() -> None:
    """OPT-350M's LM head is 512 wide (its ``word_embed_proj_dim``), not 1,024 (its hidden
    size): a profile without an LM-head operator prices the head by :func:`lm_head_work`,
    the count the roofline takes, so the head of OPT-350M costs what the same model with a
    512-wide hidden size's head would, and less than one 1,024 wide."""
    from dataclasses import replace

    from sim.cost import ProfiledCostModel
    from sim.cost.profile import read_profile
    from sim.cost.work import lm_head_work

    profile = read_profile(EMBEDDED_PROFILE, tp=1)
    opt350 = get_model("opt-350m")
    assert opt350.embed_dim == 512 < opt350.hidden_size
    k = WorkCoefficients.of(opt350)
    params, act = lm_head_work(opt350, 1)
    assert k.flops_per_logit == 2 * params == 2 * 512 * opt350.vocab_size
    assert k.act_bytes_per_logit == 2 * act == 2 * (512 + opt350.vocab_size)
    unprojected = replace(opt350, word_embed_proj_dim=None)
    rows = np.array([1.0, 64.0, 1024.0])
    narrow = ProfiledCostModel(profile, opt350, "a100-40gb")._lm_fn(rows)
    wide = ProfiledCostModel(profile, unprojected, "a100-40gb")._lm_fn(rows)
    assert np.all(wide > 1.5 * narrow)


def _tiny_spec() -> ModelSpec:
    """A Llama-shaped model small enough to count by hand: 2 layers, hidden 8, 2 heads and
    2 KV heads of width 4, gated MLP 16 wide, vocabulary 32."""
    return ModelSpec(
        name="hand-count", family="llama", num_layers=2, hidden_size=8, num_heads=2,
        num_kv_heads=2, head_dim=4, ffn_hidden_size=16, vocab_size=32, max_model_len=64,
        gated_mlp=True, tie_word_embeddings=False,
    )  # fmt: skip


# A 5-token prefill chunk after 3 cached tokens (pairs 5 * 3 + 5 * 6 / 2 = 30) and two
# decode sequences over 10 context tokens in all.
HAND_SHAPE = BatchShape(
    prefill_tokens=5, prefill_seqs=1, prefill_attn_pairs=30, prefill_kv_read_tokens=3,
    decode_seqs=2, decode_ctx_tokens=10,
)  # fmt: skip


def test_work_of_a_tiny_model_matches_a_hand_count() -> None:
    """The module doc's count, by hand, for :func:`_tiny_spec` and ``HAND_SHAPE`` (7 new
    tokens, 3 sampled rows, fp16):

    - layer matmul weights: q, k, v, o 8 x 8 each (256) + gated MLP 3 x 8 x 16 (384) =
      640, 2 layers 1280; LM head 8 x 32 = 256;
    - linear FLOPs 2 x 1280 x 7 + 2 x 256 x 3 = 19456;
    - linear bytes: weights (1280 + 256) x 2 = 3072; per token and layer 4h (32) + 4q (32)
      + 2 x 3 x ffn (96) + 2kv (16) = 176 elements, x 2 layers x 2 B x 7 tokens = 4928; per
      row 8 + 32 elements x 2 B x 3 rows = 240; 8240 in all;
    - attention FLOPs 4 x head_dim 4 x heads 2 x layers 2 x (30 + 10) pairs = 2560;
    - attention bytes: K and V of 2 layers x 2 heads x 4 x 2 B = 64 per token, read for
      10 + 3 tokens and written for the 7 new ones: 20 x 64 = 1280.
    """
    k = WorkCoefficients.of(_tiny_spec())
    assert count_work(k, *shape_counts(HAND_SHAPE)) == (19456, 8240, 2560, 1280)
    w = RooflineCostModel(_tiny_spec(), "a100-40gb").work(HAND_SHAPE)
    assert (w["linear_flops"], w["linear_bytes"], w["attn_flops"], w["attn_bytes"]) == (
        19456,
        8240,
        2560,
        1280,
    )


def test_attention_flops_are_split_over_tensor_parallel_gpus() -> None:
    """Tensor parallelism splits the heads: at tp=2 each GPU computes 1 of the 2 heads, so
    half the attention FLOPs (4 x 4 x 1 x 2 layers x 40 pairs = 1280) and half the K/V
    bytes (32 a token, 20 tokens); the decoder matmuls and LM head also halve here (no
    replicated KV head): 2 x 640 x 7 + 2 x 128 x 3 = 9728."""
    k1 = WorkCoefficients.of(_tiny_spec(), tp=1)
    k2 = WorkCoefficients.of(_tiny_spec(), tp=2)
    lf1, _, af1, ab1 = count_work(k1, *shape_counts(HAND_SHAPE))
    lf2, _, af2, ab2 = count_work(k2, *shape_counts(HAND_SHAPE))
    assert (lf2, af2, ab2) == (9728, 1280, 640)
    assert (lf2, af2, ab2) == (lf1 / 2, af1 / 2, ab1 / 2)
