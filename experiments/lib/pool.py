"""A process pool that stops when its caller stops.

Leaving a plain ``ProcessPoolExecutor``'s ``with`` block on an exception waits for every job
already submitted: a Ctrl-C, or one job's config error, in a command that queued hundreds of
simulations ran on for minutes (hours with ``--full``) before it said anything. And every
worker took the Ctrl-C too, so the job each one was running failed with a
``KeyboardInterrupt`` of its own.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager


def _workers_ignore_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def worker_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of ``workers`` processes for the block. Its workers ignore Ctrl-C (the terminal
    sends it to every process of the command): the main process alone takes it. When the block
    ends on an exception (a ``KeyboardInterrupt``, a ``SystemExit``, an error), the jobs not
    started are cancelled, the workers killed and the exception goes on at once; a run a worker
    had half done leaves what its own writes leave (each file whole or absent). When the block
    ends normally, the pool waits for its jobs, as a plain pool does."""
    pool = ProcessPoolExecutor(workers, initializer=_workers_ignore_ctrl_c)
    try:
        yield pool
    except BaseException:
        # the executor's private parts: its workers, and the thread that fails the jobs of
        # workers that die (and reaps them) before it ends
        processes = list((getattr(pool, "_processes", None) or {}).values())
        manager = getattr(pool, "_executor_manager_thread", None)
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.kill()
        if manager is not None:
            manager.join()
        raise
    pool.shutdown(wait=True)
