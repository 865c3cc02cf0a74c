"""experiments.bench.gpu_report on the committed first H200 run (no GPU needed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from experiments.bench.gpu_report import DECODE_SHAPES, PREFILL_TOKENS, main

ROOT = Path(__file__).resolve().parents[1]
FIRST_RUN = ROOT / "docs/validation/h200/first-run"
HOST_TIME = FIRST_RUN.parent / "host-time" / "1-warmup-batch"


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu_report")
    assert main([str(FIRST_RUN), "--out", str(out)]) == 0
    return out


def test_operators_price_every_probe_shape_three_ways(report_dir: Path) -> None:
    ops = pd.read_csv(report_dir / "operators.csv")
    assert len(ops) == len(PREFILL_TOKENS) + len(DECODE_SHAPES)
    assert (ops[["measured_ms", "transferred_ms", "roofline_ms"]] > 0).all().all()
    for way in ("transferred", "roofline"):
        err = ops[f"{way}_ms"] / ops["measured_ms"] - 1
        assert (err - ops[f"{way}_err"]).abs().max() < 1e-9
    decode = ops[ops["step"] == "decode"].sort_values(["seqs_or_tokens", "context"])
    for _, g in decode.groupby("seqs_or_tokens"):  # more context never costs less
        assert g["measured_ms"].is_monotonic_increasing


def test_every_run_of_the_profiled_model_is_read_and_cross_validated(report_dir: Path) -> None:
    runs = sorted(p.name for p in (FIRST_RUN / "engine").iterdir() if p.name.startswith("opt-13b_"))
    gap = pd.read_csv(report_dir / "forward_gap.csv")
    assert sorted(gap["run"].unique()) == runs  # the OPT-1.3B runs have no profile: left out
    for run, g in gap.groupby("run"):  # every decode-only step lands in one bin
        steps = pd.read_csv(FIRST_RUN / "engine" / str(run) / "steps.csv")
        decode = (steps["prefill_tokens"] == 0) & (steps["decode_seqs"] > 0)
        assert g["steps"].sum() == decode.sum()
    speed = pd.read_csv(report_dir / "speed.csv")
    assert sorted(speed["run"]) == runs
    assert (speed["window_min"] <= speed["median"]).all()
    assert (speed["median"] <= speed["window_max"]).all()
    stalls = pd.read_csv(report_dir / "stalls.csv")  # every run, both models
    assert len(stalls) == len(list((FIRST_RUN / "engine").glob("*/steps.csv")))
    assert ((stalls["stalls"] > 0) == (stalls["stall_excess_s"] > 0)).all()
    assert (stalls["share"].between(0, 1)).all()
    cross = pd.read_csv(report_dir / "cross_run.csv")
    assert len(cross) == len(runs) ** 2
    assert set(zip(cross["fit_run"], cross["run"], strict=True)) == {
        (f, r) for f in runs for r in runs
    }
    assert cross["request_throughput"].notna().all()


def test_a_directory_with_neither_profile_nor_engine_runs_is_one_line(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(A call whose engine part wrote nothing still gets its profile's table.)"""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    (tmp_path / "call").mkdir()
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "call"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
    assert "not a gpu_all.sh output" in err
    shutil.copytree(FIRST_RUN / "profile", tmp_path / "call" / "profile")
    assert main([str(tmp_path / "call"), "--out", str(tmp_path / "out")]) == 0
    assert len(pd.read_csv(tmp_path / "out" / "operators.csv")) == len(PREFILL_TOKENS) + len(
        DECODE_SHAPES
    )
    assert (tmp_path / "out" / "stalls.csv").read_text() == ""


def _one_run_call(call: Path) -> Path:
    """A gpu_all.sh output with the first call's profile and one OPT-13B run, ``full``."""
    shutil.copytree(FIRST_RUN / "profile", call / "profile")
    (call / "engine").mkdir()
    shutil.copy(FIRST_RUN / "engine" / "trace_opt-13b.csv", call / "engine")
    shutil.copytree(FIRST_RUN / "engine" / "opt-13b_vllm_offline", call / "engine" / "full")
    return call


def test_the_sync_check_is_read_when_the_call_ran_it(tmp_path: Path, capsys) -> None:
    call = _one_run_call(tmp_path / "call")
    assert main([str(call), "--out", str(tmp_path / "none")]) == 0  # not run: empty tables
    assert (tmp_path / "none" / "sync_slept.csv").read_text() == ""
    (call / "sync").mkdir()
    step = {"tokens": 8, "sleep_ms": 100.0, "total_ms": 113.0}
    slept_steps = [{**step, "issue_ms": 112.0}, {**step, "issue_ms": 13.0}]
    doc = {"sync_sites": {"engine/runner.py:120": 3}, "slept_steps": slept_steps}
    (call / "sync" / "sync_check.json").write_text(json.dumps(doc))
    assert main([str(call), "--out", str(tmp_path / "out")]) == 0
    sites = pd.read_csv(tmp_path / "out" / "sync_sites.csv")
    assert sites.to_dict("records") == [{"site": "engine/runner.py:120", "count": 3}]
    slept = pd.read_csv(tmp_path / "out" / "sync_slept.csv")
    assert slept["waited"].tolist() == [True, False]  # returned after the sleep / before it
    (call / "sync" / "sync_check.json").write_text('{"sync_sites": []}')
    capsys.readouterr()
    assert main([str(call), "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sync_check.json" in err


def test_the_host_time_is_read_when_the_call_ran_it(tmp_path: Path, capsys) -> None:
    call = _one_run_call(tmp_path / "call")
    assert main([str(call), "--out", str(tmp_path / "none")]) == 0
    assert (tmp_path / "none" / "host_time.csv").read_text() == ""
    (call / "host").mkdir()
    shutil.copy(HOST_TIME / "host_time.csv", call / "host")
    assert main([str(call), "--out", str(tmp_path / "out")]) == 0
    table = pd.read_csv(tmp_path / "out" / "host_time.csv")
    committed = pd.read_csv(HOST_TIME / "host_time_summary.csv")
    pd.testing.assert_frame_equal(table, committed)
    (call / "host" / "host_time.csv").write_text("a,b\n1,2\n")
    capsys.readouterr()
    assert main([str(call), "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "host_time.csv" in err


def test_a_run_without_steps_is_left_out_from_any_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped profile is found from the repository, not the working directory, and a
    run whose steps.csv has a header only (it served nothing) is in no table."""
    call = _one_run_call(tmp_path / "call")
    run = FIRST_RUN / "engine" / "opt-13b_vllm_offline"
    shutil.copytree(run, call / "engine" / "empty")
    steps = pd.read_csv(run / "steps.csv")
    steps.iloc[:0].to_csv(call / "engine" / "empty" / "steps.csv", index=False)
    metrics = json.loads((run / "metrics.json").read_text())
    (call / "engine" / "empty" / "metrics.json").write_text(json.dumps({**metrics, "num_steps": 0}))
    monkeypatch.chdir(tmp_path)
    assert main([str(call), "--out", str(tmp_path / "out")]) == 0
    for table in ("forward_gap", "speed", "stalls", "cross_run"):
        frame = pd.read_csv(tmp_path / "out" / f"{table}.csv")
        assert set(frame["run"]) == {"full"}, table


def test_a_cut_steps_file_or_an_output_file_is_one_line(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's steps.csv with fewer rows than its metrics.json counts is refused (it was
    read as the whole run), and so is an --out that is a file, before any work."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    call = _one_run_call(tmp_path / "call")
    steps = call / "engine" / "full" / "steps.csv"
    lines = steps.read_text().splitlines(keepends=True)
    steps.write_text("".join(lines[: len(lines) // 2]))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for out, phrase in ((tmp_path / "out", "but metrics.json counts"), (blocker, "not a folder")):
        with pytest.raises(SystemExit) as exit_:
            main([str(call), "--out", str(out)])
        err = capsys.readouterr().err.strip()
        assert exit_.value.code == 2 and len(err.splitlines()) == 1 and phrase in err, err


FIFTH_RUN = FIRST_RUN.parent / "fifth-run"
H100_NAME = "NVIDIA H100 80GB HBM3"  # what torch.cuda.get_device_name reports on an H100 SXM


def _fifth_run_call(call: Path) -> Path:
    """A gpu_all.sh output with the fifth call's profile and its OPT-13B vllm offline run."""
    shutil.copytree(FIFTH_RUN / "profile", call / "profile")
    (call / "engine").mkdir()
    shutil.copy(FIFTH_RUN / "engine" / "trace_opt-13b.csv", call / "engine")
    run = "opt-13b_vllm_offline"
    shutil.copytree(FIFTH_RUN / "engine" / run, call / "engine" / run)
    return call


def _edit_sidecar(call: Path, **keys: object) -> None:
    path = call / "profile" / "operator_profile.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **keys}, indent=2))


def test_a_run_on_an_h100_gives_a_report(tmp_path: Path) -> None:
    """The same files as an H100 would write them: the profile names the device as torch
    does, the run was served with the H100's hardware entry."""
    import yaml

    call = _fifth_run_call(tmp_path / "call")
    _edit_sidecar(call, gpu=H100_NAME)
    config = call / "engine" / "opt-13b_vllm_offline" / "config.yaml"
    doc = yaml.safe_load(config.read_text())
    doc["hardware"] = yaml.safe_load((ROOT / "configs/hardware/h100.yaml").read_text())
    config.write_text(yaml.safe_dump(doc))
    assert main([str(call), "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["hardware"] == "h100" and report["runs"] == ["opt-13b_vllm_offline"]
    assert len(pd.read_csv(tmp_path / "out" / "cross_run.csv")) == 1


def test_a_cut_profile_skips_only_the_tables_that_price_with_it(tmp_path: Path, capsys) -> None:
    """A profile its time limit cut short (``complete`` false) or a call without one: the
    stalls, the sync check and the host time are still reported, the rest skipped, said."""
    call = _fifth_run_call(tmp_path / "call")
    _edit_sidecar(call, complete=False)
    for out in ("cut", "none"):
        if out == "none":
            shutil.rmtree(call / "profile")
        assert main([str(call), "--out", str(tmp_path / out)]) == 0
        said = capsys.readouterr().out
        assert "skipped" in said and "operator_profile" in said
        for table in ("operators", "forward_gap", "speed", "cross_run"):
            assert (tmp_path / out / f"{table}.csv").read_text() == "", table
        assert len(pd.read_csv(tmp_path / out / "stalls.csv")) == 1


def test_a_steps_file_without_a_column_is_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    """(A run of another model than the profile's is read for its stalls alone.)"""
    call = _fifth_run_call(tmp_path / "call")
    run = "opt-1.3b_vllm_offline"
    shutil.copytree(FIFTH_RUN / "engine" / run, call / "engine" / run)
    steps = call / "engine" / run / "steps.csv"
    pd.read_csv(steps).drop(columns="duration_s").to_csv(steps, index=False)
    with pytest.raises(SystemExit) as exit_:
        main([str(call), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
    assert str(steps) in err and "duration_s" in err


def test_an_unknown_hardware_name_is_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    call = _fifth_run_call(tmp_path / "call")
    for hardware, says in (("b300", "unknown GPU"), ("h100", "measured on h200")):
        with pytest.raises(SystemExit) as exit_:
            main([str(call), "--out", str(tmp_path / "out"), "--hardware", hardware])
        err = capsys.readouterr().err.strip()
        assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
        assert err.startswith("error: --hardware: ") and says in err, err
