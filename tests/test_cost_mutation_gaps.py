"""Gaps a mutation audit of sim/cost/ found: each test holds one documented contract that a
surviving mutant broke without any other test noticing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from core.plan import BatchShape
from sim.catalog import get_gpu
from sim.cost import CalibratedCostModel, Efficiency, ProfiledCostModel, RooflineCostModel
from sim.cost.calibrated import ROOFLINE_TERMS, TERMS, host_seconds
from sim.cost.overhead import STACKS, swap_seconds
from sim.cost.profile import OperatorProfile
from sim.cost.profiled import interp_points, profiled_layer
from tests.test_cost_profiled import synthetic_rows, write_profile

H200_PROFILE = Path(__file__).resolve().parents[1] / "sim/cost/profiles/kvlab-h200-opt-13b"
OPT13B_LAYERS = 40
OPT13B_HIDDEN = 5120


def _points(rows: list[tuple[int, int, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An op's ``(num_tokens, context_tokens, time_s)`` arrays from its rows."""
    n, c, t = zip(*rows, strict=True)
    return np.array(n, dtype=float), np.array(c, dtype=float), np.array(t, dtype=float)


def _opt13b_profile(ops: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> OperatorProfile:
    """An in-memory profile of OPT-13B on the A100-40GB at tp 1, block 16 (so a model of
    OPT-13B on that GPU uses it as measured)."""
    return OperatorProfile(ops, "a100-40gb", 1, "opt-13b", None, 16, "synthetic")


def _flat_ops() -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``linear`` and ``other`` rows (every profile needs them), 1 ms / 0.1 ms flat."""
    return {
        "linear": _points([(1, 0, 1e-3), (64, 0, 1e-3), (2048, 0, 1e-3)]),
        "other": _points([(1, 0, 1e-4), (64, 0, 1e-4), (2048, 0, 1e-4)]),
    }


def _random_steps(seed: int, n: int = 120) -> pd.DataFrame:
    """Non-empty steps of random shapes: decode-only, prefill-only and mixed (each step's
    prompts of one length, from position 0)."""
    rng = np.random.default_rng(seed)
    decode = rng.integers(0, 40, n)
    prefill_seqs = np.where(rng.random(n) < 0.3, rng.integers(1, 4, n), 0)
    length = rng.integers(1, 300, n)  # each prompt's, from position 0
    decode[(decode == 0) & (prefill_seqs == 0)] = 1
    return pd.DataFrame({
        "prefill_tokens": prefill_seqs * length, "prefill_seqs": prefill_seqs,
        "prefill_attn_pairs": prefill_seqs * length * (length + 1) // 2,
        "prefill_kv_read_tokens": 0,
        "decode_seqs": decode, "decode_ctx_tokens": decode * rng.integers(16, 1500, n),
    })  # fmt: skip


# --- efficiency.py -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["compute", "memory", "peer_link_efficiency"])
def test_an_efficiency_of_zero_is_refused(name: str) -> None:
    """Each fraction of a peak lies in (0, 1]: 0 would divide a step's bytes or FLOPs by a
    rate of 0 (the roofline's ``_flop_rate``, ``_byte_rate``, the all-reduce's link); 1, the
    datasheet peak itself, is allowed."""
    with pytest.raises(ValueError, match=rf"efficiency {name} must be in \(0, 1\], got 0"):
        Efficiency(**{name: 0.0})
    assert getattr(Efficiency(**{name: 1.0}), name) == 1.0


# --- roofline.py ---------------------------------------------------------------------------


def test_pcie_bandwidth_override_prices_swaps() -> None:
    """``Efficiency.pcie_bandwidth``: host-link bytes/s for swaps (None: the GPU's). Set to
    8 GB/s on an A100-40GB (datasheet 32 GB/s), 5 swapped-out blocks of OPT-13B (16 tokens ×
    K and V × 40 layers × 5120 × 2 bytes each) take their bytes / 8e9 s."""
    m = RooflineCostModel("opt-13b", "a100-40gb", efficiency=Efficiency(pcie_bandwidth=8e9))
    block_bytes = 16 * 2 * OPT13B_LAYERS * OPT13B_HIDDEN * 2
    assert m.block_bytes == block_bytes
    assert get_gpu("a100-40gb").host_link_bandwidth != 8e9
    t = m.transfer_time(BatchShape(swap_out_blocks=5))
    assert t == pytest.approx(5 * block_bytes / 8e9, rel=1e-12)


def test_serial_stack_cpu_time_counts_prefill_sequences() -> None:
    """A serial stack's step is GPU + CPU, the CPU fit ``per_step_s + per_seq_s ×
    sequences`` counting every sequence in the step (prefill and decode); a prefill-only
    step adds no paged-kernel gather. So 4 prompts of 128 tokens cost on ``vllm-2023``
    exactly the plain roofline's time plus the CPU fit at 4 sequences."""
    n, seqs = 128, 4
    prefill = BatchShape(
        prefill_tokens=seqs * n, prefill_seqs=seqs, prefill_attn_pairs=seqs * n * (n + 1) // 2
    )
    stack = STACKS["vllm-2023"]
    assert not stack.overlapped and stack.cpu is not None
    serial = RooflineCostModel("opt-13b", "a100-40gb", stack="vllm-2023")
    plain = RooflineCostModel("opt-13b", "a100-40gb")
    cpu = stack.cpu.per_step_s + stack.cpu.per_seq_s * seqs
    assert serial.step_time(prefill) - plain.step_time(prefill) == pytest.approx(cpu, rel=1e-9)


# --- overhead.py ---------------------------------------------------------------------------


def test_swap_with_one_chunk_per_direction_pays_its_calls_once_per_moving_direction() -> None:
    """``swap_chunk_bytes`` 0: a direction's blocks move in one chunk, so each direction
    that moves blocks pays ``swap_calls_per_direction`` call latencies once, however many
    blocks either direction moves (a stack with no per-block copies: bytes + chunk calls)."""
    s = replace(STACKS["none"], copy_latency_s=1e-5, swap_calls_per_direction=3,
                swap_chunk_bytes=0.0)  # fmt: skip
    assert s.copies_per_block_per_layer == 0
    b, layers, link = 1e6, 40, 1e9
    assert swap_seconds(s, 0, 5, b, layers, link) == pytest.approx(5 * b / link + 3e-5)
    assert swap_seconds(s, 4, 6, b, layers, link) == pytest.approx(10 * b / link + 6e-5)


# --- profiled.py ---------------------------------------------------------------------------


def test_interp_points_never_extrapolates_below_zero() -> None:
    """``interp_points``: linear extrapolation below the first point, results >= 0. The line
    through (10, 1) and (20, 5) is at -2.6 at x = 1: clamped to 0."""
    out = interp_points(np.array([1.0]), np.array([10.0, 20.0]), np.array([1.0, 5.0]))
    assert out.tolist() == [0.0]


def test_decode_below_the_smallest_profiled_count_is_proportional_to_it() -> None:
    """Decode attention below the smallest profiled sequence count is that count's time in
    proportion to the sequences (``_decode_table_s``: "in proportion to it beyond them"). With
    counts {2, 4}, one sequence of context 256 costs half of two sequences of 256 each: the
    profiled 2-sequence point × 40 layers × 1 / 2."""
    ops = _flat_ops()
    ops["attn_decode"] = _points([
        (2, 2 * 16, 1e-5), (2, 2 * 256, 3e-5), (2, 2 * 1024, 9e-5),
        (4, 4 * 16, 2e-5), (4, 4 * 256, 5e-5), (4, 4 * 1024, 1.6e-4),
    ])  # fmt: skip
    m = ProfiledCostModel(_opt13b_profile(ops), "opt-13b", "a100-40gb")
    assert m.same and m.stack.name == "none"
    one = m.decode_attention_seconds(BatchShape(decode_seqs=1, decode_ctx_tokens=256))
    two = m.decode_attention_seconds(BatchShape(decode_seqs=2, decode_ctx_tokens=2 * 256))
    assert two == pytest.approx(OPT13B_LAYERS * 3e-5, rel=1e-12)
    assert one == pytest.approx(OPT13B_LAYERS * 3e-5 / 2, rel=1e-12)
    assert one == pytest.approx(0.5 * two, rel=1e-12)


def test_prefill_attention_moved_to_another_gpu_scales_by_the_peak_ratio() -> None:
    """Transferred ``attn_prefill`` is rescaled by FLOPs per pair and peak: the shipped H200
    profile of OPT-13B on an A100-40GB (same model and tp, so the same FLOPs per pair) takes
    989 / 312 dense TFLOP/s (the datasheets' peaks) times as long for one 1024-token prompt
    (a point where the measured curve is already non-decreasing)."""
    assert get_gpu("h200").peak_flops == 989e12
    assert get_gpu("a100-40gb").peak_flops == 312e12
    measured = ProfiledCostModel(str(H200_PROFILE), "opt-13b", "h200")
    moved = ProfiledCostModel(str(H200_PROFILE), "opt-13b", "a100-40gb")
    assert measured.same and not moved.same
    n = 1024
    q = BatchShape(prefill_tokens=n, prefill_seqs=1, prefill_attn_pairs=n * (n + 1) // 2)
    ratio = moved._attention_s(q) / measured._attention_s(q)
    assert ratio == pytest.approx(989 / 312, rel=1e-9)


def test_prefill_attention_moved_to_another_tp_scales_by_the_heads_on_one_gpu(
    tmp_path: Path,
) -> None:
    """Transferred ``attn_prefill`` is rescaled by the heads each GPU computes, the target's
    over the profile's at the profile's own tp: a profile of OPT-13B (40 heads) taken at tp 2
    (20 heads a GPU) prices one prompt at tp 4 (10 heads a GPU, same GPU, so the same peak)
    at half the time it measured, not at a quarter (the profile's heads taken whole)."""
    prof = write_profile(tmp_path / "p", synthetic_rows(), tp=2)
    measured = ProfiledCostModel(prof, "opt-13b", "a100-40gb", tp=2)
    moved = ProfiledCostModel(prof, "opt-13b", "a100-40gb", tp=4)
    assert measured.same and not moved.same
    n = 512  # a measured point of the (increasing) synthetic curve
    q = BatchShape(prefill_tokens=n, prefill_seqs=1, prefill_attn_pairs=n * (n + 1) // 2)
    assert moved._attention_s(q) / measured._attention_s(q) == pytest.approx(0.5, rel=1e-9)


def test_roofline_attention_efficiencies_come_from_the_linear_ends() -> None:
    """A profile without attention rows prices attention by the roofline at the profile's
    achieved fractions: memory = the linear operator's at its smallest token count (a weight
    stream), compute = at its largest. Linear times set to reach 0.5 of the layer's roofline
    (datasheet peaks) at 1 token and 0.8 at 2,048 give exactly those efficiencies."""
    gpu = get_gpu("a100-40gb")
    fractions = {1: 0.5, 64: 0.65, 2048: 0.8}
    probe = _opt13b_profile(_flat_ops())
    params, act = profiled_layer(probe).work_per_gpu(1)

    def roof(n: int) -> float:
        return max(2 * params * n / gpu.peak_flops, (params + n * act) * 2 / gpu.mem_bandwidth)

    ops = _flat_ops()
    ops["linear"] = _points([(n, 0, roof(n) / f) for n, f in fractions.items()])
    m = ProfiledCostModel(_opt13b_profile(ops), "opt-13b", "a100-40gb")
    eff = m.roofline.efficiency
    assert eff.memory == pytest.approx(0.5, rel=1e-9)
    assert eff.compute == pytest.approx(0.8, rel=1e-9)
    ref = RooflineCostModel("opt-13b", "a100-40gb", efficiency=Efficiency(compute=0.8, memory=0.5))
    for shape in (
        BatchShape(decode_seqs=8, decode_ctx_tokens=8 * 300),
        BatchShape(prefill_tokens=1024, prefill_seqs=1, prefill_attn_pairs=1024 * 1025 // 2),
    ):
        assert m._attention_s(shape) == pytest.approx(ref.gpu_parts(shape)[1], rel=1e-9)


# --- calibrated.py -------------------------------------------------------------------------


def test_steps_with_no_tokens_are_dropped_from_the_fit() -> None:
    """``fit``: rows with no tokens (swap-only steps) are dropped. Steps timed exactly by
    known coefficients, plus 5 empty rows of 50 ms: the fit counts only the non-empty steps
    and recovers the known coefficients as if the empty rows were absent."""
    known = dict(zip(TERMS, (2e-3, 1.3, 1.1, 1.2, 5e-5, 3e-4), strict=True))
    steps = _random_steps(7)
    steps["duration_s"] = CalibratedCostModel("opt-125m", "h200", known).predict_steps(steps)
    empty = pd.DataFrame(0, index=range(5), columns=steps.columns)
    empty["duration_s"] = 0.05
    with_empty = pd.concat([steps, empty], ignore_index=True)
    clean = CalibratedCostModel.fit(steps, "opt-125m", "h200")
    fit = CalibratedCostModel.fit(with_empty, "opt-125m", "h200")
    assert fit.fit_stats["n_steps"] == len(steps)
    for t in TERMS:
        assert fit.coefficients[t] == pytest.approx(known[t], rel=1e-6, abs=1e-12)
        assert fit.coefficients[t] == pytest.approx(clean.coefficients[t], rel=1e-9, abs=1e-15)


def test_roofline_terms_are_zero_when_fitted_on_top_of_a_profile(tmp_path: Path) -> None:
    """On top of a profile only c0, c4 and c5 are fitted; c1-c3 (``ROOFLINE_TERMS``) are 0
    (module doc), even when the steps run 1.3 × the profile's operator seconds + 1 ms, a
    30% the roofline terms could otherwise absorb."""
    prof = write_profile(tmp_path / "p", synthetic_rows(), gpu="cpu", model="opt-125m")
    ops = ProfiledCostModel(prof, "opt-125m", "h200", as_measured=True)
    steps = _random_steps(3)
    shapes = [BatchShape(*(int(x) for x in row)) for row in steps.itertuples(index=False)]
    steps["duration_s"] = 1.3 * np.array([ops.gpu_seconds(s) for s in shapes]) + 1e-3
    fit = CalibratedCostModel.fit(steps, "opt-125m", "h200", profile=str(prof))
    assert [fit.coefficients[t] for t in ROOFLINE_TERMS] == [0.0, 0.0, 0.0]


def test_host_seconds_subtracts_forward_and_transfer() -> None:
    """``host_seconds`` = ``duration_s - forward_s - transfer_s``: 1.0 - 0.6 - 0.1 = 0.3."""
    row = pd.DataFrame({"duration_s": [1.0], "forward_s": [0.6], "transfer_s": [0.1]})
    assert host_seconds(row) == pytest.approx([0.3], rel=1e-12)
