"""A result file that cannot be written (a disk that fills up while a run writes its tables)
is one line naming the file, not a traceback whose error names no file."""

from __future__ import annotations

import contextlib
import errno
import io
import sys
from pathlib import Path

import pandas as pd
import pytest

from experiments.lib import results


def _disk_full(*args: object, **kwargs: object) -> None:
    """What a write on a full disk raises: an OSError with no file name."""
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_write_that_fails_midway_names_the_file_meant(tmp_path: Path) -> None:
    target = tmp_path / "steps.csv"
    with pytest.raises(results.WriteError) as caught:
        results.write_atomic(target, _disk_full)
    assert caught.value.filename == str(target) and caught.value.errno == errno.ENOSPC
    assert not list(tmp_path.iterdir())  # no temporary file left


def _simulate_cli(monkeypatch: pytest.MonkeyPatch, run_dir: Path, index: str) -> tuple[int, str]:
    """``python -m experiments.simulate`` of 5 requests into ``run_dir``, in this process:
    its exit status and stderr."""
    import experiments.simulate as app

    argv = [
        "simulate", "workload.num_requests=5", f"hydra.run.dir={run_dir}", f"index={index}",
        "hydra/job_logging=disabled", "hydra/hydra_logging=disabled",
    ]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as caught:
        app.main_with_checks(app.main, config_name="simulate")
    return int(caught.value.code or 0), err.getvalue()


def test_a_full_disk_while_simulate_writes_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results, "_rows_to_csv", _disk_full)  # steps.csv's writer
    run_dir = tmp_path / "run"
    status, err = _simulate_cli(monkeypatch, run_dir, str(tmp_path / "index.csv"))
    assert status == 1
    assert "Traceback" not in err
    assert err.strip().splitlines() == [
        f"error: cannot write {run_dir / 'steps.csv'} (No space left on device): "
        "the run's results are not saved"
    ]
    assert not results.is_complete(run_dir)
    assert "No space left on device" in (run_dir / "error.txt").read_text()
    assert pd.read_csv(tmp_path / "index.csv")["status"].tolist() == ["failed"]


def test_a_full_disk_while_capacity_writes_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from experiments import capacity

    monkeypatch.setattr(results, "_to_csv", _disk_full)  # runs.csv's writer
    out = tmp_path / "cap"
    argv = ["workload.duration_s=60", "--systems", "vllm", "--seeds", "1", "--rates", "0.5,1",
            "--workers", "1", "--bisect-evals", "1", "--out", str(out)]  # fmt: skip
    with pytest.raises(SystemExit) as caught:
        capacity.main(argv)
    err = capsys.readouterr().err
    assert caught.value.code == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"error: cannot write {out / 'runs.csv'} (No space left on device)"
    )


def test_a_folder_where_a_run_file_goes_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # clearing the earlier run's files met a folder named steps.csv: a traceback
    run_dir = tmp_path / "run"
    (run_dir / "steps.csv").mkdir(parents=True)
    status, err = _simulate_cli(monkeypatch, run_dir, "null")
    assert status == 1
    assert err.strip().splitlines() == [
        f"error: cannot write {run_dir / 'steps.csv'} (is a folder, not a file): "
        "the run's results are not saved"
    ]
