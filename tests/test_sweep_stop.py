"""A sweep its launcher stops (a worker process killed) or an interrupt stops keeps what it
did: finished jobs, ``error.txt`` in the jobs it had in flight, ``summary.csv``, one line
and status 1 for a dead worker instead of the launcher's traceback; rerunning into the same
folder runs only what is left."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments.lib import sweep_stop
from experiments.lib.callbacks import job_records

REPO = Path(__file__).resolve().parents[1]


def _sweep(sweep_dir: Path, *extra: str, die_at: str | None = None, index: str = "null"):
    env = {**os.environ, "KVLAB_TEST_DIE_AT_SEED": die_at or ""}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, "-m", "experiments.simulate", "-m", "hydra/launcher=joblib",
         "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep_dir}", f"index={index}",
         "workload.num_requests=30", "seed=0,1,2", *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_a_dead_worker_stops_the_sweep_in_one_line_and_a_rerun_resumes(tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep_dir = tmp_path / "sweep"
    killer = "+hydra.callbacks.die._target_=tests.sweep_killer.DieAtSeed"
    index = tmp_path / "index.csv"
    proc = _sweep(sweep_dir, killer, die_at="1", index=str(index))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "a worker process died" in errors[0]
    assert f"hydra.sweep.dir={sweep_dir}" in errors[0]
    summary = pd.read_csv(sweep_dir / "summary.csv").set_index("job")
    assert summary.loc[1, "status"] == "interrupted"
    assert "worker process died" in summary.loc[1, "error"]
    assert set(summary["status"]) <= {"ok", "interrupted"}
    started = {int(d.name) for d in job_records(sweep_dir)}
    assert set(summary.index) == {0, 1, 2}  # every job is accounted for, started or not
    for job in {0, 1, 2} - started:
        assert "before this job started" in summary.loc[job, "error"]
    rows = pd.read_csv(index)  # and a job that started has its row in the runs index
    stopped = [j for j in summary.index[summary["status"] == "interrupted"] if j in started]
    marked = rows[rows["status"] == "interrupted"]["run_dir"].map(lambda d: int(Path(d).name))
    assert sorted(marked) == sorted(stopped)

    again = _sweep(sweep_dir)
    assert again.returncode == 0, again.stderr
    summary = pd.read_csv(sweep_dir / "summary.csv").set_index("job")
    assert set(summary.index) == {0, 1, 2} and set(summary["status"]) == {"ok"}


def _job(sweep_dir: Path, name: str, finished: bool) -> Path:
    job = sweep_dir / name
    (job / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create([f"seed={name}"]), job / ".hydra" / "overrides.yaml")
    if finished:
        (job / "metrics.json").write_text('{"completed": 3}')
    return job


def test_an_interrupt_marks_the_jobs_in_flight_and_writes_the_summary(tmp_path: Path) -> None:
    old = _job(tmp_path, "9", finished=False)  # another sweep's, before this one began

    def main() -> None:
        sweep_stop.STARTED.append((tmp_path, job_records(tmp_path), None))
        _job(tmp_path, "0", finished=True)
        _job(tmp_path, "1", finished=False)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), sweep_stop.sweep_stops_kept(["-m", "seed=0,1"]):
        main()
    assert (
        "interrupted (Ctrl-C) before this job finished"
        in (tmp_path / "1" / "error.txt").read_text()
    )
    assert not (old / "error.txt").exists()
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary[["job", "status"]].values.tolist() == [[0, "ok"], [1, "interrupted"]]


def test_an_interrupted_sweeps_summary_lists_the_jobs_it_never_started(tmp_path: Path) -> None:
    from experiments.lib.callbacks import SweepSummary

    config = OmegaConf.create({"hydra": {
        "sweep": {"dir": str(tmp_path)},
        "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                    "max_batch_size": None, "params": None},
        "overrides": {"task": ["system=vllm,orca_oracle", "seed=0,1", "index=null"]},
    }})  # fmt: skip

    def start(num: int, system: str, seed: int) -> Path:
        job = tmp_path / str(num)
        (job / ".hydra").mkdir(parents=True)
        overrides = [f"system={system}", f"seed={seed}", "index=null"]
        OmegaConf.save(OmegaConf.create(overrides), job / ".hydra" / "overrides.yaml")
        return job

    def main() -> None:
        SweepSummary().on_multirun_start(config)
        (start(0, "vllm", 0) / "metrics.json").write_text('{"completed": 3}')
        start(1, "vllm", 1)  # in flight; jobs 2 and 3 (orca_oracle) never started
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), sweep_stop.sweep_stops_kept(["-m", "seed=0,1"]):
        main()
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary[["job", "system", "seed", "status"]].values.tolist() == [
        [0, "vllm", 0, "ok"], [1, "vllm", 1, "interrupted"],
        [2, "orca_oracle", 0, "interrupted"], [3, "orca_oracle", 1, "interrupted"],
    ]  # fmt: skip
    assert summary["error"][1].startswith("interrupted (Ctrl-C) before this job finished")
    again = f"rerun the same command with hydra.sweep.dir={tmp_path} to run it"
    not_started = f"interrupted (Ctrl-C) before this job started; {again}"
    assert list(summary["error"][2:]) == [not_started, not_started]
    assert not (tmp_path / "2").exists()  # a job never started leaves no folder


def test_an_in_process_sweep_ended_by_its_jobs_interrupt_writes_the_summary(
    tmp_path: Path,
) -> None:
    # Hydra's basic launcher runs jobs in this process: the job's own handler marks its
    # folder and ends the command with 130 (Ctrl-C) or 143 (SIGTERM)
    def main() -> None:
        sweep_stop.STARTED.append((tmp_path, job_records(tmp_path), None))
        _job(tmp_path, "0", finished=True)
        job = _job(tmp_path, "1", finished=False)
        (job / "error.txt").write_text("interrupted (SIGTERM) before the run finished\n")
        raise SystemExit(143)

    with pytest.raises(SystemExit), sweep_stop.sweep_stops_kept(["-m", "seed=0,1"]):
        main()
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary[["job", "status"]].values.tolist() == [[0, "ok"], [1, "interrupted"]]


def test_a_sweep_asked_by_hydra_mode_is_one() -> None:
    assert sweep_stop.is_sweep(["hydra.mode=MULTIRUN", "seed=0,1"])
    assert not sweep_stop.is_sweep(["seed=0", "hydra.mode=RUN"])


def test_a_job_error_outside_the_jobs_handler_is_reported_as_hydra_would(capsys) -> None:
    def run_job() -> None:  # Hydra's frame the report trims to (hydra.core.utils.run_job)
        inside_the_job()

    def inside_the_job() -> None:
        raise RuntimeError("a job that failed outside its handler")

    try:
        run_job()
    except RuntimeError as exc:
        with pytest.raises(SystemExit) as stop:
            sweep_stop._report_as_hydra(exc)
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "in inside_the_job" in err and "in run_job" not in err
    assert err.rstrip().endswith("Set the environment variable HYDRA_FULL_ERROR=1 for a "
                                 "complete stack trace.")  # fmt: skip
    outside = ValueError("not a job's")  # no run_job frame: left to the caller to raise
    assert sweep_stop._report_as_hydra(outside) is None


def test_a_damaged_metrics_file_is_run_again_on_resume(tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep_dir = tmp_path / "sweep"
    assert _sweep(sweep_dir).returncode == 0, "the first sweep"
    (sweep_dir / "0" / "metrics.json").write_text("{")  # damaged since it was written
    again = _sweep(sweep_dir)
    assert again.returncode == 0, again.stderr
    assert "metrics.json: unreadable" in again.stdout + again.stderr
    summary = pd.read_csv(sweep_dir / "summary.csv").set_index("job")
    assert list(summary.loc[[0], "status"]) == ["ok"]


def test_other_errors_pass_through_and_a_single_run_is_left_alone(monkeypatch) -> None:
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(ValueError), sweep_stop.sweep_stops_kept(["-m", "seed=0,1"]):
        assert os.environ["HYDRA_FULL_ERROR"] == "1"  # Hydra hands a launcher's error on
        raise ValueError("x")
    assert "HYDRA_FULL_ERROR" not in os.environ
    with sweep_stop.sweep_stops_kept(["seed=0"]):
        assert "HYDRA_FULL_ERROR" not in os.environ


def test_a_compact_hydra_error_stays_one_line(monkeypatch, capsys) -> None:
    from hydra.errors import MissingConfigException

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as stop, sweep_stop.sweep_stops_kept(["-m", "seed=0,1"]):
        raise MissingConfigException("no config 'x'", "x")
    assert stop.value.code == 1 and capsys.readouterr().err == "no config 'x'\n"


LAUNCH = """
import sys
from pathlib import Path
from experiments.lib.jobs import Job, launch
from experiments.lib.sweep_stop import LauncherStopped
die = "+hydra.callbacks.die._target_=tests.sweep_killer.DieAtSeed"
jobs = [Job(f"s{s}", ("workload.num_requests=20", f"seed={s}", "index=null")) for s in (0, 1)]
try:
    launch(jobs, "joblib", Path(sys.argv[1]), ["hydra.launcher.n_jobs=2", die])
except LauncherStopped as stopped:
    print(stopped)
    sys.exit(3)
"""


def test_launch_turns_a_dead_worker_into_launcher_stopped(tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    env = {**os.environ, "KVLAB_TEST_DIE_AT_SEED": "1"}
    done = subprocess.run([sys.executable, "-c", LAUNCH, str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "a worker process died" in done.stdout and "run the same command again" in done.stdout
