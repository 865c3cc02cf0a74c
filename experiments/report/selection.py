"""Which figures ``experiments.reproduce`` makes (``--figures``), and its progress lines.

:data:`FIGURES` names every figure reproduce can make, in report order. A figure runs
what it needs and nothing else: Fig. 13's ShareGPT panel reuses Fig. 2's runs, Fig. 15
reads Fig. 14's vLLM runs and Fig. 19 compares its swap runs with Fig. 18b's ShareGPT
recompute runs, so selecting one of these runs those shared runs too, but only the
selected figures' files and report sections are written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future

from experiments.lib.checks import ConfigError

FIGURES = (
    "table1", "fig2", "fig12", "fig13", "fig14", "fig15", "fig16", "fig17", "fig18b", "fig19",
    "sensitivity",
)  # fmt: skip
# The older --skip-* flags: each removes these figures from the selection.
SKIPS = {
    "skip_fig12": ("fig12",),
    "skip_sharing": ("fig14", "fig15", "fig16", "fig17"),
    "skip_blocks": ("fig18b", "fig19"),
}


def select(spec: str | None, skipped: Iterable[str] = ()) -> tuple[str, ...]:
    """The figures to make, in :data:`FIGURES` order: the comma-separated names of
    ``spec`` (``None``: every figure) less those of ``skipped`` (:data:`SKIPS` keys).
    An unknown name raises :class:`ConfigError` listing the valid ones, and so does a
    selection the skips leave empty."""
    names = FIGURES if spec is None else [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in FIGURES]
    if unknown or not names:
        raise ConfigError(
            "--figures",
            f"unknown figure {', '.join(map(repr, unknown))}" if unknown else "no figure named",
            got=spec,
            expected=f"comma-separated names from {', '.join(FIGURES)}",
        )
    drop = {f for key in skipped for f in SKIPS[key]}
    chosen = tuple(f for f in FIGURES if f in names and f not in drop)
    if not chosen:
        flags = ", ".join("--" + k.replace("_", "-") for k in skipped)
        raise ConfigError(
            "--figures", f"every figure named is removed by {flags}: nothing to make", spec,
            "a figure the --skip-* flags leave",
        )  # fmt: skip
    return chosen


class Progress:
    """Log lines per figure, each with the seconds since the progress started: when the
    figure's runs are done and when its files are written."""

    def __init__(self, log: logging.Logger, started: float | None = None) -> None:
        self.log = log
        self.started = time.perf_counter() if started is None else started

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def runs(self, figure: str, futures: Sequence[Future], unit: str = "jobs") -> None:
        """Log "``figure``: N ``unit`` done" once every one of ``futures`` is done, unless
        one was cancelled or failed (a command stopped: its own line says so)."""
        left = [len(futures)]
        spoiled = [False]
        lock = threading.Lock()

        def done(future: Future) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
                spoiled[0] |= future.cancelled() or future.exception() is not None
            if last and not spoiled[0]:
                self.log.info("%s: %d %s done (%.0f s)", figure, len(futures), unit, self.elapsed())

        for f in futures:
            f.add_done_callback(done)

    def wrote(self, figure: str, *files: str) -> None:
        self.log.info("%s: wrote %s (%.0f s)", figure, ", ".join(files), self.elapsed())
