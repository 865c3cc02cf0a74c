"""Logging for the commands that run many simulations (``reproduce``, ``capacity``,
``experiments.report.sharing``): their own progress lines at INFO, each run's setup lines
(its KV-capacity breakdown, printed once in the report as Table 1) and the plotting
libraries' chatter (fontTools' font subsetting) at WARNING only."""

from __future__ import annotations

import logging

QUIET = ("experiments.simulate", "experiments.lib.setup", "matplotlib", "fontTools")
# a trace window past its last arrival: every rate of a capacity search replays it, and the
# search's heading already rates the trace over its own span (reproduce's and the sharing
# report's batches draw their workloads, which never warn)
SILENT = ("core.workload.spec.window",)


def batch_logging() -> None:
    """Configure the root logger as above; call it before the worker processes start, which
    keep the levels set here."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in SILENT:
        logging.getLogger(name).setLevel(logging.ERROR)
