"""``capacity.csv`` and ``runs.csv`` of ``experiments.capacity`` name the model, GPU and
clock of their runs, so that the files of searches of several settings can be joined."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from experiments import capacity

SMALL = ["workload.duration_s=30", "--systems", "vllm", "--seeds", "1", "--rates", "0.5,1,2",
         "--workers", "1", "--bisect-evals", "1"]  # fmt: skip


def test_capacity_and_runs_csv_name_the_model_gpu_and_clock(tmp_path: Path) -> None:
    """Before: neither file named the model, the GPU or the cost model (the heading, the
    figure's title and ``provenance.json`` did), so that the tables of two searches joined
    could not be told apart. Each row holds them after ``system``, as its runs'
    ``metrics.json`` names them."""
    out = capacity.main(["model=opt-1.3b", "hardware=h100", *SMALL,
                         "--out", str(tmp_path / "out")])  # fmt: skip
    setting = ["model", "hardware", "tp", "cost", "cost_stack"]
    for name in ("capacity.csv", "runs.csv"):
        table = pd.read_csv(out / name, keep_default_na=False)
        assert list(table.columns[:6]) == ["system", *setting], name
        assert set(map(tuple, table[setting].astype(str).values)) == {
            ("opt-1.3b", "h100", "1", "roofline", "none")
        }, name
    runs = pd.read_csv(out / "runs.csv", keep_default_na=False)
    metrics = json.loads((out / "runs" / runs["label"].iloc[0] / "metrics.json").read_text())
    assert [metrics[k] for k in ("model", "hardware", "tp", "cost_stack")] == [
        "opt-1.3b", "h100", 1, "none"
    ]  # fmt: skip


def test_capacity_csv_takes_each_systems_setting_from_its_rows() -> None:
    """Per system its own ``cost_stack`` (``cost=profiled`` prices ``vllm_v1`` in another
    stack than the paper's systems); rows without them (a report's) add no column."""
    rows = [
        {"setting": "search", "system": s, "model": "m", "hardware": "g", "tp": 2,
         "cost": "profiled", "cost_stack": stack, "rate": 1.0, "seed": 0, "passes": True,
         "fails_on": "", "normalized_latency": 0.1, "label": s}
        for s, stack in (("vllm", "vllm-2023"), ("vllm_v1", "vllm-v1"))
    ]  # fmt: skip
    cap = capacity.capacity_frame(rows, ["vllm_v1", "vllm"])
    assert list(cap.columns[:6]) == ["system", "model", "hardware", "tp", "cost", "cost_stack"]
    assert list(cap["cost_stack"]) == ["vllm-v1", "vllm-2023"]
    bare = [{k: v for k, v in r.items() if k not in capacity.SETTING_COLUMNS} for r in rows]
    assert not set(capacity.SETTING_COLUMNS) & set(capacity.capacity_frame(bare, ["vllm"]))


def test_each_systems_rows_name_its_own_clock_stack(tmp_path: Path) -> None:
    """``cost=profiled`` prices each system in its own stack: every system's rows name
    theirs (and the cost model's kind), not the first system's."""
    out = capacity.main(["workload.duration_s=5", "cost=profiled", "--systems", "vllm,vllm_v1",
                         "--seeds", "1", "--rates", "20", "--bisect-evals", "1", "--workers",
                         "1", "--out", str(tmp_path / "out")])  # fmt: skip
    for name in ("capacity.csv", "runs.csv"):
        table = pd.read_csv(out / name, keep_default_na=False)
        stacks = dict(zip(table["system"], table["cost_stack"], strict=True))
        assert stacks == {"vllm": "vllm-2023", "vllm_v1": "vllm-v1"}, name
        assert set(table["cost"]) == {"profiled"}, name
