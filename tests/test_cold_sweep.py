"""Setting a profile's cold first sweeps aside (experiments.bench.cold_sweep)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from experiments.bench.cold_sweep import cold_sweeps, main, set_aside
from experiments.lib.checks import ConfigError


def _profile(path: Path, sweeps: list[list[float]], method: str) -> Path:
    path.mkdir()
    rows = [
        {"op": "linear", "num_tokens": i + 1, "context_tokens": 0, "time_ms": sum(s) / len(s),
         "sweeps_ms": ";".join(map(str, s)), "sweep_units": ";".join(["0"] * len(s))}
        for i, s in enumerate(sweeps)
    ]  # fmt: skip
    pd.DataFrame(rows).to_csv(path / "operator_profile.csv", index=False)
    (path / "operator_profile.json").write_text(json.dumps({"method": method, "gpu": "cpu"}))
    return path


def test_the_summary_leaves_the_cold_sweeps_out(tmp_path: Path) -> None:
    src = _profile(tmp_path / "p", [[9.0, 1.0, 2.0, 6.0], [4.0, 2.0, 2.0, 2.0]], "mean of 4")
    out = set_aside(src, tmp_path / "out", 1)
    table = pd.read_csv(out / "operator_profile.csv")
    assert table["time_ms"].tolist() == [3.0, 2.0]
    assert (
        table["sweeps_ms"].tolist()
        == pd.read_csv(src / "operator_profile.csv")["sweeps_ms"].tolist()
    )  # the sweeps keep their places
    meta = json.loads((out / "operator_profile.json").read_text())
    assert cold_sweeps(meta) == 1 and meta["gpu"] == "cpu"
    # a median profile keeps the median; two sweeps set aside
    med = _profile(tmp_path / "m", [[9.0, 9.0, 1.0, 2.0, 6.0]], "median of 5 sweeps")
    assert pd.read_csv(set_aside(med, tmp_path / "m2", 2) / "operator_profile.csv")[
        "time_ms"
    ].tolist() == [2.0]
    # the source is untouched
    assert pd.read_csv(src / "operator_profile.csv")["time_ms"].tolist() == [4.5, 2.5]


def test_bad_input_names_the_key(tmp_path: Path) -> None:
    src = _profile(tmp_path / "p", [[9.0, 1.0, 2.0]], "mean of 3")
    with pytest.raises(ConfigError, match="--sweeps"):
        set_aside(src, tmp_path / "o", 3)
    with pytest.raises(ConfigError, match="--out"):
        set_aside(src, src, 1)
    with pytest.raises(ConfigError, match="PROFILE_DIR"):
        set_aside(tmp_path / "missing", tmp_path / "o2", 1)
    once = set_aside(src, tmp_path / "o3", 1)
    with pytest.raises(ConfigError, match="--sweeps"):  # fewer than already set aside
        set_aside(once, tmp_path / "o4", 0)
    with pytest.raises(ConfigError, match="cold_sweeps"):
        cold_sweeps({"cold_sweeps": -1})
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "missing"), "--out", str(tmp_path / "o5")])
    assert exit_.value.code == 2
