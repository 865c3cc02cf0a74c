"""``experiments.bench.cpu_error_parts``: a sitting's open-loop error split into the
profile's forward and the fitted host terms, plain and per sequence."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from core.plan import BatchShape
from experiments.bench.cpu_error_parts import error_parts, main, pooled_profile
from experiments.lib.checks import ConfigError
from sim.cost import CalibratedCostModel, ProfiledCostModel
from tests.test_cost_profiled import _random_steps, synthetic_rows, write_profile

C0, PER_SEQ = 2e-3, 1e-4


def make_sitting(root: Path, forward_scale: dict[str, float], host_scale: float) -> Path:
    """Runs whose forward takes ``forward_scale[run]`` times the profile's price and whose
    host time is ``host_scale`` times the terms ``C0 + PER_SEQ × seqs``; run s carries a
    calibration with exactly those terms."""
    prof = write_profile(root / "operator_profile", synthetic_rows(), gpu="cpu", model="opt-125m")
    ops = ProfiledCostModel(prof, "opt-125m", "h200", as_measured=True)
    for i, (run, scale) in enumerate(forward_scale.items()):
        steps = _random_steps(i, n=60)
        shapes = [BatchShape(*(int(x) for x in row)) for row in steps.itertuples(index=False)]
        seqs = steps["prefill_seqs"] + steps["decode_seqs"]
        steps["forward_s"] = np.array([ops.gpu_seconds(s) for s in shapes]) * scale
        steps["transfer_s"] = 1e-3  # neither priced nor counted as host time
        host = (C0 + PER_SEQ * seqs) * host_scale
        steps["duration_s"] = steps["forward_s"] + steps["transfer_s"] + host
        (root / f"run_{run}").mkdir()
        steps.to_csv(root / f"run_{run}" / "steps.csv", index=False)
    terms = {"constant": C0, "per_sequence": PER_SEQ, "per_prefill_sequence": 0.0,
             "linear_flop_time": 0.0, "attn_flop_time": 0.0, "byte_time": 0.0}  # fmt: skip
    model = CalibratedCostModel("opt-125m", "h200", terms, profile=str(prof))
    doc = {**model.to_dict(), "profile": "somewhere/else"}  # the sitting's own one is used
    (root / "run_s" / "calibration.json").write_text(json.dumps(doc))
    return root


def test_each_part_is_the_error_put_into_it(tmp_path: Path) -> None:
    sitting = make_sitting(tmp_path, {"s": 1.0, "a": 1.25, "b": 0.8}, host_scale=2.0)
    rows = {r["run"]: r for r in error_parts(sitting)}
    assert list(rows) == ["a", "b", "s"]
    for run, scale in (("s", 1.0), ("a", 1.25), ("b", 0.8)):
        r = rows[run]
        assert r["forward"] == pytest.approx(1 / scale - 1, abs=1e-9)
        assert r["forward_per_seq"] == pytest.approx(1 / scale - 1, abs=1e-9)
        assert r["forward_decode_many"] == pytest.approx(1 / scale - 1, abs=1e-9)
        assert r["host"] == pytest.approx(-0.5, abs=1e-9)  # measured twice the terms
        assert r["host_per_seq"] == pytest.approx(-0.5, abs=1e-9)
        assert 0 < r["host_share"] < 1
        lo, hi = sorted((r["forward"], r["host"]))
        assert lo <= r["step"] <= hi  # the whole step lies between its parts


def test_per_sequence_weighting_follows_the_steps_with_many_sequences(tmp_path: Path) -> None:
    """A forward that runs slow only in steps of many sequences: the per-sequence error is
    the larger one."""
    sitting = make_sitting(tmp_path, {"s": 1.0}, host_scale=1.0)
    steps = pd.read_csv(sitting / "run_s" / "steps.csv")
    many = (steps["prefill_seqs"] + steps["decode_seqs"]) >= 20
    steps.loc[many, "forward_s"] *= 1.5
    steps.loc[many, "duration_s"] += steps.loc[many, "forward_s"] / 3  # the added half
    steps.to_csv(sitting / "run_s" / "steps.csv", index=False)
    (r,) = error_parts(sitting)
    assert r["forward_per_seq"] < r["forward"] < 0
    assert r["forward_decode_one"] == pytest.approx(0.0, abs=1e-9)
    assert r["forward_decode_many"] < 0
    assert r["host"] == pytest.approx(0.0, abs=1e-9)


def test_the_script_writes_its_table_and_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sitting = make_sitting(tmp_path / "sit", {"s": 1.0, "a": 1.1}, host_scale=1.0)
    assert main([str(sitting)]) == 0
    table = pd.read_csv(sitting / "error_parts.csv")
    assert list(table["run"]) == ["a", "s"]
    for argv in ([str(sitting), "--fit-on", "a"], [str(tmp_path / "nowhere")]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("error: --fit-on:") and "run_a/calibration.json" in err[0]
    assert err[1].startswith("error: SITTING_DIR: not a directory")


def test_a_pooled_profile_is_each_points_geometric_mean(tmp_path: Path) -> None:
    rows = synthetic_rows()
    slow = [(op, n, c, t * 4) for op, n, c, t in rows]
    a = write_profile(tmp_path / "a", rows, gpu="cpu", model="opt-125m")
    b = write_profile(tmp_path / "b", slow, gpu="cpu", model="opt-125m")
    pooled = pd.read_csv(pooled_profile([a, b], tmp_path / "pooled") / "operator_profile.csv")
    first = pd.read_csv(a / "operator_profile.csv").sort_values(["op", "num_tokens",
                                                                 "context_tokens"])  # fmt: skip
    assert pooled["time_ms"].to_numpy() == pytest.approx(2 * first["time_ms"].to_numpy())
    with pytest.raises(ConfigError, match="--profile-from: its points differ"):
        pooled_profile([a, write_profile(tmp_path / "c", rows[:-1])], tmp_path / "bad")


def test_priced_on_other_profiles_an_error_of_the_runs_stays(tmp_path: Path) -> None:
    """Runs whose forward is 25% slower than their own sitting's profile are also 25% slow
    against a pool of profiles that agree with it; a pool of profiles twice as fast halves
    every price."""
    sitting = make_sitting(tmp_path / "sit", {"s": 1.0, "a": 1.25}, host_scale=1.0)
    rows = synthetic_rows()
    same = [write_profile(tmp_path / f"p{i}", rows, gpu="cpu", model="opt-125m") for i in (1, 2)]
    fast = write_profile(tmp_path / "fast", [(o, n, c, t / 2) for o, n, c, t in rows],
                         gpu="cpu", model="opt-125m")  # fmt: skip
    own = {r["run"]: r["forward"] for r in error_parts(sitting)}
    pooled = {r["run"]: r["forward"] for r in error_parts(sitting, "s", pooled_profile(
        same, tmp_path / "pool"))}  # fmt: skip
    assert pooled == pytest.approx(own)
    halved = error_parts(sitting, "s", pooled_profile([fast], tmp_path / "pool_fast"))
    assert {r["run"]: r["forward"] for r in halved} == pytest.approx(
        {run: (1 + e) / 2 - 1 for run, e in own.items()}
    )


def test_at_the_sittings_speed_a_drift_the_sweeps_measured_goes_away(tmp_path: Path) -> None:
    """A machine at half the profile's time in the first half of the sitting and 1.5 times
    in the second, as two sweeps measured it: runs timed on it are off as is, exact timed;
    one-sequence decode steps put at the end are placed there."""
    sitting = make_sitting(tmp_path, {"s": 1.0, "a": 1.0}, host_scale=1.0)
    table = pd.read_csv(sitting / "operator_profile" / "operator_profile.csv")
    table["sweeps_ms"] = [f"{t * 0.5};{t * 1.5}" for t in table["time_ms"]]
    table.to_csv(sitting / "operator_profile" / "operator_profile.csv", index=False)
    expected = {}
    for run in ("s", "a"):
        path = sitting / f"run_{run}" / "steps.csv"
        steps = pd.read_csv(path)
        one = (steps["prefill_tokens"] == 0) & (steps["decode_seqs"] == 1)
        steps = pd.concat([steps[~one], steps[one]], ignore_index=True)  # one-seq steps last
        n = expected[run] = len(steps)
        speed = np.where((np.arange(n) + 0.5) / n < 0.5, 0.5, 1.5)
        host = steps["duration_s"] - steps["forward_s"] - steps["transfer_s"]
        steps["forward_s"] *= speed
        steps["duration_s"] = steps["forward_s"] + steps["transfer_s"] + host * speed
        steps.to_csv(path, index=False)
    record = {"participants": [{"participant": r, "expected": n} for r, n in expected.items()]}
    (sitting / "sitting.json").write_text(json.dumps(record))
    as_is = {r["run"]: r for r in error_parts(sitting)}
    timed = {r["run"]: r for r in error_parts(sitting, timed=True)}
    for run in ("s", "a"):
        assert abs(as_is[run]["forward_decode_one"]) > 0.2  # priced at the mean speed
        for part in ("forward", "forward_per_seq", "forward_decode_one", "host", "step"):
            assert timed[run][part] == pytest.approx(0.0, abs=1e-9)
        assert timed[run]["one_at"] > 0.5 > timed[run]["many_at"]
    with pytest.raises(ConfigError, match="--timed: needs the sitting's own profile"):
        error_parts(sitting, profile=sitting / "operator_profile", timed=True)


def test_a_folder_without_runs_is_named_as_such(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "empty")])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2
    assert err.startswith("error: SITTING_DIR: holds no run_* folder")


def test_profiles_of_another_model_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a --profile-from measured on another model than the sitting's ended in a traceback
    sitting = make_sitting(tmp_path / "sit", {"s": 1.0, "a": 1.1}, host_scale=1.0)
    other = write_profile(tmp_path / "other", synthetic_rows(), gpu="cpu", model="tiny-opt")
    with pytest.raises(SystemExit) as exit_:
        main([str(sitting), "--profile-from", str(other)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "measured on tiny-opt" in err[0], err
