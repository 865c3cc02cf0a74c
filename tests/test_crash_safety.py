"""A run killed while it writes its results leaves no half-written file, and nothing that
a later read takes for a whole run: ``metrics.json`` comes last, every file is renamed into
place whole (``experiments.lib.results``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments.lib.callbacks import collect_summary
from experiments.lib.results import is_complete, read_metrics

REPO = Path(__file__).resolve().parents[1]
ROWS = 2000  # big enough that a file takes several writes' worth of bytes

# Writes one run with write_run and SIGKILLs itself at the given call of os.replace or
# os.fsync (argv: run dir, "replace"|"fsync"|"none", call number).
WRITER = f"""
import os, signal, sys
import pandas as pd
from experiments.lib import results

run_dir, where, at = sys.argv[1], sys.argv[2], int(sys.argv[3])
calls = {{"replace": 0, "fsync": 0}}
real = {{"replace": os.replace, "fsync": os.fsync}}

def hook(name):
    def wrapped(*args):
        calls[name] += 1
        if name == where and calls[name] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real[name](*args)
    return wrapped

os.replace, os.fsync = hook("replace"), hook("fsync")
frame = pd.DataFrame({{"request_id": range({ROWS}), "x": [0.5] * {ROWS}}})
results.write_run(
    results.Path(run_dir), {{"model": {{"name": "m"}}}}, {{"completed": {ROWS}}},
    frame, frame, extra={{"engine": {{"num_blocks": 7}}}},
)
"""


def _write(run_dir: Path, where: str, at: int) -> int:
    proc = subprocess.run(
        [sys.executable, "-c", WRITER, str(run_dir), where, str(at)],
        cwd=REPO, capture_output=True, timeout=120,
    )  # fmt: skip
    return proc.returncode


def _assert_whole(run_dir: Path) -> None:
    """Every result file present reads whole."""
    if (run_dir / "config.yaml").exists():
        assert OmegaConf.load(run_dir / "config.yaml").model.name == "m"
    for name in ("requests.csv", "steps.csv"):
        if (run_dir / name).exists():
            assert len(pd.read_csv(run_dir / name)) == ROWS
    if (run_dir / "engine.json").exists():
        assert json.loads((run_dir / "engine.json").read_text()) == {"num_blocks": 7}


@pytest.mark.parametrize(("where", "at"), [("fsync", 1), ("replace", 2), ("fsync", 4),
                                           ("replace", 5)])  # fmt: skip
def test_a_run_killed_midway_is_not_taken_for_a_whole_one(
    tmp_path: Path, where: str, at: int
) -> None:
    run_dir = tmp_path / "0"
    assert _write(run_dir, where, at) == -9  # killed
    assert not is_complete(run_dir)
    _assert_whole(run_dir)
    assert collect_summary(tmp_path).empty
    # The same directory written again to the end is a whole run.
    assert _write(run_dir, "none", 0) == 0
    assert is_complete(run_dir) and read_metrics(run_dir) == {"completed": ROWS}
    _assert_whole(run_dir)
    summary = collect_summary(tmp_path)
    assert len(summary) == 1
    # a sweep with no failure still has the error column, empty
    assert list(summary.columns[-2:]) == ["status", "error"] and summary["error"].iloc[0] == ""


@pytest.mark.parametrize(("where", "at"), [("fsync", 1), ("replace", 2), ("replace", 4)])
def test_a_rewrite_killed_midway_leaves_no_complete_run_of_mixed_files(
    tmp_path: Path, where: str, at: int
) -> None:
    # reproduce writes each run into the same runs/<label>/ again: killed after the new
    # config.yaml, the old metrics.json made the folder pass for a finished run of the new
    # config, beside the old tables; and a killed write's temporary file stayed
    run_dir = tmp_path / "0"
    assert _write(run_dir, "none", 0) == 0 and is_complete(run_dir)
    assert _write(run_dir, where, at) == -9
    assert not is_complete(run_dir)
    assert _write(run_dir, "none", 0) == 0 and is_complete(run_dir)
    assert not list(run_dir.glob(".*.tmp"))


# A simulate run whose work is stopped by ``STOP`` (a line of Python run inside it); argv:
# run dir, index path.
STOPPED = """
import os, signal, sys, time
import experiments.simulate as app
from experiments.lib.cli import main_with_checks

def stopped(cfg, out_dir=None):
    STOP
    time.sleep(30)

app.run = stopped
run_dir, index = sys.argv[1], sys.argv[2]
sys.argv = ["simulate", "workload.num_requests=5", f"hydra.run.dir={run_dir}", f"index={index}"]
main_with_checks(app.main, config_name="simulate")
"""


def _stopped_run(tmp_path: Path, stop: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """The process, run directory and index of a simulate run stopped by ``stop``."""
    run_dir, index = tmp_path / "run", tmp_path / "index.csv"
    proc = subprocess.run(
        [sys.executable, "-c", STOPPED.replace("STOP", stop), str(run_dir), str(index)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"},
    )  # fmt: skip
    return proc, run_dir, index


def test_an_interrupted_run_is_marked_partial_in_one_line(tmp_path: Path) -> None:
    proc, run_dir, index = _stopped_run(tmp_path, "raise KeyboardInterrupt")
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"interrupted: {run_dir} holds a")
    assert "interrupted" in (run_dir / "error.txt").read_text()
    assert not is_complete(run_dir)
    assert pd.read_csv(index)["status"].tolist() == ["interrupted"]


def test_an_interrupted_in_process_sweep_says_how_to_resume_it(tmp_path: Path) -> None:
    # Hydra's basic launcher: the job's own line said "run the same command again", which
    # starts a new sweep folder (its default is the time) and runs the finished jobs again
    sweep_dir = tmp_path / "sweep"
    script = STOPPED.replace("STOP", "raise KeyboardInterrupt").replace(
        'f"hydra.run.dir={run_dir}"', f'"-m", "seed=0,1", "hydra.sweep.dir={sweep_dir}"'
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "unused"), str(tmp_path / "index.csv")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"},
    )  # fmt: skip
    assert proc.returncode == 130, proc.stderr
    assert f"with hydra.sweep.dir={sweep_dir} to run it" in proc.stderr.strip().splitlines()[-1]
    summary = pd.read_csv(sweep_dir / "summary.csv")  # the job never started is listed too
    assert summary[["job", "seed", "status"]].values.tolist() == [
        [0, 0, "interrupted"], [1, 1, "interrupted"],
    ]  # fmt: skip


def test_a_terminated_run_is_marked_partial_like_an_interrupted_one(tmp_path: Path) -> None:
    """SIGTERM (what timeout, kill and Slurm send) left no error.txt and no index row (the
    process just died)."""
    proc, run_dir, index = _stopped_run(tmp_path, "os.kill(os.getpid(), signal.SIGTERM)")
    assert proc.returncode == 143, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "interrupted (SIGTERM)" in (run_dir / "error.txt").read_text()
    assert pd.read_csv(index)["status"].tolist() == ["interrupted"]


def test_an_interrupt_while_a_finished_run_writes_its_row_waits_for_it() -> None:
    """Ctrl-C while a finished run appends its index row (interrupts_deferred): the block
    runs to its end and the interrupt is raised after it (it cut the row off, with a
    traceback); a SIGTERM likewise, as Terminated."""
    from experiments.lib import signals

    done: list[str] = []
    with pytest.raises(KeyboardInterrupt), signals.interrupts_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        done.append("row")
    assert done == ["row"]
    with pytest.raises(signals.Terminated), signals.interrupts_deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        done.append("row again")
    assert done == ["row", "row again"]


# A command starting (``python -m experiments.<name>`` sets argv[0] to "-m" while the package
# imports) that is interrupted before its own handling begins, as by Ctrl-C during torch's
# import: argv: "-m" or "library", then the exception to raise ("interrupt", "sigterm",
# "error").
STARTING = """
import sys
if sys.argv[1] == "-m":
    sys.argv[0] = "-m"
import experiments
from experiments.lib.signals import Terminated
raise {"interrupt": KeyboardInterrupt, "sigterm": Terminated, "error": ValueError}[sys.argv[2]]
"""


@pytest.mark.parametrize(
    ("how", "raised", "full", "stderr", "status"),
    [
        ("-m", "interrupt", "0", "interrupted (Ctrl-C)\n", -signal.SIGINT),
        ("-m", "sigterm", "0", "interrupted (SIGTERM)\n", 143),
        ("-m", "interrupt", "1", "Traceback", -signal.SIGINT),
        ("-m", "error", "0", "Traceback", 1),
        ("library", "interrupt", "0", "Traceback", -signal.SIGINT),
    ],
)
def test_an_interrupt_while_a_command_starts_is_one_line(
    how: str, raised: str, full: str, stderr: str, status: int
) -> None:
    """One line, not torch's import traceback, and the exit status of the signal; tracebacks
    stay for other errors, with HYDRA_FULL_ERROR=1, and where kvlab is imported as a library."""
    env = {**os.environ, "HYDRA_FULL_ERROR": full}
    done = subprocess.run([sys.executable, "-c", STARTING, how, raised], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == status
    if stderr.startswith("Traceback"):
        assert done.stderr.startswith("Traceback")
    else:
        assert done.stderr == stderr


def test_sigterm_to_the_command_outside_any_job_ends_it_as_ctrl_c_does() -> None:
    """A launcher that runs jobs in worker processes (joblib) waits in the command's own
    process: SIGTERM there must raise, so the launcher stops its workers, and the handler
    before the command is back after it."""
    from experiments.lib.cli import main_with_checks
    from experiments.lib.signals import Terminated

    def waiting_launcher() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # never reached to its end: the signal raises first
        pytest.fail("SIGTERM did not reach the command")

    def unhandled(signum: int, frame: object) -> None:
        raise AssertionError("SIGTERM reached the handler from before the command")

    before = signal.signal(signal.SIGTERM, unhandled)  # not the default: it kills pytest
    try:
        with pytest.raises(Terminated):
            main_with_checks(waiting_launcher, ["workload.num_requests=3", "index=null"], None)
        assert signal.getsignal(signal.SIGTERM) is unhandled
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_signal_once_the_runs_files_are_whole_leaves_a_complete_run(tmp_path: Path) -> None:
    # it came between the last file and the index row: error.txt called the whole run
    # partial, beside its metrics.json, and the index said interrupted
    stop = "(out_dir / 'metrics.json').write_text('{\"completed\": 5}'); raise KeyboardInterrupt"
    proc, run_dir, index = _stopped_run(tmp_path, stop)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"interrupted after the run finished: {run_dir} is complete"
    )
    assert is_complete(run_dir) and not (run_dir / "error.txt").exists()
    assert pd.read_csv(index)["status"].tolist() == ["ok"]
