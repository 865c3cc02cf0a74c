"""What every figure notebook shares: where the results are, a clear error when they are
missing, reading run metrics, and saving a figure (``experiments.report.figures.save``:
PNG + PDF with TrueType fonts) next to the results. Notebooks read result files only; they
never run a simulation.

Importing this module puts the repository root on ``sys.path`` so that notebooks opened
from ``notebooks/`` can import ``core`` and ``experiments``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments.report.figures import save  # re-exported: the one saver

__all__ = ["MissingResultsError", "read_metrics", "require", "results_dir", "save"]

RESULTS_ENV = "KVLAB_RESULTS"
DEFAULT_RESULTS = Path("results") / "reproduce"


class MissingResultsError(FileNotFoundError):
    """A result file a notebook needs does not exist."""


def results_dir() -> Path:
    """The results directory: ``$KVLAB_RESULTS`` if set, else ``results/reproduce``.
    A relative path is taken from the repository root (not the notebook's folder)."""
    path = Path(os.environ.get(RESULTS_ENV) or DEFAULT_RESULTS).expanduser()
    return path if path.is_absolute() else REPO / path


def require(results: Path, *names: str) -> list[Path]:
    """Paths of ``names`` under ``results``; raise :class:`MissingResultsError` naming every
    missing file and the command that writes them."""
    missing = [n for n in names if not (results / n).is_file()]
    if missing:
        raise MissingResultsError(
            f"{results} lacks {', '.join(missing)}. Run `python -m experiments.reproduce "
            f"--out {results}` first, or set {RESULTS_ENV} to the directory it wrote."
        )
    return [results / n for n in names]


def read_metrics(results: Path, labels: dict[str, str]) -> pd.DataFrame:
    """One row per ``system -> run label``: ``runs/<label>/metrics.json`` plus a ``system``
    column, in the order of ``labels``."""
    paths = require(results, *(f"runs/{label}/metrics.json" for label in labels.values()))
    rows = [json.loads(p.read_text()) | {"system": s} for s, p in zip(labels, paths, strict=True)]
    return pd.DataFrame(rows)
