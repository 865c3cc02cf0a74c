"""Roofline, recorded and calibrated cost models."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from core.plan import BatchShape
from sim.catalog import get_gpu, get_model
from sim.cost import (
    CalibratedCostModel,
    CostModel,
    Efficiency,
    RecordedCostModel,
    RooflineCostModel,
    build_cost_model,
)
from sim.cost.calibrated import TERMS, nnls


def decode(seqs: int, ctx_each: int) -> BatchShape:
    return BatchShape(decode_seqs=seqs, decode_ctx_tokens=seqs * ctx_each)


def prefill(tokens: int, seqs: int = 1) -> BatchShape:
    per = tokens // seqs
    return BatchShape(
        prefill_tokens=per * seqs, prefill_seqs=seqs, prefill_attn_pairs=seqs * per * (per + 1) // 2
    )


@pytest.fixture
def opt13b() -> RooflineCostModel:
    return RooflineCostModel("opt-13b", "a100-40gb")


def test_empty_step_costs_nothing(opt13b: RooflineCostModel) -> None:
    assert opt13b.step_time(BatchShape()) == 0.0
    eff = Efficiency().with_values({"per_step_overhead_s": "test"}, per_step_overhead_s=0.01)
    assert RooflineCostModel("opt-13b", "a100-40gb", efficiency=eff).step_time(BatchShape()) == 0


def test_monotone_in_tokens_and_context(opt13b: RooflineCostModel) -> None:
    for n in (1, 8, 64, 256):
        times = [opt13b.step_time(decode(n, c)) for c in (16, 256, 1024, 2048)]
        assert times == sorted(times) and times[0] < times[-1]
    by_batch = [opt13b.step_time(decode(n, 512)) for n in (1, 4, 32, 128, 256)]
    assert by_batch == sorted(by_batch) and by_batch[0] < by_batch[-1]
    by_prefill = [opt13b.step_time(prefill(t)) for t in (16, 128, 512, 2048)]
    assert by_prefill == sorted(by_prefill) and by_prefill[0] < by_prefill[-1]
    cached = dataclasses.replace(prefill(256), prefill_kv_read_tokens=1024)
    assert opt13b.step_time(cached) > opt13b.step_time(prefill(256))


def test_decode_batch_one_is_weight_bandwidth_bound(opt13b: RooflineCostModel) -> None:
    m, g = get_model("opt-13b"), get_gpu("a100-40gb")
    weights_time = m.num_params() * 2 / (g.mem_bandwidth * 0.88)
    t = opt13b.step_time(decode(1, 512))
    assert 0.015 < t < 0.020  # order 17 ms
    assert t == pytest.approx(weights_time, rel=0.03)
    # Memory-bound: doubling bandwidth halves it, doubling FLOPs changes nothing.
    fast_mem = RooflineCostModel("opt-13b", dataclasses.replace(g, mem_bandwidth=2 * 1555e9))
    fast_flops = RooflineCostModel("opt-13b", dataclasses.replace(g, peak_flops=2 * 312e12))
    assert fast_mem.step_time(decode(1, 512)) == pytest.approx(t / 2, rel=1e-9)
    assert fast_flops.step_time(decode(1, 512)) == pytest.approx(t, rel=1e-9)


def test_large_prefill_is_compute_bound(opt13b: RooflineCostModel) -> None:
    g = get_gpu("a100-40gb")
    shape = prefill(2048)
    t = opt13b.step_time(shape)
    w = opt13b.work(shape)
    flop_time = (w["linear_flops"] + w["attn_flops"]) / (g.peak_flops * 0.72)
    assert t == pytest.approx(flop_time, rel=1e-9)
    fast_flops = RooflineCostModel("opt-13b", dataclasses.replace(g, peak_flops=2 * 312e12))
    assert fast_flops.step_time(shape) == pytest.approx(t / 2, rel=1e-9)


def test_linear_flops_count_matmul_params_per_token(opt13b: RooflineCostModel) -> None:
    m = get_model("opt-13b")
    w = opt13b.work(
        BatchShape(
            prefill_tokens=10,
            prefill_seqs=2,
            decode_seqs=3,
            decode_ctx_tokens=300,
            prefill_attn_pairs=40,
        )
    )
    matmul = m.num_layers * m.layer_matmul_params()
    assert w["linear_flops"] == 2 * matmul * 13 + 2 * m.lm_head_params() * 5
    assert w["attn_flops"] == 4 * m.head_dim * m.num_heads * m.num_layers * (40 + 300)


def test_tensor_parallel_halves_weight_time_and_adds_allreduce() -> None:
    one = RooflineCostModel("opt-13b", "a100-40gb", tp=1)
    two = RooflineCostModel("opt-13b", "a100-40gb", tp=2)
    shape = decode(1, 512)
    assert two.weight_bytes == one.weight_bytes / 2
    t1, t2 = one.step_time(shape), two.step_time(shape)
    assert t1 / 2 < t2 < t1
    m, g = get_model("opt-13b"), get_gpu("a100-40gb")
    no_link_cost = dataclasses.replace(g, peer_link_bandwidth=1e30)
    t2_compute = RooflineCostModel("opt-13b", no_link_cost, tp=2).step_time(shape)
    assert t2_compute == pytest.approx(t1 / 2, rel=1e-3)  # weights dominate, split in two
    # Ring all-reduce, 2 per layer: 2 (tp-1)/tp × (1 token × hidden × 2 B) / NVLink.
    allreduce = 2 * m.num_layers * (2 * 1 / 2) * m.hidden_size * 2 / g.peer_link_bandwidth
    assert t2 - t2_compute == pytest.approx(allreduce, rel=1e-6)
    slow = Efficiency().with_values({"allreduce_latency_s": "test"}, allreduce_latency_s=1e-5)
    t2_lat = RooflineCostModel("opt-13b", "a100-40gb", tp=2, efficiency=slow).step_time(shape)
    assert t2_lat == pytest.approx(t2 + 2 * m.num_layers * 1e-5, rel=1e-9)


def test_swaps_and_copies_cost_block_transfers(opt13b: RooflineCostModel) -> None:
    g = get_gpu("a100-40gb")
    block_bytes = 16 * 800 * 1024
    base = decode(8, 256)
    swapped = dataclasses.replace(base, swap_in_blocks=3, swap_out_blocks=2)
    extra = opt13b.step_time(swapped) - opt13b.step_time(base)
    assert extra == pytest.approx(5 * block_bytes / g.host_link_bandwidth, rel=1e-9)
    copied = dataclasses.replace(base, copy_blocks=4)
    extra = opt13b.step_time(copied) - opt13b.step_time(base)
    assert extra == pytest.approx(4 * 2 * block_bytes / (g.mem_bandwidth * 0.88), rel=1e-9)
    assert opt13b.step_time(BatchShape(swap_out_blocks=1)) > 0


def test_per_step_overhead_is_added_once(opt13b: RooflineCostModel) -> None:
    eff = Efficiency().with_values({"per_step_overhead_s": "test"}, per_step_overhead_s=0.004)
    slow = RooflineCostModel("opt-13b", "a100-40gb", efficiency=eff)
    for shape in (decode(1, 10), prefill(512), BatchShape(swap_in_blocks=2)):
        assert slow.step_time(shape) == pytest.approx(opt13b.step_time(shape) + 0.004)


def test_efficiency_defaults_come_from_the_files_their_source_names() -> None:
    """compute: OPT-13B's layer matmuls at 4,096 tokens (operator_profile.csv line 14) over
    the H200's dense 989 TFLOP/s, median of the five calls; memory: the same calls' copy
    bandwidth (kernels/results.json copy_gbps) over 4.8 TB/s (sim.cost.efficiency)."""
    import json
    from pathlib import Path

    from sim.cost.work import model_layer_work

    runs = Path(__file__).resolve().parents[1] / "docs/validation/h200"
    names = ("first", "second", "third", "fourth", "fifth")
    params, _ = model_layer_work(get_model("opt-13b"), 1)
    h200 = get_gpu("h200")
    compute, memory = [], []
    for name in names:
        lines = (runs / f"{name}-run/profile/operator_profile.csv").read_text().splitlines()
        op, tokens, _, ms = lines[13].split(",")[:4]
        assert (op, tokens) == ("linear", "4096")
        compute.append(2 * params * 4096 / (float(ms) / 1e3) / h200.peak_flops)
        doc = json.loads((runs / f"{name}-run/kernels/results.json").read_text())
        memory.append(doc["meta"]["copy_gbps"] * 1e9 / h200.mem_bandwidth)
    assert round(float(np.median(compute)), 2) == Efficiency().compute
    assert all(round(m, 2) == Efficiency().memory for m in memory)


def test_efficiency_defaults_validation_and_description() -> None:
    eff = Efficiency()
    assert eff.compute == pytest.approx(0.72) and eff.memory == pytest.approx(0.88)
    assert eff.per_step_overhead_s == 0.0
    text = eff.describe()
    for name in ("compute", "memory", "per_step_overhead_s", "allreduce_latency_s"):
        assert name in text
    assert "H200" in text and "lower bound" in text
    with pytest.raises(ValueError, match="compute must be in"):
        Efficiency(compute=1.5)
    with pytest.raises(ValueError, match="source lacks an entry for memory"):
        Efficiency(source={"compute": "x"})
    with pytest.raises(ValueError, match="give a source"):
        eff.with_values({}, compute=0.5)
    with pytest.raises(ValueError, match="unknown efficiency fields"):
        eff.with_values({"speed": "x"}, speed=2.0)


def test_roofline_rejects_bad_parallelism() -> None:
    with pytest.raises(ValueError, match="cannot be split over tp=3"):
        RooflineCostModel("opt-13b", "a100-40gb", tp=3)


def test_recorded_replays_in_order_then_fails_clearly() -> None:
    rec = RecordedCostModel([0.1, 0.2, 0.3])
    assert isinstance(rec, CostModel)
    got = [rec.step_time(decode(1, 1)) for _ in range(3)]
    assert got == [0.1, 0.2, 0.3]
    assert rec.steps_left == 0 and rec.steps_used == 3
    with pytest.raises(IndexError, match="ran out of step times after 3 steps"):
        rec.step_time(decode(1, 1))
    with pytest.raises(ValueError, match=r"step time 1 is -1\.0"):
        RecordedCostModel([0.1, -1.0])


def _synthetic_steps(rng: np.random.Generator, n: int) -> pd.DataFrame:
    rows = []
    for _ in range(n):
        if rng.random() < 0.4:
            lengths = rng.integers(8, 700, size=rng.integers(1, 6))
            starts = rng.integers(0, 300, size=len(lengths)) * (rng.random() < 0.3)
            rows.append(
                {
                    "prefill_tokens": int(lengths.sum()),
                    "prefill_seqs": len(lengths),
                    "prefill_attn_pairs": int(
                        (lengths * starts + lengths * (lengths + 1) // 2).sum()
                    ),
                    "prefill_kv_read_tokens": int(starts.sum()),
                    "decode_seqs": 0,
                    "decode_ctx_tokens": 0,
                }
            )
        else:
            seqs = int(rng.integers(1, 200))
            rows.append(
                {
                    "prefill_tokens": 0,
                    "prefill_seqs": 0,
                    "prefill_attn_pairs": 0,
                    "prefill_kv_read_tokens": 0,
                    "decode_seqs": seqs,
                    "decode_ctx_tokens": int(rng.integers(seqs, seqs * 1500)),
                }
            )
    return pd.DataFrame(rows)


def _durations(model: CalibratedCostModel, df: pd.DataFrame, coef: dict[str, float]) -> np.ndarray:
    return model.basis_matrix(df) @ np.array([coef.get(t, 0.0) for t in TERMS])


def test_calibrated_fit_recovers_known_coefficients() -> None:
    rng = np.random.default_rng(7)
    df = _synthetic_steps(rng, 300)
    true = {"constant": 0.003, "linear_flop_time": 1.4, "attn_flop_time": 2.5, "byte_time": 1.2}
    probe = CalibratedCostModel("opt-13b", "a100-40gb", dict.fromkeys(TERMS, 0.0))
    df["duration_s"] = _durations(probe, df, true)
    fitted = CalibratedCostModel.fit(df, "opt-13b", "a100-40gb")
    for term in TERMS:
        assert fitted.coefficients[term] == pytest.approx(true.get(term, 0.0), rel=1e-4, abs=1e-12)
    assert fitted.fit_stats["r2"] == pytest.approx(1.0, abs=1e-9)
    assert fitted.fit_stats["mape"] < 1e-6
    shape = decode(16, 300)
    expected = _durations(
        probe,
        pd.DataFrame(
            [
                {
                    "prefill_tokens": 0,
                    "prefill_seqs": 0,
                    "prefill_attn_pairs": 0,
                    "prefill_kv_read_tokens": 0,
                    "decode_seqs": 16,
                    "decode_ctx_tokens": 4800,
                }
            ]
        ),
        true,
    )[0]
    assert fitted.step_time(shape) == pytest.approx(expected, rel=1e-4)
    assert fitted.step_time(BatchShape()) == 0.0
    assert "R²=1.0000" in fitted.describe()


def test_calibrated_fit_recovers_a_per_sequence_cost() -> None:
    """Steps priced with host work per sequence (and extra per prefill sequence), as the
    CPU engine pays, are recovered; a fit without those terms could not explain them."""
    rng = np.random.default_rng(5)
    df = _synthetic_steps(rng, 300)
    true = {
        "constant": 0.002,
        "linear_flop_time": 1.5,
        "attn_flop_time": 2.0,
        "byte_time": 1.3,
        "per_sequence": 4e-4,
        "per_prefill_sequence": 1.5e-3,
    }
    probe = CalibratedCostModel("opt-13b", "a100-40gb", dict.fromkeys(TERMS, 0.0))
    df["duration_s"] = _durations(probe, df, true)
    fitted = CalibratedCostModel.fit(df, "opt-13b", "a100-40gb")
    for term in TERMS:
        assert fitted.coefficients[term] == pytest.approx(true[term], rel=1e-4), term
    assert fitted.fit_stats["mape"] < 1e-6
    # 64 decode sequences pay 64 × 0.4 ms on top of the four roofline terms
    without = CalibratedCostModel(
        "opt-13b", "a100-40gb", {t: v for t, v in true.items() if t in TERMS[:4]}
    )
    assert fitted.step_time(decode(64, 300)) - without.step_time(decode(64, 300)) == (
        pytest.approx(64 * 4e-4, rel=1e-3)
    )
    assert "per_sequence" in fitted.describe() and "0.4000 ms" in fitted.describe()


def test_calibrated_model_loads_coefficients_written_before_the_sequence_terms() -> None:
    old = {
        "kind": "calibrated",
        "model": "tiny-llama",
        "gpu": "h200",
        "coefficients": {
            "constant": 0.001, "linear_flop_time": 1.2, "attn_flop_time": 1.0, "byte_time": 1.1,
        },
    }  # fmt: skip
    model = CalibratedCostModel.from_dict(old)
    assert model.coefficients["per_sequence"] == 0.0
    assert model.coefficients["per_prefill_sequence"] == 0.0
    assert model.step_time(decode(4, 40)) > 0.0
    assert set(model.to_dict()["coefficients"]) == set(TERMS)
    with pytest.raises(ValueError, match="unknown terms"):
        CalibratedCostModel("tiny-llama", "h200", old["coefficients"] | {"per_token": 1.0})


def test_calibrated_fit_keeps_coefficients_non_negative_under_noise() -> None:
    rng = np.random.default_rng(3)
    df = _synthetic_steps(rng, 200)
    true = {"constant": 0.0, "linear_flop_time": 1.3, "attn_flop_time": 0.0, "byte_time": 1.1}
    probe = CalibratedCostModel("opt-13b", "a100-40gb", dict.fromkeys(TERMS, 0.0))
    clean = _durations(probe, df, true)
    df["duration_s"] = clean * (1 + 0.05 * rng.standard_normal(len(df)))
    fitted = CalibratedCostModel.fit(df, "opt-13b", "a100-40gb")
    assert all(v >= 0.0 for v in fitted.coefficients.values())
    assert fitted.coefficients["linear_flop_time"] == pytest.approx(1.3, rel=0.1)
    assert fitted.coefficients["byte_time"] == pytest.approx(1.1, rel=0.1)
    assert 0.9 < fitted.fit_stats["r2"] <= 1.0
    assert 0.0 < fitted.fit_stats["mape"] < 0.1


def test_calibrated_fit_relative_weighting_minimizes_relative_errors() -> None:
    """Noiseless steps are recovered under either weighting; on noisy steps each weighting
    is optimal for its own objective (relative: squared relative error), so the relative fit
    never has the larger relative residuals, and the fit records which it used."""
    rng = np.random.default_rng(11)
    df = _synthetic_steps(rng, 200)
    true = {"constant": 0.002, "linear_flop_time": 1.4, "attn_flop_time": 2.0, "byte_time": 1.2}
    probe = CalibratedCostModel("opt-13b", "a100-40gb", dict.fromkeys(TERMS, 0.0))
    clean = _durations(probe, df, true)
    exact = CalibratedCostModel.fit(df.assign(duration_s=clean), "opt-13b", "a100-40gb",
                                    weighting="relative")  # fmt: skip
    for term in TERMS:
        assert exact.coefficients[term] == pytest.approx(true.get(term, 0.0), rel=1e-4, abs=1e-9)
    noisy = df.assign(duration_s=clean * np.exp(0.2 * rng.standard_normal(len(df))))
    y = noisy["duration_s"].to_numpy()

    def squared_relative(model: CalibratedCostModel) -> float:
        return float(np.sum(((model.predict_steps(noisy) - y) / y) ** 2))

    rel = CalibratedCostModel.fit(noisy, "opt-13b", "a100-40gb", weighting="relative")
    absolute = CalibratedCostModel.fit(noisy, "opt-13b", "a100-40gb")
    assert squared_relative(rel) <= squared_relative(absolute) * (1 + 1e-9)
    assert rel.fit_stats["weighting"] == "relative"
    assert absolute.fit_stats["weighting"] == "absolute"
    assert "relative errors" in rel.describe()
    with pytest.raises(ValueError, match="weighting 'squared' is not one of absolute, relative"):
        CalibratedCostModel.fit(noisy, "opt-13b", "a100-40gb", weighting="squared")
    one_zero = noisy.copy()
    one_zero.loc[one_zero.index[0], "duration_s"] = 0.0
    with pytest.raises(ValueError, match="duration_s > 0"):
        CalibratedCostModel.fit(one_zero, "opt-13b", "a100-40gb", weighting="relative")
    with pytest.raises(ValueError, match="every step's duration_s is 0"):
        CalibratedCostModel.fit(noisy.assign(duration_s=0.0), "opt-13b", "a100-40gb")


def test_calibrated_describe_names_what_it_was_fitted_on() -> None:
    coef = {"constant": 0.001, "linear_flop_time": 1.2, "attn_flop_time": 1.2, "byte_time": 1.1}
    vllm = CalibratedCostModel(
        "tiny-llama", "h200", coef, fit_stats={"n_signals": 40, "mape": 0.05}
    )
    text = vllm.describe()
    assert "vLLM run" in text and "step measurements" not in text
    assert "fit: n_signals=40 MAPE=5.00%" in text and "nan" not in text
    steps = {"n_steps": 100, "r2": 0.9, "mape": 0.05}
    engine = CalibratedCostModel("tiny-llama", "h200", coef, fit_stats=steps).describe()
    assert "engine step measurements" in engine
    assert "fit: n_steps=100 R²=0.9000 MAPE=5.00%" in engine


def test_calibrated_round_trip_and_errors() -> None:
    coef = {"constant": 0.001, "linear_flop_time": 1.2, "attn_flop_time": 1.0, "byte_time": 1.1}
    model = CalibratedCostModel("tiny-llama", "h200", coef, fit_stats={"r2": 0.9})
    again = CalibratedCostModel.from_dict(model.to_dict())
    assert again.coefficients == model.coefficients
    assert again.step_time(decode(4, 40)) == model.step_time(decode(4, 40))
    with pytest.raises(ValueError, match="lacks columns"):
        CalibratedCostModel.fit(pd.DataFrame({"duration_s": [1.0]}), "opt-13b", "a100-40gb")
    too_few = _synthetic_steps(np.random.default_rng(0), 3).assign(duration_s=0.01)
    with pytest.raises(ValueError, match="need at least 6 non-empty steps"):
        CalibratedCostModel.fit(too_few, "opt-13b", "a100-40gb")
    with pytest.raises(ValueError, match="coefficients lack"):
        CalibratedCostModel("opt-13b", "a100-40gb", {"constant": 1.0})


def test_nnls_satisfies_optimality_conditions() -> None:
    rng = np.random.default_rng(11)
    for _ in range(50):
        a = rng.standard_normal((25, 5))
        b = rng.standard_normal(25)
        x = nnls(a, b)
        grad = a.T @ (b - a @ x)
        assert (x >= 0).all()
        assert (grad <= 1e-9).all()
        assert np.allclose(grad[x > 0], 0.0, atol=1e-9)
    a = rng.standard_normal((20, 3))
    x_true = np.array([0.5, 2.0, 1.0])
    assert np.allclose(nnls(a, a @ x_true), x_true)


def test_build_cost_model_by_kind() -> None:
    eff = {"compute": 0.5, "source": {"compute": "test value"}}
    roof = build_cost_model("roofline", "opt-13b", "a100-40gb", efficiency=eff)
    assert isinstance(roof, RooflineCostModel) and roof.efficiency.compute == 0.5
    assert "test value" in roof.describe()
    with pytest.raises(ValueError, match="give a source"):
        build_cost_model("roofline", "opt-13b", "a100-40gb", efficiency={"compute": 0.5})
    rec = build_cost_model("recorded", "opt-13b", "a100-40gb", step_times=[0.5])
    assert rec.step_time(decode(1, 1)) == 0.5
    coef = dict.fromkeys(TERMS, 1.0)
    cal = build_cost_model("calibrated", "opt-13b", "a100-40gb", coefficients=coef)
    assert isinstance(cal, CalibratedCostModel)
    for m in (roof, rec, cal):
        assert isinstance(m, CostModel) and m.describe()
    with pytest.raises(ValueError, match=r"unknown cost model kind 'magic'.*roofline"):
        build_cost_model("magic", "opt-13b", "a100-40gb")
    with pytest.raises(ValueError, match="needs step_times="):
        build_cost_model("recorded", "opt-13b", "a100-40gb")


@pytest.mark.parametrize("value", [-1e-3, float("nan"), float("inf")])
def test_calibrated_cost_model_refuses_negative_or_non_finite_coefficients(value: float) -> None:
    coefficients = {t: 1.0 for t in TERMS} | {"constant": value}
    with pytest.raises(ValueError, match="finite and >= 0"):
        CalibratedCostModel("opt-13b", "a100-40gb", coefficients)


def test_describe_prints_the_datasheet_numbers_and_the_tp_link_it_prices_with() -> None:
    one = RooflineCostModel("opt-13b", "a100-40gb").describe()
    assert "HBM 1555 GB/s" in one and "peak 312 TFLOP/s" in one and "host link 32 GB/s" in one
    assert "SXM4 40GB): 1,555 GB/s" in one  # the hardware YAML's source beside the number
    assert "all-reduce" not in one
    eight = RooflineCostModel("opt-175b", "a100-80gb", tp=8).describe()
    assert "HBM 2039 GB/s" in eight
    assert "tp 8: a ring all-reduce" in eight and "nvlink at 300 GB/s per direction" in eight
    assert (
        "tp >= 2; fit on CodeLlama-34b"
        in RooflineCostModel("opt-66b", "a100-40gb", tp=4, stack="vllm-2023").describe()
    )


def test_calibrated_relative_fit_is_the_weighted_least_squares_solution() -> None:
    """``weighting="relative"`` minimises the squared relative errors, sum(((A c - y) / y)**2):
    on noisy steps of mixed sizes whose two least-squares solutions (weighted by 1 / y, and
    unweighted) are both positive, so non-negativity binds neither, each fit is its own
    numpy ``lstsq`` solution, and the two differ (big steps dominate the absolute fit)."""
    rng = np.random.default_rng(3)
    df = _synthetic_steps(rng, 300)
    true = {"constant": 0.002, "linear_flop_time": 1.5, "attn_flop_time": 2.0,
            "byte_time": 1.3, "per_sequence": 4e-4, "per_prefill_sequence": 1.5e-3}  # fmt: skip
    probe = CalibratedCostModel("opt-13b", "a100-40gb", dict.fromkeys(TERMS, 0.0))
    y = _durations(probe, df, true) * np.exp(0.1 * rng.standard_normal(len(df)))
    df["duration_s"] = y
    a = probe.basis_matrix(df)
    weighted = np.linalg.lstsq(a / y[:, None], np.ones(len(y)), rcond=None)[0]
    plain = np.linalg.lstsq(a, y, rcond=None)[0]
    assert (weighted > 0).all() and (plain > 0).all()  # interior: NNLS finds these
    assert np.max(np.abs(weighted / plain - 1)) > 0.5  # the data tell the weightings apart
    rel = CalibratedCostModel.fit(df, "opt-13b", "a100-40gb", weighting="relative")
    absolute = CalibratedCostModel.fit(df, "opt-13b", "a100-40gb")
    for i, term in enumerate(TERMS):
        assert rel.coefficients[term] == pytest.approx(weighted[i], rel=1e-8), term
        assert absolute.coefficients[term] == pytest.approx(plain[i], rel=1e-8), term


def test_calibrated_step_time_adds_swaps_and_copies_priced_by_the_roofline() -> None:
    """Swaps and copies are not fitted: the calibrated model adds the roofline's transfer
    time (no stack, so no per-copy latency). OPT-13B's block of 16 tokens holds K and V of
    40 layers x 40 heads x 128 x 2 B each: 13,107,200 B. Five swapped-in blocks cross the
    A100's 32 GB/s host link; three copied blocks are read and written at its 1.555 TB/s at
    the default memory efficiency."""
    coef = {"constant": 1e-3, "linear_flop_time": 1.2, "attn_flop_time": 1.5, "byte_time": 1.1}
    model = CalibratedCostModel("opt-13b", "a100-40gb", coef)
    block_bytes = 16 * 2 * 40 * 40 * 128 * 2
    assert block_bytes == 13_107_200
    base = decode(8, 256)
    swapped = dataclasses.replace(base, swap_in_blocks=5)
    swap_s = 5 * block_bytes / 32e9
    assert model.step_time(swapped) - model.step_time(base) == pytest.approx(swap_s, rel=1e-9)
    assert model.step_time(BatchShape(swap_in_blocks=5)) == pytest.approx(swap_s, rel=1e-9)
    copied = dataclasses.replace(base, copy_blocks=3)
    copy_s = 3 * 2 * block_bytes / (1.555e12 * Efficiency().memory)
    assert model.step_time(copied) - model.step_time(base) == pytest.approx(copy_s, rel=1e-9)


def test_measured_transfers_are_not_fitted_twice() -> None:
    """The simulator prices swaps and copies by themselves: a step's measured transfer_s
    comes out of what the terms are fitted to, so the same steps with transfers added give
    the same coefficients."""
    rng = np.random.default_rng(5)
    df = _synthetic_steps(rng, 120)
    true = {"constant": 0.002, "linear_flop_time": 1.4, "attn_flop_time": 2.0, "byte_time": 1.2}
    probe = CalibratedCostModel("opt-13b", "a100-40gb", dict.fromkeys(TERMS, 0.0))
    clean = _durations(probe, df, true)
    without = CalibratedCostModel.fit(df.assign(duration_s=clean), "opt-13b", "a100-40gb")
    transfers = rng.uniform(0.0, 0.01, len(df)) * (rng.random(len(df)) < 0.3)
    steps = df.assign(duration_s=clean + transfers, transfer_s=transfers)
    fitted = CalibratedCostModel.fit(steps, "opt-13b", "a100-40gb")
    for term in TERMS:
        assert fitted.coefficients[term] == pytest.approx(without.coefficients[term], abs=1e-9)
