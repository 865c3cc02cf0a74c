"""A process pool that stops when its caller stops.

Leaving a plain ``ProcessPoolExecutor``'s ``with`` block on an exception waits for every job
already submitted: a Ctrl-C, or one job's config error, in a command that queued hundreds of
simulations ran on for minutes (hours with ``--full``) before it said anything. And every
worker took the Ctrl-C too, so the job each one was running failed with a
``KeyboardInterrupt`` of its own. A SIGTERM (``timeout``, ``kill``, Slurm) ended the main
process without a word.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Collection, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING

from experiments.lib.signals import (
    interrupts_ignored,
    quiet_resource_trackers,
    sigterm_as_interrupt,
)

if TYPE_CHECKING:
    from experiments.lib.jobs import LaunchQueue


def _workers_leave_signals_to_the_main_process() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@contextmanager
def worker_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of ``workers`` processes for the block. Its workers ignore Ctrl-C and SIGTERM
    (a terminal, ``timeout`` and Slurm signal every process of the command): the main process
    alone takes them, and inside the block a SIGTERM raises
    :class:`~experiments.lib.signals.Terminated` there as Ctrl-C raises ``KeyboardInterrupt``
    (uncaught, either prints one line: :mod:`experiments.lib.signals`). When the block
    ends on an exception (a ``KeyboardInterrupt``, a ``SystemExit``, an error), the jobs not
    started are cancelled, the workers killed (a second signal meanwhile is dropped, so none
    is left running) and the exception goes on at once; a run a worker had half done leaves
    what its own writes leave (each file whole or absent). When the block ends normally, the
    pool waits for its jobs, as a plain pool does."""
    pool = ProcessPoolExecutor(workers, initializer=_workers_leave_signals_to_the_main_process)
    try:
        with sigterm_as_interrupt():
            yield pool
    except BaseException:
        with interrupts_ignored():
            # the executor's private parts: its workers, and the thread that fails the jobs
            # of workers that die (and reaps them) before it ends
            processes = list((getattr(pool, "_processes", None) or {}).values())
            manager = getattr(pool, "_executor_manager_thread", None)
            pool.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                process.kill()
            if manager is not None:
                manager.join()
        raise
    pool.shutdown(wait=True)


@contextmanager
def launch_threads(queue: LaunchQueue, threads: int = 64) -> Iterator[ThreadPoolExecutor]:
    """Threads that hand jobs to ``queue`` (``reproduce --launcher``). When the block ends
    on an exception (Ctrl-C, SIGTERM, an error), the processes started during the block and
    their children (a local launcher's workers) get a SIGTERM, on which each job in flight
    marks its run ``interrupted``, and a SIGKILL if still there 3 s later; the queue's jobs
    fail at once, and the exception goes on. Jobs a remote launcher (Slurm) already
    submitted are its own."""
    quiet_resource_trackers()
    pool = ThreadPoolExecutor(threads)
    before = set(_descendants(os.getpid()))
    try:
        with sigterm_as_interrupt():
            yield pool
    except BaseException as exc:
        with interrupts_ignored():
            pool.shutdown(wait=False, cancel_futures=True)
            stop_child_processes(spared=before)
            queue.abandon(exc)
        pool.shutdown(wait=True)
        raise
    pool.shutdown(wait=True)


def stop_child_processes(grace_s: float = 3.0, spared: Collection[int] = ()) -> None:
    """SIGTERM to every descendant process of this one but ``spared`` and resource trackers,
    then SIGKILL to those still running ``grace_s`` later. Linux only (reads ``/proc``);
    elsewhere it does nothing. A resource tracker (multiprocessing's, joblib's) frees its
    pool's semaphores when this process exits; killed, it printed tracebacks and a warning
    of leaked ones."""
    targets = [pid for pid in _descendants(os.getpid())
               if pid not in spared and not _is_resource_tracker(pid)]  # fmt: skip
    for pid in targets:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_running(pid) for pid in targets):
        time.sleep(0.05)
    for pid in targets:
        if _running(pid):
            _signal(pid, signal.SIGKILL)


def _is_resource_tracker(pid: int) -> bool:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"resource_tracker" in command


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):  # none where there is no /proc
        stat = _stat(int(entry.name))
        if stat is not None:
            children.setdefault(int(stat[1]), []).append(int(entry.name))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat``'s fields after the command name (state, ppid, ...); None when
    the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def _running(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")  # a zombie has stopped


def _signal(pid: int, sig: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, sig)
