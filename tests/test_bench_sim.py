"""The simulator benchmark on a seconds-long trace: both modes, files, and bookkeeping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from experiments.bench.sim import COLUMNS, main

ROOT = Path(__file__).resolve().parents[1]


def test_bench_sim_times_loop_and_whole_run(tmp_path):
    table = main(["--duration", "5", "--systems", "vllm", "--out", str(tmp_path)])
    assert list(table["mode"]) == ["loop", "e2e"]
    loop, e2e = table.iloc[0], table.iloc[1]
    # The subprocess simulates the same trace as the in-process loop.
    for key in ("requests", "steps", "sim_s"):
        assert loop[key] == e2e[key]
    assert loop["requests"] > 0 and loop["steps"] > 0
    # A whole run (interpreter, imports, files) costs more than its loop.
    assert e2e["cpu_s"] > loop["cpu_s"] > 0
    assert (table["speed_vs_real_cpu"] == table["sim_s"] / table["cpu_s"]).all()
    written = pd.read_csv(tmp_path / "bench_sim.csv")
    assert list(written.columns) == list(COLUMNS)
    doc = json.loads((tmp_path / "bench_sim.json").read_text())
    assert doc["setup"]["duration_s"] == 5 and len(doc["rows"]) == 2
    assert (
        doc["command"]
        == f"python -m experiments.bench.sim --duration 5 --systems vllm --out {tmp_path}"
    )
    assert "git_commit" in doc and "git_dirty" in doc
    assert doc["machine"]["cpu_count"] >= 1


def test_bench_sim_times_each_clock(tmp_path):
    table = main(
        ["--duration", "5", "--systems", "vllm", "--modes", "loop", "--cost", "roofline",
         "paper-a100", "--out", str(tmp_path)]
    )  # fmt: skip
    assert list(table["cost"]) == ["roofline", "paper-a100"]
    roofline, paper = table.iloc[0], table.iloc[1]
    assert roofline["requests"] == paper["requests"]
    # The paper-era clock's steps are slower than the bare roofline's lower bound.
    assert paper["sim_s"] >= roofline["sim_s"]


def test_bench_sim_repeats_alternately_and_takes_medians(tmp_path):
    table = main(
        ["--duration", "3", "--systems", "vllm", "--modes", "loop", "--repeat", "3",
         "--out", str(tmp_path)]
    )  # fmt: skip
    doc = json.loads((tmp_path / "bench_sim.json").read_text())
    assert doc["setup"]["repeat"] == 3 and len(doc["runs"]) == 3 and len(table) == 1
    cpus = sorted(run["cpu_s"] for run in doc["runs"])
    assert table.iloc[0]["cpu_s"] == cpus[1]
    assert {run["steps"] for run in doc["runs"]} == {table.iloc[0]["steps"]}


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--out", "{file}"], "--out: {file} is a file, not a folder"),
        (["--out", "{file}/sub"], "lies under {file}, a file"),
        (["--duration", "nan"], "--duration and --rate must be finite and > 0"),
        (["--seed", "-3"], "--seed must be >= 0"),
    ],
)
def test_bench_sim_refuses_bad_options_before_measuring(
    args: list[str], phrase: str, tmp_path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One line and status 2, before any run is timed (nothing printed of a run)."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = [a.format(file=blocker) for a in args]
    with pytest.raises(SystemExit) as exit_:
        main(["--duration", "5", "--systems", "vllm", "--modes", "loop", *argv])
    captured = capsys.readouterr()
    assert exit_.value.code == 2
    err = captured.err.strip()
    assert phrase.format(file=blocker) in err and len(err.splitlines()) == 1
    assert "wall" not in captured.out


@pytest.mark.parametrize("modes", [["e2e"], ["loop"]])
def test_bench_sim_refuses_a_workload_with_no_requests(modes: list[str], tmp_path) -> None:
    """0.01 s of arrivals at 1 req/s draws no request: one line naming --duration and
    --rate, status 2, nothing written (it was a traceback from the e2e child's empty run)."""
    argv = ["--duration", "0.01", "--rate", "1", "--systems", "vllm", "--modes", *modes]
    cmd = [sys.executable, "-m", "experiments.bench.sim", *argv, "--out", str(tmp_path / "o")]
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err
    assert "--duration" in err and "--rate" in err and "no request" in err
    assert not (tmp_path / "o").exists() and done.stdout == ""
