"""experiments.bench.gpu_report on the committed first H200 run (no GPU needed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from experiments.bench.gpu_report import DECODE_SHAPES, PREFILL_TOKENS, main

FIRST_RUN = Path(__file__).resolve().parents[1] / "docs/validation/h200/first-run"
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


def test_a_directory_without_a_profile_is_one_line(tmp_path: Path, capsys) -> None:
    shutil.copytree(FIRST_RUN / "engine" / "opt-13b_vllm_offline", tmp_path / "engine" / "x")
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "operator_profile.json" in err


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
