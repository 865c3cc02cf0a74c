"""experiments.bench.host_time: the dry run on CPU, step kinds, and GC time kept apart."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pandas as pd

from experiments.bench.host_time import PARTS, HostTally, main, step_kind


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
