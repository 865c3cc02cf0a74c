"""The GPU benchmark script, run in its ``--dry`` mode (CPU, Triton interpreter, tiny shapes)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from experiments.bench.kernels_gpu import SECTIONS, main

COLUMNS = {
    "correctness": {"kernel", "case", "dtype", "max_rel_err", "tol", "ok"},
    "fig18a": {
        "batch",
        "context",
        "heads",
        "head_dim",
        "paged_ms",
        "contiguous_ms",
        "ratio_paged_over_contiguous",
        "agree_rel_err",
    },
    "long_context": {
        "batch",
        "context",
        "num_splits",
        "ms",
        "kv_gbytes",
        "gbps",
        "gbps_no_split",
        "copy_gbps",
        "frac_of_copy_bw",
    },
    "block_size": {"block_size", "batch", "context", "ms", "gbps", "ratio_to_bs16"},
}


@pytest.mark.slow
def test_dry_run_writes_every_section(tmp_path: Path, capsys) -> None:
    assert main(["--out", str(tmp_path), "--dry"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["errors"] == {}
    meta = results["meta"]
    assert meta["dry"] is True and "MEANINGLESS" in meta["timings"]
    for key in ("device", "torch", "triton", "date", "command", "copy_gbps"):
        assert meta[key]
    assert "--dry" in meta["command"]
    for section in SECTIONS:
        with (tmp_path / f"{section}.csv").open() as f:
            rows = list(csv.DictReader(f))
        assert rows, f"{section}.csv is empty"
        assert COLUMNS[section] <= set(rows[0]), f"{section}.csv columns: {list(rows[0])}"
        assert len(results[section]) == len(rows)
    correctness = results["correctness"]
    assert {r["kernel"] for r in correctness} == {"paged_attention", "store_kv", "copy_blocks"}
    assert all(r["ok"] for r in correctness)
    assert {r["block_size"] for r in results["block_size"]} >= {8, 16}
    assert all(r["ms"] > 0 and r["gbps"] > 0 for r in results["long_context"])
    assert "fig18a" in capsys.readouterr().out
