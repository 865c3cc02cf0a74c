"""The CPU engine's cross-run validation script, on tiny-opt (--quick)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from experiments.bench.cpu_cross_run import (
    KEYS,
    LABELS,
    PAIRS,
    PROFILE_PASSES,
    STRETCHES_PER_SWEEP,
    main,
)
from sim.cost.calibrated import ROOFLINE_TERMS


@pytest.mark.slow
def test_calibrate_on_one_run_validate_on_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--out", str(tmp_path), "--quick"]) == 0
    doc = json.loads((tmp_path / "cross_run.json").read_text())
    pairs = {(r["calibrated_on"], r["validated_on"], r["role"]) for r in doc["rows"]}
    expected = {
        (LABELS[fit], LABELS[t], "in-sample" if t == fit else "other run")
        for fit, targets in PAIRS
        for t in targets
    }
    assert pairs == expected
    # the span run is validated on both runs it was not fitted on
    assert (LABELS["s"], LABELS["a"], "other run") in pairs
    assert (LABELS["s"], LABELS["b"], "other run") in pairs
    for row in doc["rows"]:
        assert row["metric"] in KEYS
        assert row["rel_err"] is not None and math.isfinite(row["rel_err"])
    # A and B served again with the same config: the engine against itself
    rep = {(r["run"], r["metric"]) for r in doc["repeatability"]}
    assert rep == {(LABELS[n], k) for n in ("a", "b") for k in KEYS}
    assert all(math.isfinite(r["rel_diff"]) for r in doc["repeatability"])
    for again, first in (("a2", "a"), ("b2", "b")):
        assert (tmp_path / f"run_{again}" / "config.yaml").read_text() == (
            tmp_path / f"run_{first}" / "config.yaml"
        ).read_text()
    for cal in doc["calibrations"].values():
        assert cal["fit_stats"]["weighting"] == "relative"
    cfg = {n: (tmp_path / f"run_{n}" / "config.yaml").read_text() for n in LABELS}
    assert "sharegpt" in cfg["a"] and "alpaca" in cfg["b"]  # another workload ...
    assert "rate: 30" in cfg["a"] and "rate: 60" in cfg["b"]  # ... and another rate
    assert "sigma_input: 2.0" in cfg["s"] and "rate: 40" in cfg["s"]  # the wide span run
    # by default the runs and the profile were served and taken together, a step in turn,
    # paced by a pilot profile taken first
    assert doc["sitting"] == "interleaved"
    record = json.loads((tmp_path / "sitting.json").read_text())
    assert record == doc["sitting_record"]
    assert record["pilot_profile"] == str(tmp_path / "pilot_profile")
    assert (tmp_path / "pilot_profile" / "operator_profile.csv").is_file()
    people = {r["participant"]: r for r in record["participants"]}
    assert set(people) == {*LABELS, "profile"}
    for name in LABELS:
        engine = json.loads((tmp_path / f"run_{name}" / "engine.json").read_text())
        assert people[name]["units"] == engine["num_steps"] > 0
        assert 0 <= people[name]["first"] <= people[name]["median"] <= people[name]["last"] <= 1
    sidecar = json.loads((tmp_path / "operator_profile" / "operator_profile.json").read_text())
    assert sidecar["complete"] and "interleaved" in sidecar["sitting"]
    assert "--single-calls" in sidecar["command"]
    # the machine's speed per stretch of a profile sweep, and every pair again with each
    # step at it
    assert len(doc["speed_timeline"]) == PROFILE_PASSES * STRETCHES_PER_SWEEP
    assert all(s > 0 for s in doc["speed_timeline"])
    assert [{k: r[k] for k in ("calibrated_on", "validated_on", "metric")}
            for r in doc["timed_rows"]] == [
        {k: r[k] for k in ("calibrated_on", "validated_on", "metric")} for r in doc["rows"]
    ]  # fmt: skip
    assert len(doc["timed_open_loop"]) == len(doc["open_loop"])
    # and at that speed shrunk toward the price by its own scatter: one speed per stretch,
    # each between the price and the speed measured there
    shrink = doc["speed_shrinkage"]
    assert len(shrink["speeds"]) == len(doc["speed_timeline"]) and shrink["tau"] >= 0
    for kept, measured in zip(shrink["speeds"], doc["speed_timeline"], strict=True):
        assert min(1.0, measured) - 1e-12 <= kept <= max(1.0, measured) + 1e-12
    assert [{k: r[k] for k in ("calibrated_on", "validated_on", "metric")}
            for r in doc["shrunk_rows"]] == [
        {k: r[k] for k in ("calibrated_on", "validated_on", "metric")} for r in doc["rows"]
    ]  # fmt: skip
    assert len(doc["shrunk_open_loop"]) == len(doc["open_loop"])
    # --reuse-runs recalibrates on the runs already served: their steps are left untouched
    steps = {n: (tmp_path / f"run_{n}" / "steps.csv").read_bytes() for n in cfg}
    (tmp_path / "cross_run.json").unlink()
    assert main(["--out", str(tmp_path), "--quick", "--reuse-runs"]) == 0
    assert {n: (tmp_path / f"run_{n}" / "steps.csv").read_bytes() for n in cfg} == steps
    again = json.loads((tmp_path / "cross_run.json").read_text())
    assert again["rows"] == doc["rows"]
    assert again["sitting"] == "reused" and again["sitting_record"] == record
    assert doc["system"] == again["system"] == "vllm"
    # runs kept from another system are one line, before anything is served
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path), "--quick", "--reuse-runs", "--system", "vllm_v1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --system: run_s was served under vllm") and "\n" not in err
    # a missing profile is taken alone, the runs kept
    import shutil

    shutil.rmtree(tmp_path / "operator_profile")
    assert main(["--out", str(tmp_path), "--quick", "--reuse-runs"]) == 0
    assert (tmp_path / "operator_profile" / "operator_profile.csv").is_file()
    assert {n: (tmp_path / f"run_{n}" / "steps.csv").read_bytes() for n in cfg} == steps
    alone = json.loads((tmp_path / "sitting.json").read_text())["participants"]
    assert [r["participant"] for r in alone] == ["profile"]
    assert set(doc["step_timers"].values()) == {"thread_cpu"}
    # by default every model is fitted on top of the profile the script took first
    assert doc["profile"] == str(tmp_path / "operator_profile")
    for cal in doc["calibrations"].values():
        assert cal["profile"] == doc["profile"]
        assert [cal["coefficients"][t] for t in ROOFLINE_TERMS] == [0.0, 0.0, 0.0]
    # each run's speed against the profile: a ratio per window of decode steps
    assert [d["run"] for d in doc["drift"]] == list(LABELS.values())
    for d in doc["drift"]:
        assert d["decode_steps"] > 0 and len(d["windows"]) == -(-d["decode_steps"] // 100)
        assert 0 < d["window_min"] <= d["window_max"] and d["median"] > 0
    # --profile none: the roofline basis alone, on the same runs
    assert main(["--out", str(tmp_path), "--quick", "--reuse-runs", "--profile", "none"]) == 0
    bare = json.loads((tmp_path / "cross_run.json").read_text())
    assert bare["profile"] is None
    assert all("profile" not in cal for cal in bare["calibrations"].values())
    assert bare["drift"] == []


def test_a_missing_profile_is_one_line_before_anything_is_served(tmp_path: Path, capsys) -> None:
    import pytest

    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path), "--quick", "--profile", str(tmp_path / "nope")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --profile: ") and "no such profile" in err and "\n" not in err
    assert not list(tmp_path.glob("run_*"))


@pytest.mark.slow
def test_profile_each_prices_every_run_on_its_own_profile(tmp_path: Path) -> None:
    """--profile each: a profile beside every run, the calibration names its own run's,
    and the validation of another run uses that run's."""
    argv = ["--out", str(tmp_path), "--quick", "--profile", "each", "--sitting", "sequential"]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "cross_run.json").read_text())
    for name in LABELS:
        assert (tmp_path / f"run_{name}" / "operator_profile" / "operator_profile.csv").is_file()
    for fit_on, _ in PAIRS:
        cal = json.loads((tmp_path / f"run_{fit_on}" / "calibration.json").read_text())
        assert cal["profile"] == str(tmp_path / f"run_{fit_on}" / "operator_profile")
    assert not (tmp_path / "operator_profile").exists()
    assert [d["run"] for d in doc["drift"]] == list(LABELS.values())
    assert all(math.isfinite(r["rel_err"]) for r in doc["rows"])
    assert doc["sitting"] == "sequential" and doc["sitting_record"] is None


def test_profile_each_needs_a_sequential_sitting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path), "--quick", "--profile", "each"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --profile: ") and "--sitting sequential" in err
    assert "\n" not in err and not list(tmp_path.glob("run_*"))
