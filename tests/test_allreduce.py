"""The all-reduce's two constants: the fit, the table reader's errors, the profile keys that
carry them and what they add to a tensor-parallel step."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from core.plan import BatchShape
from experiments.bench import allreduce_fit
from sim.catalog import get_model
from sim.cost.allreduce import (
    AllReduceTableError,
    fit_allreduce,
    read_allreduce_table,
    ring_allreduce_s,
)
from sim.cost.efficiency import Efficiency
from sim.cost.profile import ProfileError, read_kvlab_profile
from sim.cost.profiled import ProfiledCostModel
from tests.test_cost_profiled import synthetic_rows, write_profile

HEADER = (
    ",time_stats.all_reduce.min,time_stats.all_reduce.max,time_stats.all_reduce.mean,"
    "time_stats.all_reduce.median,time_stats.all_reduce.std,rank,num_workers,size,"
    "collective,devices_per_node,max_devices_per_node"
)
SIZES = [
    2048 * 4**k for k in range(11)
]  # 2 KiB to 2 GiB: 4 fit the latency, 3 held out, 4 the link


def write_table(path: Path, latency_s: float, bandwidth: float, workers=(2, 4)) -> Path:
    """A Vidur-format table whose medians follow the ring form exactly."""
    lines = [HEADER]
    for i, (n, size) in enumerate((n, s) for n in workers for s in SIZES):
        ms = float(ring_allreduce_s(float(size), n, latency_s, bandwidth)) * 1e3
        lines.append(f"{i},{ms},{ms},{ms},{ms},0,0,{n},{size},all_reduce,{n},4")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_fit_recovers_the_constants_of_an_exact_table(tmp_path: Path) -> None:
    table = read_allreduce_table(write_table(tmp_path / "t.csv", 40e-6, 150e9))
    fit = fit_allreduce(table, link_bandwidth=300e9)
    # the small band's median carries its few bytes' transfer: under 2 % of the latency
    assert fit.latency_s == pytest.approx(40e-6, rel=0.02)
    assert fit.efficiency == pytest.approx(0.5, rel=1e-3)
    assert fit.small_rows + fit.large_rows + fit.held_out_rows == len(SIZES)
    assert "2-GPU rows" in fit.note and "held out" in fit.note
    big = float(SIZES[-1])
    assert fit.seconds(big, 2) == pytest.approx(ring_allreduce_s(big, 2, 40e-6, 150e9), rel=0.01)


def test_the_efficiency_is_held_to_one_and_the_note_says_so(tmp_path: Path) -> None:
    table = read_allreduce_table(write_table(tmp_path / "t.csv", 40e-6, 600e9))
    fit = fit_allreduce(table, link_bandwidth=300e9)
    assert fit.efficiency == 1.0 and "held to 1" in fit.note
    assert "held to 1" not in fit_allreduce(table, link_bandwidth=900e9).note


def test_large_sizes_no_slower_than_the_latency_are_refused(tmp_path: Path) -> None:
    rows = [f"{i},1,1,1,0.04,0,0,2,{size},all_reduce,2,4" for i, size in enumerate(SIZES)]
    path = tmp_path / "flat.csv"
    path.write_text("\n".join([HEADER, *rows]) + "\n")  # 40 us at every size
    with pytest.raises(AllReduceTableError, match="no time beyond"):
        fit_allreduce(read_allreduce_table(path), 300e9)


def test_each_row_s_role_follows_the_split(tmp_path: Path) -> None:
    fit = fit_allreduce(read_allreduce_table(write_table(tmp_path / "t.csv", 4e-5, 1e11)), 3e11)
    assert fit.role(fit.small_max, 2) == "latency"
    assert fit.role(fit.small_max + 1, 2) == "held out"
    assert fit.role(fit.large_min, 2) == "efficiency"
    assert fit.role(10, 4) == "held out (another GPU count)"


def test_one_gpu_has_no_all_reduce_and_more_gpus_move_more_bytes() -> None:
    assert ring_allreduce_s(1e6, 1, 50e-6, 1e9) == 0.0
    two, eight = ring_allreduce_s(1e6, 2, 0.0, 1e9), ring_allreduce_s(1e6, 8, 0.0, 1e9)
    assert two == pytest.approx(1e-3) and eight == pytest.approx(1.75e-3)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda t: t.replace(",size,", ",bytes,"), "no column size"),
        (lambda t: t.replace("0,0,2,2048,", "0,0,2,2048.5,", 1), "row 2: size is '2048.5'"),
        (lambda t: t.replace("0,0,2,2048,", "0,0,1,2048,", 1), "row 2: num_workers is '1'"),
        (lambda t: t.replace(t.splitlines()[1], "0,1,1,1,-1,0,0,2,2048,all_reduce,2,4"),
         "row 2: time_stats.all_reduce.median is '-1'"),
        (lambda t: t.splitlines()[0] + "\n", "no data rows"),
    ],
)  # fmt: skip
def test_a_damaged_table_is_one_line_naming_file_and_row(tmp_path: Path, edit, message) -> None:
    path = write_table(tmp_path / "t.csv", 40e-6, 150e9)
    path.write_text(edit(path.read_text()))
    with pytest.raises(ProfileError, match=message) as err:
        read_allreduce_table(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, AllReduceTableError) or "no data rows" in message


def test_a_table_without_the_fitted_gpu_count_or_a_band_is_refused(tmp_path: Path) -> None:
    table = read_allreduce_table(write_table(tmp_path / "t.csv", 40e-6, 150e9, workers=(4,)))
    with pytest.raises(AllReduceTableError, match="no row over 2 GPUs"):
        fit_allreduce(table, 300e9)


def test_profile_sidecar_keys_are_checked(tmp_path: Path) -> None:
    for key, value, expected in (
        ("peer_link_efficiency", 1.5, "a number in \\[0.001, 1\\]"),
        ("peer_link_efficiency", 0, "a number in \\[0.001, 1\\]"),
        ("allreduce_latency_s", -1e-6, "seconds in \\[0, 1\\)"),
        ("allreduce_latency_s", 1e308, "seconds in \\[0, 1\\)"),
        ("peer_link_efficiency", 5e-324, "a number in \\[0.001, 1\\]"),
        ("peer_link_efficiency", True, "a number in \\[0.001, 1\\]"),
        ("allreduce_source", "", "a text saying where"),
    ):
        d = write_profile(tmp_path / key / str(value), synthetic_rows(), **{key: value})
        with pytest.raises(ProfileError, match=f"key '{key}'.*{expected}"):
            read_kvlab_profile(d)


def tp_shapes() -> list[BatchShape]:
    return [
        BatchShape(decode_seqs=1, decode_ctx_tokens=512),
        BatchShape(decode_seqs=48, decode_ctx_tokens=48 * 700),
        BatchShape(prefill_seqs=2, prefill_tokens=1500, prefill_attn_pairs=600_000),
    ]


def test_a_profile_s_all_reduce_adds_its_latency_per_call_and_slows_the_link(
    tmp_path: Path,
) -> None:
    plain = write_profile(tmp_path / "plain", synthetic_rows())
    measured = write_profile(
        tmp_path / "measured", synthetic_rows(), allreduce_latency_s=5e-5,
        peer_link_efficiency=0.5, allreduce_source="a test table",
    )  # fmt: skip
    model = get_model("opt-66b")
    for tp in (1, 4):
        a = ProfiledCostModel(plain, "opt-66b", "a100-40gb", tp=tp, stack="none")
        b = ProfiledCostModel(measured, "opt-66b", "a100-40gb", tp=tp, stack="none")
        for shape in tp_shapes():
            tokens = shape.prefill_tokens + shape.decode_seqs
            if tp == 1:
                assert b.step_time(shape) == a.step_time(shape)
                continue
            calls = 2 * model.num_layers
            moved = calls * 2 * (tp - 1) / tp * tokens * model.hidden_size * 2
            bw = a.gpu.peer_link_bandwidth
            extra = calls * 5e-5 + moved / (0.5 * bw) - moved / bw
            assert b.step_time(shape) - a.step_time(shape) == pytest.approx(extra, rel=1e-9)
    described = b.describe()
    assert "allreduce_latency_s       5e-05" in described and "a test table" in described


def test_the_shipped_profile_carries_a_measured_all_reduce() -> None:
    shipped_dir = Path(__file__).resolve().parents[1] / "sim/cost/profiles/vidur-a100-llama-2-7b"
    prof = read_kvlab_profile(shipped_dir)
    assert 0 < prof.allreduce_latency_s < 1e-3 and 0 < prof.peer_link_efficiency <= 1
    assert prof.allreduce_source and "all_reduce_pairwise_nvlink.csv" in prof.allreduce_source
    unmeasured = replace(prof, allreduce_latency_s=0.0, peer_link_efficiency=1.0,
                         allreduce_source=None)  # fmt: skip
    plain = ProfiledCostModel(unmeasured, "opt-175b", "a100-80gb", tp=8, stack="none")
    shipped = ProfiledCostModel(prof, "opt-175b", "a100-80gb", tp=8, stack="none")
    for shape in tp_shapes():
        assert shipped.step_time(shape) > plain.step_time(shape)


def test_efficiency_peer_link_is_a_fraction() -> None:
    with pytest.raises(ValueError, match="peer_link_efficiency must be in"):
        Efficiency(peer_link_efficiency=1.2)
    assert "peer_link_efficiency" in Efficiency().describe()


def test_the_bench_writes_its_files_and_refuses_a_damaged_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = write_table(tmp_path / "t.csv", 40e-6, 150e9)
    out = tmp_path / "out"
    assert allreduce_fit.main(["--table", str(table), "--out", str(out), "--no-plot"]) == 0
    fit = json.loads((out / "fit.json").read_text())
    assert fit["latency_s"] == pytest.approx(40e-6, rel=0.02)
    assert fit["efficiency"] == pytest.approx(0.5, rel=1e-3)
    errors = (out / "errors.csv").read_text().splitlines()
    assert len(errors) == 1 + 2 * len(SIZES)
    held = next(h for h in fit["held_out"] if h["rows"] == "held out")
    assert abs(held["mean_error_pct"]) < 2  # an exact table is predicted where it is held out
    table.write_text(table.read_text().replace(",size,", ",bytes,"))
    with pytest.raises(SystemExit) as done:
        allreduce_fit.main(["--table", str(table), "--out", str(out), "--no-plot"])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "no column size" in err and "\n" not in err
    assert np.isfinite(fit["link_bandwidth_bytes_per_s"])


def test_a_latency_without_its_source_is_used_and_says_so(tmp_path: Path) -> None:
    d = write_profile(tmp_path / "p", synthetic_rows(), allreduce_latency_s=2e-5)
    model = ProfiledCostModel(d, "opt-66b", "a100-40gb", tp=4, stack="none")
    assert model.roofline.efficiency.allreduce_latency_s == 2e-5
    assert model.roofline.efficiency.peer_link_efficiency == 1.0
    assert "no source given" in model.describe()


def test_a_source_without_its_constants_is_refused(tmp_path: Path) -> None:
    d = write_profile(tmp_path / "p", synthetic_rows(), allreduce_source="a table")
    with pytest.raises(ProfileError, match="'allreduce_source' without"):
        read_kvlab_profile(d)


def test_the_run_s_config_overrides_the_measured_all_reduce(tmp_path: Path) -> None:
    """cost.allreduce_latency_s / cost.peer_link_efficiency: cost=profiled takes them in
    place of its profile's, cost=roofline as its factors; a bad value is one ConfigError."""
    from experiments.lib.checks import ConfigError
    from experiments.lib.setup import make_cost_model
    from sim.catalog import get_gpu

    model, gpu = get_model("opt-66b"), get_gpu("a100-40gb")
    shipped = "sim/cost/profiles/vidur-a100-llama-2-7b"

    def build(kind: str, **keys: object):
        cost = {"kind": kind, "stack": "none", **keys}
        if kind == "profiled":
            cost["profile"] = shipped
        return make_cost_model({"cost": cost, "system": {"block_size": 16}}, model, gpu, 4)

    measured = build("profiled")
    bound = build("profiled", allreduce_latency_s=0.0, peer_link_efficiency=1.0)
    eff = bound.roofline.efficiency
    assert eff.allreduce_latency_s == 0.0 and eff.peer_link_efficiency == 1.0
    assert eff.source["allreduce_latency_s"] == "set in the run's config (cost group)"
    unmeasured = read_kvlab_profile(Path(__file__).resolve().parents[1] / shipped)
    unmeasured = replace(unmeasured, allreduce_latency_s=0.0, peer_link_efficiency=1.0,
                         allreduce_source=None)  # fmt: skip
    plain = ProfiledCostModel(unmeasured, model, gpu, tp=4, stack="none")
    for shape in tp_shapes():
        assert bound.step_time(shape) == plain.step_time(shape) < measured.step_time(shape)
    roof = build("roofline", allreduce_latency_s=1e-4)
    base = build("roofline")
    one = BatchShape(decode_seqs=1, decode_ctx_tokens=100)
    extra = roof.step_time(one) - base.step_time(one)
    assert extra == pytest.approx(2 * model.num_layers * 1e-4)
    with pytest.raises(ConfigError) as err:
        build("profiled", peer_link_efficiency=2.0)
    assert "peer_link_efficiency must be in (0, 1]" in str(err.value)
    assert err.value.key == "cost.peer_link_efficiency"
    with pytest.raises(ValueError, match="no efficiency override 'compute'"):
        ProfiledCostModel(unmeasured, model, gpu, tp=4, efficiency_overrides={"compute": 0.5})
