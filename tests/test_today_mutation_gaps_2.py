"""Tests from a mutation audit of three commits: sweep_plot's averaged-keys warning, the
profile-transfer log line, write_atomic's WriteError and capacity's full-disk line, the
block-move totals, and the system label a run's config.yaml keeps. Each kills a mutant the
suite let live."""

from __future__ import annotations

import errno
import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from omegaconf import OmegaConf

from core.metrics.summary import block_moves
from experiments.lib import results
from experiments.lib.cli import settle_run_config
from experiments.report.sweep_plot import averaged_keys
from experiments.simulate import profile_transfer_note


def _frame(rows: list[dict]) -> pd.DataFrame:
    """A summary.csv's layout: the overrides, then a headline metric and status."""
    return pd.DataFrame([{**r, "completed": 10, "status": r.get("status", "ok")} for r in rows])


def test_seeds_and_a_key_of_one_value_are_not_warned_of() -> None:
    frame = _frame(
        [{"job": i, "hardware": "l40s", "seed": s, "workload": "azure_conv", "system": "vllm"}
         for i, s in enumerate((1, 2))]
    )  # fmt: skip
    assert averaged_keys(frame, "hardware", "system") == {}


def test_a_key_that_differs_only_across_hues_is_not_averaged() -> None:
    # each (system, hardware) point holds one block size: the hue tells them apart
    frame = _frame(
        [{"job": i, "system": s, "system.block_size": b, "hardware": h}
         for i, (s, b, h) in enumerate(
             [("vllm", 16, "l40s"), ("vllm", 16, "h100"),
              ("vllm_v1", 32, "l40s"), ("vllm_v1", 32, "h100")])]
    )  # fmt: skip
    assert averaged_keys(frame, "hardware", "system") == {}


def test_a_failed_row_does_not_count_as_a_value_averaged() -> None:
    frame = _frame(
        [{"job": 0, "hardware": "l40s", "cost": "roofline"},
         {"job": 1, "hardware": "l40s", "cost": "profiled", "status": "failed"}]
    )  # fmt: skip
    assert averaged_keys(frame, "hardware", None) == {}


def test_a_missing_value_beside_a_value_is_a_difference() -> None:
    frame = _frame(
        [{"job": 0, "hardware": "l40s", "cost": "roofline"},
         {"job": 1, "hardware": "l40s", "cost": None}]
    )  # fmt: skip
    assert list(averaged_keys(frame, "hardware", None)) == ["cost"]


def test_no_finished_row_or_no_headline_metric_warns_of_nothing() -> None:
    failed = _frame(
        [{"job": i, "hardware": "l40s", "cost": c, "status": "failed"}
         for i, c in enumerate(("roofline", "profiled"))]
    )  # fmt: skip
    assert averaged_keys(failed, "hardware", None) == {}
    # nothing tells the overrides from the metrics: none is named
    own = pd.DataFrame({"hardware": ["l40s", "l40s"], "my_metric": [1.0, 2.0]})
    assert averaged_keys(own, "hardware", None) == {}


def _cost(prof_gpu: str, model: str | None, same: bool) -> SimpleNamespace:
    prof = SimpleNamespace(gpu=prof_gpu, model=model)
    return SimpleNamespace(profile=prof, gpu=SimpleNamespace(name="l40s"), same=same)


def test_a_profile_used_as_measured_says_nothing_of_scaling() -> None:
    # as_measured (a CPU's profile, say): same is set though the names differ
    assert profile_transfer_note(_cost("cpu", "opt-125m", same=True)) is None


def test_a_profile_without_a_model_names_its_layer() -> None:
    note = profile_transfer_note(_cost("a100-80gb", None, same=False))
    assert note is not None and "on a100-80gb (its profiled layer)" in note


def test_write_atomic_refuses_a_folder_and_a_file_in_the_way_as_write_errors(
    tmp_path: Path,
) -> None:
    # run_app and capacity turn a WriteError, not any OSError, into the one line
    with pytest.raises(results.WriteError) as folder:
        results.write_atomic(tmp_path, "x")
    assert folder.value.filename == str(tmp_path)
    (tmp_path / "f").write_text("")
    with pytest.raises(results.WriteError) as blocked:
        results.write_atomic(tmp_path / "f" / "m.json", "x")
    assert blocked.value.filename == str(tmp_path / "f" / "m.json")
    assert "is a file, not a folder" in str(blocked.value.strerror)


def test_a_writers_own_write_error_keeps_its_file(tmp_path: Path) -> None:
    def inner(_: Path) -> None:
        raise results.WriteError(errno.ENOSPC, "No space left on device", "inner.csv")

    with pytest.raises(results.WriteError) as caught:
        results.write_atomic(tmp_path / "outer.csv", inner)
    assert caught.value.filename == "inner.csv"


def test_an_error_without_strerror_keeps_its_message(tmp_path: Path) -> None:
    def gone(_: Path) -> None:
        raise OSError("the mount went away")

    with pytest.raises(results.WriteError) as caught:
        results.write_atomic(tmp_path / "a.csv", gone)
    assert caught.value.strerror == "the mount went away"


def test_capacity_reraises_a_write_error_under_full_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from experiments import capacity

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results, "_to_csv", disk_full)  # runs.csv's writer
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    out = tmp_path / "cap"
    argv = ["workload.duration_s=60", "--systems", "vllm", "--seeds", "1", "--rates", "0.5,1",
            "--workers", "1", "--bisect-evals", "1", "--out", str(out)]  # fmt: skip
    with pytest.raises(results.WriteError) as caught:
        capacity.main(argv)
    assert caught.value.filename == str(out / "runs.csv")


def test_block_moves_sums_each_column_under_its_own_key() -> None:
    steps = pd.DataFrame(
        {"copy_blocks": [1, 2], "swap_out_blocks": [3, 4], "swap_in_blocks": [5, 6]}
    )
    assert block_moves(steps) == {
        "total_copy_blocks": 3, "total_swap_out_blocks": 7, "total_swap_in_blocks": 11,
    }  # fmt: skip
    moves = block_moves(pd.DataFrame({"copy_blocks": [1]}))  # a table of one's own
    assert moves["total_copy_blocks"] == 1
    assert math.isnan(moves["total_swap_out_blocks"]) and math.isnan(moves["total_swap_in_blocks"])


@pytest.mark.parametrize(
    ("overrides", "label"),
    [(["+system=mine"], "mine"),  # added to a config without the group
     (["system=vllm", "system=mine"], "mine")],  # the last one given wins, as Hydra's
)  # fmt: skip
def test_the_system_label_follows_the_option_chosen(overrides: list[str], label: str) -> None:
    cfg = OmegaConf.create({"system": {"name": "vllm"}})
    settle_run_config(cfg, overrides)
    assert cfg.system.get("label") == label


def test_a_full_disk_fails_a_sweep_job_and_the_sweep_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    import experiments.simulate as app

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results, "_rows_to_csv", disk_full)  # steps.csv's writer
    sweep = tmp_path / "sweep"
    argv = ["simulate", "-m", "workload.num_requests=3,4", f"hydra.sweep.dir={sweep}",
            "index=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit):
        app.main_with_checks(app.main, config_name="simulate")
    err = capsys.readouterr().err
    assert err.count("failed: cannot write") == 2, err  # both jobs ran, each one line
    assert pd.read_csv(sweep / "summary.csv")["status"].tolist() == ["failed", "failed"]
