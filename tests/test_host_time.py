"""experiments.bench.host_time: the dry run on CPU, step kinds, and GC time kept apart."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pandas as pd
import pytest

from experiments.bench.host_time import (
    PARTS,
    HostTally,
    linear_extra_ms,
    main,
    step_kind,
    summarize,
)


def test_dry_run_times_both_systems_by_part(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path), "--dry"]) == 0
    rows = pd.read_csv(tmp_path / "host_time.csv")
    assert set(rows.run) == {"vllm", "orca_oracle"}
    assert {"prefill", "decode"} <= set(rows.kind)
    assert (rows.total_ms >= rows.issue_ms).all()
    parts = rows[list(PARTS)]
    assert (parts >= 0).all().all() and (rows.attention > 0).all() and (rows.linear > 0).all()
    assert (parts.sum(axis=1) <= rows.issue_ms + 1e-6).all()  # parts never overlap
    summary = pd.read_csv(tmp_path / "host_time_summary.csv")
    assert summary.steps.sum() == len(rows)


def test_step_kinds() -> None:
    assert step_kind(66, 0) == "prefill"
    assert step_kind(66, 3) == "mixed"
    assert step_kind(0, 3) == "decode"
    assert step_kind(0, 0) == "empty"


def test_a_gc_pause_is_not_counted_in_the_part_it_interrupts() -> None:
    tally = HostTally()
    tally.active = True
    tally.open()
    tally.on_gc("start", {"generation": 2})
    time.sleep(0.05)
    tally.on_gc("stop", {"generation": 2})
    tally.close("linear")
    assert tally.seconds["gc"] >= 0.05
    assert tally.seconds["linear"] < 0.04
    assert tally.gc_generation == 2


def test_nothing_is_counted_outside_a_forward() -> None:
    tally = HostTally()
    gc.callbacks.append(tally.on_gc)
    try:
        tally.open()
        gc.collect()
        tally.close("norm")
    finally:
        gc.callbacks.remove(tally.on_gc)
    assert not tally.seconds and tally.gc_generation == -1


def _rows(linear: list[float], issue: list[float] | None = None) -> pd.DataFrame:
    n = len(linear)
    return pd.DataFrame({
        "run": ["vllm"] * n, "kind": ["decode"] * (n - 1) + ["prefill"], "linear": linear,
        "attention": [5.0] * n, "norm": [1.0] * n, "rest": [4.0] * n, "embedding": [0.0] * n,
        "gc": [0.0] * n, "issue_ms": issue or [15.0] * n, "total_ms": issue or [15.0] * n,
        "gc_generation": [-1] * n,
    })  # fmt: skip


def test_extra_linear_time_is_what_the_other_parts_do_not_explain() -> None:
    rows = _rows([5.0, 5.0, 5.0, 10.5])
    assert list(linear_extra_ms(rows)) == pytest.approx([0, 0, 0, 5.5])
    slow_host = rows.assign(linear=rows.linear * 2, attention=10.0, norm=2.0, rest=8.0)
    assert list(linear_extra_ms(slow_host)) == pytest.approx([0, 0, 0, 11.0])  # a ratio
    summary = summarize(_rows([5.0, 5.0, 5.0, 10.5], issue=[15.0, 15.0, 15.0, 400.0]))
    prefill = summary[summary.kind == "prefill"].iloc[0]
    assert prefill.linear_extra_steps == 1 and prefill.stall_steps == 1
    assert summary[summary.kind == "decode"].iloc[0].linear_extra_steps == 0


def test_summarize_rewrites_the_summary_and_refuses_another_file(tmp_path: Path, capsys) -> None:
    _rows([5.0, 5.0, 9.0]).to_csv(tmp_path / "host_time.csv", index=False)
    assert main(["--summarize", "--out", str(tmp_path)]) == 0
    assert pd.read_csv(tmp_path / "host_time_summary.csv").steps.sum() == 3
    for text in ("a,b\n1,2\n", _rows([5.0, 5.0]).assign(linear="x").to_csv(index=False), ""):
        (tmp_path / "host_time.csv").write_text(text)  # other columns, text numbers, empty
        capsys.readouterr()
        assert main(["--summarize", "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "host_time.csv" in err


def test_no_timed_forward_is_an_error_not_an_empty_table() -> None:
    with pytest.raises(ValueError, match="no forward calls"):
        summarize([])


def test_each_system_s_rows_are_written_when_its_run_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed while the second system serves keeps the first system's rows."""
    from experiments.bench import host_time

    def measure(dry: bool, system: str, out: Path) -> list[dict]:
        if system == host_time.SYSTEMS[1]:
            raise KeyboardInterrupt  # stands for the time limit's kill
        return [{"run": system, "step": 0, "issue_ms": 1.0}]

    monkeypatch.setattr(host_time, "measure", measure)
    with pytest.raises(KeyboardInterrupt):
        host_time.measure_all(True, tmp_path)
    assert pd.read_csv(tmp_path / "host_time.csv")["run"].tolist() == [host_time.SYSTEMS[0]]
