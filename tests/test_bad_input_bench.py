"""Bad input to the small benchmark tools is one line on stderr naming the file (and line
and column), exit status 2, and no file rewritten: ``fill_sweep_units`` on a profile that is
empty, cut short or lacks a column; ``python -m`` on a library module says what it is."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from experiments.bench import fill_sweep_units, profile_gpu
from experiments.bench.tables import write_csv
from experiments.lib.checks import ConfigError
from experiments.lib.inputs import check_whole

HEADER = "op,num_tokens,context_tokens,time_ms,sweeps_ms\n"
GOOD = HEADER + "linear,1,0,2.5,2.4;2.6\nlinear,2,0,2.7,2.6;2.8\n"


def _profile(tmp_path: Path, text: str) -> Path:
    (tmp_path / "operator_profile.csv").write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "is empty"),
        (GOOD[:-9], "line 3 has no newline at its end: the file was cut short"),
        (GOOD + "linear,4,0\n", "line 4 has 3 of the header's 5 fields"),
        ("op,num_tokens,context_tokens,time_ms\nlinear,1,0,2.5\n", "no column sweeps_ms"),
        (HEADER.replace(",sweeps_ms", "") + "linear,1,0,2.5\n", "no column sweeps_ms"),
        (GOOD.replace("linear,2,0", "linear,nan,0"), "line 3, column num_tokens: not a whole"),
        (GOOD.replace("linear,2,0", "linear,2,x"), "line 3, column context_tokens"),
        (GOOD.replace("2.7,2.6;2.8", ",2.6;2.8"), "line 3, column time_ms: empty"),
        (GOOD.replace("2.6;2.8", ""), "line 3, column sweeps_ms: not times"),
        (GOOD.replace("2.6;2.8", "2.6"), "line 3, column sweeps_ms: 1 sweeps where line 2 has 2"),
        (HEADER, "has a header but no rows"),
    ],
)  # fmt: skip
def test_fill_sweep_units_refuses_a_bad_profile_and_leaves_it_untouched(
    text: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _profile(tmp_path, text)
    with pytest.raises(SystemExit) as exit_:
        fill_sweep_units.main([str(folder), "--order", "sorted"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: {folder}/operator_profile.csv: ")
    assert says in err
    assert (folder / "operator_profile.csv").read_text() == text


def test_fill_refuses_a_row_outside_the_plan_and_keeps_the_file(tmp_path: Path) -> None:
    plan = replace(profile_gpu.make_plan(dry=True), passes=2)
    text = GOOD.replace("linear,2,0", "linear,3,0")
    folder = _profile(tmp_path, text)
    with pytest.raises(ConfigError, match=r"line 3 \('linear', 3, 0\) is not a point"):
        fill_sweep_units.fill(folder, plan)
    assert (folder / "operator_profile.csv").read_text() == text


def test_fill_keeps_every_other_cell_as_written(tmp_path: Path) -> None:
    plan = replace(profile_gpu.make_plan(dry=True), passes=2)
    text = GOOD.replace("2.5,2.4;2.6", "2.50,2.40;2.60")
    folder = _profile(tmp_path, text)
    assert fill_sweep_units.fill(folder, plan) == 2
    lines = (folder / "operator_profile.csv").read_text().splitlines()
    assert lines[0] == HEADER.strip() + ",sweep_units"
    assert lines[1] == "linear,1,0,2.50,2.40;2.60,0;0"


def test_a_csv_write_csv_wrote_is_whole(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_csv(path, [{"a": 1, "b": "x,y"}, {"a": 2, "b": ""}])
    check_whole(path)
    with pytest.raises(ConfigError, match="cannot read it"):
        check_whole(tmp_path / "absent.csv")


@pytest.mark.parametrize("module", ["speed_timeline", "interleave", "tables"])
def test_a_library_module_run_as_a_command_says_so(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", f"experiments.bench.{module}", "--help"],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "is a library module" in lines[0] and "used by" in lines[0]
    assert f"experiments.bench.{module}" in lines[0]


@pytest.mark.parametrize(
    ("module", "out", "extra"),
    [
        ("kernels_gpu", "{file}", ["--dry"]), ("engine_gpu", "{file}", ["--dry"]),
        ("sync_check", "{file}", ["--dry"]), ("host_time", "{file}/x", ["--dry"]),
        ("gpu_env", "{file}/env.json", ["--dry"]), ("cpu_cross_run", "{file}", ["--quick"]),
        ("profile_transfer", "{file}", ["--vidur", "{dir}"]),
    ],
)  # fmt: skip
def test_an_out_a_file_blocks_is_one_line_naming_out_before_any_work(
    module: str, out: str, extra: list[str], tmp_path: Path, capsys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """``--out`` that is a file, or lies under one (gpu_env's names a file to write)."""
    import importlib

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    main = importlib.import_module(f"experiments.bench.{module}").main
    argv = ["--out", out.format(file=blocker), *(a.format(dir=tmp_path) for a in extra)]
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = exit_.code
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: --out: ") and "a file, not a folder" in err, err
    assert captured.out == "" and blocker.read_text() == ""
