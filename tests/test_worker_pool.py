"""Commands that fan simulations out over processes stop when they are stopped: Ctrl-C (or
an error) cancels the queued jobs and kills the workers instead of running every job first."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from experiments.lib.pool import worker_pool
from experiments.report.selection import Progress

ROOT = Path(__file__).resolve().parents[1]


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _succeeded(job: Future) -> bool:
    return job.done() and not job.cancelled() and job.exception() is None


def _ctrl_c_disposition() -> bool:
    return signal.getsignal(signal.SIGINT) is signal.SIG_IGN


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


def test_workers_leave_ctrl_c_to_the_main_process_and_a_normal_block_waits() -> None:
    with worker_pool(2) as pool:
        ignored = [pool.submit(_ctrl_c_disposition) for _ in range(4)]
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
def test_ctrl_c_stops_reproduce_in_one_line(tmp_path: Path) -> None:
    """Uninterrupted, this selection runs for minutes on one worker; a Ctrl-C a few seconds
    in ends it with one line (the 60 s bound only keeps a broken pool from hanging CI)."""
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
    os.killpg(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("reproduce ran on for a minute after Ctrl-C")
    assert proc.returncode in (-signal.SIGINT, 128 + signal.SIGINT)
    assert err.strip().splitlines()[-1] == "interrupted (Ctrl-C)"
    assert "Traceback" not in err and "jobs done" not in err
    assert not (tmp_path / "out" / "report.md").exists()
