"""The CPU engine's cross-run validation script, on tiny-opt (--quick)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from experiments.bench.cpu_cross_run import KEYS, main


def test_calibrate_on_one_run_validate_on_another(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path), "--quick"]) == 0
    doc = json.loads((tmp_path / "cross_run.json").read_text())
    runs = {r["validated_on"] for r in doc["rows"]}
    assert runs == {"A (in-sample)", "B (other run)"}
    for row in doc["rows"]:
        assert row["metric"] in KEYS
        assert row["rel_err"] is not None and math.isfinite(row["rel_err"])
    cfg_a = (tmp_path / "run_a" / "config.yaml").read_text()
    cfg_b = (tmp_path / "run_b" / "config.yaml").read_text()
    assert "sharegpt" in cfg_a and "alpaca" in cfg_b  # another workload ...
    assert "rate: 30" in cfg_a and "rate: 60" in cfg_b  # ... and another rate
    # --reuse-runs recalibrates on the runs already served: their steps are left untouched
    steps_a = (tmp_path / "run_a" / "steps.csv").read_bytes()
    (tmp_path / "cross_run.json").unlink()
    assert main(["--out", str(tmp_path), "--quick", "--reuse-runs"]) == 0
    assert (tmp_path / "run_a" / "steps.csv").read_bytes() == steps_a
    again = json.loads((tmp_path / "cross_run.json").read_text())
    assert again["rows"] == doc["rows"]
