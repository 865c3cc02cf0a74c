"""Logging for the commands that run many simulations (``reproduce``, ``capacity``,
``experiments.report.sharing``): their own progress lines at INFO, each run's setup lines
(its KV-capacity breakdown, printed once in the report as Table 1) and the plotting
libraries' chatter (fontTools' font subsetting) at WARNING only."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from core.workload.trace_io import drop_log

QUIET = ("experiments.simulate", "experiments.lib.setup", "matplotlib", "fontTools")
# a trace window past its last arrival: every rate of a capacity search replays it, and the
# search's heading already rates the trace over its own span (reproduce's and the sharing
# report's batches draw their workloads, which never warn)
# likewise the rows a trace's length filter or cap dropped: capacity builds each system's
# first run before it configures logging, where the line is said once a system
SILENT = ("core.workload.spec.window", drop_log.name)


def batch_logging() -> None:
    """Configure the root logger as above; call it before the worker processes start, which
    keep the levels set here."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in SILENT:
        logging.getLogger(name).setLevel(logging.ERROR)


@contextmanager
def heard(*names: str) -> Iterator[None]:
    """Within the block, the loggers ``names`` at their handlers' level again (an earlier
    :func:`batch_logging` in this process, a notebook's earlier search, may have silenced
    them); their levels as they were after it."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.NOTSET)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
