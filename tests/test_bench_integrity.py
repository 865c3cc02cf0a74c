"""``experiments.bench.integrity``: its table and files, and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from experiments.bench import integrity


def test_times_a_half_full_cache_and_writes_both_files(tmp_path: Path) -> None:
    table = integrity.main(["--models", "opt-125m", "--repeat", "1", "--out", str(tmp_path)])
    row = table.iloc[0]
    assert row["model"] == "opt-125m" and row["hardware"] == "a100-40gb"
    assert row["device_blocks"] // 2 <= row["blocks_held"] < row["device_blocks"]
    assert row["sequences"] > 0 and row["check_cpu_s"] >= 0
    written = pd.read_csv(tmp_path / "bench_integrity.csv")
    assert written.to_dict("records") == table.to_dict("records")
    data = json.loads((tmp_path / "bench_integrity.json").read_text())
    assert data["rows"][0]["blocks_held"] == row["blocks_held"] and data["machine"]["cpu_count"]
    assert data["command"] == (
        f"python -m experiments.bench.integrity --models opt-125m --repeat 1 --out {tmp_path}"
    )
    assert "git_commit" in data and "git_dirty" in data


def test_a_repeat_below_one_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        integrity.main(["--repeat", "0", "--out", str(tmp_path)])
    assert exit_.value.code == 2
    assert "--repeat: must be at least 1, got 0" in capsys.readouterr().err


def test_an_unknown_model_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        integrity.main(["--models", "no-such-model", "--out", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err and "Traceback" not in err
