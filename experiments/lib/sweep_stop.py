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
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from experiments.lib.results import append_index, write_csv, write_error
from experiments.lib.signals import FULL_ERROR_ASKED, interrupted_why

# (sweep folder, its job records when it started, each job's overrides or None:
# callbacks.planned_jobs) of each sweep begun in this process: appended by the SweepSummary
# callback, read when a sweep stops early
STARTED: list[tuple[Path, dict[Path, tuple[int, int]], list[list[str]] | None]] = []
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
    """Whether the command line asks Hydra for a multirun (``-m``, ``--multirun`` or
    ``hydra.mode=MULTIRUN``)."""
    return any(a in ("-m", "--multirun") or a.replace(" ", "") == "hydra.mode=MULTIRUN"
               for a in argv)  # fmt: skip


# the statuses a job's own handler ends the command with after an interrupt (cli.run_app):
# in-process jobs (Hydra's basic launcher) stop the sweep so
_INTERRUPT_EXITS = {130: "Ctrl-C", 143: "SIGTERM"}


@contextmanager
def sweep_stops_kept(argv: Sequence[str]) -> Iterator[None]:
    """Around a Hydra entry point's call: see the module doc. Inside a sweep Hydra re-raises
    a launcher's exception here instead of printing it (``HYDRA_FULL_ERROR`` is set for the
    block; kvlab reads the user's own setting through
    :func:`experiments.lib.signals.full_errors_asked`). Any other error is reported as
    Hydra would have without the variable (its traceback trimmed to the job's frames), or
    re-raised unchanged under the user's ``HYDRA_FULL_ERROR=1``."""
    if not is_sweep(argv):
        yield
        return
    STARTED.clear()
    saved = os.environ.get("HYDRA_FULL_ERROR")
    os.environ[FULL_ERROR_ASKED] = saved or ""
    os.environ["HYDRA_FULL_ERROR"] = "1"

    def restore() -> None:
        os.environ.pop(FULL_ERROR_ASKED, None)
        if saved is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved

    try:
        yield
    except KeyboardInterrupt as exc:
        _keep(interrupted_why(exc))
        raise
    except SystemExit as exc:
        if exc.code in _INTERRUPT_EXITS:  # an in-process job's handler ended the sweep
            _keep(f"interrupted ({_INTERRUPT_EXITS[exc.code]})")
        raise
    except Exception as exc:
        why = dead_worker(exc)
        if saved == "1":
            raise
        if why is None:
            restore()
            _report_as_hydra(exc)
            raise
        where = _keep(f"interrupted: the launcher stopped the sweep, as {why}")
        print(f"error: {why} and the launcher stopped the sweep; finished jobs are "
              f"kept{where}", file=sys.stderr)  # fmt: skip
        raise SystemExit(LAUNCHER_FAILURE_STATUS) from None
    finally:
        restore()


def _report_as_hydra(exc: Exception) -> None:
    """Report ``exc`` as Hydra does without ``HYDRA_FULL_ERROR`` (hydra/_internal/utils.py,
    ``run_and_report``), then exit 1: a compact Hydra error as its message (and its
    OmegaConf cause); a job's error as its traceback from inside the job on. Returns, for
    the caller to re-raise, an error from outside any job (Hydra prints those whole)."""
    from hydra.errors import CompactHydraException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(exc, CompactHydraException):
        print(str(exc), file=sys.stderr)
        if isinstance(exc.__cause__, OmegaConfBaseException):
            print(str(exc.__cause__), file=sys.stderr)
        raise SystemExit(LAUNCHER_FAILURE_STATUS) from None
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_name != "run_job":
        tb = tb.tb_next
    if tb is None:
        return
    traceback.print_exception(type(exc), exc, tb.tb_next)
    print("\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
          file=sys.stderr)  # fmt: skip
    raise SystemExit(LAUNCHER_FAILURE_STATUS) from None


def resume_hint(sweep_dir: Path | str) -> str:
    """How to run a stopped sweep's remaining jobs: the same command into its folder."""
    return f"rerun the same command with hydra.sweep.dir={sweep_dir}"


def _keep(why: str) -> str:
    """Mark this sweep's stopped jobs (``error.txt`` and an ``interrupted`` row in the runs
    index) and write its summary; returns where to look, as the end of a sentence ("" when
    no sweep started)."""
    from experiments.lib.callbacks import collect_summary, job_records

    if not STARTED:
        return ""
    sweep_dir, before, planned = STARTED[-1]
    again = f"{resume_hint(sweep_dir)} to run it"
    started = [d for d, record in job_records(sweep_dir).items() if before.get(d) != record]
    mark_stopped(started, f"{why} before this job finished: its files are partial; {again} again")
    not_started = f"{why} before this job started; {again}"
    summary = collect_summary(sweep_dir, before, planned, not_started)
    if summary.empty:
        return f"; rerun with hydra.sweep.dir={sweep_dir} to resume"
    write_csv(sweep_dir / "summary.csv", summary)
    return (f"; {sweep_dir / 'summary.csv'} lists them, the stopped ones and those not "
            f"started; {resume_hint(sweep_dir)} to run the rest")  # fmt: skip


def mark_stopped(job_dirs: Sequence[Path], line: str) -> None:
    """Mark each of ``job_dirs`` that a job started (Hydra saved its ``.hydra``) and that
    neither finished nor failed (no ``metrics.json``, no ``error.txt``) as its own handler
    would have: ``line`` in ``error.txt`` and an ``interrupted`` row in its runs index.
    For a launcher's jobs stopped from outside: call it once their processes are gone."""
    for job_dir in job_dirs:
        started = (job_dir / ".hydra").is_dir()
        done = (job_dir / "metrics.json").is_file() or (job_dir / "error.txt").is_file()
        if started and not done:
            write_error(job_dir, line + "\n")
            _index_row(job_dir, line)


def _index_row(job_dir: Path, line: str) -> None:
    """The ``interrupted`` row a job's own handler would have written (its app, overrides
    and index from the files Hydra saved in ``job_dir/.hydra``); nothing where they cannot
    be read or the job's index is null."""
    from omegaconf import OmegaConf

    from experiments.lib.cli import DEFAULT_INDEX

    saved = job_dir / ".hydra"
    try:
        config = OmegaConf.load(saved / "config.yaml")
        app = str(OmegaConf.load(saved / "hydra.yaml").hydra.job.name)
        listed = OmegaConf.to_container(OmegaConf.load(saved / "overrides.yaml"), resolve=False)
        index = config.get("index", str(DEFAULT_INDEX))
        if index:
            append_index(Path(str(index)), app, "interrupted", job_dir,
                         [str(o) for o in listed or []], error=line)  # fmt: skip
    except (OSError, ValueError, AttributeError, TypeError) as exc:  # the job's files, or index
        print(f"note: no runs-index row for {job_dir}: {exc}", file=sys.stderr)
