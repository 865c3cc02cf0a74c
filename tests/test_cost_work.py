"""One count of the work: the roofline's step time, its work() and the calibrated basis
agree over random batch shapes, in the compute-bound and the memory-bound regime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
