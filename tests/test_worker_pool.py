"""Commands that fan simulations out over processes stop when they are stopped: Ctrl-C (or
an error) cancels the queued jobs and kills the workers instead of running every job first."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import pytest

from experiments.lib.pool import worker_pool
from experiments.lib.signals import TERMINATED_STATUS, Terminated
from experiments.report.selection import Progress

ROOT = Path(__file__).resolve().parents[1]


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _succeeded(job: Future) -> bool:
    return job.done() and not job.cancelled() and job.exception() is None


def _group_ends(group: int, within_s: float = 10.0) -> bool:
    """No process of the command's group is left within ``within_s``: a helper process
    (e.g. a resource tracker) exits once the main one has gone."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _finished_within_a_minute(proc: subprocess.Popen, why: str) -> tuple[str, str]:
    """``proc``'s (stdout, stderr) once it ends; its group killed and the test failed with
    ``why`` if it runs on for a minute."""
    try:
        return proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(why)


def _signals_ignored() -> bool:
    return all(signal.getsignal(sig) is signal.SIG_IGN for sig in (signal.SIGINT, signal.SIGTERM))


def test_an_interrupt_in_the_block_cancels_the_queue_and_kills_the_workers() -> None:
    with pytest.raises(KeyboardInterrupt), worker_pool(2) as pool:
        jobs = [pool.submit(_sleep, 30.0) for _ in range(6)]
        processes = list(pool._processes.values())
        raise KeyboardInterrupt
    assert all(job.done() for job in jobs) and not any(_succeeded(job) for job in jobs)
    assert processes and not any(p.is_alive() for p in processes)


def test_a_config_error_leaves_the_block_at_once_too() -> None:
    with pytest.raises(SystemExit), worker_pool(1) as pool:
        jobs = [pool.submit(_sleep, 30.0) for _ in range(5)]
        raise SystemExit(2)
    assert all(job.done() for job in jobs) and not any(_succeeded(job) for job in jobs)


def test_a_sigterm_in_the_block_is_an_interrupt_and_the_handler_is_restored_after() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated), worker_pool(1) as pool:
        job = pool.submit(_sleep, 30.0)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises at once; this only keeps the test from passing late
    assert job.done() and not _succeeded(job)
    assert signal.getsignal(signal.SIGTERM) is before


SIGNALLED_TWICE = """
import os, signal, time
from concurrent.futures import ProcessPoolExecutor
from experiments.lib.pool import worker_pool
from experiments.lib.signals import Terminated

real_shutdown = ProcessPoolExecutor.shutdown

def shutdown_signalled_again(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)  # the second signal is taken, or dropped, right here
    return real_shutdown(self, *args, **kwargs)

ProcessPoolExecutor.shutdown = shutdown_signalled_again
try:
    with worker_pool(2) as pool:
        jobs = [pool.submit(time.sleep, 30.0) for _ in range(4)]
        processes = list(pool._processes.values())
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
except Terminated:
    pass
print(all(job.done() for job in jobs), len(processes), sum(p.is_alive() for p in processes))
"""


def test_a_second_signal_during_the_cleanup_leaves_no_worker_running() -> None:
    # `timeout` signals the main process, then its whole group: a second SIGTERM cut the
    # cleanup short, and the workers (which ignore SIGTERM) ran on without a parent
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGNALLED_TWICE], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    out, err = _finished_within_a_minute(proc, "the pool's cleanup hung after a second SIGTERM")
    assert proc.returncode == 0, err
    assert out.split() == ["True", "2", "0"]
    assert _group_ends(proc.pid)


def test_a_sigterm_anywhere_in_a_command_ends_it_in_one_line() -> None:
    # outside the blocks that turn SIGTERM into an interrupt (before a command's pool, after
    # it), SIGTERM ended `python -m experiments.<tool>` without a word
    code = ("import sys; sys.argv = ['-m']; import experiments, os, signal, time; "
            "os.kill(os.getpid(), signal.SIGTERM); time.sleep(10)")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == TERMINATED_STATUS
    assert proc.stderr.strip() == "interrupted (SIGTERM)"


def test_workers_leave_signals_to_the_main_process_and_a_normal_block_waits() -> None:
    with worker_pool(2) as pool:
        ignored = [pool.submit(_signals_ignored) for _ in range(4)]
        slept = pool.submit(_sleep, 0.2)
    assert all(job.result() for job in ignored)
    assert slept.done() and slept.result() == 0.2


def _progress_lines(caplog: pytest.LogCaptureFixture, outcomes: list[str]) -> list[str]:
    log = logging.getLogger("test_worker_pool")
    futures: list[Future] = [Future() for _ in outcomes]
    with caplog.at_level(logging.INFO, logger="test_worker_pool"):
        Progress(log).runs("fig18b", futures)
        for future, outcome in zip(futures, outcomes, strict=True):
            if outcome == "ok":
                future.set_result({})
            elif outcome == "cancelled":
                future.cancel()
                future.set_running_or_notify_cancel()
            else:
                future.set_exception(RuntimeError("failed"))
    return [r.getMessage() for r in caplog.records if r.name == "test_worker_pool"]


def test_a_figure_is_said_done_only_when_every_run_finished(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lines = _progress_lines(caplog, ["ok", "ok"])
    assert len(lines) == 1 and lines[0].startswith("fig18b: 2 jobs done")
    caplog.clear()
    assert _progress_lines(caplog, ["ok", "cancelled"]) == []
    caplog.clear()
    assert _progress_lines(caplog, ["failed", "ok"]) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "send", "statuses"),
    [
        ("Ctrl-C", lambda pid: os.killpg(pid, signal.SIGINT), (-signal.SIGINT, 130)),
        # `kill PID`: the main process alone gets it, and must stop its workers itself
        ("SIGTERM", lambda pid: os.kill(pid, signal.SIGTERM), (TERMINATED_STATUS,)),
    ],
)
def test_an_interrupt_stops_reproduce_in_one_line(
    tmp_path: Path, how: str, send: Callable[[int], None], statuses: tuple[int, ...]
) -> None:
    """Uninterrupted, this selection runs for minutes on one worker; an interrupt a few
    seconds in ends it with one line and no process left (the 60 s bound only keeps a broken
    pool from hanging CI)."""
    cmd = [sys.executable, "-m", "experiments.reproduce", "--figures", "fig18b",
           "--workers", "1", "--duration", "3600", "--out", str(tmp_path / "out")]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:  # the runs start once the selection is logged
        if "figures:" in line:
            break
    time.sleep(3)
    send(proc.pid)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"reproduce ran on for a minute after {how}")
    assert proc.returncode in statuses
    assert err.strip().splitlines()[-1] == f"interrupted ({how})"
    assert "Traceback" not in err and "jobs done" not in err
    assert not (tmp_path / "out" / "report.md").exists()
    assert _group_ends(proc.pid)


_CHILDREN = """
import subprocess, sys
from experiments.lib.pool import _descendants, _running, stop_child_processes
# a child that ignores SIGTERM (SIGKILL must follow) and a grandchild under a shell
spared = subprocess.Popen(["sleep", "60"])
stubborn = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
shell = subprocess.Popen(["sh", "-c", "sleep 60 & wait"])
import time; time.sleep(0.5)
found = _descendants(__import__("os").getpid())
assert {spared.pid, stubborn.pid, shell.pid} <= set(found) and len(found) == 4, found
stop_child_processes(grace_s=0.5, spared={spared.pid})
time.sleep(0.2)
print(sorted(p for p in found if _running(p)) == [spared.pid])
spared.kill()
"""


def test_stop_child_processes_ends_children_and_grandchildren_but_the_spared() -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("reads /proc")
    # in a process of its own: the test's process may have children of other tests
    done = subprocess.run(
        [sys.executable, "-c", _CHILDREN], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


@pytest.mark.slow
def test_sigterm_stops_reproduce_on_a_launcher_and_its_workers(tmp_path: Path) -> None:
    """`kill PID` reaches `reproduce --launcher joblib`'s main process alone: it stops the
    launcher's workers itself, marks the runs in flight interrupted and prints one line."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "experiments.reproduce", "--figures", "fig18b",
           "--launcher", "joblib", "--duration", "3600", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:
        if "figures:" in line:
            break
    # the joblib workers start and take their first runs (a loaded machine: up to a minute)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any((out / "runs").glob("*/.hydra")):
        time.sleep(0.5)
    time.sleep(2)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = _finished_within_a_minute(proc, "reproduce --launcher ran on after SIGTERM")
    assert proc.returncode == TERMINATED_STATUS
    assert err.strip().splitlines()[-1] == "interrupted (SIGTERM)"
    assert "Traceback" not in err
    assert not (out / "report.md").exists()
    # every run that started is finished or marked: joblib kills the other workers as soon
    # as one job's interrupt comes back, and their runs had been left unmarked
    index = (out / "runs" / "index.csv").read_text()
    started = [d for d in (out / "runs").iterdir() if (d / ".hydra").is_dir()]
    unfinished = [d for d in started if not (d / "metrics.json").is_file()]
    assert unfinished and all((d / "error.txt").is_file() for d in unfinished)
    assert all(f"simulate,interrupted,{d}," in index for d in unfinished), index
    assert _group_ends(proc.pid)
