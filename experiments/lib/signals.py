"""Signals around a run: SIGTERM (what ``timeout``, ``kill`` and Slurm send) ends a run the
way Ctrl-C does, and a finished run's last bookkeeping is not cut in half by either.

Both only act in the main thread (where Python delivers signals); elsewhere they do nothing.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType

TERMINATED_STATUS = 143  # a shell's status for a command ended by SIGTERM
# what the user set HYDRA_FULL_ERROR to, while a sweep sets it for Hydra
# (experiments.lib.sweep_stop; worker processes inherit both)
FULL_ERROR_ASKED = "KVLAB_HYDRA_FULL_ERROR_ASKED"


def full_errors_asked() -> bool:
    """Whether the user set ``HYDRA_FULL_ERROR=1`` (full tracebacks, config errors raised),
    inside a sweep too, where kvlab sets the variable for Hydra."""
    return os.environ.get(FULL_ERROR_ASKED, os.environ.get("HYDRA_FULL_ERROR")) == "1"


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: handled wherever Ctrl-C's ``KeyboardInterrupt`` is."""


def interrupted_why(exc: BaseException | type[BaseException]) -> str:
    """``interrupted (SIGTERM)`` or ``interrupted (Ctrl-C)``, as ``exc`` (or its class) says."""
    kind = exc if isinstance(exc, type) else type(exc)
    return f"interrupted ({'SIGTERM' if issubclass(kind, Terminated) else 'Ctrl-C'})"


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated("SIGTERM")


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block, SIGTERM raises :class:`Terminated`; the previous handler after."""
    if not _in_main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM held back while the block runs and raised after it (as
    ``KeyboardInterrupt`` / :class:`Terminated`, the first to arrive), so the block (a
    finished run's index row) is done whole. Python runs signal handlers in the main thread
    whichever thread the signal reaches, so handlers that only note the signal hold it back
    (a thread signal mask would not, with torch's threads about)."""
    if not _in_main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if held:
        raise Terminated("SIGTERM") if held[0] == signal.SIGTERM else KeyboardInterrupt


@contextmanager
def interrupts_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM dropped while the block runs (in the main thread; elsewhere
    nothing changes): for the cleanup of a command already stopping, which a second signal
    of the same stop (``timeout`` signals the main process and then its whole group) would
    cut short, leaving workers behind."""
    if not _in_main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def quiet_uncaught_interrupts() -> None:
    """An interrupt no command caught (Ctrl-C or SIGTERM while a command still imports torch,
    before its own handling starts) prints one line instead of a traceback; the exit status
    stays the signal's (Python exits by SIGINT itself; a :class:`Terminated` exits 143 at
    once). Every other exception, and every interrupt with ``HYDRA_FULL_ERROR=1``, keeps
    the usual traceback. SIGTERM raises :class:`Terminated` from now on in the main thread
    (it had ended the command without a word wherever no block of
    :func:`sigterm_as_interrupt` was open)."""
    if _in_main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt) and not full_errors_asked():
            print(interrupted_why(kind), file=sys.stderr)
            if issubclass(kind, Terminated):  # Python would exit 1: SIGTERM's status instead
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(TERMINATED_STATUS)
            return
        previous(kind, exc, tb)

    sys.excepthook = hook


# the resource trackers of multiprocessing and of joblib's loky backend warn, as the command
# exits, of the semaphores that workers stopped by a signal left, and then free them
TRACKER_WARNINGS = (
    "ignore::UserWarning:multiprocessing.resource_tracker",
    "ignore::UserWarning:joblib.externals.loky.backend.resource_tracker",
)


def quiet_resource_trackers() -> None:
    """Silence :data:`TRACKER_WARNINGS` in the resource-tracker processes started from now
    on (through ``PYTHONWARNINGS``, which they inherit; the user's own filters are kept),
    so that an interrupted sweep ends with its one line."""
    filters = [f for f in os.environ.get("PYTHONWARNINGS", "").split(",") if f]
    os.environ["PYTHONWARNINGS"] = ",".join(
        [*filters, *(w for w in TRACKER_WARNINGS if w not in filters)]
    )
