"""``experiments.bench.memory_scale``: a trace repeated end to end, simulated in a process of
its own, its peak memory measured."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from experiments.bench import memory_scale
from experiments.lib.checks import ConfigError

ROWS = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    f"2023-11-16 18:15:{10 + 2 * i:02d}.5000000,{40 + 7 * i},{5 + i}\n" for i in range(12)
)


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "azure.csv"
    path.write_text(ROWS)
    return path


def test_each_copy_follows_the_last_a_second_after_the_trace_spans(tmp_path: Path) -> None:
    out = tmp_path / "x3.csv"
    assert memory_scale.repeated_trace(_trace(tmp_path), 3, out) == 36
    times = pd.to_datetime(pd.read_csv(out)["TIMESTAMP"])
    span = pd.Timedelta(seconds=22)  # 12 arrivals 2 s apart
    assert times.is_monotonic_increasing
    assert times[12] - times[0] == times[24] - times[12] == span + pd.Timedelta(seconds=1)
    assert pd.read_csv(out)["ContextTokens"].tolist() == [40 + 7 * i for i in range(12)] * 3


def test_a_run_per_copy_count_is_measured_and_written(tmp_path: Path) -> None:
    args = ["--trace", str(_trace(tmp_path)), "--copies", "1", "2", "--out", str(tmp_path / "o"),
            "model=opt-125m", "hardware=h100"]  # fmt: skip
    table = memory_scale.main(args)
    assert table["copies"].tolist() == [1, 2] and table["requests"].tolist() == [12, 24]
    assert (table["steps"] > 0).all() and (table["peak_rss_mb"] > 10).all()
    per_request = table["peak_rss_mb"] * 1024 / table["requests"]
    assert table["kb_per_request"].tolist() == pytest.approx(per_request.tolist(), rel=1e-2)
    doc = json.loads((tmp_path / "o" / "bench_memory.json").read_text())
    assert doc["overrides"] == ["model=opt-125m", "hardware=h100"] and len(doc["rows"]) == 2
    assert pd.read_csv(tmp_path / "o" / "bench_memory.csv")["copies"].tolist() == [1, 2]


def test_a_trace_that_is_not_azure_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match=r"--trace: .*bad\.csv is not a readable Azure trace"):
        memory_scale.repeated_trace(bad, 2, tmp_path / "out.csv")
