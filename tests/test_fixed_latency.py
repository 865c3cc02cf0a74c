"""The matmuls' fixed part (:mod:`sim.cost.fixed_latency`): fitted across shard sizes, read
from a profile's sidecar or a Vidur table, and kept whole when a profile is transferred to
a smaller or larger shard (:mod:`sim.cost.profiled`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from experiments.bench.profile_transfer import VIDUR, run, shard_matrix
from sim.catalog import get_gpu
from sim.cost.fixed_latency import fit_fixed_latency, mean_small_batch_time
from sim.cost.profile import ProfileError, read_kvlab_profile, read_vidur_tables
from sim.cost.profiled import ProfiledCostModel, profiled_layer
from tests.test_cost_profiled import write_profile
from tests.test_profile_table_errors import vidur_rows, write_vidur

needs_shared = pytest.mark.skipif(not VIDUR.is_dir(), reason="../shared/measurements absent")
SHIPPED = Path(__file__).resolve().parents[1] / "sim/cost/profiles/vidur-a100-llama-2-7b"
ONE_TOKEN = np.array([1.0])


def test_the_fit_recovers_a_line_through_the_shards() -> None:
    shards = [(w, 2e-5 + 1.25e-12 * w) for w in (25e6, 50e6, 100e6, 200e6)]
    fit = fit_fixed_latency(shards)
    assert fit.seconds == pytest.approx(2e-5, rel=1e-9)
    assert fit.seconds_per_unit == pytest.approx(1.25e-12, rel=1e-9)
    assert [p[2] for p in fit.points] == pytest.approx([t for _, t in shards], rel=1e-9)


def test_a_negative_intercept_is_clipped_to_zero_and_the_slope_refitted() -> None:
    shards = [(1e8, 1e-4), (2e8, 2.5e-4)]  # the line through them crosses at -5e-5 s
    fit = fit_fixed_latency(shards)
    assert fit.seconds == 0.0
    # least squares through the origin: sum(t w) / sum(w^2)
    assert fit.seconds_per_unit == pytest.approx((1e-12 + 5e-12) / 5.0, rel=1e-9)


def test_the_intercept_stays_below_the_smallest_time() -> None:
    fit = fit_fixed_latency([(1e8, 1e-4), (2e8, 1.0001e-4)])  # nearly flat: intercept ~1e-4
    assert 0 < fit.seconds <= 0.9 * 1e-4


def test_one_shard_size_has_no_fixed_part() -> None:
    assert fit_fixed_latency([(1e8, 1e-4), (1e8, 1.1e-4)]).seconds == 0.0


def test_bad_points_are_refused() -> None:
    for bad in ([(0.0, 1e-4), (1e8, 1e-4)], [(1e8, float("nan")), (2e8, 1e-4)]):
        with pytest.raises(ValueError, match="finite and > 0"):
            fit_fixed_latency(bad)


def test_the_small_batch_time_is_the_mean_up_to_16_tokens() -> None:
    n = np.array([1.0, 2, 16, 17, 64])
    t = np.array([1.0, 2, 3, 100, 100])
    assert mean_small_batch_time(n, t) == 2.0
    assert mean_small_batch_time(np.array([32.0, 64]), np.array([5.0, 9])) == 5.0


def profile_dir(
    d: Path, other_ms: float = 0.01, other_ms_per_token: float = 0.0, **meta: object
) -> Path:
    """LLaMA-7B on an A100 80GB at tp 1: linear 0.2 ms + 1 us a token, other ``other_ms`` +
    ``other_ms_per_token`` a token."""
    tokens = (1, 16, 256, 1024, 4096)
    rows = [("linear", n, 0, 0.2 + 1e-3 * n) for n in tokens]
    rows += [("other", n, 0, other_ms + other_ms_per_token * n) for n in tokens]
    side = {"model": "llama-7b", "gpu": "a100-80gb", "ops": ["linear", "other"], **meta}
    return write_profile(d, rows, **side)


def test_the_sidecar_gives_the_fixed_part_and_its_source(tmp_path: Path) -> None:
    prof = read_kvlab_profile(
        profile_dir(tmp_path / "p", linear_fixed_s=5e-5, linear_fixed_source="a fit")
    )
    assert (prof.linear_fixed_s, prof.linear_fixed_source) == (5e-5, "a fit")
    assert read_kvlab_profile(profile_dir(tmp_path / "q")).linear_fixed_s == 0.0


def test_the_sidecar_gives_the_elementwise_fixed_part(tmp_path: Path) -> None:
    prof = read_kvlab_profile(
        profile_dir(tmp_path / "p", other_fixed_s=4e-6, other_fixed_source="another fit")
    )
    assert (prof.other_fixed_s, prof.other_fixed_source) == (4e-6, "another fit")
    assert prof.linear_fixed_s == 0.0


@pytest.mark.parametrize(
    "op,value,expected",
    [("linear", -1e-6, "a number of seconds >= 0"), ("linear", True, "a number of seconds >= 0"),
     ("linear", "2e-5", "a number of seconds >= 0"),
     ("linear", 3e-4, "less than the smallest linear time"),
     ("other", float("inf"), "a number of seconds >= 0"),
     ("other", 10**400, "a number of seconds >= 0"),
     ("other", 1e-5, "less than the smallest other time")],
)  # fmt: skip
def test_a_bad_fixed_part_names_the_sidecar_key(
    tmp_path: Path, op: str, value: object, expected: str
) -> None:
    key = f"operator_profile.json: key '{op}_fixed_s'"
    with pytest.raises(ProfileError, match=f"{key}.*{expected}"):
        read_kvlab_profile(profile_dir(tmp_path / "p", **{f"{op}_fixed_s": value}))


def linear_at_one_token(profile: object, model: str, gpu: str, tp: int) -> float:
    cost = ProfiledCostModel(profile, model, gpu, tp=tp, stack="none")  # type: ignore[arg-type]
    return float(cost.layer_op_seconds("linear", ONE_TOKEN)[0])


def test_a_smaller_shard_keeps_the_fixed_part_whole_and_scales_the_rest(tmp_path: Path) -> None:
    """At one token the roofline is the weight stream: without a fixed part a shard 8x
    smaller costs about an eighth (``r``, its activations aside); with one, ``F + (t - F) r``."""
    fixed = 5e-5
    bare = profile_dir(tmp_path / "bare")
    with_fixed = profile_dir(tmp_path / "fixed", linear_fixed_s=fixed)
    whole = linear_at_one_token(bare, "llama-7b", "a100-80gb", 1)
    assert whole == pytest.approx(0.201e-3)  # used as measured: the profile's own time
    assert linear_at_one_token(with_fixed, "llama-7b", "a100-80gb", 1) == whole
    r = linear_at_one_token(bare, "llama-7b", "a100-80gb", 8) / whole
    assert r == pytest.approx(1 / 8, rel=0.05)
    eighth = linear_at_one_token(with_fixed, "llama-7b", "a100-80gb", 8)
    assert eighth == pytest.approx(fixed + (whole - fixed) * r, rel=1e-9)
    # a larger shard (OPT-13B's layer, 1.6x) gains less than the plain ratio would give it
    big_bare = linear_at_one_token(bare, "opt-13b", "a100-80gb", 1)
    big = linear_at_one_token(with_fixed, "opt-13b", "a100-80gb", 1)
    assert whole < big < big_bare


def other_at(profile: object, model: str, tp: int, tokens: float) -> float:
    cost = ProfiledCostModel(profile, model, "a100-80gb", tp=tp, stack="none")  # type: ignore[arg-type]
    return float(cost.layer_op_seconds("other", np.array([tokens]))[0])


def test_the_elementwise_rest_scales_with_the_elements_beyond_its_fixed_part(
    tmp_path: Path,
) -> None:
    """On the same GPU, ``other`` at tp 8 is ``F + (t - F) × e_8 / e_1`` at each token count,
    ``e`` the elements a token moves on one GPU, the flat launch-bound part included. With
    no fixed part the curve moves along the token axis alone and its flat part stays."""
    fixed = 4e-6
    bare = profile_dir(tmp_path / "bare")
    with_fixed = profile_dir(tmp_path / "fixed", other_fixed_s=fixed)
    whole = other_at(bare, "llama-7b", 1, 16)
    assert whole == pytest.approx(1e-5)  # the profile's flat 0.01 ms
    layer = profiled_layer(read_kvlab_profile(bare))
    e_ratio = layer.elementwise_per_gpu(8, 2) / layer.elementwise_per_gpu(1, 2)
    assert e_ratio < 0.6
    assert other_at(with_fixed, "llama-7b", 8, 16) == pytest.approx(
        fixed + (whole - fixed) * e_ratio, rel=1e-9
    )
    assert other_at(bare, "llama-7b", 8, 16) == pytest.approx(whole, rel=1e-9)


def test_with_a_fixed_part_the_elementwise_token_axis_moves_by_bandwidth_alone(
    tmp_path: Path,
) -> None:
    """``G + (t(N × bw_p / bw_t) - G) × e_t / e_p``: on the same GPU the token axis stays; on
    the H100 it stretches by the bandwidth ratio, never by the elements ratio."""
    fixed = 2e-6
    prof = profile_dir(tmp_path / "p", 0.005, 1e-5, other_fixed_s=fixed)
    layer = profiled_layer(read_kvlab_profile(prof))
    e_ratio = layer.elementwise_per_gpu(8, 2) / layer.elementwise_per_gpu(1, 2)

    def measured(n: float) -> float:  # the profile's own line, in s
        return (0.005 + 1e-5 * n) * 1e-3

    bw = get_gpu("a100-80gb").mem_bandwidth / get_gpu("h100").mem_bandwidth
    for n in (16.0, 1024.0):
        same_gpu = ProfiledCostModel(prof, "llama-7b", "a100-80gb", tp=8, stack="none")
        got = float(same_gpu.layer_op_seconds("other", np.array([n]))[0])
        assert got == pytest.approx(fixed + (measured(n) - fixed) * e_ratio, rel=1e-9)
        h100 = ProfiledCostModel(prof, "llama-7b", "h100", tp=8, stack="none")
        got = float(h100.layer_op_seconds("other", np.array([n]))[0])
        assert got == pytest.approx(fixed + (measured(n * bw) - fixed) * e_ratio, rel=1e-9)


def test_a_same_shard_small_batch_transfer_to_another_gpu_ignores_the_fixed_part() -> None:
    """A fixed part moves between GPUs as its op's small-batch time does without it: the
    matmuls' by the bandwidth ratio (a weight stream), the elementwise operators' not at
    all."""
    prof = read_kvlab_profile(SHIPPED)
    bare_prof = replace(prof, linear_fixed_s=0.0, other_fixed_s=0.0)
    with_fixed = ProfiledCostModel(prof, "llama-7b", "h100", tp=1, stack="none")
    bare = ProfiledCostModel(bare_prof, "llama-7b", "h100", tp=1, stack="none")
    tokens = np.array([1.0, 16, 256, 4096])
    # linear where it streams weights on both GPUs; other at every count
    assert with_fixed.layer_op_seconds("linear", tokens)[:2] == pytest.approx(
        bare.layer_op_seconds("linear", tokens)[:2], rel=1e-9
    )
    assert with_fixed.layer_op_seconds("other", tokens) == pytest.approx(
        bare.layer_op_seconds("other", tokens), rel=1e-9
    )


@needs_shared
def test_vidurs_tables_give_about_22_and_6_us_on_the_a100_for_both_models() -> None:
    for name in ("mlp_llama-2-7b.csv", "mlp_codellama-34b.csv"):
        tables = read_vidur_tables(VIDUR / "a100" / name)
        assert [t.tp for t in tables] == [1, 2, 4, 8]
        assert len({(t.linear_fixed_s, t.other_fixed_s) for t in tables}) == 1
        assert 18e-6 < tables[0].linear_fixed_s < 26e-6
        assert 4e-6 < tables[0].other_fixed_s < 10e-6
        assert name in str(tables[0].linear_fixed_source)
        assert "elementwise elements" in str(tables[0].other_fixed_source)


@needs_shared
def test_held_out_small_shards_come_right_at_small_batches() -> None:
    """From the shipped tp-1 table with the fixed part fitted on CodeLlama-34B, Llama-2-7B's
    tp-4 and tp-8 matmuls at 1-64 tokens (held out) are within 10% (the plain roofline
    ratio: -19% and -38%)."""
    _, errs = run(VIDUR)
    for tp in (4, 8):
        (e,) = [e for e in errs if (e["target"], e["tp"], e["op"], e["tokens"])
                == ("A100 Llama-2-7B", tp, "linear", "1-64")]  # fmt: skip
        assert abs(e["mean_error_pct"]) < 10, e
        (e,) = [e for e in errs if (e["target"], e["tp"], e["op"], e["tokens"])
                == ("A100 Llama-2-7B", tp, "other", "1-64")]  # fmt: skip
        assert abs(e["mean_error_pct"]) < 15, e  # by the token axis alone: +48%, +55%
    _, bare = run(VIDUR, fixed_part=False)
    (e,) = [e for e in bare if (e["target"], e["tp"], e["op"], e["tokens"])
            == ("A100 Llama-2-7B", 8, "linear", "1-64")]  # fmt: skip
    assert e["mean_error_pct"] < -30


@needs_shared
def test_every_a100_shard_prices_every_other_within_10_percent_with_a_held_out_fixed_part() -> None:
    rows = shard_matrix(VIDUR)
    assert len(rows) == 56
    for r in rows:
        assert abs(r["linear_err_pct_1_64"]) < 10, r


def test_a_fitted_fixed_part_stays_below_every_measured_time(tmp_path: Path) -> None:
    """Tables whose small-batch means put the intercept above a single dipping point: the
    fixed part is held to 0.9 of the smallest time, as a sidecar's must be below it."""
    rows = []
    for tp, per_op in (("1", {"1": "0.01", "2": "0.01"}), ("2", {"1": "0.0098", "2": "0.0072"})):
        for row in vidur_rows(list(per_op)):
            row["num_tensor_parallel_workers"] = tp
            for key in row:
                if key.startswith("time_stats."):
                    row[key] = per_op[row["num_tokens"]]
            rows.append(row)
    tables = read_vidur_tables(write_vidur(tmp_path, rows))
    smallest = min(float(t.ops["linear"][2].min()) for t in tables)
    assert smallest == pytest.approx(4 * 0.0072e-3)
    assert tables[0].linear_fixed_s == pytest.approx(0.9 * smallest)
    assert f"{0.9 * smallest * 1e6:.1f} us" in str(tables[0].linear_fixed_source)
