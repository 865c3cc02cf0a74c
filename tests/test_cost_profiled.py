"""cost=profiled: reading kvlab's and Vidur's profile formats, using and transferring them."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.plan import BatchShape
from sim.catalog import get_gpu, get_model
from sim.cost import CalibratedCostModel, ProfiledCostModel, RooflineCostModel, build_cost_model
from sim.cost.calibrated import ROOFLINE_TERMS, WEIGHTINGS
from sim.cost.overhead import FIG18A_GATHER_TOKENS_PER_BLOCK
from sim.cost.profile import FORMAT, ProfileError, attention_backend, read_profile
from sim.cost.profiled import interp_points, isotonic

VIDUR_A100 = Path(__file__).resolve().parents[1].parent / (
    "shared/measurements/vidur/a100/mlp_llama-2-7b.csv"
)
needs_vidur = pytest.mark.skipif(not VIDUR_A100.exists(), reason="../shared not present")


def write_profile(d: Path, rows: list[tuple[str, int, int, float]], **meta: object) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    lines = ["op,num_tokens,context_tokens,time_ms", *(f"{o},{n},{c},{t}" for o, n, c, t in rows)]
    (d / "operator_profile.csv").write_text("\n".join(lines) + "\n")
    side = {"format": FORMAT, "model": "opt-13b", "gpu": "a100-40gb", "dtype": "float16",
            "tp": 1, "block_size": 16, "date": "2026-11-30", "command": "synthetic",
            "torch": "-", "triton": "-", **meta}  # fmt: skip
    (d / "operator_profile.json").write_text(json.dumps(side))
    return d


def synthetic_rows() -> list[tuple[str, int, int, float]]:
    """Times of a made-up GPU: linear 0.5 ms + 1 us/token, other 0.02 ms + 0.01 us/token,
    prefill quadratic, decode 0.01 ms + 0.1 us per context token, lm head 1 ms + 5 us/row."""
    rows: list[tuple[str, int, int, float]] = []
    for n in (1, 8, 64, 512, 2048):
        rows.append(("linear", n, 0, 0.5 + 1e-3 * n))
        rows.append(("other", n, 0, 0.02 + 1e-5 * n))
        rows.append(("attn_prefill", n, n, 1e-6 * n * n + 0.01))
        rows.append(("lm_head", n, 0, 1.0 + 5e-3 * n))
    for s in (1, 8, 64):
        for ctx in (s * 16, s * 256, s * 1024):
            rows.append(("attn_decode", s, ctx, 0.01 + 1e-4 * ctx))
    return rows


def test_profile_used_as_measured_on_its_own_model(tmp_path: Path) -> None:
    m = ProfiledCostModel(write_profile(tmp_path / "p", synthetic_rows()), "opt-13b", "a100-40gb")
    assert m.same
    shape = BatchShape(decode_seqs=8, decode_ctx_tokens=8 * 256)
    layers = 40
    expected_ms = (
        layers * (0.5 + 8e-3 + 0.02 + 8e-5)  # linear + other at 8 tokens
        + (1.0 + 5e-3 * 8)  # lm head, 8 rows
        + layers * (0.01 + 1e-4 * 8 * 256)  # decode attention
    )
    assert m.gpu_seconds(shape) * 1e3 == pytest.approx(expected_ms, rel=1e-9)
    attention_ms = layers * (0.01 + 1e-4 * 8 * 256)
    assert m.decode_attention_seconds(shape) * 1e3 == pytest.approx(attention_ms, rel=1e-9)
    prefill = BatchShape(prefill_tokens=64, prefill_seqs=1, prefill_attn_pairs=64 * 65 // 2)
    assert m.decode_attention_seconds(prefill) == 0.0 < m.gpu_seconds(prefill)
    assert m.step_time(BatchShape()) == 0.0
    assert "used as measured" in m.describe()


def test_profile_measured_on_an_unknown_device_is_one_clear_error(tmp_path: Path) -> None:
    """A profile from `profile_gpu --cpu` (gpu "cpu") cannot be priced: the error names the
    profile and the device."""
    prof = write_profile(tmp_path / "p", synthetic_rows(), gpu="cpu", model="opt-125m")
    with pytest.raises(ValueError, match=r"operator_profile.*measured on 'cpu', which has no"):
        ProfiledCostModel(prof, "opt-125m", "h200")


def test_profiled_step_time_is_monotone_in_tokens_and_context(tmp_path: Path) -> None:
    m = ProfiledCostModel(write_profile(tmp_path / "p", synthetic_rows()), "opt-13b",
                          "a100-40gb", stack="vllm-2023")  # fmt: skip
    for n in (1, 8, 64, 256):
        ts = [m.step_time(BatchShape(decode_seqs=n, decode_ctx_tokens=n * c))
              for c in (16, 256, 1024, 2048)]  # fmt: skip
        assert ts == sorted(ts) and ts[0] < ts[-1]
    by_prefill = [m.step_time(BatchShape(prefill_tokens=t, prefill_seqs=1,
                                         prefill_attn_pairs=t * (t + 1) // 2))
                  for t in (16, 128, 512, 2048, 9000)]  # fmt: skip
    assert by_prefill == sorted(by_prefill) and by_prefill[0] < by_prefill[-1]


def test_block_size_other_than_profiled_adds_or_removes_gather_cost(tmp_path: Path) -> None:
    """The profile's points fill whole blocks: at its own block size a block-granular stack
    adds each sequence's unfilled last block ((16 - 1) / 2 tokens expected) and that tail's
    gather, never the gather the points already hold; with no stack the block size does not
    matter."""
    d = write_profile(tmp_path / "p", synthetic_rows())
    seqs, layers = 8, 40
    shape = BatchShape(decode_seqs=seqs, decode_ctx_tokens=seqs * 512)
    t = {b: ProfiledCostModel(d, "opt-13b", "a100-40gb", block_size=b, stack="vllm-2023")
         .gpu_seconds(shape) for b in (1, 16, 64)}  # fmt: skip
    assert t[1] > t[16] and t[64] != t[16]
    plain = {b: ProfiledCostModel(d, "opt-13b", "a100-40gb", block_size=b).gpu_seconds(shape)
             for b in (1, 16, 64)}  # fmt: skip
    assert plain[1] == plain[16] == plain[64]
    tail = seqs * (16 - 1) / 2
    extra_tokens = tail + FIG18A_GATHER_TOKENS_PER_BLOCK * tail / 16
    assert t[16] - plain[16] == pytest.approx(layers * 1e-4 * extra_tokens * 1e-3, rel=1e-9)


@pytest.mark.parametrize(
    ("meta", "backend", "whole"),
    [
        ({"attention": "torch"}, "torch", True),
        ({"method": "CPU: the calling thread's CPU time, one torch thread, torch attention"},
         "torch", True),
        ({"attention": "triton"}, "triton", False),
        ({"method": "CUDA events, median of 30 after 5 warm-up calls"}, None, False),
    ],
)  # fmt: skip
def test_a_torch_backend_profile_prices_the_unfilled_last_block(
    tmp_path: Path, meta: dict, backend: str | None, whole: bool
) -> None:
    """The torch reference gathers a sequence's whole blocks, so a profile of it (said by the
    sidecar's ``attention`` or, in older profiles, by its ``method``) prices each sequence's
    unfilled last block as read, with no stack; a triton profile, or one that does not say,
    prices the context alone."""
    d = write_profile(tmp_path / "p", synthetic_rows(), **meta)
    assert attention_backend(read_profile(d).meta) == backend
    seqs, layers = 8, 40
    shape = BatchShape(decode_seqs=seqs, decode_ctx_tokens=seqs * 512)
    m = ProfiledCostModel(d, "opt-13b", "a100-40gb")
    plain = ProfiledCostModel(write_profile(tmp_path / "q", synthetic_rows()), "opt-13b",
                              "a100-40gb")  # fmt: skip
    assert m.whole_blocks is whole
    tail_s = layers * 1e-4 * seqs * (16 - 1) / 2 * 1e-3
    assert m.gpu_seconds(shape) - plain.gpu_seconds(shape) == pytest.approx(
        tail_s if whole else 0.0, abs=1e-12
    )
    assert ("decode at whole blocks" in m.describe()) is whole


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([r for r in synthetic_rows() if r[0] != "lm_head"], "missing operators lm_head"),
        ([*synthetic_rows()[:4], ("linear", 1, 0, 0.7), *synthetic_rows()[4:]],
         r"row 6: op linear sizes not increasing"),
        ([("linear", 1, 0, -0.5), *synthetic_rows()[1:]], r"row 2: op linear has time -0.5 ms"),
        ([("linear", 1, 0, 0.0), *synthetic_rows()[1:]], r"row 2: op linear has time 0 ms"),
        ([("matmul", 1, 0, 0.5), *synthetic_rows()], r"row 2: unknown op 'matmul'"),
    ],
)  # fmt: skip
def test_bad_profile_names_file_and_row(tmp_path: Path, rows: list, message: str) -> None:
    d = write_profile(tmp_path / "bad", rows)
    with pytest.raises(ProfileError, match=message) as e:
        read_profile(d)
    assert "operator_profile.csv" in str(e.value)


def test_bad_sidecar_and_missing_file(tmp_path: Path) -> None:
    d = write_profile(tmp_path / "p", synthetic_rows(), format="other/2")
    with pytest.raises(ProfileError, match=r"operator_profile\.json: format 'other/2'"):
        read_profile(d)
    with pytest.raises(ProfileError, match="no such profile"):
        read_profile(tmp_path / "nothing.csv")
    with pytest.raises(ValueError, match="needs profile="):
        build_cost_model("profiled", "opt-13b", "a100-40gb")


@needs_vidur
def test_a_negative_vidur_operator_time_names_its_column(tmp_path: Path) -> None:
    """Vidur rows are checked per operator, not only by their sums."""
    lines = VIDUR_A100.read_text().splitlines()
    header = lines[0].split(",")
    col = header.index("time_stats.attn_pre_proj.median")
    row = lines[1].split(",")
    row[col] = "-1.0"
    (tmp_path / "a100").mkdir()
    bad = tmp_path / "a100" / VIDUR_A100.name
    bad.write_text("\n".join([lines[0], ",".join(row), *lines[2:]]) + "\n")
    with pytest.raises(ProfileError, match=r"row 2: time_stats.attn_pre_proj.median is -1 ms"):
        read_profile(bad, tp=int(row[header.index("num_tensor_parallel_workers")]))


@needs_vidur
def test_vidur_profile_transfers_by_achieved_fraction() -> None:
    prof = read_profile(VIDUR_A100, tp=1)
    assert prof.gpu == "a100-80gb" and set(prof.ops) == {"linear", "other"}
    m = ProfiledCostModel(prof, "opt-13b", "a100-40gb", stack="vllm-2023")
    roof = RooflineCostModel("opt-13b", "a100-40gb")
    # achieved fraction: below 1 everywhere, a weight stream at 1 token
    assert np.all(m._achieved < 1.0) and 0.6 < m._achieved[0] < 0.9
    for n in (1, 16, 128):
        shape = BatchShape(decode_seqs=n, decode_ctx_tokens=n * 300)
        assert m.step_time(shape) > roof.step_time(shape)
    # the profiled layer shape on the profiled GPU uses the table as measured, dips and all
    llama = ProfiledCostModel(prof, "llama-7b", "a100-80gb")
    assert llama.same
    n_lin, _, t_lin = prof.ops["linear"]
    _, _, t_oth = prof.ops["other"]
    i = int(np.searchsorted(n_lin, 64))
    assert llama._layer[64] == pytest.approx(32 * (t_lin[i] + t_oth[i]), rel=1e-9)
    # OPT-13B's curve is the table transferred, then the nearest non-decreasing curve
    ratio = m._layer[64] / (40 * (isotonic(t_lin)[i] + isotonic(t_oth)[i]))
    assert 1.0 < ratio < 3.0


@needs_vidur
def test_the_transferred_vidur_profile_never_gets_cheaper_with_more_tokens() -> None:
    """Vidur's A100 rows dip between token counts (kernel choice, noise) and fall by 0.1%
    between their last two points, which made every step past 4,096 tokens cheaper the
    larger it was. The paper's clock (OPT-13B from Llama-2-7B's rows) is non-decreasing
    over the table and past it."""
    m = ProfiledCostModel(read_profile(VIDUR_A100, tp=1), "opt-13b", "a100-40gb",
                          stack="vllm-2023")  # fmt: skip
    tokens = [*range(1, 4200), 6144, 8192, 8193, 12000, 16384, 30000]
    times = [m.gpu_seconds(BatchShape(prefill_tokens=n, prefill_seqs=1)) for n in tokens]
    assert all(b >= a for a, b in itertools.pairwise(times))
    assert times[-1] > 1.5 * times[tokens.index(8192)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=40))
def test_isotonic_is_the_non_decreasing_least_squares_fit(values: list[float]) -> None:
    y = np.array(values)
    fit = isotonic(y)
    assert np.all(np.diff(fit) >= -1e-9 * max(1.0, np.abs(y).max()))
    assert fit.sum() == pytest.approx(y.sum(), rel=1e-9, abs=1e-6)  # pooled means keep sums
    if np.all(np.diff(y) >= 0):
        assert np.array_equal(fit, y)


def test_extrapolation_past_the_last_point_follows_the_top_half_not_the_last_pair() -> None:
    xp = np.array([1.0, 1000, 2000, 3000, 4000])
    fp = np.array([1.0, 10.0, 20.0, 30.0, 29.9])  # the last point a little low
    past = interp_points(np.array([4000.0, 8000.0]), xp, fp)
    # least squares over 2000..4000 (20, 30, 29.9): slope 0.00495, not the last pair's -0.0001
    assert past[1] == pytest.approx(29.9 + 4000 * 0.00495)
    flat = interp_points(np.array([9.0]), np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0]))
    assert flat[0] == 1.0  # a falling top never extrapolates down


def test_a_chunk_after_a_cached_prefix_pays_for_the_keys_it_attends_to(tmp_path: Path) -> None:
    """``attn_prefill`` rows are prompts from position 0; a 512-token chunk after 8,192
    cached tokens has 17 times the causal pairs of the chunk alone."""
    m = ProfiledCostModel(write_profile(tmp_path / "p", synthetic_rows()), "opt-13b",
                          "a100-40gb")  # fmt: skip
    q = 512

    def chunk(start: int) -> BatchShape:
        pairs = q * start + q * (q + 1) // 2
        return BatchShape(prefill_tokens=q, prefill_seqs=1, prefill_attn_pairs=pairs,
                          prefill_kv_read_tokens=start)  # fmt: skip

    times = [m.gpu_seconds(chunk(start)) for start in (0, 1536, 8192)]
    assert times[0] < times[1] < times[2]
    whole = m.gpu_seconds(chunk(0)) - m.gpu_seconds(BatchShape(prefill_tokens=q, prefill_seqs=1))
    assert whole == pytest.approx(0.0, abs=1e-12)  # from position 0: the mean length as before


def test_a_profile_is_priced_only_at_the_dtype_width_it_was_measured_in(tmp_path: Path) -> None:
    path = write_profile(tmp_path / "p", synthetic_rows(), dtype="float16")
    ProfiledCostModel(path, "opt-13b", "a100-40gb", dtype_bytes=2)
    with pytest.raises(ValueError, match=r"measured in float16 \(2 bytes an element\); the run"):
        ProfiledCostModel(path, "opt-13b", "a100-40gb", dtype_bytes=4)


@pytest.mark.parametrize("dtype", ["fp32", "float8_e4m3fn"])
def test_a_profile_of_a_dtype_kvlab_does_not_know_is_refused(tmp_path: Path, dtype: str) -> None:
    # an unknown name fell back to the run's own width: an fp32 profile priced fp16 runs
    path = write_profile(tmp_path / "p", synthetic_rows(), dtype=dtype)
    with pytest.raises(ValueError, match=f"measured in dtype '{dtype}', none kvlab prices"):
        ProfiledCostModel(path, "opt-13b", "a100-40gb", dtype_bytes=2)


@needs_vidur
def test_a_vidur_csv_prices_16_bit_runs_only() -> None:
    # read raw, Vidur's fp16 tables priced fp32 (or any) runs unchanged
    ProfiledCostModel(VIDUR_A100, "llama-7b", "a100-80gb", 1, dtype_bytes=2)
    with pytest.raises(ValueError, match="measured in float16"):
        ProfiledCostModel(VIDUR_A100, "llama-7b", "a100-80gb", 1, dtype_bytes=4)


def test_a_calibration_without_its_model_or_gpu_is_a_value_error_naming_it() -> None:
    terms = dict.fromkeys(("constant", *ROOFLINE_TERMS), 1e-6)
    doc = CalibratedCostModel("opt-125m", "h200", terms).to_dict()
    for key in ("model", "gpu"):
        with pytest.raises(ValueError, match=f"^{key}: "):
            CalibratedCostModel.from_dict({k: v for k, v in doc.items() if k != key})
    no_gpu = {k: v for k, v in doc.items() if k != "gpu"}
    assert CalibratedCostModel.from_dict(no_gpu, get_gpu("h200")).roofline.gpu.name == "h200"


_SHAPES = st.builds(
    lambda p, ps, d, dc: BatchShape(
        prefill_tokens=p * ps,
        prefill_seqs=ps,
        prefill_attn_pairs=ps * p * (p + 1) // 2,
        decode_seqs=d,
        decode_ctx_tokens=d * dc,
    ),
    st.integers(1, 3000),
    st.integers(0, 4),
    st.integers(0, 300),
    st.integers(1, 2048),
)


@settings(max_examples=40, deadline=None)
@given(
    shapes=st.lists(_SHAPES, min_size=1, max_size=30), stack=st.sampled_from(["none", "vllm-2023"])
)
def test_memoised_attention_gives_the_uncached_step_time(
    tmp_path_factory: pytest.TempPathFactory, shapes: list[BatchShape], stack: str
) -> None:
    """The decode-coefficient and prefill memos return exactly what the interpolation
    computes (each shape priced twice by a warm model against a model cleared each time)."""
    path = write_profile(tmp_path_factory.mktemp("p"), synthetic_rows())
    warm = ProfiledCostModel(path, "opt-13b", "a100-40gb", stack=stack)
    cold = ProfiledCostModel(path, "opt-13b", "a100-40gb", stack=stack)
    for shape in shapes + shapes[::-1]:
        cold._decode_memo.clear()
        cold._prefill_memo.clear()
        assert warm.step_time(shape) == cold.step_time(shape)


def _random_steps(seed: int, n: int = 200) -> pd.DataFrame:
    """Steps of random shapes: decode-only, prefill-only and mixed."""
    rng = np.random.default_rng(seed)
    decode = rng.integers(0, 40, n)
    prefill_seqs = np.where(rng.random(n) < 0.3, rng.integers(1, 4, n), 0)
    prefill_tokens = prefill_seqs * rng.integers(1, 300, n)
    decode[(decode == 0) & (prefill_seqs == 0)] = 1
    return pd.DataFrame({
        "prefill_tokens": prefill_tokens, "prefill_seqs": prefill_seqs,
        "prefill_attn_pairs": prefill_tokens * 10, "prefill_kv_read_tokens": 0,
        "decode_seqs": decode, "decode_ctx_tokens": decode * rng.integers(16, 1500, n),
    })  # fmt: skip


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 1000),
    c0=st.floats(0.0, 0.02),
    per_seq=st.floats(0.0, 1e-3),
    per_prefill=st.floats(0.0, 5e-3),
)
def test_calibration_on_a_profile_recovers_the_overhead_on_top(
    tmp_path_factory: pytest.TempPathFactory, seed: int, c0: float, per_seq: float,
    per_prefill: float,
) -> None:  # fmt: skip
    """Steps timed as the profile's operator seconds plus a per-step, per-sequence and
    per-prefill term: the fit on top of the profile finds those terms and nothing else
    (the roofline terms stay 0), and prices the steps exactly."""
    prof = write_profile(
        tmp_path_factory.mktemp("p"), synthetic_rows(), gpu="cpu", model="opt-125m"
    )
    ops = ProfiledCostModel(prof, "opt-125m", "h200", as_measured=True)
    steps = _random_steps(seed)
    shapes = [BatchShape(*(int(x) for x in row)) for row in steps.itertuples(index=False)]
    seqs = steps["prefill_seqs"] + steps["decode_seqs"]
    operators = np.array([ops.gpu_seconds(s) for s in shapes])
    steps["duration_s"] = operators + c0 + per_seq * seqs + per_prefill * steps["prefill_seqs"]
    for weighting in WEIGHTINGS:
        fit = CalibratedCostModel.fit(steps, "opt-125m", "h200", weighting=weighting,
                                      profile=str(prof))  # fmt: skip
        c = fit.coefficients
        assert [c[t] for t in ROOFLINE_TERMS] == [0.0, 0.0, 0.0]
        assert c["constant"] == pytest.approx(c0, abs=1e-9)
        assert c["per_sequence"] == pytest.approx(per_seq, abs=1e-9)
        assert c["per_prefill_sequence"] == pytest.approx(per_prefill, abs=1e-9)
        assert fit.predict_steps(steps) == pytest.approx(steps["duration_s"].to_numpy(), rel=1e-6)
        again = CalibratedCostModel.from_dict(fit.to_dict())
        assert again.profile == str(prof)
        assert again.step_time(shapes[0]) == pytest.approx(fit.step_time(shapes[0]), rel=1e-12)
        assert "as measured; the terms below are fitted on top" in again.describe()


def test_profile_as_measured_must_be_of_the_same_model(tmp_path: Path) -> None:
    """A device profile used as measured must be of the simulated model and tp: another
    model's profile is one clear error naming the profile."""
    prof = write_profile(tmp_path / "p", synthetic_rows(), gpu="cpu", model="opt-125m")
    with pytest.raises(ValueError, match=r"operator_profile.*opt-125m at tp 1; using it as "
                                         r"measured needs opt-13b at tp 1"):  # fmt: skip
        ProfiledCostModel(prof, "opt-13b", "h200", as_measured=True)
    assert ProfiledCostModel(prof, "opt-125m", "h200", as_measured=True).same


def test_profile_as_measured_must_be_of_the_same_device(tmp_path: Path) -> None:
    """A profile whose device has a catalog entry is used as measured only for that GPU;
    one from a CPU (no entry) is taken for whatever the run's basis hardware is called."""
    prof = write_profile(tmp_path / "p", synthetic_rows(), gpu="a100-40gb", model="opt-13b")
    with pytest.raises(ValueError, match=r"measured on a100-40gb; using it as measured needs h200"):
        ProfiledCostModel(prof, "opt-13b", "h200", as_measured=True)
    assert ProfiledCostModel(prof, "opt-13b", "a100-40gb", as_measured=True).same


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 1000),
    c0=st.floats(0.0, 0.02),
    per_seq=st.floats(0.0, 1e-3),
    profile_error=st.floats(-0.2, 0.2),
)
def test_host_target_fits_the_terms_to_the_time_outside_the_forward(
    tmp_path_factory: pytest.TempPathFactory, seed: int, c0: float, per_seq: float,
    profile_error: float,
) -> None:  # fmt: skip
    """Steps whose forward runs ``1 + profile_error`` times the profile's price and whose
    host time is ``c0 + per_seq × seqs``: ``target='host'`` recovers exactly the host terms
    whatever the profile's error; ``target='step'`` folds the error into them."""
    prof = write_profile(
        tmp_path_factory.mktemp("p"), synthetic_rows(), gpu="cpu", model="opt-125m"
    )
    ops = ProfiledCostModel(prof, "opt-125m", "h200", as_measured=True)
    steps = _random_steps(seed)
    shapes = [BatchShape(*(int(x) for x in row)) for row in steps.itertuples(index=False)]
    seqs = steps["prefill_seqs"] + steps["decode_seqs"]
    steps["forward_s"] = np.array([ops.gpu_seconds(s) for s in shapes]) * (1 + profile_error)
    steps["duration_s"] = steps["forward_s"] + c0 + per_seq * seqs
    host = CalibratedCostModel.fit(steps, "opt-125m", "h200", weighting="relative",
                                   profile=str(prof), target="host")  # fmt: skip
    c = host.coefficients
    assert c["constant"] == pytest.approx(c0, abs=1e-9)
    assert c["per_sequence"] == pytest.approx(per_seq, abs=1e-9)
    assert c["per_prefill_sequence"] == pytest.approx(0.0, abs=1e-9)
    assert host.fit_stats["target"] == "host"
    if profile_error > 0.05:  # the step target puts the forward's extra time into the terms
        step = CalibratedCostModel.fit(steps, "opt-125m", "h200", weighting="relative",
                                       profile=str(prof), target="step")  # fmt: skip
        assert step.coefficients["constant"] + step.coefficients["per_sequence"] > c0 + per_seq


def test_host_target_needs_a_profile_and_the_forward_time(tmp_path: Path) -> None:
    prof = write_profile(tmp_path / "p", synthetic_rows(), gpu="cpu", model="opt-125m")
    steps = _random_steps(0)
    steps["duration_s"] = 0.1
    with pytest.raises(ValueError, match="on top of an operator profile"):
        CalibratedCostModel.fit(steps, "opt-125m", "h200", target="host")
    with pytest.raises(ValueError, match="forward_s"):
        CalibratedCostModel.fit(steps, "opt-125m", "h200", profile=str(prof), target="host")
    with pytest.raises(ValueError, match="target 'both' is not one of step, host"):
        CalibratedCostModel.fit(steps, "opt-125m", "h200", profile=str(prof), target="both")


def test_decode_attention_goes_through_the_measured_points(tmp_path: Path) -> None:
    """Decode attention is piecewise linear through the measured points along each
    sequence count, in per-sequence context: a convex curve is met at every point (a line
    fitted per count would miss them), halfway between two points is the mean, halfway
    between two counts is the mean of the counts' times at the same per-sequence context,
    and a later point measured faster does not make the longer context cheaper."""
    rows = [r for r in synthetic_rows() if r[0] != "attn_decode"]

    def ms(seqs: int, per_seq: int) -> float:
        return 0.05 * seqs + 1e-6 * seqs * per_seq**2  # convex in context

    for s in (1, 8):
        rows += [("attn_decode", s, s * c, ms(s, c)) for c in (16, 256, 1024, 2048)]
    rows += [("attn_decode", 64, 64 * 16, 1.0), ("attn_decode", 64, 64 * 256, 0.5)]  # noise
    m = ProfiledCostModel(write_profile(tmp_path / "p", rows), "opt-13b", "a100-40gb")
    layers = 40

    def attn_ms(seqs: int, per_seq: int) -> float:
        shape = BatchShape(decode_seqs=seqs, decode_ctx_tokens=seqs * per_seq)
        return m._attention_s(shape) * 1e3 / layers

    for s in (1, 8):
        for c in (16, 256, 1024, 2048):
            assert attn_ms(s, c) == pytest.approx(ms(s, c), rel=1e-9)
        assert attn_ms(s, 640) == pytest.approx((ms(s, 256) + ms(s, 1024)) / 2, rel=1e-9)
    assert attn_ms(4, 256) == pytest.approx(ms(1, 256) + (ms(8, 256) - ms(1, 256)) * 3 / 7)
    assert attn_ms(64, 256) == pytest.approx(1.0)  # the running maximum, not 0.5
    assert attn_ms(128, 16) == pytest.approx(2.0)  # past the largest count: per sequence


H200_PROFILE = Path(__file__).resolve().parents[1] / "sim/cost/profiles/kvlab-h200-opt-13b"


def test_the_shipped_h200_profile_prices_its_own_model_and_gpu_as_measured() -> None:
    """The sidecar names the device as it reported itself ('NVIDIA H200'); the catalog maps
    that to h200, so OPT-13B on h200 uses the points as measured, and the step time grows
    with tokens (from 16: one row measured 3% slower than 16, a matrix-vector kernel) and
    with context."""
    meta = json.loads((H200_PROFILE / "operator_profile.json").read_text())
    assert meta["gpu"] == "NVIDIA H200" and meta["model"] == "opt-13b" and meta["source"]
    cost = ProfiledCostModel(str(H200_PROFILE), "opt-13b", "h200", 1, 2, 16, stack=None)
    assert cost.same
    prefill = [
        cost.gpu_seconds(BatchShape(prefill_tokens=n, prefill_seqs=1,
                                    prefill_attn_pairs=n * (n + 1) // 2))
        for n in (16, 256, 1024, 4096)
    ]  # fmt: skip
    assert prefill == sorted(prefill)
    for seqs in (1, 8, 64):
        decode = [cost.gpu_seconds(BatchShape(decode_seqs=seqs, decode_ctx_tokens=seqs * c))
                  for c in (16, 256, 2048)]  # fmt: skip
        assert decode == sorted(decode)


def test_a_transferred_prefill_attention_curve_never_dips() -> None:
    """The shipped H200 profile's attn_prefill row at 2 tokens is faster than at 1; carried
    to another GPU, that dip made a 2-token prefill cheaper than a 1-token one."""
    shipped = Path(__file__).resolve().parents[1] / "sim/cost/profiles/kvlab-h200-opt-13b"
    m = ProfiledCostModel(shipped, "opt-13b", "a100-80gb")
    assert not m.same
    times = [
        m.gpu_seconds(BatchShape(prefill_tokens=n, prefill_seqs=1,
                                 prefill_attn_pairs=n * (n + 1) // 2))
        for n in range(1, 300)
    ]  # fmt: skip
    assert all(b >= a for a, b in itertools.pairwise(times))


def test_two_equal_prompts_pay_twice_one_prompts_prefill_attention(tmp_path: Path) -> None:
    """Prefill attention is per sequence: two 512-token prompts cost twice one, which the
    synthetic rows price at 40 layers x (1e-6 x 512**2 + 0.01) ms."""
    m = ProfiledCostModel(write_profile(tmp_path / "p", synthetic_rows()), "opt-13b",
                          "a100-40gb")  # fmt: skip
    n, pairs = 512, 512 * 513 // 2
    one = BatchShape(prefill_tokens=n, prefill_seqs=1, prefill_attn_pairs=pairs)
    two = BatchShape(prefill_tokens=2 * n, prefill_seqs=2, prefill_attn_pairs=2 * pairs)
    per_prompt_ms = 40 * (1e-6 * n * n + 0.01)
    assert m._attention_s(one) * 1e3 == pytest.approx(per_prompt_ms, rel=1e-9)
    assert m._attention_s(two) * 1e3 == pytest.approx(2 * per_prompt_ms, rel=1e-9)


def test_decode_attention_moved_to_a_slower_gpu_grows_by_the_bandwidth_ratio() -> None:
    """Decode attention streams K/V: the shipped H200 profile of OPT-13B moved to an
    A100-40GB (same model and tp, so the same K/V bytes) takes 4.8 TB/s / 1.555 TB/s (the
    datasheets' HBM bandwidths) times as long at every batch."""
    assert get_gpu("h200").mem_bandwidth == 4.8e12
    assert get_gpu("a100-40gb").mem_bandwidth == 1.555e12
    measured = ProfiledCostModel(str(H200_PROFILE), "opt-13b", "h200")
    moved = ProfiledCostModel(str(H200_PROFILE), "opt-13b", "a100-40gb")
    assert measured.same and not moved.same
    for seqs, per_seq in ((1, 100), (8, 1000), (64, 300)):
        shape = BatchShape(decode_seqs=seqs, decode_ctx_tokens=seqs * per_seq)
        ratio = moved.decode_attention_seconds(shape) / measured.decode_attention_seconds(shape)
        assert ratio == pytest.approx(4.8 / 1.555, rel=1e-9)


def test_other_ops_of_a_twice_wider_model_cost_the_profiles_at_twice_the_tokens(
    tmp_path: Path,
) -> None:
    """The elementwise ``other`` operator is transferred by width: at N tokens a target
    with hidden size h_t costs the profile at N x h_t / h_p. OPT-13B (5,120) from a profile
    of OPT-2.7B (2,560) on the same GPU: other(N) = the profile's other(2N). Two profiles
    differing only in ``other`` (0.02 ms + 1e-5 ms a token, and a flat 0.02 ms) isolate it:
    per layer 1e-5 x 2N ms more, over OPT-13B's 40 layers."""

    def rows(per_token: float) -> list[tuple[str, int, int, float]]:
        out = [r for r in synthetic_rows() if r[0] != "other"]
        return out + [("other", n, 0, 0.02 + per_token * n) for n in (1, 8, 64, 512, 2048)]

    sloped = write_profile(tmp_path / "a", rows(1e-5), model="opt-2.7b")
    flat = write_profile(tmp_path / "b", rows(0.0), model="opt-2.7b")
    a = ProfiledCostModel(sloped, "opt-13b", "a100-40gb")
    b = ProfiledCostModel(flat, "opt-13b", "a100-40gb")
    assert get_model("opt-2.7b").hidden_size * 2 == get_model("opt-13b").hidden_size
    assert not a.same
    for n in (1, 8, 100, 1000, 3000):
        shape = BatchShape(prefill_tokens=n, prefill_seqs=1)
        extra_ms = (a.gpu_seconds(shape) - b.gpu_seconds(shape)) * 1e3
        assert extra_ms == pytest.approx(40 * 1e-5 * 2 * n, rel=1e-6)


def test_a_gpu_number_overridden_on_the_profiles_own_gpu_is_priced(tmp_path: Path) -> None:
    """hardware.mem_bandwidth_gbs=... on the GPU the profile was taken on names another
    device: the profile is transferred to it, not used as measured (same name, other
    numbers)."""
    from dataclasses import replace

    d = write_profile(tmp_path / "p", synthetic_rows())
    gpu = get_gpu("a100-40gb")
    as_is = ProfiledCostModel(d, "opt-13b", gpu)
    slower = ProfiledCostModel(d, "opt-13b", replace(gpu, mem_bandwidth=gpu.mem_bandwidth / 2))
    assert as_is.same and not slower.same
    decode = BatchShape(decode_seqs=8, decode_ctx_tokens=8 * 1024)
    assert slower.step_time(decode) > 1.5 * as_is.step_time(decode)


@pytest.mark.parametrize("dropped", ["attn_prefill", "attn_decode"])
def test_an_attention_table_the_profile_lacks_is_priced_by_the_roofline(
    tmp_path: Path, dropped: str
) -> None:
    rows = [r for r in synthetic_rows() if r[0] != dropped]
    ops = sorted({r[0] for r in rows})  # the sidecar says which operators were profiled
    m = ProfiledCostModel(write_profile(tmp_path / "p", rows, ops=ops), "opt-13b", "a100-40gb")
    roof = m.roofline
    prefill = BatchShape(prefill_tokens=2048, prefill_seqs=1, prefill_attn_pairs=2048 * 2049 // 2)
    decode = BatchShape(decode_seqs=8, decode_ctx_tokens=8 * 1024)
    shape = prefill if dropped == "attn_prefill" else decode
    assert m._attention_s(shape) == pytest.approx(roof.gpu_parts(shape)[1], rel=1e-12)
    assert m._attention_s(shape) > 0 and m.step_time(shape) > 0
    expected = roof.gpu_parts(decode)[1] if dropped == "attn_decode" else None
    if expected is not None:
        assert m.decode_attention_seconds(decode) == pytest.approx(expected, rel=1e-12)


def test_one_more_sequence_of_the_same_context_is_never_cheaper(tmp_path: Path) -> None:
    """A profile that measured 2 sequences of 16 tokens faster than 1 (noise) is priced
    non-decreasing in the count at equal per-sequence context."""
    rows = [r for r in synthetic_rows() if r[0] != "attn_decode"]
    rows += [("attn_decode", 1, 16, 0.0127), ("attn_decode", 1, 256, 0.05),
             ("attn_decode", 2, 32, 0.0121), ("attn_decode", 2, 512, 0.09)]  # fmt: skip
    m = ProfiledCostModel(write_profile(tmp_path / "p", rows), "opt-13b", "a100-40gb")
    for per_seq in (16, 64, 200, 256):
        one = m.decode_attention_seconds(BatchShape(decode_seqs=1, decode_ctx_tokens=per_seq))
        two = m.decode_attention_seconds(BatchShape(decode_seqs=2, decode_ctx_tokens=2 * per_seq))
        assert two >= one, per_seq


def test_a_calibrated_models_description_names_its_unfitted_transfer_constants() -> None:
    # swaps and block copies are priced by a roofline whose link and memory efficiency
    # were printed nowhere
    terms = dict.fromkeys(("constant", *ROOFLINE_TERMS), 1e-6)
    text = CalibratedCostModel("opt-125m", "h200", terms).describe()
    gpu = get_gpu("h200")
    assert f"swaps over the host link at {gpu.host_link_bandwidth / 1e9:g} GB/s" in text
    assert gpu.source["host_link_gbs"] in text and gpu.source["mem_bandwidth_gbs"] in text
    assert "copies at 0.88 of HBM 4800 GB/s (kvlab's device-to-device copy benchmark" in text
