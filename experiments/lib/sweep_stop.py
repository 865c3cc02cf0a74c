"""A ``-m`` sweep that stops early keeps what it did and says so in one line.

A launcher stops a whole sweep when a worker process dies (joblib: a job killed for memory,
or a crash), and Ctrl-C or SIGTERM stops it too. Neither reaches the jobs' own handlers in
a worker process, so without this the jobs in flight were left without ``error.txt`` and
the sweep without ``summary.csv``, and a dead worker printed the launcher's traceback.
:func:`sweep_stops_kept` marks each job that started in this sweep and neither finished
nor failed (``error.txt``: why it stopped, and how to run it again), writes
``summary.csv`` of the sweep's jobs, and turns a dead worker into one line and exit
status 1; an interrupt goes on to the caller's handling (status 130 or 143).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from hydra.errors import CompactHydraException

from experiments.lib.results import write_csv, write_error
from experiments.lib.signals import FULL_ERROR_ASKED, Terminated

# (sweep folder, its job records when it started) of each sweep begun in this process:
# appended by the SweepSummary callback, read when a sweep stops early
STARTED: list[tuple[Path, dict[Path, tuple[int, int]]]] = []
LAUNCHER_FAILURE_STATUS = 1
_DEAD_WORKER = ("TerminatedWorkerError", "BrokenProcessPool")


class LauncherStopped(RuntimeError):
    """A launcher stopped a batch of jobs because a worker process died (its message is
    one line saying so)."""


def dead_worker(exc: BaseException) -> str | None:
    """Why, in words, when ``exc`` is a launcher's error for a worker process that died
    (joblib/loky: killed, e.g. for memory, or crashed); None for any other error."""
    if type(exc).__name__ not in _DEAD_WORKER:
        return None
    codes = re.search(r"exit codes of the workers are (\{[^}]*\})", str(exc))
    return (f"a worker process died ({f'exit codes {codes.group(1)}: ' if codes else ''}"
            "killed, e.g. for memory, or crashed)")  # fmt: skip


def is_sweep(argv: Sequence[str]) -> bool:
    """Whether the command line asks Hydra for a multirun."""
    return any(a in ("-m", "--multirun") for a in argv)


@contextmanager
def sweep_stops_kept(argv: Sequence[str]) -> Iterator[None]:
    """Around a Hydra entry point's call: see the module doc. Inside a sweep Hydra re-raises
    a launcher's exception here instead of printing it (``HYDRA_FULL_ERROR`` is set for the
    block; kvlab reads the user's own setting through
    :func:`experiments.lib.signals.full_errors_asked`); one that is not a dead worker, or
    any with the user's ``HYDRA_FULL_ERROR=1``, is re-raised unchanged."""
    if not is_sweep(argv):
        yield
        return
    STARTED.clear()
    saved = os.environ.get("HYDRA_FULL_ERROR")
    os.environ[FULL_ERROR_ASKED] = saved or ""
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    except KeyboardInterrupt as exc:
        how = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
        _keep(f"interrupted ({how})")
        raise
    except Exception as exc:
        if saved == "1":
            raise
        if isinstance(exc, CompactHydraException):  # printed as Hydra would have
            print(str(exc), file=sys.stderr)
            raise SystemExit(LAUNCHER_FAILURE_STATUS) from None
        why = dead_worker(exc)
        if why is None:
            raise
        where = _keep(f"interrupted: the launcher stopped the sweep, as {why}")
        print(f"error: {why} and the launcher stopped the sweep; finished jobs are "
              f"kept{where}", file=sys.stderr)  # fmt: skip
        raise SystemExit(LAUNCHER_FAILURE_STATUS) from None
    finally:
        os.environ.pop(FULL_ERROR_ASKED, None)
        if saved is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved


def _keep(why: str) -> str:
    """Mark this sweep's stopped jobs and write its summary; returns where to look, as the
    end of a sentence ("" when no sweep started)."""
    from experiments.lib.callbacks import collect_summary, job_records

    if not STARTED:
        return ""
    sweep_dir, before = STARTED[-1]
    again = f"rerun the same command with hydra.sweep.dir={sweep_dir} to run it again"
    for job_dir, record in job_records(sweep_dir).items():
        started_now = before.get(job_dir) != record
        done = (job_dir / "metrics.json").is_file() or (job_dir / "error.txt").is_file()
        if started_now and not done:
            write_error(job_dir, f"{why} before this job finished: its files are partial; "
                                 f"{again}\n")  # fmt: skip
    summary = collect_summary(sweep_dir, before)
    if summary.empty:
        return f"; rerun with hydra.sweep.dir={sweep_dir} to resume"
    write_csv(sweep_dir / "summary.csv", summary)
    return (f"; {sweep_dir / 'summary.csv'} lists them and the stopped ones; rerun the same "
            f"command with hydra.sweep.dir={sweep_dir} to run the rest")  # fmt: skip
